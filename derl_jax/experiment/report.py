"""The comparison report: `results.json`, `results.md` and the plots, from finished method results.

    payload = write_report(workdir, {method: [MethodResult per seed]})

Tables: the headline test accuracy per method (mean ± std and a Student-t 95% interval over
seeds, `derl_jax.experiment.stats`), the test accuracy of the policy retrained from scratch with each
chosen expression (the same number as the headline except for population strategies, whose
headline is the evolved policy), and the validation accuracy. Then the chosen expressions, the
search budget (candidate counts, trainings saved on duplicates, inner-step totals) and notes.
When the policies were tested on several test sets or by several metrics
(`MethodResult.test_sets`, e.g. GSM8K and MATH by exact match and math-verify: Table 1(b)),
a table with one column per test set and metric comes first, for the headline policy and,
when some method's headline is not the retrained policy, for the retrained policy too.

Units: every accuracy and accuracy difference in results.json is a fraction (0.3304, not
33.04; `"accuracy_unit": "fraction"`); results.md and the pages show them in %. Each key and
its unit is listed in docs/running.md. results.json written before `accuracy_unit` existed held
its test/validation summaries in %: `summary_percent` reads both.

Plots (`derl_jax.experiment.plots`): `outer_curves.png` in the paper's Fig. 3 layout — one panel per
search method with the mean validation score of each iteration's candidates and, when
computed, their mean test accuracy; when the retrained-best curve was computed
(`compare.per_iteration_test`) a second row of panels shows it — and `structure_<method>.png`
(Fig. 4).
"""

from __future__ import annotations

import math
import os
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from derl_jax.checkpoint import atomic_write_json, atomic_write_text
from derl_jax.experiment import claims, endpoints, plots, stats
from derl_jax.outer.candidates import STRUCTURE_CLASSES
from derl_jax.experiment.results import HEADLINE_EVOLVED, MethodResult

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
CURVES_PLOT = "outer_curves.png"
BEST_SO_FAR_PLOT = "best_so_far.png"
VALIDATION_SERIES = "validation (mean of candidates)"
CANDIDATE_TEST_SERIES = "test (mean of candidates)"
RETRAINED_SERIES = "test (best of iteration, retrained)"
ACCURACY_UNIT = "fraction"
SCALED_FIELDS = ("mean", "std", "ci95_low", "ci95_high")


def as_fraction(summary: Mapping[str, Any]) -> dict:
    """A `stats.summarize` summary of values in % with its mean, std and interval as fractions."""
    return {k: (v / 100.0 if k in SCALED_FIELDS and v is not None else v) for k, v in summary.items()}


def summary_percent(summary: Mapping[str, Any], payload: Mapping[str, Any]) -> dict:
    """A summary of `payload` (a results.json) in %: scaled when the payload keeps fractions."""
    if payload.get("accuracy_unit") != ACCURACY_UNIT:
        return dict(summary)  # written before accuracy_unit: already in %
    return {k: (100.0 * v if k in SCALED_FIELDS and v is not None else v) for k, v in summary.items()}


