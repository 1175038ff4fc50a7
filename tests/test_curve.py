"""Learning curves (`derl_jax.experiment.curve`, launch/learning_curve.py) on the arith smoke preset."""

from __future__ import annotations

import json
import os

import pytest

from derl_jax.experiment import build, curve, protocol
from test_search import get_config


def test_a_curve_point_is_a_final_training_and_a_rerun_resumes(tmp_path, monkeypatch):
    # the curve's evaluator is kept so that the final training below runs its compiled program
    cfg = get_config("smoke")
    evaluators = []
    build_inner = build.build_inner

    def build_and_keep(*args, **kwargs):
        base_params, evaluator = build_inner(*args, **kwargs)
        evaluators.append(evaluator)
        return base_params, evaluator

    monkeypatch.setattr(build, "build_inner", build_and_keep)
    result = curve.learning_curve(cfg, str(tmp_path), "g1", steps=[0, 2], seeds=[0, 1])
    assert result["steps"] == [0, 2] and result["seeds"] == [0, 1]
    base = json.load(open(tmp_path / "base_policy_test.json")) if (tmp_path / "base_policy_test.json").exists() else None
    assert result["test"][0][0] == result["test"][0][1]          # step 0: the base policy, whatever the seed
    assert base is None or base["test"] == result["test"][0][0]
    point = json.load(open(curve.point_path(str(tmp_path), 2, 1)))
    assert len(point["test_items"]) == cfg.domain.num_test
    assert point["test"] == pytest.approx(sum(point["test_items"]) / len(point["test_items"]), abs=1e-6)
    assert result["mean"][1] == pytest.approx((result["test"][1][0] + result["test"][1][1]) / 2)
    assert os.path.isfile(tmp_path / "curve.png")

    assert cfg.final.steps == 2   # the same point as `--mode=final` with 2 steps and seed 1
    domain = build.build_domain(cfg)
    base_params, _ = build_inner(domain, cfg, str(tmp_path))   # the base policy read back from its cache
    final = protocol.train_final("g1", domain, evaluators[0], protocol.run_keys(1)["final"], base_params)
    assert final.test == point["test"] and final.test_items == point["test_items"]

    monkeypatch.setattr(protocol, "train_final", lambda *a, **k: pytest.fail("a kept point was trained again"))
    assert curve.learning_curve(cfg, str(tmp_path), "g1", steps=[0, 2], seeds=[0, 1])["test"] == result["test"]


def test_a_bad_expression_is_refused_before_training(tmp_path):
    with pytest.raises(ValueError, match="not a valid reward"):
        curve.learning_curve(get_config("smoke"), str(tmp_path), "g1+", steps=[2], seeds=[0])
    assert not (tmp_path / "steps_2").exists()
