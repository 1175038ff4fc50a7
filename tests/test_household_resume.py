"""A household search (real inner loop: windowed episodes, the task read once; real
Meta-Optimizer) stopped after one iteration and continued gives the uninterrupted run's history.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

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


@pytest.mark.slow
def test_a_continued_household_search_equals_the_uninterrupted_one(tmp_path):
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
