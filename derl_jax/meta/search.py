"""The outer loop: propose reward expressions, train and score them, update the strategy.

    result = search(strategy, evaluator, inner_train, validation, primitive_names, cfg,
                    workdir, key, init_params=base_params)

One outer iteration:

  1. `strategy.propose(state, key_i, n)` -> n expression texts (`n = cfg.outer.num_candidates`).
  2. Each text is checked (`derl_jax.expr.check_text`: parse, primitive count, finite and
     non-constant on probe points) and compiled; the reason of a rejection is kept.
  3. ONE `evaluator.evaluate_candidates` call trains a policy per valid expression (their
     programs stacked along K) from `init_params` and scores it on the validation split.
     Invalid candidates cost no training and score 0 but stay in the group.
  4. `strategy.update(state, texts, scores, aux)`.
  5. One history record per candidate (`history.jsonl`), one metrics record (`metrics.jsonl`
     and TensorBoard, scope "outer"), one console summary line, then an atomic checkpoint.

Every candidate is trained, duplicates included (their canonical key is recorded so reports
can group them): the budget is `iterations * n` proposals for every strategy, of which the
valid ones cost an inner training (`budget.candidates_charged`, `budget.candidates_trained`).

Population strategies (`strategy.population`, DERL-pop) start iteration i's inner policies
from the best policy of iteration i-1 (the base policy at first, and again after an
iteration without a valid candidate); that policy is part of the checkpoint.

The test split is not a parameter: nothing here can reach it (`derl_jax.meta.protocol` is
the only module that evaluates on test data).

Checkpoint and resume. After iteration i (0-based) the checkpoint step i+1 holds the
strategy state (arrays and JSON), the PRNG key, the number of finished iterations and of
history records, the incumbent (best expression so far and its score), the budget counters
and, for population strategies, the policy the next iteration starts from. Keys are derived
from the run key and the iteration number only, so an iteration replays identically. On
start: a finished run (`search_result.json` matching this setup) is returned as is;
otherwise the newest usable checkpoint is restored (a corrupt one is reported by
`CheckpointStore` and an older one used), records of iterations after it are cut from
`history.jsonl` and `metrics.jsonl` (they came from an interrupted iteration) and the loop
continues. Killing the process at any point and rerunning the same command ends with the
same history as an uninterrupted run (wall-clock fields aside). Restoring needs the
strategy's initial state as a template, so a resumed run repeats `strategy.init` (for
derl, the cold-start SFT) before loading the checkpoint over it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
import warnings
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from derl_jax.checkpoint import CheckpointStore, atomic_write_json
from derl_jax.domains.base import TokenDataset
from derl_jax.expr.canonical import canonical
from derl_jax.expr.check import check_text
from derl_jax.expr.program import Program, ProgramError, compile_expr, stack_programs
from derl_jax.expr.structure import structure
from derl_jax.logging import (
    HISTORY_FILE,
    METRICS_FILE,
    RunLogger,
    progress_bar,
    read_jsonl,
    summary_line,
    truncate_history,
)
from derl_jax.evaluator import CandidateEvaluator, CandidateResults
from derl_jax.meta.strategies import Strategy, check_proposals

SEARCH_RESULT_FILE = "search_result.json"
CHECKPOINT_DIR = "checkpoints"
INCUMBENT_POLICY_DIR = "incumbent_policy"
CHECKPOINTS_TO_KEEP = 3
WALL_CLOCK_FIELDS = ("time", "iteration_seconds")
STRUCTURE_CLASSES = ("stable", "unstable", "invalid")
METRICS_SCOPE = "outer"
_INIT_STREAM, _ITERATION_STREAM = 0, 1


# --------------------------------------------------------------------------- results


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """best_*: the incumbent (highest validation score; ties keep the earliest), None when no
    candidate was valid. history: every candidate record, in order. incumbent_params: for
    population strategies the policy the last iteration ended with (its best), else None."""

    best_text: str | None
    best_canonical: str | None
    best_score: float
    history: list[dict]
    best_iteration: int | None = None
    budget: Mapping[str, int] = dataclasses.field(default_factory=dict)
    incumbent_params: Any = None


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One proposal after checking: `program` is set exactly when `valid`."""

    text: str
    valid: bool
    reason: str
    canonical: str | None
    structure: str
    program: Program | None