def write_report(workdir: str, results: Mapping[str, Sequence[MethodResult]], *, base_test: float | None = None,
                 best_so_far: Mapping[str, Sequence[Sequence[float]]] | None = None,
                 aligned: Sequence[int] = (), histories: Mapping[str, Mapping[int, Sequence[Mapping]]] | None = None,
                 classify: Callable[[str], str | None] | None = None,
                 structure_of: Callable[[str], str] | None = None) -> dict:
    """results.json, results.md and the plots in `workdir`; returns the results.json content.
    `base_test`: the base policy's test accuracy (before RL), reported beside the methods.
    `best_so_far`: per search method, per seed, the best validation score after each charged
    candidate (`results.best_so_far`): plotted against candidates evaluated (`best_so_far.png`).
    `aligned`: the domain's outcome-aligned primitives (`Domain.aligned_indices`), recorded as
    results.json's "structure_rule"; where there are some the Fig. 4 claim is not measurable
    (`claims.claim_rows`). `histories` ({method: {seed: history.jsonl records}}) and `classify`
    (`Domain.reward_class`, None where the domain has no classes) feed the endpoints E1-E3
    (`derl_jax.experiment.endpoints`); with `structure_of` (`claims.structure_with_aligned` for the
    domain) the Fig. 4 claim reads the histories' proposals under the aligned rule."""
    workdir = os.fspath(workdir)
    pct = lambda field: {m: [100.0 * _value(r, field) for r in rs] for m, rs in results.items()}  # noqa: E731
    test_md, test_summary = stats.results_table(pct("test"), column="test accuracy (%)", clip=(0.0, 100.0))
    retrained_md, retrained_summary = stats.results_table(pct("retrained_test"), column="test accuracy (%)", clip=(0.0, 100.0))
    val_md, val_summary = stats.results_table(pct("validation"), column="validation accuracy (%)", clip=(0.0, 100.0))

    curves, retrained_curves, figures = {}, {}, {}
    for method, rs in results.items():
        if any(r.per_iteration is None for r in rs):
            continue
        series = {VALIDATION_SERIES: _ragged([r.per_iteration["validation_mean"] for r in rs])}
        candidate_tests = _complete([r.per_iteration.get("candidate_test_mean") for r in rs])
        if candidate_tests is not None:
            series[CANDIDATE_TEST_SERIES] = candidate_tests
        curves[method] = series
        best_tests = _complete([r.per_iteration.get("test_of_best") for r in rs])
        if best_tests is not None:
            retrained_curves[method] = {RETRAINED_SERIES: best_tests}
        shares = np.nanmean(_ragged_shares([r.per_iteration["structure_shares"] for r in rs]), axis=0)
        figures[f"structure_{method}"] = plots.plot_structure_shares(
            shares, os.path.join(workdir, f"structure_{method}.png"), title=f"{method}: reward structures"
        )
    if curves:
        panels = dict(curves)
        panels.update({f"{m}: best retrained": c for m, c in retrained_curves.items()})
        figures["outer_curves"] = plots.plot_outer_curves(
            panels, os.path.join(workdir, CURVES_PLOT), ylabel="accuracy", columns=len(curves)
        )

    best_curves = {m: _ragged(runs) for m, runs in (best_so_far or {}).items() if runs and all(len(r) for r in runs)}
    if best_curves:
        figures["best_so_far"] = plots.plot_outer_curves(
            {"": best_curves}, os.path.join(workdir, BEST_SO_FAR_PLOT), xlabel="candidates evaluated",
            ylabel="best validation score so far")

    paired = claims.paired_rows(results)
    claim_rows = claims.claim_rows(results, aligned=aligned, histories=histories, structure_of=structure_of)
    derl_minus_random = claims.iteration_difference(results)
    set_md, set_summary = test_set_table(results, "test_sets")
    retrained_set_md, retrained_set_summary = test_set_table(results, "retrained_test_sets")
    fraction = lambda summaries: {m: as_fraction(s) for m, s in summaries.items()}  # noqa: E731
    nested = lambda summaries: {m: {t: fraction(ms) for t, ms in sets.items()} for m, sets in summaries.items()}  # noqa: E731
    payload = {
        "accuracy_unit": ACCURACY_UNIT,
        "methods": list(results),
        "base_policy_test": base_test,
        "test_sets": nested(set_summary),
        "retrained_test_sets": nested(retrained_set_summary),
        "test": fraction(test_summary),
        "retrained_test": fraction(retrained_summary),
        "validation": fraction(val_summary),
        "paired": [{"method": m, "baseline": b, **d} for m, b, d in paired],
        "claims": claim_rows,
        "endpoints": endpoints.endpoint_rows(results, histories, classify),
        "protocols": {m: {k: v if k == "keys" else as_fraction(v) for k, v in row.items()}
                      for m, row in protocol_summary(results).items()},
        "structure_rule": {"aligned_indices": [int(i) for i in aligned]},
        "derl_minus_random_per_iteration": derl_minus_random,
        "headline": {m: sorted({r.headline for r in rs}) for m, rs in results.items()},
        "per_seed": {m: [_seed_row(r) for r in rs] for m, rs in results.items()},
        "budget": {m: [dict(r.budget) for r in rs] for m, rs in results.items()},
        "curves": {m: {k: v.tolist() for k, v in s.items()} for m, s in curves.items()},
        "retrained_curves": {m: {k: v.tolist() for k, v in s.items()} for m, s in retrained_curves.items()},
        "plots": {k: os.path.basename(v) for k, v in figures.items()},
        "best_so_far": {m: {"mean": band[0].tolist(), "std": band[1].tolist()}
                        for m, band in ((m, plots.curve_band(v)) for m, v in best_curves.items())},
    }
    atomic_write_json(os.path.join(workdir, RESULTS_JSON), _json_safe(payload))
    markdown = _markdown(results, test_md, retrained_md, val_md, payload, figures, paired)
    if set_md:
        tables = ["## Test accuracy by test set and metric (headline policy)", "", set_md]
        if any(r.headline == HEADLINE_EVOLVED for rs in results.values() for r in rs):
            tables += ["## Test accuracy by test set and metric (policy retrained from scratch)", "", retrained_set_md]
        title, _, rest = markdown.partition("\n\n")
        markdown = "\n\n".join([title, "\n".join(tables), rest])
    atomic_write_text(os.path.join(workdir, RESULTS_MD), markdown)
    return payload


