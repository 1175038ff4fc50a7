"""One outer iteration's candidates: check the proposals, train each distinct reward once, score.

    outcome = evaluate_iteration(iteration, texts, evaluator, ...)
    outcome.records      n `CandidateRecord`s, what the strategy's update receives
    outcome.history      n JSON-able history records (`history.jsonl`)

Each text is read once (`derl_jax.expr.examine`: parsed, compiled, checked on probe points —
primitive count, finite, non-constant — and classified); the reason of a rejection is kept,
and the program the check ran is the one the inner loop trains with. ONE
`evaluator.evaluate_candidates` call trains a policy per valid expression (their programs
stacked along K) and scores it on the validation split. Invalid candidates cost no training
and score 0 but stay in the group.

Duplicates: with common random numbers every candidate of a call trains with the same key,
so two candidates with the same canonical form train identical policies. With
`share_duplicates=True` each canonical form is trained once; its score, curves and policy are
copied to the later candidates with that form, whose records name it in `duplicate_of`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from derl_jax.domains.base import TokenDataset
from derl_jax.rl.evaluator import CandidateEvaluator
from derl_jax.expr.candidate import Candidate, examine
from derl_jax.expr.program import stack_programs
from derl_jax.expr.structure import STRUCTURES
from derl_jax.outer.strategy import CandidateRecord

STRUCTURE_CLASSES = STRUCTURES


def training_plan(candidates: Sequence[Candidate], share_duplicates: bool) -> tuple[list[int], dict[int, int]]:
    """(indices to train, in order; candidate index -> index of the candidate whose training it
    shares, for the duplicates). Without sharing every valid candidate trains."""
    trained: list[int] = []
    duplicate_of: dict[int, int] = {}
    first_with: dict[str, int] = {}
    for j, candidate in enumerate(candidates):
        if not candidate.valid:
            continue
        if share_duplicates and candidate.canonical in first_with:
            duplicate_of[j] = first_with[candidate.canonical]
            continue
        first_with.setdefault(candidate.canonical, j)
        trained.append(j)
    return trained, duplicate_of


@dataclasses.dataclass(frozen=True)
class IterationOutcome:
    """What one iteration produced.

    records: n CandidateRecords; history: n JSON-able history records.
    trained: candidate indices that were trained, in the order of `params`' leading axis.
    params: the trained policies stacked along K = len(trained) (None when nothing trained or
        the evaluator returned none). best_params: the policy of the best finite score, or None.
    """

    records: list[CandidateRecord]
    history: list[dict]
    trained: list[int]
    params: Any = None
    best_params: Any = None

    @property
    def scores(self) -> np.ndarray:
        """f32[n], invalid and non-finite ones 0."""
        return np.array([r.score for r in self.records], np.float32)

    def policy_row(self, index: int) -> int | None:
        """Row of `params` holding candidate `index`'s policy (its original's for a duplicate)."""
        record = self.records[index]
        source = record.duplicate_of if record.duplicate_of is not None else index
        return self.trained.index(source) if source in self.trained else None


def select(tree: Any, index: int) -> Any:
    """Entry `index` of every leaf's leading axis."""
    return jax.tree_util.tree_map(lambda leaf: leaf[index], tree)


