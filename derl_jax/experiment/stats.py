"""Result statistics: summaries over seeds, paired differences between methods, their tables.

* `summarize(values)` — mean, sample std and a Student-t 95% interval of the mean over seeds
  (`scipy.stats.t`).
* `paired_difference(a, b)` — method a minus method b on the same seeds and the same test
  items (`f32[seeds, items]` of per-item scores each): the mean difference; its primary 95%
  interval and p-value, Student-t over the per-seed paired differences (`paired_t`); a
  secondary interval from a paired two-way bootstrap (`crossed_bootstrap`); the probability
  of improvement where the items are not all 0/1; and the verdict's "separated" (the primary
  interval excludes 0).
* `holm(p_values)` — Holm's step-down adjustment for the comparisons of one table.
* `interval_estimates(per_method)` — mean and interquartile mean over (seed, item) scores with
  two-way bootstrap intervals, for one method at a time.
* `results_table` / `difference_table` — the Markdown tables of the report.

Why Student-t over seeds is the primary interval: a seed's policy answers every item, so the
seed is the unit of replication and each seed gives one paired difference d_s (the mean over
items of a's score minus b's). With S seeds, `mean(d) ± t_{0.975, S-1} · sd(d) / sqrt(S)` is
the textbook paired interval (`scipy.stats.ttest_rel` over the per-seed item means gives the
same p-value). A percentile bootstrap over S seeds shrinks the seed variance by (S-1)/S and
uses normal rather than t tails; with 3 to 10 seeds its nominal 95% covers noticeably less.

The two-way bootstrap (secondary column): seeds and items are crossed factors. Each replicate
draws S seeds and N items with replacement and takes the statistic over that S x N
sub-matrix, keeping both sources of variation. The same seed and item draws serve both
methods of a paired difference, and a fixed `BOOTSTRAP_SEED` gives the same interval again.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

CONFIDENCE = 0.95
ALPHA = 1.0 - CONFIDENCE
BOOTSTRAP_REPS = 2000
BOOTSTRAP_SEED = 0


def scipy_stats():
    """`scipy.stats`, imported on first use (it costs half a second, which a launch that stops on
    a bad flag should not pay)."""
    from scipy import stats

    return stats


def student_t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p for Student's t with `df` degrees of freedom (p=0.975, df=3 -> 3.182)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"student_t_quantile: p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"student_t_quantile: df must be > 0, got {df}")
    return float(scipy_stats().t.ppf(p, df))


# --------------------------------------------------------------------------- over seeds


def summarize(values: Sequence[float], *, clip: tuple[float, float] | None = None) -> dict:
    """Mean, sample std (ddof=1), n and the two-sided 95% Student-t interval of the mean.

    Returns {"mean", "std", "n", "ci95_low", "ci95_high", "ci_defined"}. With n == 1 the
    std is 0, the interval is [mean, mean] and `ci_defined` is False. `clip=(low, high)`
    clips the interval to the metric's range (the paper caps accuracy intervals at 100).
    """
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.size == 0:
        raise ValueError("summarize: no values")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"summarize: values must be finite, got {array.tolist()}")
    n = int(array.size)
    mean = float(array.mean())
    if n == 1:
        std, low, high = 0.0, mean, mean
    else:
        std = float(array.std(ddof=1))
        half_width = student_t_quantile(0.5 + CONFIDENCE / 2.0, n - 1) * std / math.sqrt(n)
        low, high = mean - half_width, mean + half_width
    if clip is not None:
        low, high = min(max(low, clip[0]), clip[1]), min(max(high, clip[0]), clip[1])
    return {"mean": mean, "std": std, "n": n, "ci95_low": low, "ci95_high": high, "ci_defined": n > 1}


def format_summary(summary: Mapping[str, float], digits: int = 2) -> str:
    """`mean ± std [low, high]`; a trailing `*` marks a single seed (no interval)."""
    f = f"{{:.{digits}f}}"
    text = f"{f.format(summary['mean'])} ± {f.format(summary['std'])} [{f.format(summary['ci95_low'])}, {f.format(summary['ci95_high'])}]"
    return text if summary["ci_defined"] else text + "*"


def results_table(
    per_method: Mapping[str, Sequence[float]],
    *,
    column: str = "score",
    digits: int = 2,
    clip: tuple[float, float] | None = None,
) -> tuple[str, dict]:
    """A Markdown comparison table (methods in the order given) and its numbers.

    per_method: method name -> one value per seed (e.g. test accuracy in %).
    Returns (markdown, {method: summarize(values)}).
    """
    if not per_method:
        raise ValueError("results_table: no methods")
    summaries = {}
    for method, values in per_method.items():
        try:
            summaries[str(method)] = summarize(values, clip=clip)
        except ValueError as err:
            raise ValueError(f"results_table: method {method!r}: {err}") from err
    lines = [
        f"| method | seeds | {column}: mean ± std [95% CI] |",
        "|---|---:|---|",
    ]
    lines += [f"| {m} | {s['n']} | {format_summary(s, digits)} |" for m, s in summaries.items()]
    if not all(s["ci_defined"] for s in summaries.values()):
        lines += ["", "\\* single seed: no spread or confidence interval."]
    return "\n".join(lines) + "\n", summaries



def t_test(values: Sequence[float]) -> dict:
    """One-sample Student-t test of mean 0 for per-seed values (paired differences, slopes).

    Returns {"difference": mean, "ci95_low", "ci95_high" (t_{0.975, n-1} interval), "p_value"
    (two-sided), "seeds": n, "separated" (the interval excludes 0)}. With n == 1 the interval is
    [mean, mean] and p is 1 (nothing is separated on one seed); with zero spread p is 0 when the
    mean is not 0 and 1 when it is.
    """
    summary = summarize(values)
    values = np.asarray(values, np.float64).reshape(-1)
    mean, n = summary["mean"], summary["n"]
    if n == 1:
        p = 1.0
    elif np.allclose(values, mean, rtol=1e-12, atol=1e-12):   # no spread (up to rounding)
        p = 0.0 if mean != 0.0 else 1.0
    else:
        p = float(scipy_stats().ttest_1samp(values, 0.0).pvalue)
    low, high = summary["ci95_low"], summary["ci95_high"]
    return {"difference": mean, "ci95_low": low, "ci95_high": high, "p_value": p, "seeds": n,
            "separated": bool(n > 1 and (low > 0.0 or high < 0.0))}


def welch_interval(a: Sequence[float], b: Sequence[float], *, confidence: float = CONFIDENCE) -> dict:
    """mean(b) − mean(a) for two independent samples (f[Na], f[Nb], each n >= 2), with its
    two-sided Welch interval: se = sqrt(var_a/Na + var_b/Nb) (ddof=1) and the t quantile at the
    Welch–Satterthwaite df. Returns {"difference", "low", "high", "df"}. With no spread in either
    sample the interval is [difference, difference]."""
    a = np.asarray(a, np.float64).reshape(-1)
    b = np.asarray(b, np.float64).reshape(-1)
    if a.size < 2 or b.size < 2:
        raise ValueError(f"welch_interval: each sample needs >= 2 values, got {a.size} and {b.size}")
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    difference = float(b.mean() - a.mean())
    se = math.sqrt(va + vb)
    if se == 0.0:
        return {"difference": difference, "low": difference, "high": difference, "df": float("inf")}
    df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    half_width = student_t_quantile(0.5 + confidence / 2.0, df) * se
    return {"difference": difference, "low": difference - half_width, "high": difference + half_width, "df": float(df)}


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: sort ascending, multiply the k-th
    smallest (k from 0) by (m - k), take the running maximum, cap at 1."""
    p = np.asarray(p_values, np.float64).reshape(-1)
    if p.size == 0:
        return []
    if np.any(~np.isfinite(p)) or np.any(p < 0.0) or np.any(p > 1.0):
        raise ValueError(f"holm: p-values must be in [0, 1], got {p.tolist()}")
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, np.maximum.accumulate(p[order] * (p.size - np.arange(p.size))))
    adjusted = np.empty_like(p)
    adjusted[order] = scaled
    return adjusted.tolist()


