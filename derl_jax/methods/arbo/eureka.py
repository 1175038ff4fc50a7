"""Eureka-style greedy refinement: the ARBO machinery with Eureka's history and schedule.

Every round refines the best candidate so far from its per-term curves (the schedule is
`exploit_only`: the first round, with nothing to refine, explores), seeing only that one
candidate (`View(scope="incumbent")`) and keeping no belief. The proposal operator and its
backends are `arbo`'s (`config.arbo.proposer`, `config.arbo.agent`), so `arbo` and `eureka`
differ only in history and schedule.
"""

from __future__ import annotations

from typing import Any

from derl_jax.methods.arbo.proposer import View
from derl_jax.methods.arbo.schedule import Schedule
from derl_jax.methods.arbo.settings import make_backend, read_settings
from derl_jax.methods.arbo.strategy import ArboStrategy
from derl_jax.outer.strategy import StrategyContext
from derl_jax.outer.registry import register_strategy

EUREKA_SCHEDULE = Schedule(kind="exploit_only", initial_explore=0)
EUREKA_VIEW = View(level="full", scope="incumbent", belief=False)


@register_strategy("eureka")
class EurekaStrategy(ArboStrategy):
    """Eureka-style greedy refinement of the incumbent (module docstring)."""

    @classmethod
    def from_config(cls, name: str, context: StrategyContext) -> "EurekaStrategy":
        settings = read_settings(context.cfg)
        return cls(context.primitive_names, context.outcome_index, schedule=EUREKA_SCHEDULE, view=EUREKA_VIEW,
                   backend=make_backend(settings.agent) if settings.proposer == "agent" else None,
                   max_turns=settings.agent.max_turns, task=settings.task, workdir=context.workdir)

    @classmethod
    def check_config(cls, cfg: Any, name: str) -> None:
        read_settings(cfg)
