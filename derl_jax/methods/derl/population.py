"""DERL-pop: DERL's proposals and updates; each iteration's inner policies start from the
previous iteration's best policy (`population=True`), so the search itself evolves a policy."""

from __future__ import annotations

from typing import Any

from derl_jax.methods.derl.strategy import MetaOptimizerStrategy
from derl_jax.outer.checks import check_population_config
from derl_jax.outer.registry import register_strategy


@register_strategy("derl_pop")
class DerlPopStrategy(MetaOptimizerStrategy):
    """DERL whose inner policies start from the previous iteration's best policy."""

    population = True

    @classmethod
    def check_config(cls, cfg: Any, name: str) -> None:
        super().check_config(cfg, name)
        check_population_config(cfg, name)