def test_set_table(results: Mapping[str, Sequence[MethodResult]], field: str) -> tuple[str, dict]:
    """(Markdown, {method: {set: {metric: summary}}}) of `field` ("test_sets" or
    "retrained_test_sets"), in %: one column per (test set, metric) in first-seen order.
    Empty when some result lacks the field or there is one set with one metric."""
    rows = {m: [getattr(r, field) for r in rs] for m, rs in results.items()}
    if not rows or any(not t for ts in rows.values() for t in ts):
        return "", {}
    columns = []
    for t in (t for ts in rows.values() for t in ts):
        columns += [(name, metric) for name, metrics in t.items() for metric in metrics if (name, metric) not in columns]
    if len(columns) < 2:
        return "", {}
    summary: dict = {}
    lines = ["| method | seeds | " + " | ".join(f"{name} {metric} (%)" for name, metric in columns) + " |",
             "|---|---:|" + "---:|" * len(columns)]
    for method, ts in rows.items():
        cells = []
        for name, metric in columns:
            values = [100.0 * t[name][metric] for t in ts if metric in t.get(name, {})]
            if not values:
                cells.append("-")
                continue
            stat = stats.summarize(values, clip=(0.0, 100.0))
            summary.setdefault(method, {}).setdefault(name, {})[metric] = stat
            cells.append(f"{stat['mean']:.2f} ± {stat['std']:.2f}" + ("" if stat["ci_defined"] else "*"))
        lines.append(f"| {method} | {len(ts)} | " + " | ".join(cells) + " |")
    if any(len(ts) == 1 for ts in rows.values()):
        lines += ["", "\\* single seed: no spread."]
    return "\n".join(lines) + "\n", summary


def _value(r: MethodResult, field: str) -> float:
    value = getattr(r, field)
    return r.test if value is None else value  # results saved before `retrained_test` existed


def _seed_row(r: MethodResult) -> dict:
    return {
        "seed": r.seed,
        "expression": r.expression,
        "canonical": r.canonical,
        "latex": r.latex,
        "validation": r.validation,
        "test": r.test,
        "headline": r.headline,
        "retrained_test": r.retrained_test,
        "evolved_policy_test": r.evolved_policy_test,
        "test_sets": r.test_sets,
        "retrained_test_sets": r.retrained_test_sets,
        "note": r.note,
        "test_items": None if r.test_items is None else [_compact(v) for v in r.test_items],
        "final_repeat_tests": None if r.final_repeat_tests is None else list(r.final_repeat_tests),
        "reevaluated": r.reevaluated,
    }


