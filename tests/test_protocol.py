"""Protocol: 8:2 split, final mode on the full training set, compare + report, resume, the
test split kept away from the search, config validation."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import jax
import numpy as np
import pytest

from derl_jax.domains.arith import make_arith_domain
from derl_jax.experiment import protocol
from derl_jax.experiment.checks import validate_config
from derl_jax.experiment.protocol import ConfigError, compare, run_method, split_train
from derl_jax.experiment.stats import student_t_quantile
from derl_jax.parallel import make_mesh
from derl_jax.outer import ALL_METHODS
from test_search import BASE_PARAMS, FakeEvaluator, FakeMetaOptimizer, fake_config, get_config, reference_quality

SEARCH_CODE = tuple(
    os.path.join("derl_jax", "meta", name)
    for name in ("search.py", "candidates.py", "resume.py", "candidate_policies.py", "strategies" + os.sep)
)


@pytest.fixture(scope="module")
def domain():
    return make_arith_domain(get_config("smoke").domain)


def expected_accuracy(skill: float, coverage: float = 1.0) -> float:
    return float(1.0 / (1.0 + np.exp(-(2.0 * skill - 1.0)))) * coverage


def rows_of(dataset) -> set[tuple]:
    return {tuple(row) for row in np.asarray(dataset.prompts).tolist()}


def test_split_train_is_a_fixed_8_2_partition(domain):
    inner, validation = split_train(domain.train, 0)
    assert (inner.size, validation.size) == (32, 8)
    prompts = np.asarray(domain.train.prompts)
    together = np.concatenate([np.asarray(inner.prompts), np.asarray(validation.prompts)])
    assert sorted(map(tuple, together.tolist())) == sorted(map(tuple, prompts.tolist()))
    assert not rows_of(inner) & rows_of(validation)
    again, _ = split_train(domain.train, 0)
    np.testing.assert_array_equal(np.asarray(again.prompts), np.asarray(inner.prompts))
    other, _ = split_train(domain.train, 1)
    assert not np.array_equal(np.asarray(other.prompts), np.asarray(inner.prompts))


def test_run_method_searches_then_trains_fresh_on_the_full_train_split(tmp_path, domain):
    evaluator = FakeEvaluator()
    cfg = fake_config(iterations=2, num_candidates=3)
    result = run_method("derl", cfg, domain, evaluator, tmp_path, 0, base_params=BASE_PARAMS,
                        optimizer_factory=FakeMetaOptimizer, progress=False, echo=lambda line: None)
    history = [json.loads(line) for line in open(tmp_path / "history.jsonl")]
    best = max(history, key=lambda r: r["score"])
    assert result.expression == best["text"] and result.validation == pytest.approx(best["score"])
    assert all((c["train"], c["val"]) == (32, 8) for c in evaluator.calls)  # search: inner-train / validation
    assert evaluator.final_calls == [{"quality": pytest.approx(reference_quality(result.expression, evaluator.rows), abs=1e-5), "train": 40}]
    skill = 2.0 * reference_quality(result.expression, evaluator.rows)
    assert result.test == pytest.approx(expected_accuracy(skill), abs=1e-5)
    assert result.budget["candidates_charged"] == 6 and result.evolved_policy_test is None
    assert result.per_iteration["validation_mean"] == pytest.approx(
        [np.mean([r["score"] for r in history if r["iteration"] == i]) for i in range(2)]
    )
    assert result.latex and "g_{1}" in result.latex
    # finished: returned from disk without any training
    evaluator.calls.clear(), evaluator.final_calls.clear()
    assert run_method("derl", cfg, domain, evaluator, tmp_path, 0, base_params=BASE_PARAMS,
                      optimizer_factory=FakeMetaOptimizer, progress=False) == result
    assert evaluator.calls == [] and evaluator.final_calls == []


def test_a_kept_final_policy_is_tested_not_retrained_and_only_for_its_expression(tmp_path, domain):
    evaluator = FakeEvaluator()
    key = protocol.run_keys(0)["final"]
    trained = protocol.train_final("g1+g2", domain, evaluator, key, BASE_PARAMS, str(tmp_path))
    assert len(evaluator.final_calls) == 1 and (tmp_path / protocol.FINAL_POLICY_FILE).exists()
    again = protocol.train_final("g1+g2", domain, evaluator, key, BASE_PARAMS, str(tmp_path))
    assert len(evaluator.final_calls) == 1                                      # loaded, not trained
    assert float(again.params["skill"]) == float(trained.params["skill"]) and again.test == trained.test
    assert again.curves == trained.curves and again.canonical == trained.canonical
    other = protocol.train_final("g1", domain, evaluator, key, BASE_PARAMS, str(tmp_path))
    assert len(evaluator.final_calls) == 2 and float(other.params["skill"]) != float(trained.params["skill"])
    protocol.train_final("g1+g2", domain, evaluator, key, BASE_PARAMS, None)    # nothing kept: trains
    assert len(evaluator.final_calls) == 3
    inner, validation = split_train(domain.train, 0)
    score = protocol.fixed_validation_score("g1", domain, evaluator, key, BASE_PARAMS, inner, validation, str(tmp_path))
    assert len(evaluator.calls) == 1 and protocol.fixed_validation_score(
        "g1", domain, evaluator, key, BASE_PARAMS, inner, validation, str(tmp_path)) == score
    assert len(evaluator.calls) == 1


def test_the_meta_optimizer_is_built_on_the_inner_loops_mesh(tmp_path, domain):
    evaluator, built = FakeEvaluator(), []
    evaluator.mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])

    def factory(cfg, grammar, mesh=None):
        built.append(mesh)
        return FakeMetaOptimizer(cfg, grammar, mesh)

    run_method("derl", fake_config(iterations=1, num_candidates=2), domain, evaluator, tmp_path, 0,
               base_params=BASE_PARAMS, optimizer_factory=factory, progress=False, echo=lambda line: None)
    assert built == [evaluator.mesh]


def test_fixed_baseline_skips_search_and_pop_reports_its_evolved_policy(tmp_path, domain):
    evaluator = FakeEvaluator()
    cfg = fake_config(iterations=2, num_candidates=3)
    fixed = run_method("outcome_format", cfg, domain, evaluator, tmp_path / "fixed", 0, base_params=BASE_PARAMS,
                       optimizer_factory=FakeMetaOptimizer, progress=False)
    assert fixed.expression == "g1+g2" and fixed.per_iteration is None and fixed.budget == {}
    assert not os.path.exists(tmp_path / "fixed" / "history.jsonl")
    assert [c["k"] for c in evaluator.calls] == [1]  # one inner training for its validation score
    quality = reference_quality("g1+g2", evaluator.rows)
    assert fixed.validation == pytest.approx(0.6 * quality, abs=0.05 + 1e-5)
    assert fixed.test == pytest.approx(expected_accuracy(2.0 * quality), abs=1e-5)

    pop = run_method("derl_pop", cfg, domain, FakeEvaluator(), tmp_path / "pop", 0, base_params=BASE_PARAMS,
                     optimizer_factory=FakeMetaOptimizer, progress=False, echo=lambda line: None)
    history = [json.loads(line) for line in open(tmp_path / "pop" / "history.jsonl")]
    evolved_skill = sum(
        reference_quality(max((r for r in history if r["iteration"] == i and r["trained"]), key=lambda r: r["score"])["text"], evaluator.rows)
        for i in range(2)
    )
    assert pop.evolved_policy_test == pytest.approx(expected_accuracy(evolved_skill), abs=1e-4)


class GuardedSplit:
    """Stands in for the test split: records every read and refuses reads from search code."""

    def __init__(self, data):
        self._data = data
        self.reads: list[str] = []
        self.violations: list[str] = []

    def __getattr__(self, name):
        frame = sys._getframe(1)
        while frame is not None:
            if any(part in frame.f_code.co_filename for part in SEARCH_CODE):
                self.violations.append(f"{name} from {frame.f_code.co_filename}:{frame.f_code.co_name}")
                raise AssertionError(f"the search read the test split ({name})")
            frame = frame.f_back
        self.reads.append(name)
        return getattr(self._data, name)


@pytest.mark.slow
def test_compare_reports_all_methods_and_never_lets_search_see_test(tmp_path, domain):
    guarded = GuardedSplit(domain.test)
    guarded_domain = dataclasses.replace(domain, test=guarded)
    cfg = fake_config(iterations=2, num_candidates=3)
    cfg.compare.methods = ALL_METHODS
    cfg.compare.seeds = (0, 1)
    evaluator = FakeEvaluator()
    payload = compare(cfg, guarded_domain, evaluator, tmp_path, base_params=BASE_PARAMS,
                      optimizer_factory=FakeMetaOptimizer, progress=False, echo=lambda line: None)
    assert guarded.violations == [] and guarded.reads  # final mode did read it, search never did

    saved = json.load(open(tmp_path / "results.json"))
    assert saved["methods"] == list(ALL_METHODS)
    for method in ALL_METHODS:
        rows = saved["per_seed"][method]
        assert [r["seed"] for r in rows] == [0, 1]
        tests = np.array([100.0 * r["test"] for r in rows])
        summary = {k: 100 * v for k, v in saved["test"][method].items() if k in ("mean", "std", "ci95_low")}
        assert summary["mean"] == pytest.approx(tests.mean())
        assert summary["std"] == pytest.approx(tests.std(ddof=1))
        half = 12.7062047 * tests.std(ddof=1) / np.sqrt(2)  # t_{0.975, 1}
        assert summary["ci95_low"] == pytest.approx(max(tests.mean() - half, 0.0), abs=1e-4)
        for r in rows:  # each retrained number is the final policy of the chosen expression
            assert r["retrained_test"] == pytest.approx(expected_accuracy(2.0 * reference_quality(r["expression"], evaluator.rows)), abs=1e-5)
            # the headline is that policy, except for DERL-pop: the policy its search evolved
            population = method == "derl_pop"
            assert r["headline"] == ("evolved" if population else "retrained")
            assert r["test"] == (r["evolved_policy_test"] if population else r["retrained_test"])
    assert saved["per_seed"]["outcome"][0]["expression"] == "g1"
    assert saved["per_seed"]["average"][0]["expression"] == "(g1+g2+g3+g4)/4"
    assert set(saved["curves"]) == {"derl", "derl_pop", "random", "evolution"}
    assert all(len(c["validation (mean of candidates)"]) == 2 for c in saved["curves"].values())
    for name in ["outer_curves.png"] + [f"structure_{m}.png" for m in saved["curves"]]:
        with open(tmp_path / name, "rb") as handle:
            assert handle.read(8) == b"\x89PNG\r\n\x1a\n"
    markdown = (tmp_path / "results.md").read_text()
    assert all(f"| {m} |" in markdown for m in ALL_METHODS) and "mean test accuracy of the same candidate policies" in markdown
    assert all(len(c["test (mean of candidates)"]) == 2 for c in saved["curves"].values())  # candidate_test is on
    assert payload["test"] == saved["test"]

    # resume: one method/seed lost its result -> only its final training reruns, nothing is searched again
    os.remove(tmp_path / "derl" / "seed_1" / "method_result.json")
    evaluator.calls.clear(), evaluator.final_calls.clear()
    again = compare(cfg, guarded_domain, evaluator, tmp_path, base_params=BASE_PARAMS,
                    optimizer_factory=FakeMetaOptimizer, progress=False, echo=lambda line: None)
    assert evaluator.calls == [] and len(evaluator.final_calls) == 1
    assert again["test"] == saved["test"]


def test_per_iteration_test_curve(tmp_path, domain):
    cfg = fake_config(iterations=3, num_candidates=3)
    cfg.compare.per_iteration_test = True
    evaluator = FakeEvaluator()
    result = run_method("random", cfg, domain, evaluator, tmp_path, 0, base_params=BASE_PARAMS,
                        optimizer_factory=FakeMetaOptimizer, progress=False, echo=lambda line: None)
    best_texts = result.per_iteration["best_text"]
    expected = [expected_accuracy(2.0 * reference_quality(t, evaluator.rows)) if t else None for t in best_texts]
    assert result.per_iteration["test_of_best"] == pytest.approx(expected, abs=1e-5)
    assert len(evaluator.final_calls) == 1 + len({t for t in best_texts if t})  # identical texts trained once


def test_student_t_reference_used_above():
    assert student_t_quantile(0.975, 1) == pytest.approx(12.7062047, rel=1e-6)


def test_validate_config_names_the_bad_field():
    for preset in ("default", "smoke"):
        validate_config(get_config(preset))
    cases = [
        (("outer", "num_candidates"), 1, "config.outer.num_candidates must be >= 2, got 1"),
        (("outer", "iterations"), 0, "config.outer.iterations must be >= 1, got 0"),
        (("inner", "group_size"), 2.5, "config.inner.group_size must be an integer, got 2.5"),
        (("inner", "lr"), 0.0, "config.inner.lr must be a number > 0.0, got 0.0"),
        (("meta", "backbone"), "gpt", "config.meta.backbone must be one of ('scratch', 'hf'), got 'gpt'"),
        (("evolution", "mutation_rate"), 1.5, "config.evolution.mutation_rate must be in [0, 1], got 1.5"),
        (("compare", "methods"), ("derl", "grid"), "config.compare.methods: unknown method 'grid'"),
        (("compare", "seeds"), (0, 0), "config.compare.seeds must not repeat values"),
        (("outer", "strategy"), "grid", "config.outer.strategy must be one of"),
        (("mesh", "cand"), 0, "config.mesh.cand must be a positive integer or -1"),
        (("inner", "common_random_numbers"), "yes", "config.inner.common_random_numbers must be True or False"),
    ]
    for (section, field), value, message in cases:
        cfg = get_config("smoke").to_dict()  # a plain dict: ConfigDict would refuse some types itself
        cfg[section][field] = value
        if section == "evolution":  # checked only when a run uses evolution
            cfg["outer"]["strategy"] = "evolution"
        with pytest.raises(ConfigError) as info:
            validate_config(cfg)
        assert str(info.value).startswith(message), str(info.value)
    cfg = get_config("smoke")
    cfg.policy.num_heads, cfg.policy.num_kv_heads = 3, 2
    with pytest.raises(ConfigError, match="config.policy.num_heads must be a multiple of config.policy.num_kv_heads"):
        validate_config(cfg)
    cfg = get_config("smoke")
    del cfg.final["steps"]
    with pytest.raises(ConfigError, match="config.final.steps is missing"):
        validate_config(cfg)
