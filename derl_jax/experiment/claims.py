"""What a compare says about the paper's claims: paired differences, trends, and a verdict each.

    rows = paired_rows(results)                  # every method against outcome-only and random search
    verdicts = claim_rows(results)               # the paper's claims, each separated / not separated / reversed

A paired difference compares two methods on the same seeds (the same base policy and final
training key per seed) and the same test items: `MethodResult.test_items` holds the headline
policy's per-item scores, so a method's scores form f[seeds, items] and
`stats.paired_difference` gives the Student-t interval over the per-seed differences (and a
two-way bootstrap beside it). A trend (validation rising over outer iterations, stable
structures taking over) is the least-squares slope of each seed's per-iteration series, with a
Student-t interval over seeds. Each claim's verdict reads its own interval; the Holm verdict
adjusts the claims' p-values over the claims of one compare.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from derl_jax.experiment import stats
from derl_jax.expr.check import check_compiled
from derl_jax.expr.parse import ExpressionError, parse
from derl_jax.expr.structure import INVALID, STABLE, structure
from derl_jax.experiment.results import MethodResult

BASELINES = ("outcome", "random")
# (claim, method, baseline): the paper's comparisons at the end of training
PAIRED_CLAIMS = (
    ("DERL > outcome-only", "derl", "outcome"),
    ("DERL > average of primitives", "derl", "average"),
    ("DERL > random search at equal compute", "derl", "random"),
    ("DERL-pop >= DERL", "derl_pop", "derl"),
)
# (claim, method, per-iteration series): the paper's trends over outer iterations
TREND_CLAIMS = (
    ("candidates' validation rises over iterations (Fig. 3)", "derl", "validation_mean"),
    ("stable structures take over (Fig. 4)", "derl", "share_stable"),
)


def item_matrix(runs: Sequence[MethodResult], seeds: Sequence[int]) -> np.ndarray | None:
    """f64[len(seeds), items]: the per-item test scores of `runs` at `seeds`, in that order;
    None when a seed is missing or has no item scores, or the item counts differ."""
    by_seed = {r.seed: r for r in runs}
    rows = [by_seed[s].test_items if s in by_seed else None for s in seeds]
    if not rows or any(row is None or len(row) == 0 for row in rows) or len({len(row) for row in rows}) != 1:
        return None
    return np.asarray(rows, np.float64)


def paired(results: Mapping[str, Sequence[MethodResult]], method: str, baseline: str) -> dict | None:
    """`stats.paired_difference` of `method` against `baseline` over their common seeds, or None."""
    if method not in results or baseline not in results or method == baseline:
        return None
    seeds = sorted({r.seed for r in results[method]} & {r.seed for r in results[baseline]})
    a, b = item_matrix(results[method], seeds), item_matrix(results[baseline], seeds)
    if a is None or b is None or a.shape != b.shape:
        return None
    return stats.paired_difference(a, b)


def paired_rows(results: Mapping[str, Sequence[MethodResult]],
                baselines: Sequence[str] = BASELINES) -> list[tuple[str, str, dict]]:
    """(method, baseline, paired difference) of every other method against each baseline present."""
    rows = []
    for baseline in baselines:
        for method in results:
            difference = paired(results, method, baseline)
            if difference is not None:
                rows.append((method, baseline, difference))
    return rows


def series(run: MethodResult, name: str) -> np.ndarray | None:
    """f64[iterations] of a search's per-iteration `name` ("validation_mean", "share_stable", ...)."""
    if run.per_iteration is None:
        return None
    if name.startswith("share_"):
        column = ("stable", "unstable", "invalid").index(name.removeprefix("share_"))
        return np.asarray([shares[column] for shares in run.per_iteration["structure_shares"]], np.float64)
    values = run.per_iteration.get(name)
    return None if values is None else np.asarray([np.nan if v is None else v for v in values], np.float64)


def slope(values: np.ndarray) -> float:
    """Least-squares slope of `values` against 0, 1, 2, ... (NaN entries left out)."""
    x = np.arange(len(values), dtype=np.float64)
    keep = np.isfinite(values)
    if keep.sum() < 2:
        raise ValueError("slope: needs at least two finite values")
    return float(np.polyfit(x[keep], values[keep], 1)[0])