def _compact(value: float) -> float | int:
    """0.0 / 1.0 as 0 / 1 (per-item pass scores make up most of results.json)."""
    return int(value) if float(value).is_integer() else float(value)


def _complete(rows: Sequence[Sequence[float | None] | None]) -> np.ndarray | None:
    """f64[S, I] of per-seed curves when every seed has one and every iteration a value in some seed."""
    if not rows or any(row is None for row in rows):
        return None
    values = _ragged(rows)
    return values if np.all(np.isfinite(values).any(axis=0)) else None


def _ragged(rows: Sequence[Sequence[float | None]]) -> np.ndarray:
    """f64[S, I] with NaN where a seed has no value (None or a shorter run)."""
    width = max(len(row) for row in rows)
    out = np.full((len(rows), width), np.nan)
    for s, row in enumerate(rows):
        out[s, : len(row)] = [np.nan if v is None else float(v) for v in row]
    return out


def _ragged_shares(rows: Sequence[Sequence[Sequence[float]]]) -> np.ndarray:
    width = max(len(row) for row in rows)
    out = np.full((len(rows), width, len(STRUCTURE_CLASSES)), np.nan)
    for s, row in enumerate(rows):
        out[s, : len(row)] = np.asarray(row, np.float64)
    return out


def _json_safe(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (np.floating, np.integer)):
        return _json_safe(value.item())
    return value


