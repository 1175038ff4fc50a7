"""Endpoints fixed before the runs: what a compare must show for DERL over random search.

    rows = endpoint_rows(results, histories, reward_class)   # DERL − random, then the shuffled-feedback control

* **E1** — the share of seeds whose chosen reward is top-class (`Domain.reward_class(text) ==
  "top"`), DERL against random search paired by seed, with an exact McNemar test: under the
  null the discordant seeds (one method top, the other not) split 50:50, so the two-sided
  p-value is `scipy.stats.binomtest(b, b + c, 0.5)` with b seeds DERL-only, c random-only.
  Not measurable where the domain has no classifier.
* **E2** — the final test accuracy averaged over `final.repeats` retrainings with independent
  keys (`MethodResult.final_repeat_tests`; one key: the retrained test), DERL − random paired
  by seed, Student-t over the per-seed differences (`stats.t_test`).
* **E3** — the slope over outer iterations of the share of top or partial proposals (each
  iteration's history records, classified by `reward_class`), DERL − random per seed, paired
  t over the per-seed slope differences. Not measurable without a classifier or histories.

Each row: {"endpoint", "measured_as", "difference", "ci95_low", "ci95_high", "p_value",
"verdict", "seeds", ...} or {"endpoint", "verdict": "not measurable", "note"}.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from derl_jax.experiment import stats
from derl_jax.experiment.claims import slope
from derl_jax.experiment.results import MethodResult

TOP, PARTIAL = "top", "partial"
# DERL against random search; then the control: DERL updated on shuffled validation scores (`derl_shuffled`)
# must do no better than random search, and no better than DERL, if the feedback is what helps
ENDPOINT_PAIRS = (("derl", "random"), ("derl_shuffled", "random"), ("derl", "derl_shuffled"))
Classify = Callable[[str], "str | None"]
Histories = Mapping[str, Mapping[int, Sequence[Mapping[str, Any]]]]


def _not_measurable(endpoint: str, note: str) -> dict:
    return {"endpoint": endpoint, "verdict": stats.NOT_MEASURABLE, "note": note}


def _common_seeds(results: Mapping[str, Sequence[MethodResult]], method: str, baseline: str) -> list[int]:
    return sorted({r.seed for r in results.get(method, ())} & {r.seed for r in results.get(baseline, ())})


def mcnemar_exact(first: Sequence[bool], second: Sequence[bool]) -> dict:
    """Paired binary outcomes: {"first_only": b, "second_only": c, "p_value"} with the exact
    McNemar p (`binomtest(b, b + c, 0.5)`, two-sided; 1 when there is no discordant pair)."""
    first, second = np.asarray(first, bool), np.asarray(second, bool)
    if first.shape != second.shape:
        raise ValueError(f"mcnemar_exact: {first.shape} and {second.shape} outcomes are not paired")
    b, c = int(np.sum(first & ~second)), int(np.sum(~first & second))
    p = 1.0 if b + c == 0 else float(stats.scipy_stats().binomtest(b, b + c, 0.5).pvalue)
    return {"first_only": b, "second_only": c, "p_value": p}


def e1_top_share(results: Mapping[str, Sequence[MethodResult]], classify: Classify | None,
                 method: str = "derl", baseline: str = "random") -> dict:
    """E1 (module docstring): shares of seeds with a top-class chosen reward and McNemar's p."""
    name = "E1: share of seeds whose chosen reward is top-class"
    if classify is None:
        return _not_measurable(name, "the domain declares no reward classes")
    seeds = _common_seeds(results, method, baseline)
    if not seeds:
        return _not_measurable(name, f"no common seeds of {method} and {baseline}")
    chosen = {m: {r.seed: r.expression for r in results[m]} for m in (method, baseline)}
    top = {m: [chosen[m][s] is not None and classify(chosen[m][s]) == TOP for s in seeds] for m in (method, baseline)}
    test = mcnemar_exact(top[method], top[baseline])
    difference = float(np.mean(top[method]) - np.mean(top[baseline]))
    separated = test["p_value"] < stats.ALPHA
    return {"endpoint": name, "measured_as": f"{method} − {baseline}, paired by seed, exact McNemar",
            "difference": difference, "share": float(np.mean(top[method])), "baseline_share": float(np.mean(top[baseline])),
            **test, "seeds": len(seeds), "separated": separated,
            "verdict": stats.verdict({"difference": difference, "separated": separated})}


def repeated_test(run: MethodResult) -> float:
    """The final test averaged over its retrainings with independent keys (one: `retrained_test`)."""
    repeats = getattr(run, "final_repeat_tests", None)
    if repeats:
        return float(np.mean(repeats))
    return float(run.test if run.retrained_test is None else run.retrained_test)


