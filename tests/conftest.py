"""Test-wide setup: 8 fake CPU devices so sharding tests run on any machine.

The device count is forced whatever else XLA_FLAGS holds (chex replaces only that flag), and
JAX runs on the CPU unless JAX_PLATFORMS says otherwise; `test_parallel.py` then runs its cases
in a subprocess on 8 CPU devices, so nothing is silently skipped.

Many tests compile the same programs (the same tiny policies, inner loops and samplers), so the
session shares one persistent compilation cache, as `launch/run.py` does for a run's processes:
a fresh directory made by the first process (pytest-xdist's workers and the tests' subprocesses
inherit it through the environment) and removed by that process at the end. Tests compile far
more than they run, so XLA compiles without LLVM optimisation (`--xla_backend_optimization_level=0`)
and with XLA:CPU's older elemental emitters instead of its MLIR fusion emitters
(`--xla_cpu_use_fusion_emitters=false`, which halves the compile time of the tests' programs) in
every process of the session, unless XLA_FLAGS already sets an optimisation level.

Set-ups that several test modules share and that cost more to build than to read (the small SFT
base policy of test_sft/test_inner) are built once per session in `shared_build_dir()`, a
directory made the same way, under a file lock: the first worker that needs one builds it, the
others wait and read it.
"""

import contextlib
import fcntl
import os
import shutil
import tempfile

import chex
import pytest

chex.set_n_cpu_devices(8)
ELEMENTAL_EMITTERS = "--xla_cpu_use_fusion_emitters=false"
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""),
                                        "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
                                        ELEMENTAL_EMITTERS]).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

def _session_dir(variable: str, prefix: str) -> str | None:
    """Makes the session's directory in `variable` unless a parent process already has -> the
    directory this process made (it removes it at the end), or None."""
    if os.environ.get(variable):
        return None
    os.environ[variable] = tempfile.mkdtemp(prefix=prefix)
    return os.environ[variable]


_OWN_COMPILE_CACHE = _session_dir("JAX_COMPILATION_CACHE_DIR", "derl_jax_test_xla_cache_")
if _OWN_COMPILE_CACHE is not None:
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
_OWN_SHARED_DIR = _session_dir("DERL_TEST_SHARED_DIR", "derl_jax_test_shared_")


def shared_build_dir(name: str) -> str:
    """A directory `name` that every process of this test session sees (made on first use)."""
    path = os.path.join(os.environ["DERL_TEST_SHARED_DIR"], name)
    os.makedirs(path, exist_ok=True)
    return path


@contextlib.contextmanager
def session_lock(name: str):
    """Holds an exclusive lock named `name` across the session's processes."""
    with open(os.path.join(shared_build_dir("locks"), name), "w", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pytest_unconfigure(config):
    for own in (_OWN_COMPILE_CACHE, _OWN_SHARED_DIR):
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Modules holding `slow` tests run first, each module's tests kept together (its fixtures
    are built once): with pytest-xdist the long runs then start early instead of leaving one
    worker busy at the end while the others wait."""
    def has_slow(module):
        return any(item.get_closest_marker("slow") for item in by_module[module])

    by_module = {}
    for item in items:
        by_module.setdefault(item.module.__name__ if item.module else "", []).append(item)
    ordered = sorted(by_module, key=lambda module: not has_slow(module))
    items[:] = [item for module in ordered for item in by_module[module]]


def compact_tokenizer_dir() -> str:
    """The session's compact tokenizer (tests/compact_tokenizer.py), trained by the first process
    that asks for it."""
    import compact_tokenizer

    path = shared_build_dir("compact_tokenizer")
    with session_lock("compact_tokenizer"):
        if not os.path.exists(os.path.join(path, "tokenizer.json")):
            compact_tokenizer.write_compact_tokenizer(path, compact_tokenizer.household_turn_texts())
    return path
