"""Every key results.json and metrics.jsonl hold is documented in docs/running.md, and results.json
keeps one unit per kind: every accuracy (and accuracy difference) a fraction, checked against
the inputs the report was written from."""

from __future__ import annotations

import json
import os
import re

import jax
import numpy as np
import pytest

from arbo_fakes import ARITH_NAMES, fake_search
from derl_jax.experiment.report import ACCURACY_UNIT, as_fraction, summary_percent, write_report
from derl_jax.experiment.results import HEADLINE_EVOLVED, MethodResult
from derl_jax.logging import read_jsonl
from derl_jax.outer import make_strategy
from test_claims import result

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNNING = os.path.join(REPO_ROOT, "docs", "running.md")


def documented(table: str) -> list[re.Pattern]:
    """The key patterns of the table between `<!-- <table> keys -->` and its end marker: the
    first cell's backticked paths, `.x` entries continuing the previous full path."""
    text = open(RUNNING, encoding="utf-8").read()
    block = text.split(f"<!-- {table} keys -->", 1)[1].split(f"<!-- end {table} keys -->", 1)[0]
    patterns = []
    for line in block.splitlines():
        if not line.startswith("| `"):
            continue
        stem = ""
        for path in re.findall(r"`([^`]+)`", line.split("|")[1]):
            if path.startswith("."):
                path = stem + path
            stem = path.rsplit(".", 1)[0]
            regex = re.escape(path).replace(r"\[\]", r"\[\]").replace(r"\*", r"[^.\[]+")
            regex = re.sub(r"<[a-z]+>", r"[^.\\[]+", regex.replace(r"\<", "<").replace(r"\>", ">"))
            patterns.append(re.compile(regex + "$"))
    return patterns


def key_paths(value, path: str = "") -> set[str]:
    """Every leaf path of a JSON value: objects by `.key`, lists of objects by `[]`."""
    if isinstance(value, dict):
        return set().union(*(key_paths(v, f"{path}.{k}" if path else str(k)) for k, v in value.items())) or {path}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return set().union(*(key_paths(v, path + "[]") for v in value))
    return {path}


