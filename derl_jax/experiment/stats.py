"""Result statistics: summaries over seeds, paired differences between methods, their tables.

* `summarize(values)` — mean, sample std and a Student-t 95% interval of the mean over seeds
  (`scipy.stats.t`).
* `paired_difference(a, b)` — method a minus method b on the same seeds and the same test
  items (`f32[seeds, items]` of per-item scores each): the mean difference, its 95% interval
  from a paired two-way bootstrap (`crossed_bootstrap`), the probability of improvement
  (rliable's), and whether the interval excludes 0 ("separated").
* `interval_estimates(per_method)` — mean and interquartile mean (rliable's aggregates) over
  (seed, item) scores with two-way bootstrap intervals, for one method at a time.
* `results_table` / `difference_table` — the Markdown tables of the report.

Why a two-way bootstrap: seeds and items are crossed factors. One seed's policy answers every
item, so the items of a seed are not independent draws of the training's randomness. Each
bootstrap replicate therefore draws S seeds and N items with replacement and takes the
statistic over that S x N sub-matrix, keeping both sources of variation. (rliable's
`StratifiedBootstrap` treats the columns as tasks, each with independent runs, and resamples
seeds separately in every column; over 1,000 items that averages the seed-to-seed spread away
and gives intervals far too narrow for 5 seeds.) The same seed and item draws serve both
methods of a paired difference, and a fixed `BOOTSTRAP_SEED` gives the same interval again.
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np
from rliable import metrics as rly_metrics
from scipy import stats as scipy_stats

CONFIDENCE = 0.95
BOOTSTRAP_REPS = 2000
BOOTSTRAP_SEED = 0


def student_t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p for Student's t with `df` degrees of freedom (p=0.975, df=3 -> 3.182)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"student_t_quantile: p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"student_t_quantile: df must be > 0, got {df}")
    return float(scipy_stats.t.ppf(p, df))


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


def paired_difference(a: np.ndarray, b: np.ndarray, *, reps: int = BOOTSTRAP_REPS, seed: int = BOOTSTRAP_SEED) -> dict:
    """Method a minus method b: f[S, N] per-item scores each, row s = seed s, column i = item i
    (the same seeds, base policy and test items for both).

    Returns {"difference": mean(a) - mean(b), "ci95_low", "ci95_high" (paired two-way bootstrap
    over seeds and items, `crossed_bootstrap`), "probability_of_improvement" (rliable's: for each item, P(a's score > b's)
    over every pair of a seed of a and a seed of b, ties half, averaged over items), "separated" (the interval excludes 0), "seeds", "items"}. Scores are in the units
    given (pass fractions 0/1 per item: a difference in [-1, 1]).
    """
    a, b = _score_matrix(a, "paired_difference: a"), _score_matrix(b, "paired_difference: b")
    if a.shape != b.shape:
        raise ValueError(f"paired_difference: a and b must have the same [seeds, items], got {a.shape} and {b.shape}")
    interval = crossed_bootstrap(lambda d: np.array([d.mean()]), a - b, reps=reps, seed=seed)  # paired: one draw for both
    low, high = float(interval[0, 0]), float(interval[1, 0])
    improvement = float(rly_metrics.probability_of_improvement(a, b))
    return {"difference": float(np.mean(a) - np.mean(b)), "ci95_low": low, "ci95_high": high,
            "probability_of_improvement": improvement, "separated": bool(low > 0.0 or high < 0.0),
            "seeds": int(a.shape[0]), "items": int(a.shape[1])}


def interval_estimates(scores: np.ndarray, *, reps: int = BOOTSTRAP_REPS, seed: int = BOOTSTRAP_SEED) -> dict:
    """Mean and interquartile mean (IQM) of f[S, N] per-item scores with two-way bootstrap 95%
    intervals over seeds and items: {"mean", "mean_ci", "iqm", "iqm_ci"}."""
    matrix = _score_matrix(scores, "interval_estimates")
    aggregate = lambda x: np.array([rly_metrics.aggregate_mean(x), rly_metrics.aggregate_iqm(x)])  # noqa: E731
    mean, iqm = (float(v) for v in aggregate(matrix))
    interval = crossed_bootstrap(aggregate, matrix, reps=reps, seed=seed)
    return {"mean": mean, "mean_ci": [float(interval[0, 0]), float(interval[1, 0])],
            "iqm": iqm, "iqm_ci": [float(interval[0, 1]), float(interval[1, 1])]}


def verdict(difference: Mapping[str, float]) -> str:
    """"separated" (a ahead), "reversed" (b ahead) or "not separated", from `paired_difference`."""
    if not difference["separated"]:
        return "not separated"
    return "separated" if difference["difference"] > 0 else "reversed"


def difference_table(rows: Sequence[tuple[str, str, Mapping[str, float]]], *, scale: float = 100.0,
                     digits: int = 1) -> str:
    """Markdown table of paired differences: rows of (method, baseline, `paired_difference` result),
    differences shown in points (x `scale`)."""
    f = f"{{:+.{digits}f}}"
    lines = ["| method | baseline | difference (points) | 95% CI (paired bootstrap) | P(method > baseline) | seeds x items | verdict |",
             "|---|---|---:|---|---:|---|---|"]
    for method, baseline, d in rows:
        lines.append(f"| {method} | {baseline} | {f.format(scale * d['difference'])} | "
                     f"[{f.format(scale * d['ci95_low'])}, {f.format(scale * d['ci95_high'])}] | "
                     f"{d['probability_of_improvement']:.2f} | {d['seeds']} x {d['items']} | {verdict(d)} |")
    return "\n".join(lines) + "\n"