def _markdown(results, test_md: str, retrained_md: str, val_md: str, payload: Mapping, figures: Mapping[str, str],
              paired: Sequence[tuple[str, str, dict]]) -> str:
    evolved = sorted({m for m, rs in results.items() for r in rs if r.headline == HEADLINE_EVOLVED})
    headline = "the policy retrained from scratch with the chosen expression on the full training set"
    if evolved:
        headline += f"; for {', '.join(evolved)} the policy the population search evolved"
    lines = ["# DERL comparison", ""]
    if payload["claims"]:
        lines += ["## The paper's claims on this compare", "",
                  "Separated: the 95% Student-t interval over seeds excludes 0 in the claim's direction; reversed: "
                  "it excludes 0 the other way. The Holm verdict adjusts the p-values over this table's claims.", "",
                  claims.claims_table(payload["claims"])]
    if payload.get("endpoints"):
        lines += ["## Endpoints fixed before the runs (DERL − random search; the shuffled-feedback control)", "",
                  endpoints.endpoints_table(payload["endpoints"])]
    lines += protocol_lines(payload)
    lines += [f"## Test accuracy (headline: {headline})", "", test_md]
    if payload.get("base_policy_test") is not None:
        lines += [f"Base policy (before RL): {100 * payload['base_policy_test']:.2f}% test accuracy.", ""]
    if paired:
        lines += ["## Paired differences (same seeds, same base policy, same test items)", "",
                  "Method minus baseline in test accuracy points. The verdict reads the Student-t interval over "
                  "the per-seed paired differences (\"separated\" only when it excludes 0); the two-way bootstrap "
                  "over seeds and items is shown beside it; the Holm verdict adjusts the p-values over the table's "
                  "rows.", "", stats.difference_table(paired)]
    lines += _iteration_difference_lines(payload.get("derl_minus_random_per_iteration"))
    lines += ["## Test accuracy of the policy retrained from scratch (every method)", "", retrained_md]
    lines += ["## Validation accuracy (search score; fixed baselines: one inner training)", "", val_md]
    lines += ["## Chosen expressions", "",
              "| method | seed | expression | canonical | validation (%) | test (%) | retrained test (%) |",
              "|---|---:|---|---|---:|---:|---:|"]
    for method, rs in results.items():
        for r in rs:
            lines.append(
                f"| {method} | {r.seed} | `{r.expression}` | `{r.canonical}` | {100 * r.validation:.2f} | "
                f"{100 * r.test:.2f} | {100 * _value(r, 'retrained_test'):.2f} |"
            )
    lines += _best_so_far_lines(payload.get("best_so_far") or {})
    budgets = [(m, r) for m, rs in results.items() for r in rs if r.budget]
    if budgets:
        lines += ["", "## Search budget", "",
                  "Candidates: proposals charged / inner trainings run / trainings saved on duplicates. Inner steps: "
                  "per candidate, over the whole search, and behind the headline policy (population strategies: its "
                  "lineage) and the retrained one.", "",
                  "| method | seed | charged | trained | saved | steps/candidate | search steps | headline policy steps | retrained policy steps |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for m, r in budgets:
            b = r.budget
            cells = [b.get(k, "-") for k in ("candidates_charged", "candidates_trained", "candidates_shared",
                                             "inner_steps_per_candidate", "search_inner_steps",
                                             "reported_policy_inner_steps", "retrained_policy_inner_steps")]
            lines.append(f"| {m} | {r.seed} | " + " | ".join(str(c) for c in cells) + " |")
    notes = [f"- {m}, seed {r.seed}: {r.note}" for m, rs in results.items() for r in rs if r.note]
    if notes:
        lines += ["", "## Notes", ""] + notes
    lines += ["", "## Plots", ""]
    for name, path in figures.items():
        lines.append(f"- `{os.path.basename(path)}`" + (f": {_curve_text(payload)}" if name == "outer_curves" else ""))
    return "\n".join(lines) + "\n"


def protocol_summary(results: Mapping[str, Sequence[MethodResult]]) -> dict:
    """Per method, the paper's protocol and the re-evaluated one side by side, each a
    `stats.summarize` over seeds in % (results.json keeps them as fractions): "paper" (the first
    key's retrained test), "repeated" (the mean over `final.repeats` keys, with "keys"),
    "reevaluated" (the re-evaluated choice's r-key mean); a column is left out where no seed has
    it, a method with the paper column alone is left out."""
    out: dict = {}
    for method, runs in results.items():
        columns = {"paper": [100.0 * _value(r, "retrained_test") for r in runs]}
        if all(r.final_repeat_tests for r in runs) and any(len(r.final_repeat_tests) > 1 for r in runs):
            columns["repeated"] = [100.0 * float(np.mean(r.final_repeat_tests)) for r in runs]
            columns["keys"] = sorted({len(r.final_repeat_tests) for r in runs})
        if runs and all(r.reevaluated for r in runs):
            columns["reevaluated"] = [100.0 * float(r.reevaluated["test"]) for r in runs]
        if len(columns) > 1:
            out[method] = {k: v if k == "keys" else stats.summarize(v, clip=(0.0, 100.0)) for k, v in columns.items()}
    return out


def protocol_lines(payload: Mapping[str, Any]) -> list[str]:
    """The paper's protocol beside the repeated and re-evaluated ones (retrained policies, %), from
    a results.json's "protocols"."""
    protocols = payload.get("protocols") or {}
    if not protocols:
        return []
    pct = lambda summary: stats.format_summary(summary_percent(summary, payload))  # noqa: E731
    lines = ["## The paper's protocol and the re-evaluated one (retrained policy's test, %)", "",
             "Paper: the choice by one validation score, its final policy trained with one key. Repeated: the same "
             "choice, final test averaged over `final.repeats` keys. Re-evaluated: the top candidates re-trained "
             "before the choice (`final.reevaluate_top_k`, charged as candidates), final test over the same keys.", "",
             "| method | paper | repeated (keys) | re-evaluated |", "|---|---|---|---|"]
    for method, row in protocols.items():
        cells = [pct(row["paper"])]
        cells.append(f"{pct(row['repeated'])} ({'/'.join(map(str, row['keys']))})" if "repeated" in row else "-")
        cells.append(pct(row["reevaluated"]) if "reevaluated" in row else "-")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines + [""]


def _iteration_difference_lines(difference: Mapping[str, Sequence[float]] | None) -> list[str]:
    """derl − random in each iteration's mean candidate validation score, with its interval."""
    if not difference:
        return []
    lines = ["## derl − random: mean validation score of each iteration's candidates (points, paired by seed)", "",
             "| iteration | difference | 95% CI |", "|---:|---:|---|"]
    for i, (mean, low, high) in enumerate(zip(difference["mean"], difference["ci95_low"], difference["ci95_high"])):
        lines.append(f"| {i + 1} | {100 * mean:+.2f} | [{100 * low:+.2f}, {100 * high:+.2f}] |")
    return lines + ["", f"Over {difference['seeds']} seeds.", ""]


def _best_so_far_lines(curves: Mapping[str, Mapping[str, Sequence[float]]]) -> list[str]:
    """A table of the best validation score so far (mean ± std over seeds, %) after a quarter, half,
    three quarters and all of the longest search's candidates."""
    if not curves:
        return []
    longest = max(len(c["mean"]) for c in curves.values())
    marks = sorted({max(1, round(longest * q)) for q in (0.25, 0.5, 0.75, 1.0)})
    lines = ["", "## Best validation score so far against candidates evaluated (%, mean ± std over seeds)", "",
             "| method | " + " | ".join(f"{c} candidates" for c in marks) + " |", "|---|" + "---:|" * len(marks)]
    for method, curve in curves.items():
        cells = [f"{100 * curve['mean'][c - 1]:.2f} ± {100 * curve['std'][c - 1]:.2f}" if c <= len(curve["mean"]) else "-"
                 for c in marks]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def _curve_text(payload: Mapping) -> str:
    parts = ["validation: mean score of each iteration's candidates (invalid ones 0)"]
    if any(CANDIDATE_TEST_SERIES in c for c in payload["curves"].values()):
        parts.append("test: mean test accuracy of the same candidate policies, tested after the search")
    else:
        parts.append("candidate test curve not computed (set config.compare.candidate_test=True)")
    if payload["retrained_curves"]:
        parts.append("second row: each iteration's best expression retrained in final mode and tested")
    return "; ".join(parts)


LEVELS_MD = "results_levels.md"
LEVELS_JSON = "results_levels.json"


def write_levels_report(workdir: str, payloads: Mapping[str, Mapping[str, Any]]) -> str:
    """`results_levels.md` / `.json` in `workdir` from one compare per generalisation level
    ({level: results.json content}), in the layout of the paper's Table 1(a): one row per method,
    one column per level, headline test accuracy mean ± std [95% interval] over seeds, the base
    policy's accuracy as the first row. Returns the Markdown."""
    levels = list(payloads)
    methods = list(dict.fromkeys(m for p in payloads.values() for m in p["methods"]))
    lines = ["| method | " + " | ".join(levels) + " |", "|---|" + "---|" * len(levels)]
    base = [payloads[level].get("base_policy_test") for level in levels]
    if any(b is not None for b in base):
        lines.append("| base policy (before RL) | " + " | ".join("-" if b is None else f"{100 * b:.2f}" for b in base) + " |")
    for method in methods:
        cells = [stats.format_summary(summary_percent(payloads[level]["test"][method], payloads[level]))
                 if method in payloads[level]["test"] else "-" for level in levels]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    seeds = sorted({len(rows) for p in payloads.values() for rows in p["per_seed"].values()})
    markdown = "\n".join(["# Test accuracy (%) per generalisation level", "",
                          f"Headline test accuracy, mean ± std [95% t-interval] over {'/'.join(map(str, seeds))} seeds.",
                          "", *lines]) + "\n"
    atomic_write_text(os.path.join(workdir, LEVELS_MD), markdown)
    atomic_write_json(os.path.join(workdir, LEVELS_JSON), _json_safe(
        {"accuracy_unit": ACCURACY_UNIT, "levels": levels, "base_policy_test": dict(zip(levels, base)),
         "test": {level: {m: as_fraction(summary_percent(s, payloads[level])) for m, s in payloads[level]["test"].items()}
                  for level in levels}}))
    return markdown
