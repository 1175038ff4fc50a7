"""Reward search driven by a persistent evaluation history: ARBO's agent and the scripted search.

Each round (one outer iteration): the schedule picks explore or exploit from the acceptance
record; the proposal operator reads the history and writes n candidates, their lineage and a
new belief; `update` appends the search loop's records as observations. The history is the
strategy state: it goes into the search checkpoint (so a resumed run proposes exactly what an
uninterrupted one would) and, when the strategy is built for a run directory
(`StrategyContext.workdir`), into `<workdir>/arbo/history.json` after every round, with the
method's name and its proposer beside it.

Methods:

  arbo, arbo_ablation:<name>
      ARBO: a tool-using LLM agent works in a workspace of files over the history
      (`derl_jax.methods.arbo.tools`, `agent`), on a model behind an OpenAI-compatible
      endpoint or a local checkpoint sampled in process (`config.arbo.agent`). Slots the agent
      leaves unsubmitted (it ran out of turns, the endpoint failed) are charged as empty,
      invalid candidates: nothing scripted stands in for the agent. Each round's transcript is
      kept in `<workdir>/arbo/transcripts/round_<r>.json`. Presets: `AGENT_ABLATIONS`.
  history_search, history_search_ablation:<name>
      the scripted search: the structural proposer's fixed diagnoses and edit templates
      (`derl_jax.methods.arbo.proposer`) in the same history and schedule. Presets:
      `STRUCTURAL_ABLATIONS` (`greedy` is the greedy refinement `eureka` named before).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from derl_jax.checkpoint import atomic_write_json
from derl_jax.methods.arbo import history as hist
from derl_jax.methods.arbo.proposer import View, propose_structural
from derl_jax.methods.arbo.schedule import EXPLORE, Schedule, next_mode
from derl_jax.methods.arbo.sources import domain_kind
from derl_jax.methods.arbo.settings import (AGENT_ABLATIONS, STRUCTURAL_ABLATIONS, describe_backend, make_backend,
                                            read_settings, run_seed)
from derl_jax.methods.arbo.tools import MAX_NOTE
from derl_jax.outer.registry import register_strategy
from derl_jax.outer.strategy import CandidateRecord, Strategy, StrategyContext, check_update

UNSCHEDULED = "unscheduled"  # the mode of a round without the schedule (arbo_ablation:no_framework)
UNSUBMITTED = "unsubmitted"  # the operator of a slot the agent left empty
TRANSCRIPTS = "transcripts"


@dataclasses.dataclass(frozen=True)
class ArboState:
    history: hist.History = hist.History()
    last_metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """propose's aux: the mode, what the searcher says about each text, its new belief, its statistics."""

    mode: str
    proposals: tuple[hist.Proposal, ...]
    belief: hist.Belief | None
    stats: Mapping[str, float] = dataclasses.field(default_factory=dict)


class HistoryStrategy(Strategy):
    """What the history-driven methods share: the history as state, the schedule, the update,
    the checkpoint and the history file. Subclasses set `proposer` and write `propose`."""

    proposer = ""
    ablation_prefix = ""

    def __init__(self, primitive_names: Sequence[str], outcome_index: int = 0, *, schedule: Schedule = Schedule(),
                 view: View = View(), task: str = "", workdir: str | None = None, about: Mapping[str, Any] = (),
                 domain: str | None = None):
        self.primitive_names = tuple(primitive_names)
        self.domain = domain  # `config.domain.kind`: its primitives' aliases in a model's text are read as names
        self.outcome_index = int(outcome_index)
        self.schedule = schedule
        self.view = view
        self.task = task
        self.workdir = workdir
        self.about = dict(about)

    @classmethod
    def _ablation(cls, name: str) -> str | None:
        head, _, argument = name.partition(":")
        return argument if head == cls.ablation_prefix else None

    def describe(self) -> dict[str, Any]:
        """What the history file says about the searcher: the method, its proposer, the model."""
        return {"method": self.name, "proposer": self.proposer, **self.about}

    def init(self, key: Any) -> ArboState:
        return ArboState()

    def mode(self, state: ArboState) -> str:
        return next_mode(hist.acceptance_record(state.history), self.schedule)

    def update(self, state: ArboState, records: Sequence[CandidateRecord], scores: np.ndarray, aux: RoundPlan):
        check_update(records, scores, f"{self.name}.update")
        texts = [p.text for p in aux.proposals]
        if [r.text for r in records] != texts:
            raise ValueError(f"{self.name}.update: the records are not the texts this round proposed ({texts})")
        history = hist.append_round(state.history, records, aux.proposals, aux.mode, aux.belief)
        if self.workdir is not None:
            hist.save(history, self.workdir, self.describe())
        best = hist.incumbent(history)
        metrics = {"explore": float(aux.mode == EXPLORE), "accepted": float(hist.acceptance_record(history)[-1]),
                   "refinements": float(sum(p.parent is not None for p in aux.proposals)),
                   "incumbent_id": float(best.id) if best is not None else -1.0, **aux.stats}
        return ArboState(history=history, last_metrics=metrics)

    def metrics(self, state: ArboState) -> dict[str, float]:
        return dict(state.last_metrics)

    def checkpoint(self, state: ArboState) -> tuple[dict, dict]:
        return {}, {"history": hist.to_json(state.history), "last_metrics": dict(state.last_metrics)}

    def restore(self, initial_state: ArboState, arrays: Any, data: Mapping[str, Any]) -> ArboState:
        state = ArboState(history=hist.from_json(data["history"]), last_metrics=dict(data.get("last_metrics", {})))
        if self.workdir is not None:
            hist.save(state.history, self.workdir, self.describe())  # drops what an interrupted round had written
        return state


