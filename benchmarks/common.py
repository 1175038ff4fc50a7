"""Tiny helpers shared by the benchmarks: timing and printing results as JSON and a table."""

from __future__ import annotations

import json
import platform
import statistics
import time
from typing import Any, Callable, Mapping, Sequence


def median_time(fn: Callable[[], Any], *, repeats: int = 3, warmup: int = 1) -> float:
    """Median wall time in seconds of `fn()` after `warmup` calls (block inside `fn`)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> dict:
    """{"cpu": model name, "simd": widest of avx512f / avx2 / avx} from a Linux cpuinfo file;
    {} where it cannot be read. CPU ratios against PyTorch depend on both (oneDNN and XLA
    use different kernels per instruction set)."""
    try:
        with open(cpuinfo) as handle:
            text = handle.read()
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    flags = set(fields.get("flags", "").split())
    simd = next((name for name in ("avx512f", "avx2", "avx") if name in flags), "none")
    return {"cpu": fields.get("model name", "unknown"), "simd": simd}


def machine() -> dict:
    """A few facts about where the numbers were taken."""
    import os

    info = {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine(),
            **cpu_model()}
    try:
        import jax

        info["jax"] = jax.__version__
        info["backend"] = jax.default_backend()
        info["devices"] = [str(d) for d in jax.devices()]
    except Exception:  # noqa: BLE001 - benchmarks without JAX still report
        pass
    return info


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value == 0 or 1e-3 <= abs(value) < 1e6:
            return f"{value:.4g}"
        return f"{value:.3e}"
    return str(value)


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows of dicts as an aligned plain-text table (numbers right-aligned)."""
    if not rows:
        return "(no rows)"
    columns = list(columns or dict.fromkeys(k for row in rows for k in row))
    cells = [[_cell(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    numeric = [all(isinstance(row.get(c), (int, float)) for row in rows if c in row) for c in columns]

    def line(values):
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(columns), line(["-" * w for w in widths])]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def report(name: str, rows: Sequence[Mapping[str, Any]], *, config: Mapping[str, Any] | None = None,
           summary: Mapping[str, Any] | None = None, columns: Sequence[str] | None = None,
           out: str | None = None) -> dict:
    """Print one JSON line (prefixed `RESULT `) and the aligned table (and write the JSON object
    to `out` when given); return the JSON object."""
    result = {"benchmark": name, "config": dict(config or {}), "machine": machine(), "rows": [dict(r) for r in rows]}
    if summary:
        result["summary"] = dict(summary)
    if out:
        with open(out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1, sort_keys=True)
    print("RESULT " + json.dumps(result, sort_keys=True))
    print()
    print(f"== {name} ==")
    if config:
        print("config: " + ", ".join(f"{k}={v}" for k, v in config.items()))
    print(table(rows, columns))
    if summary:
        print()
        for key, value in summary.items():
            print(f"{key}: {_cell(value)}")
    return result
