"""Random search: the cold-started Meta-Optimizer sampled with its parameters frozen, the
paper's compute-controlled random baseline (Appendix F.2)."""

from __future__ import annotations

from derl_jax.meta.strategies.derl import MetaOptimizerStrategy
from derl_jax.meta.strategies.registry import register_strategy


@register_strategy("random")
class RandomSearchStrategy(MetaOptimizerStrategy):
    learn = False