def examine(text: str, primitive_names: Sequence[str], outcome_index: int = 0) -> Candidate:
    """Check, classify and compile one proposed expression (never raises for bad text)."""
    tree, validity = check_text(text, primitive_names, outcome_index=outcome_index)
    if tree is None or not validity.ok:
        key = canonical(tree) if tree is not None else None
        return Candidate(text, False, validity.reason or "invalid", key, "invalid", None)
    num_primitives = len(primitive_names)
    try:
        program = compile_expr(tree, num_primitives=num_primitives)
    except ProgramError as err:
        return Candidate(text, False, f"compile error: {err}", canonical(tree), "invalid", None)
    shape = structure(tree, num_primitives, outcome_index=outcome_index)
    return Candidate(text, True, "", canonical(tree), shape, program)


# --------------------------------------------------------------------------- keys and setup


def as_typed_key(key: Any) -> jax.Array:
    """A typed PRNG key from a typed key or raw uint32 key data (`jax.random.PRNGKey`)."""
    key = jax.numpy.asarray(key) if not isinstance(key, jax.Array) else key
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    if key.dtype == np.uint32:
        return jax.random.wrap_key_data(key)
    raise TypeError(f"search: key must be a PRNG key (jax.random.key or PRNGKey), got {key.dtype}{list(key.shape)}")


def key_list(key: jax.Array) -> list[int]:
    return np.asarray(jax.random.key_data(key)).reshape(-1).tolist()


def iteration_keys(key: jax.Array, iteration: int) -> tuple[jax.Array, jax.Array]:
    """(propose key, evaluate key) of `iteration`: a function of the run key and iteration only."""
    stream = jax.random.fold_in(jax.random.fold_in(key, _ITERATION_STREAM), iteration)
    propose_key, evaluate_key = jax.random.split(stream)
    return propose_key, evaluate_key


def outer_sizes(cfg: Any) -> tuple[int, int]:
    """(iterations, num_candidates) from `cfg.outer`, validated."""
    iterations, n = int(cfg.outer.iterations), int(cfg.outer.num_candidates)
    if iterations < 1:
        raise ValueError(f"config.outer.iterations must be >= 1, got {iterations}")
    if n < 2:
        raise ValueError(f"config.outer.num_candidates must be >= 2, got {n}")
    return iterations, n


def setup_record(strategy: Strategy, primitive_names, n: int, train_set, val_set, key) -> dict:
    """What must match between a checkpoint and the run resuming from it."""
    return {
        "strategy": strategy.name,
        "population": bool(strategy.population),
        "num_candidates": int(n),
        "primitive_names": list(primitive_names),
        "key": key_list(key),
        "train_size": int(train_set.size),
        "val_size": int(val_set.size),
    }


def check_same_setup(saved: Mapping[str, Any], current: Mapping[str, Any], workdir: str) -> None:
    differences = [f"{k}: saved {saved.get(k)!r}, now {v!r}" for k, v in current.items() if saved.get(k) != v]
    if differences:
        raise ValueError(
            f"search: {workdir} holds a search with a different setup ({'; '.join(differences)}); "
            "use another workdir or the original settings"
        )


# --------------------------------------------------------------------------- run state


@dataclasses.dataclass
class _Run:
    """Everything that changes from one iteration to the next (and is checkpointed)."""

    completed: int
    state: Any
    incumbent: dict
    budget: dict
    history_records: int
    start_params: Any = None  # population strategies: the next iteration's starting policy


def _fresh_incumbent() -> dict:
    return {"text": None, "canonical": None, "score": None, "iteration": None, "index": None}


def _checkpoint_arrays(strategy: Strategy, run: _Run, key: jax.Array) -> dict:
    arrays: dict[str, Any] = {"rng": jax.random.key_data(key)}
    strategy_arrays, _ = strategy.checkpoint(run.state)
    if jax.tree_util.tree_leaves(strategy_arrays):
        arrays["strategy"] = strategy_arrays
    if strategy.population:
        arrays["start_policy"] = run.start_params
    return arrays


def _checkpoint_meta(strategy: Strategy, run: _Run, setup: dict) -> dict:
    _, strategy_data = strategy.checkpoint(run.state)
    return {
        "completed": run.completed,
        "history_records": run.history_records,
        "setup": setup,
        "strategy": strategy_data,
        "incumbent": run.incumbent,
        "budget": run.budget,
    }


