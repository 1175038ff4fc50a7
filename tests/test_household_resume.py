"""A household search (real inner loop: windowed episodes, the task read once; real
Meta-Optimizer) stopped after one iteration and continued gives the uninterrupted run's history.

The three runs compile the same programs: the persistent compilation cache of the test session
(its directory in $JAX_COMPILATION_CACHE_DIR, tests/conftest.py) is on in this process while they
run, so the second and third runs read what the first compiled instead of compiling it again.
"""

from __future__ import annotations

import importlib.util
import os

import jax
import pytest
from jax.experimental.compilation_cache import compilation_cache

from derl_jax.experiment.run import run
from derl_jax.logging import read_jsonl
from derl_jax.outer.search import strip_wall_clock

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def smoke_config(iterations: int):
    spec = importlib.util.spec_from_file_location("household_config", os.path.join(REPO_ROOT, "configs", "household.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = module.get_config("smoke")
    cfg.outer.iterations = iterations
    return cfg


@pytest.fixture
def persistent_compile_cache(tmp_path):
    """JAX's persistent compilation cache on in this process for one test, every compilation
    cached; the settings it found are restored afterwards."""
    wanted = {"jax_compilation_cache_dir": os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(tmp_path / "xla_cache"),
              "jax_persistent_cache_min_compile_time_secs": 0.0}
    found = {name: getattr(jax.config, name) for name in wanted}
    for name, value in wanted.items():
        jax.config.update(name, value)
    yield
    for name, value in found.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()


@pytest.mark.slow
def test_a_continued_household_search_equals_the_uninterrupted_one(tmp_path, persistent_compile_cache):
    straight = tmp_path / "straight"
    run(smoke_config(2), str(straight), "search", progress=False)
    resumed = tmp_path / "resumed"
    run(smoke_config(1), str(resumed), "search", progress=False)
    assert len(read_jsonl(resumed / "history.jsonl")) == len(read_jsonl(straight / "history.jsonl")) // 2
    run(smoke_config(2), str(resumed), "search", progress=False)
    want = strip_wall_clock(read_jsonl(straight / "history.jsonl"))
    assert strip_wall_clock(read_jsonl(resumed / "history.jsonl")) == want
    assert {record["iteration"] for record in want} == {0, 1}
    trained = [record for record in want if record["trained"]]   # the inner loop ran and left its curves
    assert trained and any(abs(value) > 0 for record in trained for value in record["curves"]["reward_mean"])
