"""The outer loop: the search over reward expressions and its contract with every method.

`strategy` defines what a method is (`Strategy`, `CandidateRecord`); `registry` finds the
methods of `derl_jax.methods` by name; `search` runs one method's search, with
`candidates` (each proposal compiled once, trained, scored), `resume` and `budget`.
"""

from derl_jax.outer.registry import (
    ALL_METHODS,
    get_strategy,
    is_known_strategy,
    make_strategy,
    register_strategy,
    strategy_names,
)
from derl_jax.outer.strategy import (
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
