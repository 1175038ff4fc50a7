"""What a search saves to survive a kill, and how it comes back: checkpoint contents, journal, log repair.

After iteration i (0-based) the search writes, in this order: the iteration's lines of
`history.jsonl` and `metrics.jsonl`, its journal entry `journal/iteration_<i>.json` (the same
records, atomically), the candidate policies when they are kept, then checkpoint step i+1 —
strategy state (arrays and JSON), PRNG key, iterations and history records done, incumbent,
budget counters and, for population strategies, the policy the next iteration starts from.

On resume from checkpoint step c (the newest usable one), `repair_logs` rewrites
`history.jsonl` and `metrics.jsonl` to exactly the journal's records of iterations 0..c-1:
lines of later iterations (an interrupted attempt) go, and lines lost to a torn or damaged
write come back. The journal entries of iterations >= c are deleted; those iterations are
replayed. A journal entry that is missing (a run directory from before the journal existed)
is replaced by whatever readable lines the logs hold for that iteration, with a warning.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from typing import Any, Mapping

import jax
import numpy as np

from derl_jax.checkpoint import CheckpointStore, atomic_write_json
from derl_jax.logging import HISTORY_FILE, METRICS_FILE, read_jsonl_lenient, rewrite_jsonl, to_jsonable

JOURNAL_DIR = "journal"
_JOURNAL_NAME = re.compile(r"^iteration_(\d+)\.json$")


# --------------------------------------------------------------------------- run state


@dataclasses.dataclass
class SearchRun:
    """Everything that changes from one iteration to the next (and is checkpointed)."""

    completed: int
    state: Any
    incumbent: dict
    budget: dict
    history_records: int
    start_params: Any = None  # population strategies: the next iteration's starting policy


def fresh_incumbent() -> dict:
    return {"text": None, "canonical": None, "score": None, "iteration": None, "index": None}


def fresh_budget() -> dict:
    """candidates_charged: proposals (n per iteration); candidates_trained: inner trainings run;
    candidates_shared: duplicates that reused another candidate's training (trainings saved);
    start_policy_updates: iterations whose best policy became the next start policy
    (population strategies; 0 otherwise)."""
    return {"candidates_charged": 0, "candidates_trained": 0, "candidates_shared": 0, "start_policy_updates": 0}


def key_list(key: jax.Array) -> list[int]:
    return np.asarray(jax.random.key_data(key)).reshape(-1).tolist()


def checkpoint_arrays(strategy: Any, run: SearchRun, key: jax.Array) -> dict:
    arrays: dict[str, Any] = {"rng": jax.random.key_data(key)}
    strategy_arrays, _ = strategy.checkpoint(run.state)
    if jax.tree_util.tree_leaves(strategy_arrays):
        arrays["strategy"] = strategy_arrays
    if strategy.population:
        arrays["start_policy"] = run.start_params
    return arrays


def checkpoint_meta(strategy: Any, run: SearchRun, setup: dict) -> dict:
    _, strategy_data = strategy.checkpoint(run.state)
    return {
        "completed": run.completed,
        "history_records": run.history_records,
        "setup": setup,
        "strategy": strategy_data,
        "incumbent": run.incumbent,
        "budget": run.budget,
    }


def check_same_setup(saved: Mapping[str, Any], current: Mapping[str, Any], workdir: str) -> None:
    differences = [f"{k}: saved {saved.get(k)!r}, now {v!r}" for k, v in current.items() if saved.get(k) != v]
    if differences:
        raise ValueError(
            f"search: {workdir} holds a search with a different setup ({'; '.join(differences)}); "
            "use another workdir or the original settings"
        )


def restore_run(store: CheckpointStore, strategy: Any, initial: SearchRun, key, setup: dict, workdir: str) -> SearchRun:
    """The run state of the newest usable checkpoint, or `initial` when there is none."""
    template = checkpoint_arrays(strategy, initial, key)
    restored = store.restore(arrays_template=template)
    if restored is None:
        return initial
    arrays, meta = restored
    check_same_setup(meta["setup"], setup, workdir)
    if key_list(jax.random.wrap_key_data(arrays["rng"])) != setup["key"]:
        raise ValueError(f"search: the checkpoint in {workdir} holds a different PRNG key than this run")
    state = strategy.restore(initial.state, arrays.get("strategy", {}), meta["strategy"])
    return SearchRun(
        completed=int(meta["completed"]),
        state=state,
        incumbent=dict(meta["incumbent"]),
        budget={**fresh_budget(), **meta["budget"]},
        history_records=int(meta["history_records"]),
        start_params=arrays.get("start_policy"),
    )


# --------------------------------------------------------------------------- journal


def journal_path(workdir: str, iteration: int) -> str:
    return os.path.join(workdir, JOURNAL_DIR, f"iteration_{int(iteration):06d}.json")


def write_journal(workdir: str, iteration: int, history: list[Mapping[str, Any]], metrics: Mapping[str, Any]) -> None:
    """The iteration's history records and metrics record, atomically (what the logs must hold)."""
    entry = {"iteration": int(iteration), "history": list(history), "metrics": [dict(metrics)]}
    atomic_write_json(journal_path(workdir, iteration), to_jsonable(entry, "journal"), indent=None)