def undocumented(paths, patterns) -> list[str]:
    return sorted(p for p in paths if not any(pattern.match(p) for pattern in patterns))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A compare of 4 methods x 3 seeds on 40 test items: two test sets, DERL-pop evolved, budgets."""
    rng = np.random.default_rng(1)
    results = {m: [] for m in ("derl", "derl_pop", "outcome", "random")}
    for seed in range(3):
        base = (rng.random(40) < 0.4).astype(float)
        for method in results:
            searches = method != "outcome"
            validation = [0.2 + 0.05 * i + 0.01 * seed for i in range(3)] if searches else None
            run = result(method, seed, base if method != "derl" else np.maximum(base, rng.random(40) < 0.3),
                         validation=validation, stable=[0.3, 0.5, 0.7] if searches else None)
            sets = {"main": {"exact": run.test, "verify": run.test}, "other": {"exact": 0.5 * run.test}}
            extra = {"test_sets": sets, "retrained_test_sets": sets, "validation": 0.4 + 0.01 * seed,
                     "budget": {"candidates_charged": 6, "candidates_trained": 5, "candidates_shared": 1,
                                "start_policy_updates": 3, "inner_steps_per_candidate": 4, "search_inner_steps": 20,
                                "reported_policy_inner_steps": 24, "retrained_policy_inner_steps": 24}
                     if searches else {}}
            if method == "derl_pop":
                extra.update(headline=HEADLINE_EVOLVED, evolved_policy_test=run.test)
            if searches:
                extra["per_iteration"] = {**run.per_iteration, "test_of_best": [0.3, 0.35, 0.4],
                                          "candidate_test_mean": [0.25, 0.3, 0.32]}
            results[method].append(MethodResult(**{**run.to_json(), **extra}))
    workdir = tmp_path_factory.mktemp("report")
    curves = {m: [list(np.maximum.accumulate(rng.random(6) * 0.5)) for _ in range(3)] for m in ("derl", "random")}
    payload = write_report(str(workdir), results, base_test=0.35, best_so_far=curves)
    saved = json.loads((workdir / "results.json").read_text())
    return results, curves, payload, saved, (workdir / "results.md").read_text()


def test_every_results_json_key_is_documented(report):
    _, _, _, saved, _ = report
    paths = key_paths(saved)
    assert {"paired[].difference", "claims[].verdict", "test_sets.derl.other.exact.mean", "plots.outer_curves",
            "budget.derl[].search_inner_steps", "derl_minus_random_per_iteration.mean"} <= paths
    assert undocumented(paths, documented("results.json")) == []


def test_every_accuracy_in_results_json_is_a_fraction(report):
    results, curves, payload, saved, markdown = report
    assert saved["accuracy_unit"] == ACCURACY_UNIT == "fraction" and saved["base_policy_test"] == 0.35
    for method, runs in results.items():
        tests = np.array([r.test for r in runs])
        assert saved["test"][method]["mean"] == pytest.approx(tests.mean())
        assert saved["test"][method]["std"] == pytest.approx(tests.std(ddof=1))
        assert saved["validation"][method]["mean"] == pytest.approx(np.mean([r.validation for r in runs]))
        assert saved["test_sets"][method]["other"]["exact"]["mean"] == pytest.approx(0.5 * tests.mean())
        assert [row["test"] for row in saved["per_seed"][method]] == pytest.approx(tests)
        assert f"| {method} | 3 | {100 * tests.mean():.2f} ± {100 * tests.std(ddof=1):.2f}" in markdown  # % in md
        if method != "outcome":
            series = saved["curves"][method]["validation (mean of candidates)"]
            np.testing.assert_allclose(series, [r.per_iteration["validation_mean"] for r in runs])
            assert saved["retrained_curves"][method]["test (best of iteration, retrained)"][0] == [0.3, 0.35, 0.4]
    for method, runs in curves.items():
        assert saved["best_so_far"][method]["mean"] == pytest.approx(np.mean(runs, axis=0))
    gap = np.mean([np.mean(a.test_items) - np.mean(b.test_items) for a, b in zip(results["derl"], results["outcome"])])
    paired = next(p for p in saved["paired"] if (p["method"], p["baseline"]) == ("derl", "outcome"))
    assert paired["difference"] == pytest.approx(gap) and 0 < gap < 1
    steps = saved["derl_minus_random_per_iteration"]["mean"]
    assert steps == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)      # the same validation curves on every seed
    assert "Base policy (before RL): 35.00%" in markdown


def test_summaries_in_either_layout_read_back_in_percent(report):
    _, _, _, saved, _ = report
    summary = saved["test"]["derl"]
    percent = summary_percent(summary, saved)
    assert percent["mean"] == pytest.approx(100 * summary["mean"]) and percent["n"] == summary["n"] == 3
    old = {"test": {"derl": percent}}                  # results.json written before accuracy_unit: in %
    assert summary_percent(old["test"]["derl"], old) == percent
    assert as_fraction(percent) == pytest.approx(summary)


def test_every_metrics_jsonl_key_is_documented(tmp_path):
    patterns = documented("metrics.jsonl")
    for method in ("history_search",):
        cfg = {"domain": {"kind": "arith"}}
        strategy = make_strategy(method, cfg, None, ARITH_NAMES, workdir=tmp_path / method)
        fake_search(strategy, str(tmp_path / method), iterations=2, n=3, names=ARITH_NAMES)
        records = read_jsonl(tmp_path / method / "metrics.jsonl")
        assert len(records) == 2 and {"score_mean", "incumbent_score", "candidates_charged"} <= set(records[0])
        assert undocumented(set().union(*map(set, records)), patterns) == []
        assert all(0.0 <= r["score_max"] <= 1.0 for r in records)   # validation scores: fractions
    assert not undocumented({"strategy/loss", "outer/x"} - {"outer/x"}, patterns)
    assert undocumented({"made_up_key"}, patterns) == ["made_up_key"]
    jax.clear_caches()
