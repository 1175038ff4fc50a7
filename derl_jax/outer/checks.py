"""Config checks the outer loop owns: the `outer` block, then each method the run uses.

Registered with `derl_jax.config.register_check` on import. `check_methods` asks each method
named by `outer.strategy` and `compare.methods` to check its own fields (`Strategy.check_config`:
the Meta-Optimizer methods the `meta` block, evolution its `evolution` block, population
methods that the inner loop returns policies).
"""

from __future__ import annotations

from typing import Any

from derl_jax.config import ConfigError, choice, config_value, has_field, int_at_least, register_check
from derl_jax.expr.parse import OPERATOR_SETS
from derl_jax.outer.registry import get_strategy, is_known_strategy, strategy_names


def check_outer_block(cfg: Any) -> None:
    """`config.outer`: a known strategy, iterations, candidates per iteration, the split seed,
    population strategies' iterations and inner steps (0: derived, `derl_jax.outer.budget`);
    and `config.meta.operators`, the operator set every searched candidate keeps to."""
    strategy = config_value(cfg, "outer.strategy")
    if not is_known_strategy(strategy):
        raise ConfigError(f"config.outer.strategy must be one of {strategy_names()}, got {strategy!r}")
    int_at_least(cfg, "outer.iterations", 1)
    int_at_least(cfg, "outer.num_candidates", 2)
    int_at_least(cfg, "outer.split_seed", 0)
    for field in ("population_iterations", "population_inner_steps"):
        if has_field(cfg, f"outer.{field}"):
            int_at_least(cfg, f"outer.{field}", 0)
    operator_set(cfg)


def operator_set(cfg: Any) -> str:
    """`config.meta.operators` (one of `OPERATOR_SETS`; "extended" when the config has no such field)."""
    return choice(cfg, "meta.operators", OPERATOR_SETS) if has_field(cfg, "meta.operators") else "extended"


def methods_of(cfg: Any) -> tuple[str, ...]:
    """The methods a run may use: `outer.strategy`, then `compare.methods` (when the config has them)."""
    compared = tuple(config_value(cfg, "compare.methods")) if has_field(cfg, "compare.methods") else ()
    return tuple(dict.fromkeys([config_value(cfg, "outer.strategy"), *compared]))


def check_methods(cfg: Any) -> None:
    """Each method of `methods_of(cfg)` checks the fields it reads."""
    for name in methods_of(cfg):
        get_strategy(name).check_config(cfg, name)


def check_population_config(cfg: Any, name: str) -> None:
    """A population strategy needs the inner loop to hand back the trained policies."""
    if has_field(cfg, "inner.return_params") and not config_value(cfg, "inner.return_params"):
        raise ConfigError(
            f"config.inner.return_params=False cannot run {name!r}: a population strategy starts each "
            "iteration from the previous iteration's best policy, which the inner loop must return"
        )


register_check("outer", check_outer_block)
register_check("methods", check_methods)
