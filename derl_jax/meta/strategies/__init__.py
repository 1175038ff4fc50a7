"""Outer-loop strategies: every method that proposes reward expressions, one module each.

`base` defines `Strategy` and `CandidateRecord`; `registry` maps names to classes and finds
the strategy modules of this package by itself; `validation` checks the config fields the
strategies and the outer loop read.
"""

from derl_jax.meta.strategies.base import (
    CandidateRecord,
    MetaOptimizerLike,
    OptimizerFactory,
    Strategy,
    StrategyContext,
    check_proposals,
    check_scores,
    check_update,
    finite_metrics,
)
from derl_jax.meta.strategies.registry import (
    ALL_METHODS,
    get_strategy,
    is_known_strategy,
    make_strategy,
    register_strategy,
    strategy_names,
)
from derl_jax.meta.strategies.validation import validate_config