def _restore_run(store: CheckpointStore, strategy: Strategy, initial: _Run, key, setup: dict, workdir: str) -> _Run:
    template = _checkpoint_arrays(strategy, initial, key)
    restored = store.restore(arrays_template=template)
    if restored is None:
        return initial
    arrays, meta = restored
    check_same_setup(meta["setup"], setup, workdir)
    if key_list(jax.random.wrap_key_data(arrays["rng"])) != setup["key"]:
        raise ValueError(f"search: the checkpoint in {workdir} holds a different PRNG key than this run")
    state = strategy.restore(initial.state, arrays.get("strategy", {}), meta["strategy"])
    return _Run(
        completed=int(meta["completed"]),
        state=state,
        incumbent=dict(meta["incumbent"]),
        budget=dict(meta["budget"]),
        history_records=int(meta["history_records"]),
        start_params=arrays.get("start_policy"),
    )


# --------------------------------------------------------------------------- one iteration


def _select(tree: Any, index: int) -> Any:
    return jax.tree_util.tree_map(lambda leaf: leaf[index], tree)


def _results_for(results: Any, count: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
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


def _curve_summary(curves: Mapping[str, np.ndarray], k: int) -> tuple[dict, dict]:
    """(final-step value per curve, full curve per curve as lists) of candidate k."""
    final, full = {}, {}
    for name, values in curves.items():
        row = values[k]
        full[name] = row.tolist()
        last = float(row.reshape(-1)[-1]) if row.size else float("nan")
        final[name] = last if math.isfinite(last) else None
    return final, full


def run_iteration(
    iteration: int,
    strategy: Strategy,
    state: Any,
    evaluator: CandidateEvaluator,
    train_set: TokenDataset,
    val_set: TokenDataset,
    primitive_names: Sequence[str],
    key: jax.Array,
    n: int,
    init_params: Any,
    outcome_index: int = 0,
) -> tuple[Any, list[dict], Any]:
    """One outer iteration (module docstring, steps 1-4).

    Returns (new strategy state, n history records, the best policy of this iteration — None
    when no candidate was valid or the strategy is not a population strategy).
    """
    propose_key, evaluate_key = iteration_keys(key, iteration)
    texts, aux = strategy.propose(state, propose_key, n)
    texts = check_proposals(texts, n, f"{strategy.name}.propose")
    candidates = [examine(text, primitive_names, outcome_index) for text in texts]
    trained = [j for j, c in enumerate(candidates) if c.valid]
    scores = np.zeros(n, np.float32)
    reasons = [c.reason for c in candidates]
    curves: dict[str, np.ndarray] = {}
    best_params = None
    if trained:
        programs = stack_programs([candidates[j].program for j in trained])
        results = evaluator.evaluate_candidates(programs, init_params, evaluate_key, train_set, val_set)
        trained_scores, curves = _results_for(results, len(trained))
        for k, j in enumerate(trained):
            if math.isfinite(float(trained_scores[k])):
                scores[j] = trained_scores[k]
            else:
                reasons[j] = "non-finite validation score"
        finite = np.isfinite(trained_scores)
        if strategy.population and finite.any():
            best_params = _select(results.params, int(np.argmax(np.where(finite, trained_scores, -np.inf))))
    new_state = strategy.update(state, texts, scores, aux)
    position = {j: k for k, j in enumerate(trained)}
    records = []
    for j, candidate in enumerate(candidates):
        final, full = _curve_summary(curves, position[j]) if j in position else ({}, {})
        records.append(
            {
                "iteration": iteration,
                "index": j,
                "method": strategy.name,
                "text": candidate.text,
                "canonical": candidate.canonical,
                "valid": candidate.valid,
                "trained": j in position,
                "reason": reasons[j],
                "structure": candidate.structure,
                "score": float(scores[j]),
                "final": final,
                "curves": full,
            }
        )
    return new_state, records, best_params


def iteration_metrics(records: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Scores, validity and structure shares of one iteration's records."""
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


def _update_incumbent(incumbent: dict, records: Sequence[Mapping[str, Any]]) -> dict:
    best = dict(incumbent)
    for record in records:
        if not record["valid"] or not record["trained"] or record["reason"]:
            continue  # invalid, untrained, or its training gave no finite score
        if best["score"] is None or record["score"] > best["score"]:
            best = {
                "text": record["text"],
                "canonical": record["canonical"],
                "score": record["score"],
                "iteration": record["iteration"],
                "index": record["index"],
            }
    return best


# --------------------------------------------------------------------------- search


def search(
    strategy: Strategy,
    evaluator: CandidateEvaluator,
    train_set: TokenDataset,
    val_set: TokenDataset,
    primitive_names: Sequence[str],
    cfg: Any,
    workdir: str | os.PathLike,
    key: Any,
    *,
    init_params: Any,
    outcome_index: int = 0,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
) -> SearchResult:
    """Run (or resume, or return the finished) outer loop in `workdir` (module docstring).

    train_set: the inner-training split; val_set: the validation split (scores).
    cfg: reads `outer.iterations` and `outer.num_candidates`; written to config.json.
    init_params: the base policy every candidate starts from (population strategies: only
        in the first iteration).
    echo: receives each per-iteration summary line (default: printed to stdout above the
        progress bar, prefixed with the strategy name).
    """
    iterations, n = outer_sizes(cfg)
    key = as_typed_key(key)
    primitive_names = tuple(primitive_names)
    workdir = os.fspath(workdir)
    os.makedirs(workdir, exist_ok=True)
    fixed = _Fixed(
        strategy, evaluator, train_set, val_set, primitive_names, key, n, iterations, init_params, outcome_index,
        setup_record(strategy, primitive_names, n, train_set, val_set, key),
    )
    finished = load_finished(workdir, fixed.setup, iterations, init_params if strategy.population else None)
    if finished is not None:
        return finished

    initial = _Run(
        completed=0,
        state=strategy.init(jax.random.fold_in(key, _INIT_STREAM)),
        incumbent=_fresh_incumbent(),
        budget={"candidates_charged": 0, "candidates_trained": 0},
        history_records=0,
        start_params=init_params if strategy.population else None,
    )
    store = CheckpointStore(os.path.join(workdir, CHECKPOINT_DIR), max_to_keep=CHECKPOINTS_TO_KEEP)
    try:
        run = _restore_run(store, strategy, initial, key, fixed.setup, workdir)
        if run.completed > iterations:
            raise ValueError(
                f"search: {workdir} already holds {run.completed} iterations, more than config.outer.iterations={iterations}"
            )
        _cut_logs_after(workdir, run)
        with RunLogger(workdir, purge_step=run.completed) as logger:
            if hasattr(cfg, "to_dict") or isinstance(cfg, Mapping):
                logger.write_config(cfg)
            _loop(fixed, run, store, logger, progress, echo)
    finally:
        store.close()
    return _finish(workdir, strategy, run, fixed.setup, iterations)


@dataclasses.dataclass(frozen=True)
class _Fixed:
    """What stays the same for a whole search."""

    strategy: Strategy
    evaluator: CandidateEvaluator
    train_set: TokenDataset
    val_set: TokenDataset
    primitive_names: tuple[str, ...]
    key: jax.Array
    num_candidates: int
    iterations: int
    init_params: Any
    outcome_index: int
    setup: dict


def _loop(fixed: _Fixed, run: _Run, store: CheckpointStore, logger: RunLogger, progress: bool, echo) -> None:
    """Iterations `run.completed .. fixed.iterations - 1`, each logged and checkpointed; mutates `run`."""
    strategy, n = fixed.strategy, fixed.num_candidates
    bar = progress_bar(total=fixed.iterations, initial=run.completed, desc=f"outer {strategy.name}", enabled=progress)
    say = echo or (lambda line: bar.write(f"[{strategy.name}] {line}", file=sys.stdout))
    try:
        for iteration in range(run.completed, fixed.iterations):
            started = time.time()
            start_params = run.start_params if strategy.population else fixed.init_params
            state, records, best_params = run_iteration(
                iteration, strategy, run.state, fixed.evaluator, fixed.train_set, fixed.val_set,
                fixed.primitive_names, fixed.key, n, start_params, fixed.outcome_index,
            )
            run.state = state
            run.incumbent = _update_incumbent(run.incumbent, records)
            run.budget["candidates_charged"] += n
            run.budget["candidates_trained"] += sum(r["trained"] for r in records)
            if strategy.population and best_params is not None:
                run.start_params = best_params
            run.completed = iteration + 1
            run.history_records += len(records)
            now = time.time()
            logger.append_history([{**r, "time": now} for r in records])
            metrics = iteration_metrics(records)
            metrics.update(
                incumbent_score=run.incumbent["score"],
                candidates_charged=run.budget["candidates_charged"],
                candidates_trained=run.budget["candidates_trained"],
                iteration_seconds=now - started,
            )
            metrics.update({f"strategy/{k}": v for k, v in strategy.metrics(state).items()})
            logger.log_metrics(iteration, {k: math.nan if v is None else v for k, v in metrics.items()}, METRICS_SCOPE)
            say(summary_line(iteration, run.incumbent["score"], metrics["validity_rate"], run.incumbent["text"]))
            store.save(
                run.completed,
                arrays=_checkpoint_arrays(strategy, run, fixed.key),
                meta=_checkpoint_meta(strategy, run, fixed.setup),
            )
            bar.update(1)
    finally:
        bar.close()


def _cut_logs_after(workdir: str, run: _Run) -> None:
    """Drop history/metrics records of iterations the checkpoint does not cover."""
    last_kept = run.completed - 1
    truncate_history(os.path.join(workdir, HISTORY_FILE), last_kept, key="iteration")
    truncate_history(os.path.join(workdir, METRICS_FILE), last_kept, key="step")
    have = len(read_jsonl(os.path.join(workdir, HISTORY_FILE)))
    if have != run.history_records:
        warnings.warn(
            f"search: {workdir}/{HISTORY_FILE} holds {have} records up to iteration {last_kept}, "
            f"the checkpoint expects {run.history_records}",
            RuntimeWarning,
            stacklevel=3,
        )


def _finish(workdir: str, strategy: Strategy, run: _Run, setup: dict, iterations: int) -> SearchResult:
    if strategy.population:
        with CheckpointStore(os.path.join(workdir, INCUMBENT_POLICY_DIR), max_to_keep=1) as policy_store:
            if policy_store.latest_step() is None or policy_store.latest_step() < iterations:
                policy_store.save(iterations, arrays={"policy": run.start_params}, meta={"iterations": iterations})
    atomic_write_json(
        os.path.join(workdir, SEARCH_RESULT_FILE),
        {"setup": setup, "iterations": iterations, "incumbent": run.incumbent, "budget": run.budget},
    )
    return _result(workdir, run.incumbent, run.budget, run.start_params if strategy.population else None)


def _result(workdir: str, incumbent: Mapping[str, Any], budget: Mapping[str, int], params: Any) -> SearchResult:
    return SearchResult(
        best_text=incumbent["text"],
        best_canonical=incumbent["canonical"],
        best_score=float(incumbent["score"]) if incumbent["score"] is not None else 0.0,
        history=read_jsonl(os.path.join(workdir, HISTORY_FILE)),
        best_iteration=incumbent["iteration"],
        budget=dict(budget),
        incumbent_params=params,
    )


def load_finished(workdir: str, setup: Mapping[str, Any], iterations: int, policy_template: Any = None) -> SearchResult | None:
    """The result of a finished search in `workdir` with this setup and `iterations`, else None.

    policy_template: for population strategies, the structure of the saved incumbent policy;
    when that policy cannot be restored, None is returned (the caller resumes from checkpoints).
    """
    path = os.path.join(workdir, SEARCH_RESULT_FILE)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        saved = json.load(handle)
    check_same_setup(saved["setup"], setup, workdir)
    if saved["iterations"] != iterations:
        return None
    params = None
    if policy_template is not None:
        with CheckpointStore(os.path.join(workdir, INCUMBENT_POLICY_DIR), max_to_keep=1) as policy_store:
            restored = policy_store.restore(arrays_template={"policy": policy_template})
        if restored is None:
            return None
        params = restored[0]["policy"]
    return _result(workdir, saved["incumbent"], saved["budget"], params)


def read_search_result(workdir: str | os.PathLike) -> dict:
    """The JSON of a finished search (`search_result.json`); FileNotFoundError naming the path."""
    path = os.path.join(os.fspath(workdir), SEARCH_RESULT_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no finished search in {os.fspath(workdir)} (missing {SEARCH_RESULT_FILE})")
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def strip_wall_clock(records: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Records without their wall-clock fields (`WALL_CLOCK_FIELDS`), for comparing runs."""
    return [{k: v for k, v in r.items() if k not in WALL_CLOCK_FIELDS} for r in records]