def e2_repeated_final(results: Mapping[str, Sequence[MethodResult]], method: str = "derl",
                      baseline: str = "random") -> dict:
    """E2 (module docstring): the r-key final test, paired over seeds."""
    name = "E2: final test averaged over independent retraining keys"
    seeds = _common_seeds(results, method, baseline)
    if len(seeds) < 2:
        return _not_measurable(name, f"fewer than two common seeds of {method} and {baseline}")
    by_seed = {m: {r.seed: repeated_test(r) for r in results[m]} for m in (method, baseline)}
    keys = sorted({len(getattr(r, "final_repeat_tests", None) or [0]) for m in (method, baseline) for r in results[m]})
    found = stats.t_test([by_seed[method][s] - by_seed[baseline][s] for s in seeds])
    return {"endpoint": name, "measured_as": f"{method} − {baseline}, {'/'.join(map(str, keys))} key{'s' if keys != [1] else ''} per seed, "
            "Student-t over seeds", **found, "verdict": stats.verdict(found)}


def aligned_share_per_iteration(records: Sequence[Mapping[str, Any]], classify: Classify) -> np.ndarray:
    """f64[iterations]: per outer iteration, the share of its proposals whose class is top or partial."""
    iterations = sorted({int(r["iteration"]) for r in records})
    shares = []
    for i in iterations:
        group = [r for r in records if int(r["iteration"]) == i]
        shares.append(np.mean([classify(str(r["text"])) in (TOP, PARTIAL) for r in group]))
    return np.asarray(shares, np.float64)


def e3_share_slope(histories: Histories | None, classify: Classify | None, method: str = "derl",
                   baseline: str = "random") -> dict:
    """E3 (module docstring): per-seed slope difference of the top-or-partial share, paired t."""
    name = "E3: slope of the share of top or partial proposals per iteration"
    if classify is None:
        return _not_measurable(name, "the domain declares no reward classes")
    if not histories or method not in histories or baseline not in histories:
        return _not_measurable(name, f"no search histories of {method} and {baseline}")
    seeds = sorted(set(histories[method]) & set(histories[baseline]))
    differences = []
    for seed in seeds:
        a = aligned_share_per_iteration(histories[method][seed], classify)
        b = aligned_share_per_iteration(histories[baseline][seed], classify)
        if len(a) >= 2 and len(b) >= 2:
            differences.append(slope(a) - slope(b))
    if len(differences) < 2:
        return _not_measurable(name, "fewer than two seeds with two iterations each")
    found = stats.t_test(differences)
    return {"endpoint": name, "measured_as": f"{method} − {baseline}, share per iteration, Student-t over seeds",
            **found, "verdict": stats.verdict(found)}


def endpoint_rows(results: Mapping[str, Sequence[MethodResult]], histories: Histories | None = None,
                  classify: Classify | None = None,
                  pairs: Sequence[tuple[str, str]] = ENDPOINT_PAIRS) -> list[dict]:
    """E1, E2, E3 of each (method, baseline) of `pairs` that both ran, in that order; [] when none did."""
    rows = []
    for method, baseline in pairs:
        if method in results and baseline in results:
            rows += [e1_top_share(results, classify, method, baseline), e2_repeated_final(results, method, baseline),
                     e3_share_slope(histories, classify, method, baseline)]
    return rows


def endpoints_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Markdown: endpoint, measured as, difference (points; E1: share of seeds), 95% interval, p,
    verdict, and the verdict after Holm's adjustment over the table's measured rows."""
    lines = ["| endpoint | measured as | difference | 95% CI | p | verdict | Holm verdict |",
             "|---|---|---:|---|---:|---|---|"]
    measured = [i for i, row in enumerate(rows) if row["verdict"] != stats.NOT_MEASURABLE]
    adjusted = dict(zip(measured, stats.with_holm([rows[i] for i in measured])))
    for i, row in enumerate(rows):
        row = adjusted.get(i, row)
        if row["verdict"] == stats.NOT_MEASURABLE:
            lines.append(f"| {row['endpoint']} | - | - | - | - | not measurable: {row['note']} | - |")
            continue
        interval = (f"[{100 * row['ci95_low']:+.2f}, {100 * row['ci95_high']:+.2f}]" if "ci95_low" in row
                    else f"{row['first_only']} vs {row['second_only']} discordant seeds")
        lines.append(f"| {row['endpoint']} | {row['measured_as']} | {100 * row['difference']:+.2f} | {interval} | "
                     f"{row['p_value']:.3f} | {row['verdict']} | {row['verdict_holm']} |")
    return "\n".join(lines) + "\n"