@register_strategy("history_search")
@register_strategy("history_search_ablation", takes_argument=True)
class HistorySearch(HistoryStrategy):
    """The scripted search: the structural proposer in the history and schedule (module docstring)."""

    proposer = "structural"
    ablation_prefix = "history_search_ablation"

    @classmethod
    def _settings(cls, cfg: Any, name: str):
        return read_settings(cfg, cls._ablation(name), ablations=STRUCTURAL_ABLATIONS, method=name, agent=False)

    @classmethod
    def from_config(cls, name: str, context: StrategyContext) -> "HistorySearch":
        settings = cls._settings(context.cfg, name)
        return cls(context.primitive_names, context.outcome_index, schedule=settings.schedule, view=settings.view,
                   task=settings.task, workdir=context.workdir)

    @classmethod
    def check_config(cls, cfg: Any, name: str) -> None:
        cls._settings(cfg, name)

    def propose(self, state: ArboState, key: Any, n: int) -> tuple[list[str], RoundPlan]:
        mode = self.mode(state)
        _, structural_key = jax.random.split(key)  # the key stream this search has always drawn from
        proposals, belief = propose_structural(state.history, mode, structural_key, n, self.primitive_names,
                                               self.outcome_index, self.view)
        plan = RoundPlan(mode, tuple(proposals), belief if self.view.belief else None)
        return [p.text for p in proposals], plan


@register_strategy("arbo")
@register_strategy("arbo_ablation", takes_argument=True)
class ArboStrategy(HistoryStrategy):
    """ARBO: the tool-using LLM agent in its workspace (module docstring)."""

    proposer = "agent"
    ablation_prefix = "arbo_ablation"

    def __init__(self, primitive_names: Sequence[str], outcome_index: int = 0, *, backend: Any,
                 sources: Mapping[str, str] = (), max_turns: int = 24, framework: bool = True, **kwargs):
        super().__init__(primitive_names, outcome_index, **kwargs)
        self.backend = backend
        self.sources = dict(sources)
        self.max_turns = int(max_turns)
        self.framework = bool(framework)

    @classmethod
    def _settings(cls, cfg: Any, name: str):
        return read_settings(cfg, cls._ablation(name), ablations=AGENT_ABLATIONS, method=name, agent=True)

    @classmethod
    def from_config(cls, name: str, context: StrategyContext) -> "ArboStrategy":
        from derl_jax.methods.arbo.sources import source_files

        settings = cls._settings(context.cfg, name)
        return cls(context.primitive_names, context.outcome_index,
                   backend=make_backend(settings.agent, run_seed(context.cfg)),
                   sources=source_files(context.cfg, context.primitive_names, context.outcome_index),
                   max_turns=settings.agent.max_turns, framework=settings.framework, schedule=settings.schedule,
                   view=settings.view, task=settings.task, workdir=context.workdir,
                   about={"backend": describe_backend(settings.agent)}, domain=domain_kind(context.cfg))

    @classmethod
    def check_config(cls, cfg: Any, name: str) -> None:
        cls._settings(cfg, name)

    def mode(self, state: ArboState) -> str:
        return super().mode(state) if self.framework else UNSCHEDULED

    def propose(self, state: ArboState, key: Any, n: int) -> tuple[list[str], RoundPlan]:
        from derl_jax.methods.arbo.agent import run_agent
        from derl_jax.methods.arbo.tools import Workspace

        mode = self.mode(state)
        workspace = Workspace(state.history, self.view, self.primitive_names, self.outcome_index, wanted=n,
                              sources=self.sources, task=self.task, domain=self.domain)
        seed = int(jax.random.randint(key, (), 0, 2**30))
        outcome = run_agent(self.backend, workspace, mode if self.framework else None, seed=seed,
                            max_turns=self.max_turns)
        missing = n - len(outcome.proposals)
        why = f"not submitted: the agent stopped ({outcome.stopped})"[:MAX_NOTE]
        proposals = tuple(outcome.proposals) + (hist.Proposal("", None, UNSUBMITTED, why),) * missing
        stats = {"agent_submitted": float(len(outcome.proposals)), "agent_turns": float(outcome.turns),
                 "agent_tool_errors": float(outcome.tool_errors), "agent_backend_errors": float(outcome.backend_errors),
                 "agent_belief_written": float(outcome.belief_written)}
        if self.workdir is not None:
            save_transcript(self.workdir, state.history.rounds, outcome.messages, {**self.describe(), "mode": mode,
                            "seed": seed, "stopped": outcome.stopped})
        return [p.text for p in proposals], RoundPlan(mode, proposals, outcome.belief if self.view.belief else None, stats)


def transcript_path(run_dir: str | os.PathLike, round_index: int) -> str:
    return os.path.join(os.fspath(run_dir), hist.HISTORY_DIR, TRANSCRIPTS, f"round_{round_index}.json")


def save_transcript(run_dir: str | os.PathLike, round_index: int, messages: Sequence[dict],
                    about: Mapping[str, Any]) -> str:
    """Write one round's conversation (OpenAI-format messages) atomically; returns the path."""
    path = transcript_path(run_dir, round_index)
    atomic_write_json(path, {**dict(about), "round": round_index, "messages": list(messages)})
    return path
