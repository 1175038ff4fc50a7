"""What one (method, seed) run of the protocol produced, as saved in `method_result.json`."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

from derl_jax.outer.candidates import STRUCTURE_CLASSES

HEADLINE_RETRAINED = "retrained"  # a fresh policy trained in final mode with the chosen expression
HEADLINE_EVOLVED = "evolved"  # the policy the population search itself evolved


@dataclasses.dataclass(frozen=True)
class MethodResult:
    """One (method, seed): the chosen expression, its validation score, the test accuracies.

    test: the headline test accuracy — for population strategies (DERL-pop) the policy the
        search evolved (its last iteration's best, trained through the curriculum of rewards),
        for every other method the policy retrained from scratch in final mode. `headline`
        says which.
    retrained_test: test accuracy of the policy retrained in final mode (every method).
    evolved_policy_test: population strategies: the evolved policy's test accuracy, else None.
    test_sets: {test set: {metric: accuracy}} of the headline policy (`protocol.test_accuracies`;
        math: {"gsm8k": {"exact": .., "verify": ..}, "math": {...}}); `test` is its first
        metric on its first set. retrained_test_sets: the same for the retrained policy.
    test_items: the headline policy's score on each item of the first test set (1/0 pass, in the
        set's order; its mean is the set's accuracy), for paired comparisons between methods on
        the same items (`derl_jax.experiment.claims`); None where the evaluator gives none.
    budget: the search's candidate counters (`derl_jax.outer.search`) and inner-step totals
        (`derl_jax.outer.budget.inner_step_totals`); {} for fixed expressions.
    per_iteration (search methods): lists over outer iterations of "validation_mean",
        "validation_best", "validity_rate", "structure_shares" ([stable, unstable, invalid]),
        "best_text", "test_of_best" (each iteration's best expression retrained in final mode,
        or None without `compare.per_iteration_test`) and "candidate_test_mean" (mean test
        accuracy of the iteration's n candidate policies, invalid ones 0, or None without
        `compare.candidate_test`).
    final_repeat_tests: the chosen expression's final policy trained with each of `final.repeats`
        independent keys and tested (`derl_jax.experiment.reevaluate`); the first is
        `retrained_test`. None in results saved before repeats existed.
    reevaluated: with `final.reevaluate_top_k`, the re-evaluated protocol's choice
        (`reevaluate.reevaluated_choice`: candidates, their search and re-training scores, the
        averaged scores, the chosen "expression", its r-key "tests" and their mean "test").
    """

    method: str
    seed: int
    expression: str | None
    canonical: str | None
    latex: str | None
    validation: float
    test: float
    budget: Mapping[str, Any]
    per_iteration: Mapping[str, Any] | None
    final_curves: Mapping[str, list]
    retrained_test: float | None = None
    evolved_policy_test: float | None = None
    headline: str = HEADLINE_RETRAINED
    note: str = ""
    test_sets: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    retrained_test_sets: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    test_items: Sequence[float] | None = None
    final_repeat_tests: Sequence[float] | None = None
    reevaluated: Mapping[str, Any] | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "MethodResult":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - fields
        if unknown:
            raise ValueError(f"MethodResult.from_json: unknown fields {sorted(unknown)}")
        return cls(**dict(data))


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


def best_so_far(history: Sequence[Mapping[str, Any]]) -> list[float]:
    """f[C]: the best validation score among the first c+1 charged candidates, in the order the
    search proposed them (iteration, then index); an invalid candidate scores 0 (the ARBO paper's
    main plot: best-so-far against candidates evaluated)."""
    ordered = sorted(history, key=lambda r: (int(r["iteration"]), int(r["index"])))
    scores = [float(r["score"]) if r.get("valid", True) and r.get("score") is not None else 0.0 for r in ordered]
    return np.maximum.accumulate(np.asarray(scores, np.float64)).tolist() if scores else []


def per_iteration_summary(history: Sequence[Mapping[str, Any]]) -> dict[str, list]:
    """Per outer iteration: mean/best validation score, validity, structure shares, best text."""
    iterations = sorted({int(r["iteration"]) for r in history})
    summary: dict[str, list] = {k: [] for k in ("validation_mean", "validation_best", "validity_rate", "structure_shares", "best_text")}
    for i in iterations:
        records = [r for r in history if r["iteration"] == i]
        scores = np.array([r["score"] for r in records], np.float64)
        summary["validation_mean"].append(float(scores.mean()))
        summary["validation_best"].append(float(scores.max()))
        summary["validity_rate"].append(float(np.mean([r["valid"] for r in records])))
        summary["structure_shares"].append(structure_shares([[r["structure"] for r in records]])[0].tolist())
        valid = [r for r in records if r["valid"]]
        summary["best_text"].append(max(valid, key=lambda r: r["score"])["text"] if valid else None)
    return summary
