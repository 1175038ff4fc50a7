"""The process a run lives in: host devices, the compilation cache, which process writes.

These run before JAX starts its backend (`make_host_devices`) or right after
(`use_compile_cache`), so JAX is imported inside the functions that need it.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import time
from typing import Any, Mapping

from derl_jax.checkpoint import atomic_write_json
from derl_jax.config import InputError, config_value
from derl_jax.parallel import distributed_requested, host_cores, host_description, host_device_flags
from derl_jax.plan.roofline import memory_fraction

RUN_INFO_FILE = "run_info.json"
COMPILE_CACHE_DIR = "compile_cache"
COMPILE_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
MIN_COMPILE_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"


def run_cores(mode: str) -> int:
    """The CPU cores one run of this process may use: all of them, or one in a compare, whose
    workers use the cores (so that its results do not depend on the worker count)."""
    return 1 if mode == "compare" else host_cores()


def make_host_devices(cfg: Any, mode: str, environ: dict) -> None:
    """Before JAX starts its backend: one XLA host device per core in `environ["XLA_FLAGS"]`
    for a run that may split its steps over them (`run_cores(mode)` > 1, `config.mesh.data` 0,
    see `derl_jax.rl.placement.auto_data_size`) when no mesh axis is -1, the job is one process
    and XLA_FLAGS does not already fix the count. Harmless on accelerators, where the host
    devices go unused."""
    sizes = [config_value(cfg, f"mesh.{axis}") for axis in ("cand", "data", "model")]
    if mode == "plan" or sizes[1] != 0 or -1 in sizes or distributed_requested(environ):
        return
    environ["XLA_FLAGS"] = host_device_flags(environ.get("XLA_FLAGS", ""), run_cores(mode))


def platform_devices(environ: Mapping[str, str]) -> list:
    """This process's devices (starting JAX's backend); InputError naming JAX_PLATFORMS (one
    line) when the platform it names does not start here."""
    import jax

    try:
        return jax.devices()
    except Exception as err:  # noqa: BLE001  (each missing backend fails its own way, some with no message)
        why = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise InputError(f"JAX_PLATFORMS={environ.get('JAX_PLATFORMS', '')!r}: that platform does not start in "
                         f"this process ({why}); unset JAX_PLATFORMS to use the devices there are") from None


def memory_note(platform: str, environ: Mapping[str, str]) -> str | None:
    """On GPUs, one line: the share of each device's memory JAX's allocator takes and where that
    comes from (the figure `--mode=plan` plans against); None on other platforms."""
    if platform != "gpu":
        return None
    fraction, source = memory_fraction(environ)
    return (f"GPU memory: JAX's allocator takes {fraction:.0%} of each device ({source}); "
            f"set XLA_PYTHON_CLIENT_MEM_FRACTION before the run to change it")


def compile_cache_dir(flag: str | None, workdir: str, environ: Mapping[str, str], process_count: int) -> str | None:
    """The run's persistent compilation cache directory, None for none: `flag` (--compile_cache)
    when given ('' for none), else the environment's JAX_COMPILATION_CACHE_DIR, else
    `<workdir>/compile_cache` when this is a single-process job (in a multi-process job only
    process 0 writes the run directory, so each host names its own cache)."""
    if flag is not None:
        return flag.strip() or None
    if environ.get(COMPILE_CACHE_ENV):
        return environ[COMPILE_CACHE_ENV]
    return os.path.join(workdir, COMPILE_CACHE_DIR) if process_count == 1 else None


def use_compile_cache(directory: str | None) -> None:
    """Point JAX's persistent compilation cache at `directory` (None: off) for this process and the
    compare workers it spawns (they inherit the environment). Every compilation is cached, however
    short: a run compiles dozens of small programs whose sum is a large share of a CPU run."""
    import jax

    if directory is None:
        os.environ.pop(COMPILE_CACHE_ENV, None)
        jax.config.update("jax_compilation_cache_dir", None)
        return
    os.environ[COMPILE_CACHE_ENV] = directory
    os.environ.setdefault(MIN_COMPILE_TIME_ENV, "0")
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(os.environ[MIN_COMPILE_TIME_ENV]))


def primary_process() -> bool:
    """False on processes 1.. of a multi-process job (JAX is imported by then); True otherwise."""
    jax = sys.modules.get("jax")
    return jax is None or jax.process_index() == 0


def commit_of(path: str) -> str | None:
    """The git commit of the checkout holding `path` (with "+changes" when its tree differs), or None."""
    where = os.path.dirname(os.path.abspath(path))
    try:
        head = subprocess.run(["git", "-C", where, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def run_info(command: str, mode: str) -> dict:
    """What made a run: the command, the code's commit, the date, the machine (its CPU and the cores
    this process may use, which set XLA:CPU's threads and so the rounding) and the versions."""
    import jax

    return {"command": command, "mode": mode, "commit": commit_of(__file__),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **host_description(),
            "devices": [str(d.device_kind) for d in jax.devices()][:1] + ([f"x{jax.device_count()}"]
                                                                           if jax.device_count() > 1 else []),
            "python": platform.python_version()}


def record_run(workdir: str, info: Mapping[str, Any], started: float) -> None:
    """`<workdir>/run_info.json`: `info` and the wall time since `started` (time.monotonic())."""
    atomic_write_json(os.path.join(workdir, RUN_INFO_FILE), {**info, "wall_s": round(time.monotonic() - started, 1)})
