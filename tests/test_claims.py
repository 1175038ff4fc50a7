"""The paper's claims on one compare (`derl_jax.experiment.claims`) and their place in the report."""

from __future__ import annotations

import json

import numpy as np
import pytest

from derl_jax.experiment import claims
from derl_jax.experiment.report import write_report
from derl_jax.experiment.results import MethodResult


def result(method: str, seed: int, items, *, validation=None, stable=None) -> MethodResult:
    per_iteration = None
    if validation is not None:
        shares = [[s, 1.0 - s, 0.0] for s in stable]
        per_iteration = {"validation_mean": list(validation), "validation_best": list(validation),
                         "validity_rate": [1.0] * len(validation), "structure_shares": shares,
                         "best_text": ["g1"] * len(validation), "test_of_best": None, "candidate_test_mean": None}
    items = [float(v) for v in items]
    return MethodResult(method=method, seed=seed, expression="g1", canonical="g1", latex="g_1", validation=0.5,
                        test=float(np.mean(items)), budget={}, per_iteration=per_iteration, final_curves={},
                        retrained_test=float(np.mean(items)), test_items=items)


@pytest.fixture
def compare():
    """derl solves every item outcome solves plus 20 more of 100; random and average equal outcome;
    derl's validation rises 0.1 per iteration on every seed and its stable share by 0.2."""
    rng = np.random.default_rng(0)
    results = {m: [] for m in ("derl", "outcome", "random", "average")}
    for seed in range(3):
        base = (rng.random(100) < 0.3).astype(float)
        better = base.copy()
        better[np.flatnonzero(base == 0)[:20]] = 1.0
        rising = [0.2 + 0.1 * i + 0.01 * seed for i in range(4)]
        results["derl"].append(result("derl", seed, better, validation=rising, stable=[0.2, 0.4, 0.6, 0.8]))
        results["outcome"].append(result("outcome", seed, base))
        flat = [0.3 + 0.01 * seed] * 4
        results["random"].append(result("random", seed, base, validation=flat, stable=[0.5] * 4))
        results["average"].append(result("average", seed, base))
    return results


def test_claims_recover_a_known_gap_and_known_trends(compare):
    rows = {row["claim"]: row for row in claims.claim_rows(compare)}
    for claim in ("DERL > outcome-only", "DERL > average of primitives", "DERL > random search at equal compute"):
        assert rows[claim]["difference"] == pytest.approx(0.20)  # 20 of 100 items on every seed
        assert rows[claim]["verdict"] == "separated" and rows[claim]["ci95_low"] > 0
    assert "DERL-pop >= DERL" not in rows  # derl_pop did not run
    validation = rows["candidates' validation rises over iterations (Fig. 3)"]
    assert validation["difference"] == pytest.approx(0.1) and validation["verdict"] == "separated"
    assert rows["stable structures take over (Fig. 4)"]["difference"] == pytest.approx(0.2)


def test_identical_methods_are_not_separated(compare):
    same = claims.paired(compare, "random", "outcome")
    assert same["difference"] == 0.0 and same["ci95_low"] <= 0.0 <= same["ci95_high"]
    assert same["separated"] is False


def test_the_per_iteration_difference_pairs_seeds(compare):
    difference = claims.iteration_difference(compare)
    expected = [0.2 + 0.1 * i - 0.3 for i in range(4)]  # the seed offsets cancel: every seed differs alike
    np.testing.assert_allclose(difference["mean"], expected, atol=1e-12)
    np.testing.assert_allclose(difference["ci95_low"], expected, atol=1e-12)
    assert difference["seeds"] == 3


def test_missing_item_scores_or_seeds_leave_a_claim_out(compare):
    compare["outcome"] = [r for r in compare["outcome"] if r.seed != 1] + [
        MethodResult(**{**compare["outcome"][1].to_json(), "test_items": None})]
    assert claims.paired(compare, "derl", "outcome") is None
    assert claims.paired(compare, "derl", "random") is not None
    assert claims.item_matrix(compare["derl"], [0, 7]) is None


def test_the_report_carries_the_claims_and_the_paired_table(compare, tmp_path):
    payload = write_report(str(tmp_path), compare)
    markdown = (tmp_path / "results.md").read_text()
    assert "## The paper's claims on this compare" in markdown
    assert "| DERL > outcome-only | derl − outcome, test, paired over 3 seeds x 100 items | +20.00 |" in markdown
    assert "## Paired differences (same seeds, same base policy, same test items)" in markdown
    assert "| derl | outcome | +20.0 |" in markdown
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["per_seed"]["derl"][0]["test_items"][:5] == [int(v) for v in compare["derl"][0].test_items[:5]]
    assert {(p["method"], p["baseline"]) for p in saved["paired"]} >= {("derl", "outcome"), ("derl", "random")}
    assert payload["claims"] == saved["claims"]
