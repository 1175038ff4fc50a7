"""Self-Guide's fixed reward: `self_guide` proposes R_env + lambda(u) * g_sg (no search).

The trapezoid trust schedule lambda(u) comes from the config block `trust` (warmup, ramp_end,
anneal_start: fractions of inner training; defaults 0.2 / 0.4 / 0.8; see
derl_jax/selfguide.py). The domain must have the summed self-reward primitive `g_sg`
(household: `config.domain.self_guide=True`). Like `outcome`, the protocol trains it once.
"""

from __future__ import annotations

from typing import Any

from derl_jax.meta.strategies.base import StrategyContext
from derl_jax.meta.strategies.fixed import FixedStrategy
from derl_jax.meta.strategies.registry import register_strategy
from derl_jax.selfguide import SELF_REWARD_PRIMITIVE, composite_text, schedule_from_config


@register_strategy("self_guide")
class SelfGuideStrategy(FixedStrategy):
    """Always proposes `derl_jax.selfguide.composite_text` of the config's schedule."""

    @classmethod
    def from_config(cls, name: str, context: StrategyContext) -> FixedStrategy:
        return cls(composite_text(context.primitive_names, schedule_from_config(context.cfg), context.outcome_index))

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
                              f"{cfg.domain.kind!r} lacks with this config (household: set config.domain.self_guide=True)")