def with_holm(rows: Sequence[Mapping[str, float]]) -> list[dict]:
    """`rows` (each with "p_value" and "difference") with "p_holm" and "verdict_holm" added: Holm
    over the rows given (one compare's claims, or one table's paired rows). Rows whose p-value is
    None (not measurable) are left out of the adjustment and keep `verdict(row)`."""
    tested = [i for i, row in enumerate(rows) if row.get("p_value") is not None]
    adjusted = dict(zip(tested, holm([rows[i]["p_value"] for i in tested])))
    return [{**row, "p_holm": adjusted[i], "verdict_holm": _direction(row["difference"], adjusted[i] < ALPHA)}
            if i in adjusted else {**row, "p_holm": None, "verdict_holm": verdict(row)}
            for i, row in enumerate(rows)]


def _direction(difference: float, separated: bool) -> str:
    if not separated:
        return "not separated"
    return "separated" if difference > 0 else "reversed"


# --------------------------------------------------------------------------- over seeds and items


def _score_matrix(scores: np.ndarray | Sequence[Sequence[float]], where: str) -> np.ndarray:
    """f64[seeds, items], finite; ValueError naming `where` otherwise."""
    matrix = np.asarray(scores, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] < 1 or matrix.shape[1] < 1:
        raise ValueError(f"{where}: expected scores of shape [seeds, items], got {matrix.shape}")
    if not np.all(np.isfinite(matrix)):
        raise ValueError(f"{where}: scores must be finite")
    return matrix


