"""Result statistics, comparison tables and the outer-loop plots.

* `summarize(values)` — mean, sample std and a Student-t 95% confidence interval over
  seeds (the paper's Appendix G reports these for 4 seeds).
* `results_table(per_method)` — a Markdown table `mean ± std [low, high]` per method and
  the same numbers as a JSON-able dict.
* `plot_outer_curves` — mean ± std over seeds of validation/test accuracy per outer
  iteration (the paper's Figure 3).
* `plot_structure_shares` — stable / unstable / invalid shares of the proposed
  expressions per outer iteration (the paper's Figure 4).

Figures are drawn with Matplotlib's Agg renderer through `matplotlib.figure.Figure`, so
no pyplot backend or global state is touched. Student-t quantiles are computed here (no SciPy): the t CDF through the regularized
incomplete beta function, inverted by bisection.
"""

from __future__ import annotations

import math
import os
from typing import Mapping, Sequence

import numpy as np

STRUCTURE_CLASSES = ("stable", "unstable", "invalid")
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


# --------------------------------------------------------------------------- plots


def curve_band(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample std over seeds of `values: f[S, I]` (NaN = missing) -> (f64[I], f64[I]).

    The std is 0 where fewer than two seeds have a value.
    """
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 1:
        array = array[None, :]
    if array.ndim != 2 or array.shape[1] == 0:
        raise ValueError(f"curve_band: expected values of shape [seeds, iterations], got {array.shape}")
    counts = np.sum(np.isfinite(array), axis=0)
    if np.any(counts == 0):
        raise ValueError(f"curve_band: iterations {np.flatnonzero(counts == 0).tolist()} have no finite value")
    clean = np.where(np.isfinite(array), array, 0.0)
    mean = clean.sum(axis=0) / counts
    squares = np.where(np.isfinite(array), (array - mean) ** 2, 0.0).sum(axis=0)
    std = np.where(counts > 1, np.sqrt(squares / np.maximum(counts - 1, 1)), 0.0)
    return mean, std


def plot_outer_curves(
    curves: Mapping[str, np.ndarray] | Mapping[str, Mapping[str, np.ndarray]],
    path: str | os.PathLike,
    *,
    title: str | None = None,
    xlabel: str = "outer iteration",
    ylabel: str = "accuracy",
) -> str:
    """Mean ± std band over seeds per outer iteration, one line per series; saves a PNG.

    curves: series name -> f[S, I] (e.g. {"validation": v, "test": t}), or panel name ->
    such a mapping for one panel per benchmark/method (the paper's Figure 3 layout).
    """
    panels = _as_panels(curves)
    fig = _figure(figsize=(4.5 * len(panels), 3.4))
    axes = fig.subplots(1, len(panels), squeeze=False)
    for ax, (panel, series) in zip(axes[0], panels.items()):
        for name, values in series.items():
            try:
                mean, std = curve_band(values)
            except ValueError as err:
                raise ValueError(f"plot_outer_curves: series {panel}/{name}: {err}") from err
            steps = np.arange(1, mean.size + 1)
            (line,) = ax.plot(steps, mean, marker="o", markersize=3, label=name)
            ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        _integer_ticks(ax)
        if panel:
            ax.set_title(panel)
        ax.grid(alpha=0.3)
        ax.legend(frameon=False)
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def _as_panels(curves) -> dict[str, dict[str, np.ndarray]]:
    if not curves:
        raise ValueError("plot_outer_curves: no curves")
    nested = [isinstance(v, Mapping) for v in curves.values()]
    if all(nested):
        if any(not series for series in curves.values()):
            raise ValueError("plot_outer_curves: a panel has no series")
        return {str(k): dict(v) for k, v in curves.items()}
    if any(nested):
        raise ValueError("plot_outer_curves: mix of arrays and panels; give all arrays or all mappings")
    return {"": dict(curves)}


def structure_shares(classes_per_iteration: Sequence[Sequence[str]]) -> np.ndarray:
    """f64[I, 3] fractions of 'stable', 'unstable', 'invalid' labels per iteration."""
    shares = np.zeros((len(classes_per_iteration), len(STRUCTURE_CLASSES)))
    for i, labels in enumerate(classes_per_iteration):
        if not labels:
            raise ValueError(f"structure_shares: iteration {i} has no expressions")
        for label in labels:
            if label not in STRUCTURE_CLASSES:
                raise ValueError(f"structure_shares: iteration {i}: unknown class {label!r}, expected {STRUCTURE_CLASSES}")
            shares[i, STRUCTURE_CLASSES.index(label)] += 1
        shares[i] /= len(labels)
    return shares


def plot_structure_shares(
    shares: np.ndarray,
    path: str | os.PathLike,
    *,
    title: str | None = None,
    labels: Sequence[str] = STRUCTURE_CLASSES,
) -> str:
    """Stacked area of stable/unstable/invalid shares (%) per outer iteration; saves a PNG.

    shares: f[I, 3] fractions or counts per iteration (rows are normalised to sum to 1).
    """
    array = np.asarray(shares, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] != len(labels) or array.shape[0] == 0:
        raise ValueError(f"plot_structure_shares: expected shape [iterations, {len(labels)}], got {array.shape}")
    if not np.all(np.isfinite(array)) or np.any(array < 0):
        raise ValueError("plot_structure_shares: shares must be finite and non-negative")
    totals = array.sum(axis=1, keepdims=True)
    if np.any(totals == 0):
        raise ValueError(f"plot_structure_shares: rows {np.flatnonzero(totals[:, 0] == 0).tolist()} sum to 0")
    percent = 100.0 * array / totals
    fig = _figure(figsize=(5.5, 3.4))
    ax = fig.subplots()
    steps = np.arange(1, array.shape[0] + 1)
    colors = ("#4C9F70", "#E3A72F", "#C8553D")[: len(labels)]
    ax.stackplot(steps, percent.T, labels=list(labels), colors=colors, alpha=0.85)
    ax.set_xlim(steps[0], steps[-1] if steps.size > 1 else steps[0] + 1)
    ax.set_ylim(0, 100)
    ax.set_xlabel("outer iteration")
    ax.set_ylabel("share of expressions (%)")
    _integer_ticks(ax)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    if title:
        ax.set_title(title)
    return _save(fig, path)


def _figure(figsize: tuple[float, float]):
    """A figure drawn by the Agg renderer, independent of pyplot's global backend/state."""
    from matplotlib.figure import Figure

    return Figure(figsize=figsize)


def _integer_ticks(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _save(fig, path: str | os.PathLike) -> str:
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=120)
    return path
