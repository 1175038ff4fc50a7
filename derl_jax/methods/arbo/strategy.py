"""ARBO: reward search driven by a persistent evaluation history (`derl_jax.methods.arbo`).

Each round (one outer iteration): the schedule picks explore or exploit from the acceptance
record; the proposal operator — the structural proposer, or the LLM agent with the structural
proposer filling what it leaves uncommitted — reads the history and writes n candidates, their
lineage and a new belief; `update` appends the search loop's records as observations. The
history is the strategy state: it goes into the search checkpoint (so a resumed run proposes
exactly what an uninterrupted one would) and, when the strategy is built for a run directory
(`StrategyContext.workdir`), into `<workdir>/arbo/history.json` after every round.

Names: `arbo` (config.arbo as given) and `arbo_ablation:<preset>` with a preset of
`derl_jax.methods.arbo.settings.ABLATIONS` (no_belief, scores_only, explore_only, exploit_only)
applied over it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from derl_jax.expr.canonical import canonical
from derl_jax.expr.check import check_text
from derl_jax.methods.arbo import history as hist
from derl_jax.methods.arbo.proposer import View, propose_structural
from derl_jax.methods.arbo.schedule import EXPLORE, Schedule, next_mode
from derl_jax.methods.arbo.settings import make_backend, read_settings
from derl_jax.outer.strategy import CandidateRecord, Strategy, StrategyContext, check_update
from derl_jax.outer.registry import register_strategy

ABLATION_NAME = "arbo_ablation"


@dataclasses.dataclass(frozen=True)
class ArboState:
    history: hist.History = hist.History()
    last_metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """propose's aux: the mode, what the searcher says about each text, its new belief."""

    mode: str
    proposals: tuple[hist.Proposal, ...]
    belief: hist.Belief | None
    agent: Mapping[str, float] = dataclasses.field(default_factory=dict)


@register_strategy("arbo")
@register_strategy(ABLATION_NAME, takes_argument=True)
class ArboStrategy(Strategy):
    """History-driven search: every candidate's scores, curves and failures kept, an explore/exploit
    schedule (module docstring)."""

    def __init__(self, primitive_names: Sequence[str], outcome_index: int = 0, *, schedule: Schedule = Schedule(),
                 view: View = View(), backend: Any = None, max_turns: int = 24, task: str = "",
                 workdir: str | None = None):
        self.primitive_names = tuple(primitive_names)
        self.outcome_index = int(outcome_index)
        self.schedule = schedule
        self.view = view
        self.backend = backend
        self.max_turns = int(max_turns)
        self.task = task
        self.workdir = workdir

    @staticmethod
    def _ablation(name: str) -> str | None:
        head, _, argument = name.partition(":")
        return argument if head == ABLATION_NAME else None

    @classmethod
    def from_config(cls, name: str, context: StrategyContext) -> "ArboStrategy":
        settings = read_settings(context.cfg, cls._ablation(name))
        return cls(context.primitive_names, context.outcome_index, schedule=settings.schedule, view=settings.view,
                   backend=make_backend(settings.agent) if settings.proposer == "agent" else None,
                   max_turns=settings.agent.max_turns, task=settings.task, workdir=context.workdir)

    @classmethod
    def check_config(cls, cfg: Any, name: str) -> None:
        read_settings(cfg, cls._ablation(name))

    def init(self, key: Any) -> ArboState:
        return ArboState()

    def mode(self, state: ArboState) -> str:
        return next_mode(hist.acceptance_record(state.history), self.schedule)

    def propose(self, state: ArboState, key: Any, n: int) -> tuple[list[str], RoundPlan]:
        mode = self.mode(state)
        agent_key, fill_key = jax.random.split(key)
        proposals: list[hist.Proposal] = []
        belief, stats = None, {}
        if self.backend is not None:
            proposals, belief, stats = self._agent_round(state, agent_key, mode, n)
        if len(proposals) < n:
            committed = [_canonical(p.text, self.primitive_names, self.outcome_index) for p in proposals]
            filled, structural_belief = propose_structural(
                state.history, mode, fill_key, n - len(proposals), self.primitive_names, self.outcome_index,
                self.view, avoid=committed)
            proposals += filled
            if self.backend is None:
                belief = structural_belief  # with an agent, the belief is the agent's
        if not self.view.belief:
            belief = None
        plan = RoundPlan(mode, tuple(proposals), belief, stats)
        return [p.text for p in proposals], plan

    def _agent_round(self, state: ArboState, key: Any, mode: str, n: int):
        from derl_jax.methods.arbo.agent import run_agent
        from derl_jax.methods.arbo.tools import Workspace

        workspace = Workspace(state.history, self.view, self.primitive_names, self.outcome_index, wanted=n)
        seed = int(jax.random.randint(key, (), 0, 2**30))
        outcome = run_agent(self.backend, workspace, mode, seed=seed, max_turns=self.max_turns, task=self.task)
        belief = outcome.belief if self.view.belief else None
        stats = {"agent_committed": float(len(outcome.proposals)), "agent_turns": float(outcome.turns),
                 "agent_tool_errors": float(outcome.tool_errors), "agent_backend_errors": float(outcome.backend_errors)}
        return list(outcome.proposals), belief, stats

    def update(self, state: ArboState, records: Sequence[CandidateRecord], scores: np.ndarray, aux: RoundPlan):
        check_update(records, scores, f"{self.name}.update")
        texts = [p.text for p in aux.proposals]
        if [r.text for r in records] != texts:
            raise ValueError(f"{self.name}.update: the records are not the texts this round proposed ({texts})")
        history = hist.append_round(state.history, records, aux.proposals, aux.mode, aux.belief)
        if self.workdir is not None:
            hist.save(history, self.workdir)
        best = hist.incumbent(history)
        metrics = {"explore": float(aux.mode == EXPLORE), "accepted": float(hist.acceptance_record(history)[-1]),
                   "refinements": float(sum(p.parent is not None for p in aux.proposals)),
                   "incumbent_id": float(best.id) if best is not None else -1.0, **aux.agent}
        return ArboState(history=history, last_metrics=metrics)

    def metrics(self, state: ArboState) -> dict[str, float]:
        return dict(state.last_metrics)

    def checkpoint(self, state: ArboState) -> tuple[dict, dict]:
        return {}, {"history": hist.to_json(state.history), "last_metrics": dict(state.last_metrics)}

    def restore(self, initial_state: ArboState, arrays: Any, data: Mapping[str, Any]) -> ArboState:
        state = ArboState(history=hist.from_json(data["history"]), last_metrics=dict(data.get("last_metrics", {})))
        if self.workdir is not None:
            hist.save(state.history, self.workdir)  # drops what an interrupted round had written
        return state


def _canonical(text: str, names: Sequence[str], outcome_index: int) -> str:
    tree, _ = check_text(text, names, outcome_index=outcome_index)
    return canonical(tree)  # committed texts passed check_text, so they parse
