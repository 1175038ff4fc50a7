"""Run-directory logging: config, metrics, the search history, TensorBoard, progress bars.

Layout of a run directory written by `RunLogger(workdir)`:

    workdir/config.json     the run's configuration (written once, atomically)
    workdir/metrics.jsonl   one JSON object per `log_metrics` call:
                            {"step": 3, "scope": "outer", "time": 1712.3, "val_mean": 0.5, ...}
    workdir/history.jsonl   one JSON object per evaluated candidate (`append_history`)
    workdir/tb/             TensorBoard event files, tags "<scope>/<metric name>"

JSONL files are append-only and line-complete: a record counts once its newline is on
disk. A run killed mid-write can leave a torn last line; `read_jsonl` ignores it and the
next append cuts it off first. On resume the search rewrites both files (`rewrite_jsonl`)
to exactly what its checkpoint covers, from its own journal (`derl_jax.outer.resume`), so a
damaged line anywhere loses nothing.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import sys
import time
import warnings
from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np
from tqdm.auto import tqdm

from derl_jax.checkpoint import atomic_write_json, atomic_write_text

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
HISTORY_FILE = "history.jsonl"
TENSORBOARD_DIR = "tb"
RESERVED_METRIC_KEYS = ("step", "scope", "time")


# --------------------------------------------------------------------------- JSON values


def to_jsonable(value: Any, where: str = "value") -> Any:
    """`value` with NumPy/JAX numbers and arrays turned into Python ones, non-finite floats into None.

    Accepts dicts (keys made str), lists/tuples, str, bool, None, numbers and arrays;
    anything else raises TypeError naming `where` (the path inside the record).
    """
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (np.ndarray, np.generic, jax.Array)):
        host = np.asarray(value)
        if host.dtype.kind not in "biuf":
            raise TypeError(f"{where}: arrays of dtype {host.dtype} cannot be logged as JSON")
        return to_jsonable(host.tolist(), where)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    raise TypeError(f"{where}: cannot be written as JSON (type {type(value).__name__})")


def scalar_value(value: Any, where: str) -> float | None:
    """A metric value as a Python float (None when NaN/inf); it must hold exactly one number."""
    if isinstance(value, (bool, numbers.Real)):
        number = float(value)
    elif isinstance(value, (np.ndarray, np.generic, jax.Array)):
        host = np.asarray(value)
        if host.size != 1 or host.dtype.kind not in "biuf":
            raise TypeError(f"{where}: a metric must be one real number, got {host.dtype}{list(host.shape)}")
        number = float(host.reshape(()))
    else:
        raise TypeError(f"{where}: a metric must be a number, got {type(value).__name__}")
    return number if math.isfinite(number) else None


# --------------------------------------------------------------------------- JSONL files


def append_jsonl(path: str | os.PathLike, records: Sequence[Mapping[str, Any]], *, fsync: bool = True) -> None:
    """Append `records` as complete lines with one write; fsync unless `fsync=False`.

    A torn last line left by a killed writer is cut off first so the file stays one
    record per line.
    """
    path = os.fspath(path)
    lines = []
    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise TypeError(f"append_jsonl({path!r}): record {index} is a {type(record).__name__}, not a dict")
        payload = to_jsonable(record, f"record {index}")
        lines.append(json.dumps(payload, allow_nan=False, separators=(",", ":")) + "\n")
    if not lines:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    drop_torn_tail(path)
    data = "".join(lines).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def drop_torn_tail(path: str | os.PathLike) -> int:
    """Cut bytes after the last newline of `path` (a partly written record); returns bytes cut."""
    path = os.fspath(path)
    if not os.path.exists(path):
        return 0
    with open(path, "rb+") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return 0
        keep = _offset_after_last_newline(handle, size)
        handle.truncate(keep)
        handle.flush()
        os.fsync(handle.fileno())
    warnings.warn(f"{path}: dropped a torn last record of {size - keep} bytes", RuntimeWarning, stacklevel=3)
    return size - keep


def _offset_after_last_newline(handle, size: int, chunk: int = 1 << 16) -> int:
    end = size
    while end > 0:
        start = max(0, end - chunk)
        handle.seek(start)
        block = handle.read(end - start)
        position = block.rfind(b"\n")
        if position >= 0:
            return start + position + 1
        end = start
    return 0


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """All records of a JSONL file ([] if it does not exist).

    A last line that is unterminated or not valid JSON (a write cut short) is ignored with
    a warning; an invalid line anywhere else raises ValueError naming `path:line`.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        return []
    with open(path, "rb") as handle:
        raw = handle.read()
    lines = raw.split(b"\n")
    torn_tail = lines.pop()  # b"" when the file ends with a newline
    if torn_tail:
        warnings.warn(f"{path}: ignoring an unterminated last line ({len(torn_tail)} bytes)", RuntimeWarning, stacklevel=2)
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            if number == len(lines) and not torn_tail:
                warnings.warn(f"{path}:{number}: ignoring an unreadable last line ({err})", RuntimeWarning, stacklevel=2)
                continue
            raise ValueError(f"{path}:{number}: not a JSON record: {err}") from err
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        records.append(record)
    return records


