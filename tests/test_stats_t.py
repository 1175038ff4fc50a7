"""The primary interval (Student-t over per-seed paired differences), Holm's adjustment, the
claims' verdicts from them, and the Fig. 4 structure rule with outcome-aligned primitives."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from derl_jax.experiment import claims, stats
from derl_jax.experiment.results import MethodResult
from derl_jax.expr.parse import parse
from derl_jax.expr.structure import INVALID, STABLE, UNSTABLE, structure


def _scores(per_seed_means_a, per_seed_means_b, items=4):
    """f[S, items] whose row means are the given per-seed means (items of equal value)."""
    a = np.repeat(np.asarray(per_seed_means_a, float)[:, None], items, axis=1)
    b = np.repeat(np.asarray(per_seed_means_b, float)[:, None], items, axis=1)
    return a, b


def test_the_t_interval_by_hand_and_against_ttest_rel():
    """Three seeds with paired differences 0.10, 0.02, 0.06: mean 0.06, sd 0.04, t_{0.975,2} = 4.3027."""
    rng = np.random.default_rng(0)
    b = (rng.random((3, 50)) < 0.4).astype(float)
    a = b.copy()
    for s, flips in enumerate((5, 1, 3)):   # seed s gains `flips` of 50 items: +0.10, +0.02, +0.06
        zeros = np.flatnonzero(a[s] == 0)[:flips]
        a[s, zeros] = 1.0
    d = stats.paired_difference(a, b, reps=200)
    half = 4.302652729911275 * 0.04 / math.sqrt(3)
    assert d["difference"] == pytest.approx(0.06)
    assert (d["ci95_low"], d["ci95_high"]) == pytest.approx((0.06 - half, 0.06 + half))
    assert d["ci95_low"] < 0.0 < d["ci95_high"] and stats.verdict(d) == "not separated"
    reference = scipy_stats.ttest_rel(a.mean(axis=1), b.mean(axis=1))
    assert d["p_value"] == pytest.approx(reference.pvalue)
    # t = 0.06 / (0.04 / sqrt 3) = 2.598 on 2 df: two-sided p = 0.1217
    assert d["p_value"] == pytest.approx(0.1217, abs=5e-4)
    # the bootstrap (secondary) is narrower than the t-interval with 3 seeds
    assert d["bootstrap_high"] - d["bootstrap_low"] < d["ci95_high"] - d["ci95_low"]


def test_a_seed_with_an_exact_zero_difference_counts_like_any_other():
    """Per-seed differences +0.25, 0, +0.25, +0.25, 0: a seed that ties enters the mean and the sd
    (it is not dropped), and the interval's lower end is not pinned at 0 as a bootstrap's is."""
    a, b = _scores([0.5, 0.25, 0.75, 0.5, 0.0], [0.25, 0.25, 0.5, 0.25, 0.0])
    d = stats.paired_difference(a, b, reps=500)
    diffs = np.array([0.25, 0.0, 0.25, 0.25, 0.0])
    half = scipy_stats.t.ppf(0.975, 4) * diffs.std(ddof=1) / math.sqrt(5)
    assert (d["ci95_low"], d["ci95_high"]) == pytest.approx((0.15 - half, 0.15 + half))
    assert d["ci95_low"] < 0.0 and stats.verdict(d) == "not separated"
    # a percentile bootstrap can never leave the range of the seeds' differences: its end sits at >= 0
    assert d["bootstrap_low"] >= 0.0 > d["ci95_low"]
    assert d["p_value"] == pytest.approx(scipy_stats.ttest_1samp(diffs, 0.0).pvalue)


def test_constant_and_zero_scores():
    a, b = _scores([0.5, 0.5, 0.5], [0.25, 0.25, 0.25])
    d = stats.paired_difference(a, b, reps=100)   # no spread: the interval is the point, p = 0
    assert (d["ci95_low"], d["ci95_high"], d["p_value"]) == pytest.approx((0.25, 0.25, 0.0))
    assert stats.verdict(d) == "separated"
    zero = stats.paired_difference(np.zeros((3, 5)), np.zeros((3, 5)), reps=100)
    assert zero["measurable"] is False and zero["p_value"] is None and stats.verdict(zero) == "not measurable"
    one = stats.t_test([0.3])
    assert one["p_value"] == 1.0 and not one["separated"]


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.03, 0.5 -> x4, x3, x2, x1 = 0.04, 0.06, 0.06, 0.5 (running maximum)
    assert stats.holm([0.03, 0.5, 0.01, 0.02]) == pytest.approx([0.06, 0.5, 0.04, 0.06])
    assert stats.holm([0.4, 0.9]) == pytest.approx([0.8, 0.9])   # capped at 1 after the max: 0.9 stays 0.9
    assert stats.holm([0.6, 0.9]) == pytest.approx([1.0, 1.0])
    assert stats.holm([]) == []
    with pytest.raises(ValueError, match="p-values"):
        stats.holm([0.2, 1.5])


def test_holm_matches_a_step_down_loop():
    rng = np.random.default_rng(3)
    for _ in range(20):
        p = rng.random(7) ** 3
        order = np.argsort(p)
        expected, running = np.empty(7), 0.0
        for k, i in enumerate(order):
            running = max(running, min(1.0, (7 - k) * p[i]))
            expected[i] = running
        assert stats.holm(p) == pytest.approx(expected.tolist())


def test_with_holm_verdicts_and_rows_left_out():
    rows = [{"difference": 0.1, "p_value": 0.01}, {"difference": -0.2, "p_value": 0.02},
            {"difference": 0.05, "p_value": 0.04}, {"difference": 0.0, "p_value": None, "measurable": False}]
    out = stats.with_holm(rows)
    assert [r["p_holm"] for r in out[:3]] == pytest.approx([0.03, 0.04, 0.04])
    assert [r["verdict_holm"] for r in out] == ["separated", "reversed", "separated", "not measurable"]
    out = stats.with_holm(rows[:3] + [{"difference": 0.3, "p_value": 0.9}])
    assert [r["verdict_holm"] for r in out] == ["separated", "not separated", "not separated", "not separated"]


def test_p_from_interval_recovers_the_t_test():
    values = [0.3, -0.1, 0.2, 0.15, 0.4]
    t = stats.t_test(values)
    assert stats.p_from_interval(t["difference"], t["ci95_low"], t["ci95_high"], 5) == pytest.approx(t["p_value"])


def _result(method, seed, items, shares=None):
    per_iteration = None if shares is None else {"structure_shares": shares, "validation_mean": [0.1, 0.2, 0.3]}
    return MethodResult(method=method, seed=seed, expression="g1", canonical="g1", latex=None, validation=0.0,
                        test=float(np.mean(items)), budget={}, per_iteration=per_iteration, final_curves={},
                        test_items=list(items))


def test_claim_rows_carry_holm_and_the_structure_claim_is_not_measurable_with_aligned_primitives():
    rng = np.random.default_rng(5)
    results = {m: [] for m in ("derl", "outcome", "random")}
    for seed in range(4):
        base = (rng.random(200) < 0.3).astype(float)
        shares = [[0.2 + 0.1 * i + 0.01 * seed, 0.3, 0.5 - 0.1 * i - 0.01 * seed] for i in range(3)]
        results["derl"].append(_result("derl", seed, np.maximum(base, rng.random(200) < 0.1), shares))
        results["outcome"].append(_result("outcome", seed, base))
        results["random"].append(_result("random", seed, (rng.random(200) < 0.3).astype(float), shares))
    rows = claims.claim_rows(results)
    by_claim = {r["claim"]: r for r in rows}
    measured = [r["p_value"] for r in rows]
    assert [r["p_holm"] for r in rows] == pytest.approx(stats.holm(measured))
    assert by_claim[claims.STRUCTURE_CLAIM]["verdict"] == "separated"   # shares rise 10 points an iteration
    aligned = claims.claim_rows(results, aligned=(1,))
    row = {r["claim"]: r for r in aligned}[claims.STRUCTURE_CLAIM]
    assert row["verdict"] == "not measurable" and row["p_value"] is None and "g2" in row["note"]
    others = [r for r in aligned if r["claim"] != claims.STRUCTURE_CLAIM]
    assert [r["p_holm"] for r in others] == pytest.approx(stats.holm([r["p_value"] for r in others]))
    table = claims.claims_table(aligned)
    assert "not measurable: the structure rule ignores" in table and "Holm verdict" in table


def test_refresh_recomputes_a_saved_payload():
    """A results.json saved with bootstrap intervals: `refresh` gives the t-intervals from its items."""
    a, b = _scores([0.5, 0.25, 0.75], [0.25, 0.25, 0.5])
    payload = {"per_seed": {"derl": [{"seed": s, "test_items": a[s].tolist()} for s in range(3)],
                            "outcome": [{"seed": s, "test_items": b[s].tolist()} for s in range(3)]},
               "claims": [{"claim": claims.STRUCTURE_CLAIM, "kind": "trend", "method": "derl", "series": "share_stable",
                           "difference": 0.02, "ci95_low": -0.01, "ci95_high": 0.05, "seeds": 3, "verdict": "x"}],
               "structure_rule": {"aligned_indices": []}}
    paired, rows = claims.refresh(payload)
    assert [(m, base) for m, base, _ in paired] == [("derl", "outcome")]
    direct = stats.paired_difference(a, b)
    assert paired[0][2]["ci95_low"] == pytest.approx(direct["ci95_low"])
    assert [r["claim"] for r in rows] == ["DERL > outcome-only", claims.STRUCTURE_CLAIM]
    assert rows[1]["p_value"] == pytest.approx(stats.p_from_interval(0.02, -0.01, 0.05, 3))
    assert rows[1]["verdict"] == "not separated"
    payload["structure_rule"] = {"aligned_indices": [1]}
    assert claims.refresh(payload)[1][1]["verdict"] == "not measurable"


SYMBOLS = ("exact", "position", "bag", "length", "marker")


@pytest.mark.parametrize("text, outcome_only, with_aligned", [
    ("g2", INVALID, STABLE),              # the known-best reward on symbols
    ("g1+g2", STABLE, STABLE),
    ("g2*g3", INVALID, UNSTABLE),
    ("g2/(g3+1)", INVALID, STABLE),
    ("g2-g1", INVALID, INVALID),          # penalises the outcome
    ("g3+g4", INVALID, INVALID),          # copying signals only
    ("g5", INVALID, INVALID),             # the decoy
    ("-g2", INVALID, INVALID),
])
def test_the_structure_rule_counts_aligned_primitives(text, outcome_only, with_aligned):
    expr = parse(text, SYMBOLS)
    assert structure(expr, 5, 0) == outcome_only
    assert structure(expr, 5, 0, aligned=(1,)) == with_aligned


def test_the_structure_claim_reclassifies_the_proposals_under_the_aligned_rule():
    """Proposals `g2` (stable only with g2 aligned) take over from `g3+g4` (invalid either way)."""
    import functools

    def history(counts):
        return [{"iteration": i, "text": "g2" if j < count else "g3+g4"} for i, count in enumerate(counts) for j in range(4)]

    histories = {"derl": {0: history([0, 1, 2, 3]), 1: history([1, 1, 3, 4]), 2: history([0, 2, 2, 4])}}
    structure_of = functools.partial(claims.structure_with_aligned, names=SYMBOLS, outcome_index=0, aligned=(1,))
    assert [structure_of(t) for t in ("g2", "g3+g4", "g2*g3", "g2+", "g1")] == [STABLE, INVALID, UNSTABLE, INVALID, STABLE]
    np.testing.assert_allclose(claims.stable_share_per_iteration(histories["derl"][1], structure_of), [0.25, 0.25, 0.75, 1])
    rows = claims.claim_rows({"derl": []}, aligned=(1,), histories=histories, structure_of=structure_of)
    (row,) = rows
    slopes = [np.polyfit(np.arange(4.0), np.array(c) / 4, 1)[0] for c in ([0, 1, 2, 3], [1, 1, 3, 4], [0, 2, 2, 4])]
    assert row["claim"] == claims.STRUCTURE_CLAIM and row["rule"] == "aligned"
    assert row["difference"] == pytest.approx(np.mean(slopes)) and row["verdict"] == "separated"
    outcome_only = functools.partial(claims.structure_with_aligned, names=SYMBOLS, outcome_index=0, aligned=())
    assert claims.stable_share_per_iteration(histories["derl"][1], outcome_only).tolist() == [0, 0, 0, 0]


def test_welch_interval_by_hand_and_against_scipy():
    """a = (1, 2, 3), b = (2, 4, 6, 8): difference 3, se^2 = 1/3 + 20/12 = 2, df = 4 / (1/18 + 25/27)."""
    got = stats.welch_interval([1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0])
    df = 4.0 / ((1.0 / 3.0) ** 2 / 2 + (20.0 / 12.0) ** 2 / 3)
    half = scipy_stats.t.ppf(0.975, df) * math.sqrt(2.0)
    assert got["difference"] == pytest.approx(3.0) and got["df"] == pytest.approx(df)
    assert (got["low"], got["high"]) == pytest.approx((3.0 - half, 3.0 + half))
    rng = np.random.default_rng(1)
    for _ in range(20):   # 0 leaves the 99% interval exactly when Welch's test rejects at 0.01
        a, b = rng.normal(0.3, 0.2, 4), rng.normal(0.3 + rng.uniform(-0.4, 0.4), 0.1, 5)
        interval = stats.welch_interval(a, b, confidence=0.99)
        p = scipy_stats.ttest_ind(b, a, equal_var=False).pvalue
        assert (interval["low"] <= 0.0 <= interval["high"]) == (p >= 0.01)
    assert stats.welch_interval([0.5, 0.5], [0.2, 0.2]) == {"difference": pytest.approx(-0.3), "low": pytest.approx(-0.3),
                                                            "high": pytest.approx(-0.3), "df": float("inf")}
    with pytest.raises(ValueError, match="welch_interval"):
        stats.welch_interval([0.1], [0.2, 0.3])
