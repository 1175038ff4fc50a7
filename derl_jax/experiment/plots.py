"""The outer-loop plots.

* `plot_outer_curves` — mean over seeds of validation/test accuracy per outer iteration with a
  Student-t 95% interval band, one panel per method or view, all panels on one y-axis (the
  paper's Figure 3).
* `plot_structure_shares` — stable / unstable / invalid shares of the proposed
  expressions per outer iteration (the paper's Figure 4; `results.structure_shares`).

Figures are drawn with Matplotlib's Agg renderer through `matplotlib.figure.Figure`, so
no pyplot backend or global state is touched.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import numpy as np

from derl_jax.experiment.stats import student_t_quantile
from derl_jax.outer.candidates import STRUCTURE_CLASSES


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


def curve_interval(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean and the two-sided Student-t 95% interval of the mean over seeds of `values: f[S, I]`
    (NaN = missing) -> (mean, low, high), each f64[I]; the interval is the mean itself where
    fewer than two seeds have a value."""
    mean, std = curve_band(values)
    counts = np.sum(np.isfinite(np.atleast_2d(np.asarray(values, np.float64))), axis=0)
    half = np.array([student_t_quantile(0.975, n - 1) * s / np.sqrt(n) if n > 1 else 0.0 for n, s in zip(counts, std)])
    return mean, mean - half, mean + half


def plot_outer_curves(
    curves: Mapping[str, np.ndarray] | Mapping[str, Mapping[str, np.ndarray]],
    path: str | os.PathLike,
    *,
    title: str | None = None,
    xlabel: str = "outer iteration",
    ylabel: str = "accuracy",
    columns: int | None = None,
    x: Sequence[float] | None = None,
) -> str:
    """Mean over seeds per outer iteration with its 95% interval band, one line per series, every
    panel on the same y-axis; saves a PNG.

    curves: series name -> f[S, I] (e.g. {"validation": v, "test": t}), or panel name ->
    such a mapping for one panel per benchmark/method (the paper's Figure 3 layout).
    columns: panels per row (default: all in one row); panels fill rows left to right.
    x: the positions of the I points (default 1..I).
    """
    panels = _as_panels(curves)
    columns = len(panels) if columns is None else max(1, min(int(columns), len(panels)))
    rows = -(-len(panels) // columns)
    fig = _figure(figsize=(4.5 * columns, 3.4 * rows))
    axes = fig.subplots(rows, columns, squeeze=False, sharey=True).reshape(-1)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    for ax, (panel, series) in zip(axes, panels.items()):
        for name, values in series.items():
            try:
                mean, low, high = curve_interval(values)
            except ValueError as err:
                raise ValueError(f"plot_outer_curves: series {panel}/{name}: {err}") from err
            steps = np.arange(1, mean.size + 1) if x is None else np.asarray(x, np.float64)
            if steps.shape != mean.shape:
                raise ValueError(f"plot_outer_curves: {steps.size} x positions for {mean.size} points")
            (line,) = ax.plot(steps, mean, marker="o", markersize=3, label=name)
            ax.fill_between(steps, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
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