def trend(runs: Sequence[MethodResult], name: str) -> dict | None:
    """Per-seed slopes of `name` over iterations: `stats.t_test` of them (mean, Student-t 95%
    interval, p-value, "separated"); None
    without at least two seeds of at least two iterations."""
    slopes = []
    for run in runs:
        values = series(run, name)
        if values is not None and np.isfinite(values).sum() >= 2:
            slopes.append(slope(values))
    if len(slopes) < 2:
        return None
    return stats.t_test(slopes)


def iteration_difference(results: Mapping[str, Sequence[MethodResult]], method: str = "derl",
                         baseline: str = "random", name: str = "validation_mean") -> dict | None:
    """Per outer iteration, `method` minus `baseline` in `name` (mean of each iteration's
    candidates), paired by seed: {"mean": f[I], "ci95_low": f[I], "ci95_high": f[I], "seeds": S}
    with Student-t intervals over seeds; None without two common seeds."""
    if method not in results or baseline not in results:
        return None
    a = {r.seed: series(r, name) for r in results[method]}
    b = {r.seed: series(r, name) for r in results[baseline]}
    seeds = sorted(s for s in set(a) & set(b) if a[s] is not None and b[s] is not None)
    if len(seeds) < 2:
        return None
    width = min(min(len(a[s]), len(b[s])) for s in seeds)
    differences = np.array([a[s][:width] - b[s][:width] for s in seeds])
    summaries = [stats.summarize(differences[:, i]) for i in range(width)]
    return {"mean": [s["mean"] for s in summaries], "ci95_low": [s["ci95_low"] for s in summaries],
            "ci95_high": [s["ci95_high"] for s in summaries], "seeds": len(seeds)}


STRUCTURE_CLAIM = TREND_CLAIMS[1][0]
NOT_MEASURABLE = stats.NOT_MEASURABLE


def claim_rows(results: Mapping[str, Sequence[MethodResult]], *, aligned: Sequence[int] = (),
               histories: Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]] | None = None,
               structure_of: Callable[[str], str] | None = None) -> list[dict]:
    """One row per paper claim this compare can test: {"claim", "kind" ("paired" | "trend"),
    "difference", "ci95_low", "ci95_high", "p_value", "verdict", "p_holm", "verdict_holm", ...};
    claims whose methods did not run, or lack item scores or seeds, are left out.

    aligned: the domain's outcome-aligned primitives besides the outcome (`Domain.aligned_indices`).
    The structure classes a search records use the outcome-only rule; where a domain declares
    aligned primitives the Fig. 4 claim reads the proposals of `histories` ({method: {seed:
    history records}}) classified again by `structure_of(text)` (`structure_with_aligned`), and
    is "not measurable" (no interval, not in Holm) without them."""
    rows = []
    for claim, method, baseline in PAIRED_CLAIMS:
        difference = paired(results, method, baseline)
        if difference is not None:
            rows.append({"claim": claim, "kind": "paired", "method": method, "baseline": baseline, **difference})
    for claim, method, name in TREND_CLAIMS:
        if claim == STRUCTURE_CLAIM and aligned and histories and structure_of is not None:
            found = _reclassified_trend(histories.get(method) or {}, structure_of)
            if found is not None:
                rows.append({"claim": claim, "kind": "trend", "method": method, "series": name + " (aligned rule)",
                             "rule": "aligned", **found})
            continue
        found = trend(results.get(method, ()), name)
        if found is not None:
            rows.append({"claim": claim, "kind": "trend", "method": method, "series": name, **found})
    return finish_claims(rows, aligned)


def stable_share_per_iteration(records: Sequence[Mapping[str, Any]], structure_of: Callable[[str], str]) -> np.ndarray:
    """f64[iterations]: per outer iteration, the share of its proposals `structure_of` calls stable."""
    iterations = sorted({int(r["iteration"]) for r in records})
    return np.asarray([np.mean([structure_of(str(r["text"])) == STABLE for r in records if int(r["iteration"]) == i])
                       for i in iterations], np.float64)


def _reclassified_trend(histories: Mapping[int, Sequence[Mapping[str, Any]]], structure_of) -> dict | None:
    slopes = [slope(shares) for shares in (stable_share_per_iteration(h, structure_of) for h in histories.values())
              if len(shares) >= 2]
    return stats.t_test(slopes) if len(slopes) >= 2 else None