def host_results(results: Any, count: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Validated host copies of `results.scores` f32[K] and `results.curves` name -> f32[K, ...]."""
    scores = np.asarray(results.scores, np.float32)
    if scores.shape != (count,):
        raise ValueError(f"evaluate_candidates: expected scores of shape ({count},), got {scores.shape}")
    curves = {}
    for name, values in dict(results.curves).items():
        values = np.asarray(values, np.float32)
        if values.ndim < 1 or values.shape[0] != count:
            raise ValueError(f"evaluate_candidates: curve {name!r} has shape {values.shape}, expected a leading axis {count}")
        curves[str(name)] = values
    return scores, curves


def evaluate_iteration(
    iteration: int,
    texts: Sequence[str],
    evaluator: CandidateEvaluator,
    train_set: TokenDataset,
    val_set: TokenDataset,
    primitive_names: Sequence[str],
    key: jax.Array,
    init_params: Any,
    *,
    method: str,
    outcome_index: int = 0,
    share_duplicates: bool = False,
    evaluate_kwargs: Mapping[str, Any] | None = None,
    operators: str = "extended",
) -> IterationOutcome:
    """Check, train and score the n `texts` of `iteration` (module docstring).

    operators: the operator set a valid text keeps to (`derl_jax.expr.parse.OPERATOR_SETS`).
    key: the iteration's evaluation key; init_params: the policy every candidate starts from.
    evaluate_kwargs: extra keyword arguments of `evaluate_candidates` (e.g. `steps`).
    """
    n = len(texts)
    candidates = [examine(text, primitive_names, outcome_index, operators) for text in texts]
    trained, duplicate_of = training_plan(candidates, share_duplicates)
    scores = np.zeros(n, np.float32)
    reasons: list[str | None] = [c.reason or None for c in candidates]
    rows: dict[int, dict[str, np.ndarray]] = {}
    params = best_params = None
    if trained:
        programs = stack_programs([candidates[j].program for j in trained])
        results = evaluator.evaluate_candidates(programs, init_params, key, train_set, val_set, **dict(evaluate_kwargs or {}))
        trained_scores, curves = host_results(results, len(trained))
        for k, j in enumerate(trained):
            rows[j] = {name: values[k] for name, values in curves.items()}
            if math.isfinite(float(trained_scores[k])):
                scores[j] = trained_scores[k]
            else:
                reasons[j] = "non-finite validation score"
        params = results.params
        finite = np.isfinite(trained_scores)
        if params is not None and finite.any():
            best_params = select(params, int(np.argmax(np.where(finite, trained_scores, -np.inf))))
    for j, source in duplicate_of.items():
        scores[j], reasons[j], rows[j] = scores[source], reasons[source], rows[source]

    records, history = [], []
    for j, candidate in enumerate(candidates):
        curves_j = rows.get(j, {})
        record = CandidateRecord(
            iteration=iteration, index=j, text=candidate.text, canonical=candidate.canonical,
            valid=candidate.valid, reason=reasons[j], score=float(scores[j]), curves=curves_j,
            duplicate_of=duplicate_of.get(j),
        )
        records.append(record)
        history.append(history_record(record, method=method, trained=j in trained, structure=candidate.structure))
    return IterationOutcome(records, history, trained, params, best_params)


def history_record(record: CandidateRecord, *, method: str, trained: bool, structure: str) -> dict:
    """The JSON line of one candidate in `history.jsonl`."""
    final, full = {}, {}
    for name, row in record.curves.items():
        row = np.asarray(row)
        full[name] = row.tolist()
        last = float(row.reshape(-1)[-1]) if row.size else float("nan")
        final[name] = last if math.isfinite(last) else None
    return {
        "iteration": record.iteration,
        "index": record.index,
        "method": method,
        "text": record.text,
        "canonical": record.canonical,
        "valid": record.valid,
        "trained": trained,
        "duplicate_of": record.duplicate_of,
        "reason": record.reason or "",
        "structure": structure,
        "score": record.score,
        "final": final,
        "curves": full,
    }


def iteration_metrics(records: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Scores, validity and structure shares of one iteration's history records."""
    scores = np.array([r["score"] for r in records], np.float64)
    valid = np.array([r["valid"] for r in records], bool)
    metrics: dict[str, float | None] = {
        "score_mean": float(scores.mean()),
        "score_max": float(scores.max()),
        "score_mean_valid": float(scores[valid].mean()) if valid.any() else None,
        "validity_rate": float(valid.mean()),
        "distinct_canonical": float(len({r["canonical"] for r in records if r["valid"]})),
    }
    for name in STRUCTURE_CLASSES:
        metrics[f"share_{name}"] = float(np.mean([r["structure"] == name for r in records]))
    return metrics