def read_journal(workdir: str, iteration: int) -> dict | None:
    """The journal entry of `iteration`, or None when it is missing or unreadable."""
    path = journal_path(workdir, iteration)
    try:
        with open(path, encoding="utf-8") as handle:
            entry = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        warnings.warn(f"search: journal entry {path} is unreadable ({err})", RuntimeWarning, stacklevel=2)
        return None
    ok = isinstance(entry, dict) and entry.get("iteration") == iteration
    return entry if ok and isinstance(entry.get("history"), list) and isinstance(entry.get("metrics"), list) else None


def drop_journal_after(workdir: str, completed: int) -> None:
    """Delete the journal entries of iterations >= `completed` (they are replayed)."""
    directory = os.path.join(workdir, JOURNAL_DIR)
    if not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        match = _JOURNAL_NAME.match(name)
        if match and int(match.group(1)) >= completed:
            os.remove(os.path.join(directory, name))


def repair_logs(workdir: str, completed: int, expected_records: int, metrics_scope: str) -> None:
    """Rewrite history.jsonl and metrics.jsonl to exactly iterations 0..completed-1 (module docstring)."""
    history_path, metrics_path = os.path.join(workdir, HISTORY_FILE), os.path.join(workdir, METRICS_FILE)
    have_history, damaged_history = read_jsonl_lenient(history_path)
    have_metrics, damaged_metrics = read_jsonl_lenient(metrics_path)
    history, metrics, missing = [], [], []
    for iteration in range(completed):
        entry = read_journal(workdir, iteration)
        if entry is None:
            missing.append(iteration)
            history += [r for r in have_history if r.get("iteration") == iteration]
            metrics += [r for r in have_metrics if r.get("step") == iteration and r.get("scope") == metrics_scope]
        else:
            history += entry["history"]
            metrics += entry["metrics"]
    if missing:
        warnings.warn(
            f"search: {workdir}/{JOURNAL_DIR} has no entry for iterations {missing}; their log lines are kept as found",
            RuntimeWarning,
            stacklevel=3,
        )
    for path, have, want, damaged in (
        (history_path, have_history, history, damaged_history),
        (metrics_path, have_metrics, metrics, damaged_metrics),
    ):
        if have != want or damaged:
            if damaged:
                warnings.warn(f"search: {path}: rebuilt around unreadable lines {damaged}", RuntimeWarning, stacklevel=3)
            rewrite_jsonl(path, want)
    if len(history) != expected_records:
        warnings.warn(
            f"search: {history_path} holds {len(history)} records up to iteration {completed - 1}, "
            f"the checkpoint expects {expected_records}",
            RuntimeWarning,
            stacklevel=3,
        )
    drop_journal_after(workdir, completed)