def crossed_bootstrap(statistic: Callable[[np.ndarray], np.ndarray], scores: np.ndarray, *, reps: int,
                      seed: int) -> np.ndarray:
    """95% percentile intervals of `statistic` over a two-way bootstrap of f[S, N] scores (seeds x
    items): each of `reps` replicates draws S seed rows and N item columns with replacement.

    statistic: f[S, N] -> f[K]. Returns f[2, K] (row 0 the lower, row 1 the upper bound)."""
    rng = np.random.default_rng(seed)
    num_seeds, num_items = scores.shape
    replicates = []
    for _ in range(reps):
        rows = rng.integers(0, num_seeds, size=num_seeds)
        columns = rng.integers(0, num_items, size=num_items)
        replicates.append(statistic(scores[rows][:, columns]))
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    return np.percentile(np.asarray(replicates, dtype=np.float64), [tail, 100.0 - tail], axis=0)


def probability_of_improvement(a: np.ndarray, b: np.ndarray) -> float:
    """For each item, P(a's score > b's) over every pair (seed of a, seed of b), ties counted
    half, averaged over items. a, b: f[S, N]. (With 0/1 items it is 0.5 + (mean a - mean b)/2,
    so it says nothing the difference does not.)"""
    wins = (a[:, None, :] > b[None, :, :]).mean(axis=(0, 1))
    ties = (a[:, None, :] == b[None, :, :]).mean(axis=(0, 1))
    return float(np.mean(wins + 0.5 * ties))


def paired_t(a: np.ndarray, b: np.ndarray) -> dict:
    """`t_test` of the per-seed paired differences mean_items(a[s]) - mean_items(b[s]); a, b f[S, N]."""
    return t_test(a.mean(axis=1) - b.mean(axis=1))


def paired_difference(a: np.ndarray, b: np.ndarray, *, reps: int = BOOTSTRAP_REPS, seed: int = BOOTSTRAP_SEED) -> dict:
    """Method a minus method b: f[S, N] per-item scores each, row s = seed s, column i = item i
    (the same seeds, base policy and test items for both).

    Returns {"difference": mean(a) - mean(b); "ci95_low", "ci95_high", "p_value": the primary
    interval and two-sided p, Student-t over the S per-seed differences (`paired_t`);
    "bootstrap_low", "bootstrap_high": the paired two-way bootstrap over seeds and items;
    "probability_of_improvement": None when every score is 0 or 1, else
    `probability_of_improvement(a, b)`; "separated": the primary interval excludes 0; "interval":
    "t"; "measurable": False when both methods score 0 on every item of every seed (then
    "p_value" is None and the verdict "not measurable"); "seeds", "items"}. Scores are in the
    units given (fractions 0/1 per item: a difference in [-1, 1]).
    """
    a, b = _score_matrix(a, "paired_difference: a"), _score_matrix(b, "paired_difference: b")
    if a.shape != b.shape:
        raise ValueError(f"paired_difference: a and b must have the same [seeds, items], got {a.shape} and {b.shape}")
    t = paired_t(a, b)
    boot = crossed_bootstrap(lambda d: np.array([d.mean()]), a - b, reps=reps, seed=seed)  # paired: one draw for both
    binary = bool(np.all((a == 0.0) | (a == 1.0)) and np.all((b == 0.0) | (b == 1.0)))
    measurable = bool(np.any(a != 0.0) or np.any(b != 0.0))
    return {"difference": float(np.mean(a) - np.mean(b)), "ci95_low": t["ci95_low"], "ci95_high": t["ci95_high"],
            "p_value": t["p_value"] if measurable else None, "measurable": measurable, "bootstrap_low": float(boot[0, 0]), "bootstrap_high": float(boot[1, 0]),
            "probability_of_improvement": None if binary else probability_of_improvement(a, b),
            "separated": t["separated"], "interval": "t", "seeds": int(a.shape[0]), "items": int(a.shape[1])}