def structure_with_aligned(text: str, names: Sequence[str], outcome_index: int, aligned: Sequence[int]) -> str:
    """The Fig. 4 class of a proposal `text` under the rule with the domain's aligned primitives
    (`derl_jax.expr.structure.structure(..., aligned=...)`); "invalid" when it does not parse or check."""
    try:
        expr = parse(text, names)
    except ExpressionError:
        return INVALID
    checked = check_compiled(expr, len(names), outcome_index=outcome_index)
    if not checked[0].ok:
        return INVALID
    return structure(expr, len(names), outcome_index, checked=checked, aligned=aligned)


def finish_claims(rows: Sequence[Mapping[str, Any]], aligned: Sequence[int] = ()) -> list[dict]:
    """Claim rows with their verdicts: the raw one from each interval, the Holm one over the
    measurable claims; the Fig. 4 claim "not measurable" where `aligned` is not empty and the row
    was not measured under the aligned rule (`"rule": "aligned"`)."""
    rows = [dict(row) for row in rows]
    for row in rows:
        if row["claim"] == STRUCTURE_CLAIM and aligned and row.get("rule") != "aligned":
            row.update(verdict=NOT_MEASURABLE, verdict_holm=NOT_MEASURABLE, p_value=None, p_holm=None,
                       note="the structure rule ignores the domain's outcome-aligned primitives "
                            + ", ".join(f"g{i + 1}" for i in aligned))
    measurable = [i for i, row in enumerate(rows) if row.get("verdict") != NOT_MEASURABLE]
    for i, adjusted in zip(measurable, stats.with_holm([rows[i] for i in measurable])):
        rows[i] = {**adjusted, "verdict": stats.verdict(adjusted)}
    return rows


def refresh(payload: Mapping[str, Any]) -> tuple[list[tuple[str, str, dict]], list[dict]]:
    """(paired rows, claim rows) of a saved results.json, recomputed with the current statistics:
    paired rows and paired claims from each seed's item scores (`per_seed[..]["test_items"]`),
    trend claims from the saved slopes' interval (its p-value recovered from it,
    `stats.p_from_interval`). The Fig. 4 claim is "not measurable" where the payload's
    `structure_rule` names aligned primitives."""
    runs = {m: [MethodResult(method=m, seed=r["seed"], expression=None, canonical=None, latex=None,
                             validation=0.0, test=0.0, budget={}, per_iteration=None, final_curves={},
                             test_items=r.get("test_items"))
                for r in rows] for m, rows in payload.get("per_seed", {}).items()}
    paired_found = paired_rows(runs)
    rows = []
    for claim, method, baseline in PAIRED_CLAIMS:
        difference = paired(runs, method, baseline)
        if difference is not None:
            rows.append({"claim": claim, "kind": "paired", "method": method, "baseline": baseline, **difference})
    for row in payload.get("claims") or ():
        if row["kind"] == "trend":
            p = row.get("p_value")
            if p is None and row.get("ci95_low") is not None:
                p = stats.p_from_interval(row["difference"], row["ci95_low"], row["ci95_high"], row["seeds"])
            rows.append({key: value for key, value in row.items() if key not in ("verdict", "verdict_holm", "p_holm")}
                        | {"p_value": p, "separated": bool(row["ci95_low"] > 0.0 or row["ci95_high"] < 0.0)})
    aligned = (payload.get("structure_rule") or {}).get("aligned_indices", ())
    return paired_found, finish_claims(rows, aligned)


def claims_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: claim, difference (points for paired claims, points per iteration for trends),
    95% Student-t interval over seeds, p-value, verdict and Holm verdict (over the claims)."""
    lines = ["| claim | measured as | difference | 95% CI (t over seeds) | p | verdict | Holm verdict |",
             "|---|---|---:|---|---:|---|---|"]
    for row in rows:
        if row["kind"] == "paired":
            what = f"{row['method']} − {row['baseline']}, test, paired over {row['seeds']} seeds x {row['items']} items"
        else:
            what = f"{row['method']}: slope of {row['series']} per iteration over {row['seeds']} seeds"
        if row.get("note"):
            lines.append(f"| {row['claim']} | {what} | - | - | - | {NOT_MEASURABLE}: {row['note']} | - |")
            continue
        p = "-" if row.get("p_value") is None else f"{row['p_value']:.3f}"
        lines.append(f"| {row['claim']} | {what} | {100 * row['difference']:+.2f} | "
                     f"[{100 * row['ci95_low']:+.2f}, {100 * row['ci95_high']:+.2f}] | {p} | {row['verdict']} | "
                     f"{row.get('verdict_holm', '-')} |")
    return "\n".join(lines) + "\n"