def read_jsonl_lenient(path: str | os.PathLike) -> tuple[list[dict], list[int]]:
    """(records of every readable line, numbers of the lines that are not a JSON object).

    For repairing a damaged file: unlike `read_jsonl` it never raises for a bad line.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        return [], []
    with open(path, "rb") as handle:
        lines = handle.read().split(b"\n")
    records, damaged = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            damaged.append(number)
    return records, damaged


def jsonl_text(records: Sequence[Mapping[str, Any]]) -> str:
    """`records` as JSONL text, one compact line each (what `append_jsonl` writes)."""
    return "".join(
        json.dumps(to_jsonable(r, f"record {i}"), allow_nan=False, separators=(",", ":")) + "\n"
        for i, r in enumerate(records)
    )


def rewrite_jsonl(path: str | os.PathLike, records: Sequence[Mapping[str, Any]]) -> None:
    """Replace the JSONL file at `path` with `records`, atomically."""
    atomic_write_text(path, jsonl_text(records))


def truncate_history(path: str | os.PathLike, keep_until_iteration: int, *, key: str = "iteration") -> int:
    """Keep only records with `record[key] <= keep_until_iteration`; returns how many were dropped.

    Used on resume: records written after the restored checkpoint are replayed by the
    resumed run and must not appear twice. The file is replaced atomically.
    """
    path = os.fspath(path)
    records = read_jsonl(path)
    kept = []
    for index, record in enumerate(records):
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"truncate_history({path!r}): record {index} has no numeric {key!r} field: {record}")
        if value <= keep_until_iteration:
            kept.append(record)
    dropped = len(records) - len(kept)
    if dropped or os.path.exists(path):
        text = "".join(json.dumps(r, allow_nan=False, separators=(",", ":")) + "\n" for r in kept)
        atomic_write_text(path, text)
    return dropped


# --------------------------------------------------------------------------- run logger


class RunLogger:
    """Writes a run directory (see the module docstring).

    Only the primary process (jax.process_index() == 0) writes; on other processes every
    method is a no-op so callers need no `if`. `purge_step` (on resume) makes TensorBoard
    discard events at or after that step from the previous attempt.
    """

    def __init__(
        self,
        workdir: str | os.PathLike,
        *,
        tensorboard: bool = True,
        purge_step: int | None = None,
        is_primary: bool | None = None,
    ):
        self.workdir = os.fspath(workdir)
        self.is_primary = jax.process_index() == 0 if is_primary is None else is_primary
        self.metrics_path = os.path.join(self.workdir, METRICS_FILE)
        self.history_path = os.path.join(self.workdir, HISTORY_FILE)
        self.config_path = os.path.join(self.workdir, CONFIG_FILE)
        self.tensorboard_dir = os.path.join(self.workdir, TENSORBOARD_DIR)
        self._use_tensorboard = tensorboard
        self._purge_step = purge_step
        self._writer = None
        if self.is_primary:
            os.makedirs(self.workdir, exist_ok=True)

    def write_config(self, config: Any) -> None:
        """config.json from a dict or an ml_collections ConfigDict (anything with `to_dict()`)."""
        if not self.is_primary:
            return
        as_dict = config.to_dict() if hasattr(config, "to_dict") else config
        if not isinstance(as_dict, Mapping):
            raise TypeError(f"RunLogger.write_config: expected a dict or ConfigDict, got {type(config).__name__}")
        atomic_write_json(self.config_path, to_jsonable(as_dict, "config"), indent=2)

    def log_metrics(self, step: int, metrics: Mapping[str, Any], scope: str) -> dict:
        """Append one metrics.jsonl record and write TensorBoard scalars `<scope>/<name>`.

        metrics: name -> one number (Python, NumPy or JAX scalar); NaN/inf become null and
        are not sent to TensorBoard. Returns the record written.
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise TypeError(f"RunLogger.log_metrics: step must be an int, got {step!r}")
        if not isinstance(scope, str) or not scope:
            raise ValueError(f"RunLogger.log_metrics: scope must be a non-empty str, got {scope!r}")
        values = {}
        for name, value in metrics.items():
            if name in RESERVED_METRIC_KEYS:
                raise ValueError(f"RunLogger.log_metrics: metric name {name!r} is reserved ({RESERVED_METRIC_KEYS})")
            values[str(name)] = scalar_value(value, f"metric {scope}/{name}")
        record = {"step": int(step), "scope": scope, "time": time.time(), **values}
        if not self.is_primary:
            return record
        append_jsonl(self.metrics_path, [record], fsync=False)
        writer = self._tensorboard_writer()
        if writer is not None:
            for name, value in values.items():
                if value is not None:
                    writer.add_scalar(f"{scope}/{name}", value, int(step))
            writer.flush()
        return record

    def append_history(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Append candidate records (expression text, score, iteration, ...) to history.jsonl, fsynced."""
        if self.is_primary:
            append_jsonl(self.history_path, records, fsync=True)

    def read_history(self) -> list[dict]:
        return read_jsonl(self.history_path)

    def read_metrics(self) -> list[dict]:
        return read_jsonl(self.metrics_path)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> "RunLogger":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _tensorboard_writer(self):
        if not self._use_tensorboard:
            return None
        if self._writer is None:
            from tensorboardX import SummaryWriter

            self._writer = SummaryWriter(logdir=self.tensorboard_dir, purge_step=self._purge_step)
        return self._writer


# --------------------------------------------------------------------------- console


def progress_bar(
    iterable: Iterable | None = None,
    *,
    total: int | None = None,
    desc: str | None = None,
    enabled: bool = True,
    stream=None,
    **tqdm_kwargs,
) -> tqdm:
    """A tqdm bar on `stream` (stderr by default) that is silent when disabled or not a TTY.

    Also silent on non-primary processes of a multi-host run.
    """
    stream = sys.stderr if stream is None else stream
    is_tty = bool(getattr(stream, "isatty", lambda: False)())
    active = enabled and is_tty and jax.process_index() == 0
    return tqdm(iterable, total=total, desc=desc, file=stream, disable=not active, dynamic_ncols=True, **tqdm_kwargs)


def summary_line(
    iteration: int,
    best_score: float | None,
    validity_rate: float,
    incumbent: str | None,
    *,
    max_incumbent_chars: int = 80,
) -> str:
    """One console line per outer iteration, e.g.

    `iter    3 | best 0.8125 | valid  75.0% | g1 + 0.5*g2`
    """
    if not 0.0 <= validity_rate <= 1.0:
        raise ValueError(f"summary_line: validity_rate must be in [0, 1], got {validity_rate!r}")
    if best_score is None or not math.isfinite(float(best_score)):
        best = "best      -"
    else:
        best = f"best {float(best_score):.4f}"
    text = "(none)" if incumbent is None else " ".join(str(incumbent).split())
    if len(text) > max_incumbent_chars:
        text = text[: max_incumbent_chars - 1] + "…"
    return f"iter {int(iteration):4d} | {best} | valid {100.0 * validity_rate:5.1f}% | {text}"