def interquartile_mean(scores: np.ndarray) -> float:
    """Mean of the middle half of all scores (25% trimmed from each end, `scipy.stats.trim_mean`)."""
    return float(scipy_stats().trim_mean(np.asarray(scores, np.float64).reshape(-1), 0.25))


def interval_estimates(scores: np.ndarray, *, reps: int = BOOTSTRAP_REPS, seed: int = BOOTSTRAP_SEED) -> dict:
    """Mean and interquartile mean (IQM) of f[S, N] per-item scores with two-way bootstrap 95%
    intervals over seeds and items: {"mean", "mean_ci", "iqm", "iqm_ci"}."""
    matrix = _score_matrix(scores, "interval_estimates")
    aggregate = lambda x: np.array([x.mean(), interquartile_mean(x)])  # noqa: E731
    mean, iqm = (float(v) for v in aggregate(matrix))
    interval = crossed_bootstrap(aggregate, matrix, reps=reps, seed=seed)
    return {"mean": mean, "mean_ci": [float(interval[0, 0]), float(interval[1, 0])],
            "iqm": iqm, "iqm_ci": [float(interval[0, 1]), float(interval[1, 1])]}


NOT_MEASURABLE = "not measurable"


def verdict(difference: Mapping[str, float]) -> str:
    """"separated" (a ahead), "reversed" (b ahead) or "not separated", from the primary interval
    (`paired_difference` / `t_test`'s "separated"); "not measurable" when both score 0 everywhere."""
    if difference.get("measurable") is False:
        return NOT_MEASURABLE
    return _direction(difference["difference"], bool(difference["separated"]))


def difference_table(rows: Sequence[tuple[str, str, Mapping[str, float]]], *, scale: float = 100.0,
                     digits: int = 1) -> str:
    """Markdown table of paired differences: rows of (method, baseline, `paired_difference` result),
    differences shown in points (x `scale`). The verdict reads the Student-t interval; the Holm
    verdict adjusts the p-values over the table's rows. The probability of improvement is shown
    only when some row has one (items not all 0/1); the bootstrap column only when the rows carry it."""
    f = f"{{:+.{digits}f}}"
    span = lambda low, high: f"[{f.format(scale * low)}, {f.format(scale * high)}]"  # noqa: E731
    improvement = any(d.get("probability_of_improvement") is not None for _, _, d in rows)
    bootstrap = any("bootstrap_low" in d for _, _, d in rows)
    holm_rows = with_holm([d for _, _, d in rows]) if all("p_value" in d for _, _, d in rows) and rows else None
    header = ["method", "baseline", "difference (points)", "95% CI (t over seeds)"]
    header += ["95% CI (two-way bootstrap)"] if bootstrap else []
    header += ["P(method > baseline)"] if improvement else []
    header += ["seeds x items", "verdict"] + (["Holm verdict"] if holm_rows is not None else [])
    lines = ["| " + " | ".join(header) + " |",
             "|---|---|---:|---|" + ("---|" if bootstrap else "") + ("---:|" if improvement else "") + "---|---|"
             + ("---|" if holm_rows is not None else "")]
    for i, (method, baseline, d) in enumerate(rows):
        cells = [method, baseline, f.format(scale * d["difference"]), span(d["ci95_low"], d["ci95_high"])]
        if bootstrap:
            cells.append(span(d["bootstrap_low"], d["bootstrap_high"]) if "bootstrap_low" in d else "-")
        if improvement:
            p = d.get("probability_of_improvement")
            cells.append("-" if p is None else f"{p:.2f}")
        cells += [f"{d['seeds']} x {d['items']}", verdict(d)]
        if holm_rows is not None:
            cells.append(holm_rows[i]["verdict_holm"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def p_from_interval(mean: float, low: float, high: float, n: int) -> float:
    """The two-sided one-sample t p-value behind a saved Student-t 95% interval [low, high] of a
    mean over n values (se = half-width / t_{0.975, n-1})."""
    if n < 2:
        return 1.0
    half = (high - low) / 2.0
    if half <= 0.0:
        return 0.0 if mean != 0.0 else 1.0
    se = half / student_t_quantile(0.5 + CONFIDENCE / 2.0, n - 1)
    return float(2.0 * scipy_stats().t.sf(abs(mean) / se, n - 1))
