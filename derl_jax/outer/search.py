"""The outer loop: propose reward expressions, train and score them, update the strategy.

    result = search(strategy, evaluator, inner_train, validation, primitive_names, cfg,
                    workdir, key, init_params=base_params)

One outer iteration:

  1. `strategy.propose(state, key_i, n)` -> n expression texts (`n = cfg.outer.num_candidates`).
  2. `derl_jax.outer.candidates.evaluate_iteration`: each text is checked and compiled (the
     reason of a rejection is kept); ONE `evaluator.evaluate_candidates` call trains a policy
     per distinct valid expression (programs stacked along K) from the iteration's start policy
     and scores it on the validation split. Invalid candidates cost no training and score 0
     but stay in the group.
  3. `strategy.update(state, records, scores, aux)` with the n `CandidateRecord`s (text,
     canonical form, validity and reason, score, per-step inner curves).
  4. One history record per candidate (`history.jsonl`), one metrics record (`metrics.jsonl`
     and TensorBoard, scope "outer"), one console summary line, the journal entry, then an
     atomic checkpoint (`derl_jax.outer.resume`).

Budget: `iterations * n` proposals for every strategy (`budget.candidates_charged`). With
common random numbers (`config.inner.common_random_numbers`, on by default) candidates with
the same canonical form train identical policies, so each form is trained once per iteration
and its score, curves and policy are copied to the duplicates (`duplicate_of` in their
records); `budget.candidates_trained` counts the trainings run, `budget.candidates_shared`
the trainings saved. Without common random numbers every valid candidate trains.
`budget.start_policy_updates` counts the iterations that advanced a population strategy's
start policy.

Population strategies (`strategy.population`, DERL-pop) start iteration i's inner policies
from the best policy of iteration i-1: the base policy in the first iteration; after an
iteration without a valid candidate (or without a finite score) the start policy stays what it
was. That policy is part of the checkpoint. `inner_steps` sets how many inner steps each
candidate trains (None: the evaluator's `inner.steps`).

`keep_candidate_policies=True` saves each iteration's trained candidate policies
(`derl_jax.outer.candidate_policies`), so they can be tested after the search.

The test split is not a parameter: nothing here can reach it (`derl_jax.experiment.protocol` is
the only module that evaluates on test data).

Resume. Keys are derived from the run key and the iteration number only, so an iteration
replays identically. On start: a finished run (`search_result.json` matching this setup) is
returned as is; otherwise the newest usable checkpoint is restored (a corrupt one is reported
by `CheckpointStore` and an older one used), `history.jsonl` and `metrics.jsonl` are rewritten
to exactly what it covers (`resume.repair_logs`) and the loop continues. Killing the process
at any point, or damaging any log line, and rerunning the same command ends with the same
history as an uninterrupted run (wall-clock fields aside). A strategy that cannot propose
(its model's endpoint stays down) raises `SearchStopped` from `propose`: the iteration is
neither charged nor logged, the last checkpoint stays the newest, and the launcher prints one
line and exits non-zero; rerunning the command resumes there. Restoring needs the strategy's
initial state as a template, so a resumed run repeats `strategy.init` (for derl, the
cold-start SFT) before loading the checkpoint over it.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import sys
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from derl_jax.checkpoint import CheckpointStore, atomic_write_json
from derl_jax.domains.base import TokenDataset
from derl_jax.rl.evaluator import CandidateEvaluator
from derl_jax.logging import HISTORY_FILE, RunLogger, progress_bar, read_jsonl, summary_line
from derl_jax.outer import candidate_policies
from derl_jax.outer.candidates import evaluate_iteration, iteration_metrics
from derl_jax.outer.checks import operator_set
from derl_jax.outer.resume import (
    SearchRun,
    check_same_setup,
    checkpoint_arrays,
    checkpoint_meta,
    fresh_budget,
    fresh_incumbent,
    key_list,
    repair_logs,
    restore_run,
    write_journal,
)
from derl_jax.outer.strategy import CandidateRecord, Strategy, check_proposals
from derl_jax.parallel import gather_to_host

SEARCH_RESULT_FILE = "search_result.json"
CHECKPOINT_DIR = "checkpoints"
INCUMBENT_POLICY_DIR = "incumbent_policy"
CHECKPOINTS_TO_KEEP = 3
WALL_CLOCK_FIELDS = ("time", "iteration_seconds")
METRICS_SCOPE = "outer"
_INIT_STREAM, _ITERATION_STREAM = 0, 1


class SearchStopped(RuntimeError):
    """The search cannot go on for now (e.g. the proposer's endpoint stays down); nothing of the
    current iteration is charged, and rerunning the same command resumes from the last checkpoint."""


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


# --------------------------------------------------------------------------- keys and setup


def as_typed_key(key: Any) -> jax.Array:
    """A typed PRNG key from a typed key or raw uint32 key data (`jax.random.PRNGKey`)."""
    key = jax.numpy.asarray(key) if not isinstance(key, jax.Array) else key
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return key
    if key.dtype == np.uint32:
        return jax.random.wrap_key_data(key)
    raise TypeError(f"search: key must be a PRNG key (jax.random.key or PRNGKey), got {key.dtype}{list(key.shape)}")


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


def shares_duplicates(cfg: Any) -> bool:
    """Whether duplicates share one training: `config.inner.common_random_numbers` (default True)."""
    inner = getattr(cfg, "inner", None)
    value = inner.get("common_random_numbers", True) if hasattr(inner, "get") else True
    return bool(value)


@dataclasses.dataclass(frozen=True)
class _Setup:
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
    share_duplicates: bool
    inner_steps: int | None
    keep_candidate_policies: bool
    workdir: str
    operators: str = "extended"  # the operator set candidates may use (`config.meta.operators`)

    def record(self) -> dict:
        """What must match between a checkpoint and the run resuming from it."""
        return {
            "strategy": self.strategy.name,
            "population": bool(self.strategy.population),
            "num_candidates": self.num_candidates,
            "primitive_names": list(self.primitive_names),
            "key": key_list(self.key),
            "train_size": int(self.train_set.size),
            "val_size": int(self.val_set.size),
            "share_duplicates": self.share_duplicates,
            "inner_steps": self.inner_steps,
        }


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
    inner_steps: int | None = None,
    iterations: int | None = None,
    keep_candidate_policies: bool = False,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
) -> SearchResult:
    """Run (or resume, or return the finished) outer loop in `workdir` (module docstring).

    train_set: the inner-training split; val_set: the validation split (scores).
    cfg: reads `outer.iterations`, `outer.num_candidates`, `inner.common_random_numbers` and
        `meta.operators` (the operator set a candidate must keep to, "extended" when absent);
        written to config.json.
    init_params: the base policy every candidate starts from (population strategies: only
        in the first iteration).
    inner_steps: inner steps per candidate, handed to `evaluate_candidates(..., steps=)`
        (None: the evaluator's own setting).
    iterations: outer iterations (None: `outer.iterations`; population strategies run their own,
        `derl_jax.outer.budget.population_iterations`).
    echo: receives each per-iteration summary line (default: printed to stdout above the
        progress bar, prefixed with the strategy name).
    """
    configured, n = outer_sizes(cfg)
    iterations = configured if iterations is None else int(iterations)
    if iterations < 1:
        raise ValueError(f"search: iterations must be >= 1, got {iterations}")
    if inner_steps is not None and not _accepts_steps(evaluator):
        raise TypeError(
            f"search: {type(evaluator).__name__}.evaluate_candidates takes no `steps` keyword, which strategy "
            f"{strategy.name!r} needs (inner_steps={inner_steps})"
        )
    workdir = os.fspath(workdir)
    if jax.process_index() == 0:
        os.makedirs(workdir, exist_ok=True)
    setup = _Setup(
        strategy, evaluator, train_set, val_set, tuple(primitive_names), as_typed_key(key), n, iterations,
        init_params, outcome_index, shares_duplicates(cfg), None if inner_steps is None else int(inner_steps),
        bool(keep_candidate_policies), workdir, operators=operator_set(cfg),
    )
    finished = load_finished(workdir, setup.record(), iterations, init_params if strategy.population else None)
    if finished is not None:
        return finished

    initial = SearchRun(
        completed=0,
        state=strategy.init(jax.random.fold_in(setup.key, _INIT_STREAM)),
        incumbent=fresh_incumbent(),
        budget=fresh_budget(),
        history_records=0,
        start_params=init_params if strategy.population else None,
    )
    store = CheckpointStore(os.path.join(workdir, CHECKPOINT_DIR), max_to_keep=CHECKPOINTS_TO_KEEP)
    try:
        run = restore_run(store, strategy, initial, setup.key, setup.record(), workdir)
        if run.completed > iterations:
            raise ValueError(
                f"search: {workdir} already holds {run.completed} iterations, more than the {iterations} configured"
            )
        if jax.process_index() == 0:
            repair_logs(workdir, run.completed, run.history_records, METRICS_SCOPE)
        with RunLogger(workdir, purge_step=run.completed) as logger:
            if hasattr(cfg, "to_dict") or isinstance(cfg, Mapping):
                logger.write_config(cfg)
            _loop(setup, run, store, logger, progress, echo)
    finally:
        store.close()
    return _finish(setup, run)


def _accepts_steps(evaluator: CandidateEvaluator) -> bool:
    parameters = inspect.signature(evaluator.evaluate_candidates).parameters.values()
    return any(p.name == "steps" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _loop(setup: _Setup, run: SearchRun, store: CheckpointStore, logger: RunLogger, progress: bool, echo) -> None:
    """Iterations `run.completed .. setup.iterations - 1`, each logged and checkpointed; mutates `run`."""
    strategy, n = setup.strategy, setup.num_candidates
    bar = progress_bar(total=setup.iterations, initial=run.completed, desc=f"outer {strategy.name}", enabled=progress)
    say = echo or (lambda line: bar.write(f"[{strategy.name}] {line}", file=sys.stdout))
    try:
        for iteration in range(run.completed, setup.iterations):
            started = time.time()
            propose_key, evaluate_key = iteration_keys(setup.key, iteration)
            texts, aux = strategy.propose(run.state, propose_key, n)
            texts = check_proposals(texts, n, f"{strategy.name}.propose")
            outcome = evaluate_iteration(
                iteration, texts, setup.evaluator, setup.train_set, setup.val_set, setup.primitive_names,
                evaluate_key, run.start_params if strategy.population else setup.init_params,
                method=strategy.name, outcome_index=setup.outcome_index, share_duplicates=setup.share_duplicates,
                operators=setup.operators,
                evaluate_kwargs={} if setup.inner_steps is None else {"steps": setup.inner_steps},
            )
            run.state = strategy.update(run.state, outcome.records, outcome.scores, aux)
            run.incumbent = _update_incumbent(run.incumbent, outcome.records)
            run.budget["candidates_charged"] += n
            run.budget["candidates_trained"] += len(outcome.trained)
            run.budget["candidates_shared"] += sum(r.duplicate_of is not None for r in outcome.records)
            if strategy.population and outcome.best_params is not None:
                run.start_params = outcome.best_params
                run.budget["start_policy_updates"] += 1
            run.completed = iteration + 1
            run.history_records += n
            now = time.time()
            history = [{**r, "time": now} for r in outcome.history]
            logger.append_history(history)
            metrics = iteration_metrics(outcome.history)
            metrics.update(
                incumbent_score=run.incumbent["score"],
                candidates_charged=run.budget["candidates_charged"],
                candidates_trained=run.budget["candidates_trained"],
                candidates_shared=run.budget["candidates_shared"],
                iteration_seconds=now - started,
            )
            metrics.update({f"strategy/{k}": v for k, v in strategy.metrics(run.state).items()})
            written = logger.log_metrics(iteration, {k: math.nan if v is None else v for k, v in metrics.items()}, METRICS_SCOPE)
            if setup.keep_candidate_policies:  # every process takes part in gathering policies spread over them
                outcome = dataclasses.replace(outcome, params=gather_to_host(outcome.params))
            if jax.process_index() == 0:
                write_journal(setup.workdir, iteration, history, written)
                if setup.keep_candidate_policies:
                    rows = [-1 if r.reason else outcome.policy_row(j) for j, r in enumerate(outcome.records)]
                    candidate_policies.save_iteration(setup.workdir, iteration, outcome.params, [-1 if k is None else k for k in rows])
            say(summary_line(iteration, run.incumbent["score"], metrics["validity_rate"], run.incumbent["text"]))
            store.save(run.completed, arrays=checkpoint_arrays(strategy, run, setup.key), meta=checkpoint_meta(strategy, run, setup.record()))
            bar.update(1)
    finally:
        bar.close()


def _update_incumbent(incumbent: dict, records: Sequence[CandidateRecord]) -> dict:
    """The best scored candidate so far (a strictly higher score replaces it, so ties keep the earliest)."""
    best = dict(incumbent)
    for record in records:
        if not record.valid or record.reason:
            continue  # invalid, or its training gave no finite score
        if best["score"] is None or record.score > best["score"]:
            best = {
                "text": record.text,
                "canonical": record.canonical,
                "score": record.score,
                "iteration": record.iteration,
                "index": record.index,
            }
    return best


# --------------------------------------------------------------------------- results


def _finish(setup: _Setup, run: SearchRun) -> SearchResult:
    workdir, iterations = setup.workdir, setup.iterations
    if setup.strategy.population:
        with CheckpointStore(os.path.join(workdir, INCUMBENT_POLICY_DIR), max_to_keep=1) as policy_store:
            if policy_store.latest_step() is None or policy_store.latest_step() < iterations:
                policy_store.save(iterations, arrays={"policy": run.start_params}, meta={"iterations": iterations})
    atomic_write_json(
        os.path.join(workdir, SEARCH_RESULT_FILE),
        {"setup": setup.record(), "iterations": iterations, "incumbent": run.incumbent, "budget": run.budget},
    )
    return _result(workdir, run.incumbent, run.budget, run.start_params if setup.strategy.population else None)


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
