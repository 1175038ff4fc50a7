"""Result statistics, the comparison table and the two plots."""

import math

import numpy as np
import pytest

from derl_jax.experiment.plots import curve_band, plot_outer_curves, plot_structure_shares
from derl_jax.experiment.results import structure_shares
from derl_jax.experiment.stats import (
    difference_table,
    interval_estimates,
    paired_difference,
    probability_of_improvement,
    results_table,
    student_t_quantile,
    summarize,
    verdict,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "df, expected",
    [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (5, 2.571), (10, 2.228), (30, 2.042), (120, 1.980)],
)
def test_t_quantiles_match_tables(df, expected):
    assert student_t_quantile(0.975, df) == pytest.approx(expected, abs=5e-4)


def test_t_quantile_closed_forms():
    # df=1 is Cauchy: tan(pi (p - 1/2)); df=2: (2p-1) * sqrt(2 / (4 p (1-p)))
    for p in (0.6, 0.9, 0.975, 0.995):
        assert student_t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
        assert student_t_quantile(p, 2) == pytest.approx((2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p))), rel=1e-9)
    assert student_t_quantile(0.025, 4) == pytest.approx(-student_t_quantile(0.975, 4))
    assert student_t_quantile(0.975, 1e6) == pytest.approx(1.959964, abs=1e-5)  # the normal quantile
    with pytest.raises(ValueError, match="p must be in"):
        student_t_quantile(1.0, 3)


def test_a_paired_difference_by_hand():
    """Two seeds x two items; the difference and the probability of improvement counted by hand
    (shown only for scores that are not all 0/1: with 0/1 items it is 0.5 + difference / 2)."""
    a = np.array([[1.0, 0.0], [1.0, 1.0]])
    b = np.array([[0.0, 0.0], [1.0, 0.0]])
    d = paired_difference(a, b, reps=500)
    assert d["difference"] == pytest.approx(0.75 - 0.25)
    assert d["probability_of_improvement"] is None
    # item 0: a's seeds {1, 1} against b's {0, 1}: wins 1, 0.5, 1, 0.5 -> 0.75; item 1: {0, 1} against {0, 0} -> 0.75
    assert probability_of_improvement(a, b) == pytest.approx(0.75) == pytest.approx(0.5 + d["difference"] / 2)
    graded = paired_difference(0.5 * a, 0.5 * b, reps=100)
    assert graded["probability_of_improvement"] == pytest.approx(0.75)
    assert d["ci95_low"] <= d["difference"] <= d["ci95_high"]
    assert -1.0 <= d["bootstrap_low"] <= d["difference"] <= d["bootstrap_high"] <= 1.0
    assert (d["seeds"], d["items"]) == (2, 2)


def test_a_constant_difference_is_recovered_exactly_and_separated():
    rng = np.random.default_rng(0)
    b = rng.integers(0, 2, size=(5, 300)).astype(float) * 0.5
    d = paired_difference(b + 0.1, b)  # paired: every seed and every resample sees the same +0.1
    assert d["difference"] == pytest.approx(0.1)
    assert d["ci95_low"] == pytest.approx(0.1) and d["ci95_high"] == pytest.approx(0.1)
    assert d["bootstrap_low"] == pytest.approx(0.1) and d["bootstrap_high"] == pytest.approx(0.1)
    assert d["separated"] and verdict(d) == "separated"
    assert verdict(paired_difference(b, b + 0.1)) == "reversed"


def test_two_draws_of_one_method_are_not_separated_and_a_true_gap_is():
    rng = np.random.default_rng(1)
    first, second = (rng.random((5, 1000)) < 0.3).astype(float), (rng.random((5, 1000)) < 0.3).astype(float)
    same = paired_difference(first, second)
    assert same["ci95_low"] < 0.0 < same["ci95_high"] and verdict(same) == "not separated"
    better = (rng.random((5, 1000)) < 0.4).astype(float)
    gap = paired_difference(better, second)
    assert gap["ci95_low"] < gap["difference"] < gap["ci95_high"] and gap["ci95_low"] > 0.0 and verdict(gap) == "separated"
    assert gap["bootstrap_low"] < 0.1 < gap["bootstrap_high"]
    assert paired_difference(better, second) == gap  # a fixed bootstrap seed: the same interval again


def test_the_seed_to_seed_spread_widens_the_interval():
    """Per-seed differences of +30, -10, +20, -20, +5 points on every item: the mean is +5, but five
    seeds cannot tell it from 0. A bootstrap over items alone would give [+5, +5]; the primary
    interval is the t-interval of the five per-seed differences, and the two-way bootstrap
    (secondary) is narrower than it, inside the range of the seeds."""
    per_seed = np.array([0.3, -0.1, 0.2, -0.2, 0.05])
    b = (np.random.default_rng(2).random((5, 1000)) < 0.5).astype(float)
    d = paired_difference(b + per_seed[:, None], b)
    assert d["difference"] == pytest.approx(0.05)
    assert d["ci95_low"] < 0.0 < d["ci95_high"] and verdict(d) == "not separated"
    t = summarize(per_seed)
    assert (d["ci95_low"], d["ci95_high"]) == pytest.approx((t["ci95_low"], t["ci95_high"]))
    assert t["ci95_low"] < d["bootstrap_low"] and d["bootstrap_high"] < t["ci95_high"]
    assert d["bootstrap_high"] - d["bootstrap_low"] > 0.2
    assert min(per_seed) <= d["bootstrap_low"] and d["bootstrap_high"] <= max(per_seed)


