"""The planner's memory figures against the compiler's, piece by piece, for a run config.

    python -m derl_jax.plan.memory_check configs/arith.py:smoke configs/math.py:tiny

For each config: its `RunShape` (the domain built, as `--mode=plan` does when the config
leaves shapes to it), the analytic terms (`derl_jax.plan.analytic.per_device`) and the
compiled pieces' memory analysis (`derl_jax.plan.compiled.plan_in_subprocess`, fake CPU
devices), as one Markdown row per config:

    sample temps   analytic KV cache + sampling temporaries  vs  compiled `sample` temp bytes
    update temps   analytic activations + logits + gradients  vs  compiled `update` temp bytes
    peak           analytic peak (`peak_bytes_estimate`)      vs  compiled peak (`report.plan`)

The compiled peak and the analytic one both include the Meta-Optimizer and the trained copies
beyond the candidates in flight (neither is in the compiled pieces).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Sequence

from derl_jax.domains.registry import get_domain
from derl_jax.plan import analytic, compiled, report
from derl_jax.plan.analytic import RunShape

HEADER = ("| config | mesh | sample temps: planner / compiled | update temps: planner / compiled | "
          "peak: planner / compiled |")


def load_config(spec: str) -> Any:
    """The config of "path/to/config.py[:preset]" (its `get_config(preset)`)."""
    path, _, arg = spec.partition(":")
    module_spec = importlib.util.spec_from_file_location(os.path.basename(path).removesuffix(".py"), path)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"memory_check: {path!r} is not a Python config file")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg or None)


def compare(shape: RunShape) -> dict[str, tuple[int, int]]:
    """{"sample" | "update" | "peak": (planner bytes, compiled bytes)} per device for `shape`."""
    sizes = analytic.per_device(shape)
    memory = compiled.plan_in_subprocess(shape, with_flops=False)
    pieces = memory["memory"]
    compiled_peak = report.plan(shape, "h100", memory, fraction=1.0)["peak_bytes"]
    return {"sample": (sizes["kv_cache"] + sizes["sampling"], pieces["sample"]["temp_bytes"]),
            "update": (sizes["activations"] + sizes["logits"] + sizes["gradients"], pieces["update"]["temp_bytes"]),
            "peak": (analytic.peak_bytes_estimate(shape), compiled_peak)}


def row(name: str, shape: RunShape, figures: dict[str, tuple[int, int]]) -> str:
    mib = lambda value: f"{value / (1 << 20):.2f}"  # noqa: E731
    cells = [f"{mib(a)} / {mib(c)} MiB ({a / c:.2f})" for a, c in
             (figures[piece] for piece in ("sample", "update", "peak"))]
    return f"| {name} | {tuple(shape.mesh)} | " + " | ".join(cells) + " |"


def main(argv: Sequence[str]) -> list[str]:
    """One row per "config.py[:preset]" in `argv`; "--compute_dtype=float32" sets
    `policy.compute_dtype` of the configs after it."""
    lines, compute = [HEADER, "|" + "---|" * 5], ""
    for spec in argv:
        if spec.startswith("--compute_dtype="):
            compute = spec.split("=", 1)[1]
            continue
        cfg = load_config(spec)
        if compute:
            cfg.policy.compute_dtype = compute
            spec = f"{spec} (compute {compute})"
        shape = report.shape_from_config(cfg, domain=get_domain(str(cfg.domain.kind)).build(cfg))
        lines.append(row(spec, shape, compare(shape)))
        print(lines[-1] if len(lines) > 3 else "\n".join(lines), flush=True)
    return lines


if __name__ == "__main__":
    main(sys.argv[1:])
