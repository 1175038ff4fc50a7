"""Self-Guide's fixed reward: `self_guide` proposes R_env + lambda(u) * g_sg (no search).

The trapezoid trust schedule lambda(u) comes from the config block `trust` (warmup, ramp_end,
anneal_start: fractions of inner training; defaults 0.2 / 0.4 / 0.8; see
derl_jax/selfguide.py). The domain must have the summed self-reward primitive `g_sg`
(household, scienceworld, alfworld: `config.domain.self_guide=True`). Like `outcome`, the protocol
trains it once.

Two ablations of the schedule are methods of their own, so one compare holds the whole
ablation table: `self_guide_no_warmup` (warmup = ramp_end = 0: lambda = 1 from the start, then
the configured anneal) and `self_guide_no_anneal` (anneal_start = 1: the configured warm-up and
ramp, then full trust to the end).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from derl_jax.outer.strategy import StrategyContext
from derl_jax.methods.baselines import FixedStrategy
from derl_jax.outer.registry import register_strategy
from derl_jax.selfguide import SELF_REWARD_PRIMITIVE, composite_text, schedule_from_config


@register_strategy("self_guide")
class SelfGuideStrategy(FixedStrategy):
    """Always proposes `derl_jax.selfguide.composite_text` of the config's schedule."""

    schedule_changes: dict = {}

    @classmethod
    def from_config(cls, name: str, context: StrategyContext) -> FixedStrategy:
        schedule = dataclasses.replace(schedule_from_config(context.cfg), **cls.schedule_changes)
        return cls(composite_text(context.primitive_names, schedule, context.outcome_index))

    @classmethod
    def check_config(cls, cfg: Any, name: str) -> None:
        from derl_jax.config import ConfigError
        from derl_jax.domains.registry import get_domain

        try:
            schedule_from_config(cfg)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        names = get_domain(str(cfg.domain.kind)).primitive_names(cfg)
        if SELF_REWARD_PRIMITIVE not in names:
            raise ConfigError(f"method {name!r} needs the primitive {SELF_REWARD_PRIMITIVE!r}, which domain "
                              f"{cfg.domain.kind!r} lacks with this config (household, scienceworld, alfworld: set "
                              "config.domain.self_guide=True)")


@register_strategy("self_guide_no_warmup")
class SelfGuideNoWarmup(SelfGuideStrategy):
    """Self-Guide with lambda = 1 from the start (no warm-up, no ramp), annealed as configured."""

    schedule_changes = {"warmup": 0.0, "ramp_end": 0.0}


@register_strategy("self_guide_no_anneal")
class SelfGuideNoAnneal(SelfGuideStrategy):
    """Self-Guide with the configured warm-up and ramp, then full trust to the end (no annealing)."""

    schedule_changes = {"anneal_start": 1.0}