def test_paired_difference_refuses_unpaired_scores():
    with pytest.raises(ValueError, match="same \\[seeds, items\\]"):
        paired_difference(np.zeros((3, 10)), np.zeros((3, 11)))
    with pytest.raises(ValueError, match="shape \\[seeds, items\\]"):
        paired_difference(np.zeros(10), np.zeros(10))


def test_interval_estimates_of_mean_and_iqm():
    scores = np.tile(np.arange(8, dtype=float), (4, 1))  # every seed scores items 0..7
    estimate = interval_estimates(scores, reps=500)
    assert estimate["mean"] == pytest.approx(3.5)
    assert estimate["iqm"] == pytest.approx(np.mean(np.arange(2, 6)))  # the middle half: items 2..5
    assert estimate["mean_ci"][0] <= 3.5 <= estimate["mean_ci"][1]


def test_the_difference_table_reports_points_and_verdicts():
    rows = [("derl", "outcome", {"difference": 0.034, "ci95_low": 0.012, "ci95_high": 0.055, "p_value": 0.03,
                                 "bootstrap_low": 0.02, "bootstrap_high": 0.05,
                                 "probability_of_improvement": 0.61, "separated": True, "seeds": 5, "items": 1000}),
            ("derl", "random", {"difference": -0.01, "ci95_low": -0.03, "ci95_high": 0.012, "p_value": 0.4,
                                "bootstrap_low": -0.02, "bootstrap_high": 0.01,
                                "probability_of_improvement": None, "separated": False, "seeds": 5, "items": 1000})]
    table = difference_table(rows)
    # Holm over two rows: 0.03 x 2 = 0.06 > 0.05, so the first row is not separated after adjustment
    assert "| derl | outcome | +3.4 | [+1.2, +5.5] | [+2.0, +5.0] | 0.61 | 5 x 1000 | separated | not separated |" in table
    assert "| derl | random | -1.0 | [-3.0, +1.2] | [-2.0, +1.0] | - | 5 x 1000 | not separated | not separated |" in table
    binary = difference_table(rows[1:])   # no graded scores: no probability-of-improvement column
    assert "P(method > baseline)" not in binary and "| -1.0 | [-3.0, +1.2] | [-2.0, +1.0] | 5 x 1000 |" in binary


def test_summarize_matches_numpy():
    values = [91.0, 88.5, 93.25, 90.0]
    s = summarize(values)
    mean, std = np.mean(values), np.std(values, ddof=1)
    half = 3.182446305284263 * std / 2.0  # t_{0.975, 3} * std / sqrt(4)
    assert s["n"] == 4 and s["ci_defined"]
    assert s["mean"] == pytest.approx(mean) and s["std"] == pytest.approx(std)
    assert s["ci95_low"] == pytest.approx(mean - half) and s["ci95_high"] == pytest.approx(mean + half)


def four_seeds_with(mean, std):
    """Four values whose mean and sample std are exactly `mean` and `std`."""
    a = std * math.sqrt(3.0 / 4.0)
    return [mean - a, mean - a, mean + a, mean + a]


def test_summarize_reproduces_the_papers_appendix_g_intervals():
    # ScienceWorld L1 DERL-pop: 95.31 ± 1.28 [93.28, 97.34]; ALFWorld L2 DERL: 65.04 ± 2.64 [60.83, 69.25]
    for mean, std, low, high in [(95.31, 1.28, 93.28, 97.34), (65.04, 2.64, 60.83, 69.25), (21.09, 3.19, 16.02, 26.17)]:
        s = summarize(four_seeds_with(mean, std))
        assert s["std"] == pytest.approx(std)
        assert s["ci95_low"] == pytest.approx(low, abs=0.011) and s["ci95_high"] == pytest.approx(high, abs=0.011)
    # the paper caps accuracy at 100: ScienceWorld L0 DERL-pop 98.24 ± 1.61 [95.68, 100.0]
    capped = summarize(four_seeds_with(98.24, 1.61), clip=(0.0, 100.0))
    assert capped["ci95_high"] == 100.0 and capped["ci95_low"] == pytest.approx(95.68, abs=0.011)


def test_single_seed_and_bad_input():
    s = summarize([0.7])
    assert s == {"mean": 0.7, "std": 0.0, "n": 1, "ci95_low": 0.7, "ci95_high": 0.7, "ci_defined": False}
    with pytest.raises(ValueError, match="no values"):
        summarize([])
    with pytest.raises(ValueError, match="must be finite"):
        summarize([1.0, float("nan")])


