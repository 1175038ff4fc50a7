"""Result statistics over seeds and the comparison table.

* `summarize(values)` — mean, sample std and a Student-t 95% confidence interval over
  seeds (the paper's Appendix G reports these for 4 seeds).
* `results_table(per_method)` — a Markdown table `mean ± std [low, high]` per method and
  the same numbers as a JSON-able dict.

Student-t quantiles are computed here (no SciPy): the t CDF through the regularized
incomplete beta function, inverted by bisection.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np

CONFIDENCE = 0.95


# --------------------------------------------------------------------------- Student t


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b) for 0 <= x <= 1, a, b > 0, by its continued fraction (modified Lentz)."""
    if not 0.0 <= x <= 1.0 or a <= 0 or b <= 0:
        raise ValueError(f"regularized_incomplete_beta: need 0 <= x <= 1 and a, b > 0, got x={x}, a={a}, b={b}")
    if x in (0.0, 1.0):
        return x
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast only below this point
        return 1.0 - regularized_incomplete_beta(1.0 - x, b, a)
    log_front = a * math.log(x) + b * math.log1p(-x) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    return math.exp(log_front) / a * _beta_continued_fraction(x, a, b)


def _beta_continued_fraction(x: float, a: float, b: float, max_terms: int = 1000, tolerance: float = 1e-15) -> float:
    """1 / (1 + d1 / (1 + d2 / (1 + ...))) with the incomplete-beta coefficients

    d_{2m+1} = -(a+m)(a+b+m) x / ((a+2m)(a+2m+1)),   d_{2m} = m(b-m) x / ((a+2m-1)(a+2m)),

    evaluated by the modified Lentz method.
    """
    tiny = 1e-300
    fraction, c, d = 1.0, 1.0, 0.0
    for k in range(1, max_terms + 1):
        m = k // 2
        if k % 2:
            coefficient = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        else:
            coefficient = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d = 1.0 + coefficient * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + coefficient / c
        c = c if abs(c) > tiny else tiny
        delta = c * d
        fraction *= delta
        if abs(delta - 1.0) < tolerance:
            break
    return 1.0 / fraction


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"student_t_cdf: df must be > 0, got {df}")
    tail = 0.5 * regularized_incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
    return 1.0 - tail if t >= 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (e.g. p=0.975, df=3 -> 3.182), by bisection to ~1e-12."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"student_t_quantile: p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"student_t_quantile: df must be > 0, got {df}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if student_t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


# --------------------------------------------------------------------------- summaries


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