def test_results_table_numbers_and_order():
    per_method = {
        "GRPO + Out.": [76.0, 78.5, 74.25, 77.5],
        "DERL": [91.0, 88.5, 93.25, 90.0],
        "Random": [50.0],
    }
    markdown, data = results_table(per_method, column="ALFWorld L0")
    assert list(data) == ["GRPO + Out.", "DERL", "Random"]
    lines = markdown.strip().splitlines()
    assert lines[0] == "| method | seeds | ALFWorld L0: mean ± std [95% CI] |"
    for line, (method, values) in zip(lines[2:5], per_method.items()):
        mean = np.mean(values)
        std = np.std(values, ddof=1) if len(values) > 1 else 0.0
        half = {4: 3.182446305284263, 1: 0.0}[len(values)] * std / math.sqrt(len(values))
        cell = f"{mean:.2f} ± {std:.2f} [{mean - half:.2f}, {mean + half:.2f}]"
        assert line == f"| {method} | {len(values)} | {cell}{'*' if len(values) == 1 else ''} |"
        assert data[method]["mean"] == pytest.approx(mean)
    assert "single seed" in lines[-1]
    with pytest.raises(ValueError, match="method 'bad': summarize: no values"):
        results_table({"bad": []})


def test_curve_band_against_numpy_with_missing_values():
    rng = np.random.default_rng(0)
    values = rng.uniform(size=(4, 6))
    mean, std = curve_band(values)
    np.testing.assert_allclose(mean, values.mean(axis=0))
    np.testing.assert_allclose(std, values.std(axis=0, ddof=1))
    values[1, 2] = np.nan
    values[1:, 5] = np.nan
    mean, std = curve_band(values)
    np.testing.assert_allclose(mean[2], np.mean(values[[0, 2, 3], 2]))
    np.testing.assert_allclose(std[2], np.std(values[[0, 2, 3], 2], ddof=1))
    assert mean[5] == values[0, 5] and std[5] == 0.0
    with pytest.raises(ValueError, match="iterations \\[1\\] have no finite value"):
        curve_band(np.array([[1.0, np.nan]]))


def assert_png(path, min_width=200):
    data = open(path, "rb").read()
    assert data[:8] == PNG_SIGNATURE
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= min_width and height >= 100
    import matplotlib.image

    image = matplotlib.image.imread(path)
    assert image.shape[:2] == (height, width) and image.std() > 0  # decodes, not blank


def test_plot_outer_curves_writes_png(tmp_path):
    rng = np.random.default_rng(1)
    val = np.cumsum(rng.uniform(0, 0.05, size=(4, 10)), axis=1)
    test = val - 0.02
    single = plot_outer_curves({"validation": val, "test": test}, tmp_path / "curves.png", title="ALFWorld")
    assert_png(single)
    panels = plot_outer_curves(
        {"GSM8K": {"validation": val, "test": test}, "MATH": {"validation": val[:, :5], "test": test[:, :5]}},
        tmp_path / "sub" / "panels.png",
    )
    assert_png(panels, min_width=800)
    with pytest.raises(ValueError, match="mix of arrays and panels"):
        plot_outer_curves({"a": val, "b": {"x": val}}, tmp_path / "bad.png")


def test_structure_shares_and_plot(tmp_path):
    labels = [["unstable", "unstable", "stable", "invalid"], ["stable", "stable", "unstable", "stable"]]
    shares = structure_shares(labels)
    np.testing.assert_allclose(shares, [[0.25, 0.5, 0.25], [0.75, 0.25, 0.0]])
    assert_png(plot_structure_shares(shares, tmp_path / "shares.png"))
    assert_png(plot_structure_shares(np.array([[3, 1, 0], [1, 1, 2], [4, 0, 0]]), tmp_path / "counts.png"))
    with pytest.raises(ValueError, match="rows \\[1\\] sum to 0"):
        plot_structure_shares(np.array([[1, 0, 0], [0, 0, 0]]), tmp_path / "x.png")
    with pytest.raises(ValueError, match="unknown class 'weird'"):
        structure_shares([["weird"]])


def test_best_so_far_follows_the_charged_order_and_scores_invalid_candidates_zero():
    from derl_jax.experiment.results import best_so_far

    history = [  # written out of order; iteration 1 index 0 is invalid with a stale score
        {"iteration": 1, "index": 1, "valid": True, "score": 0.7},
        {"iteration": 0, "index": 1, "valid": True, "score": 0.2},
        {"iteration": 1, "index": 0, "valid": False, "score": 0.9},
        {"iteration": 0, "index": 0, "valid": True, "score": 0.4},
    ]
    assert best_so_far(history) == [0.4, 0.4, 0.4, 0.7]
    assert best_so_far([]) == []
