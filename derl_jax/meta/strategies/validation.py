"""Config checks of the outer loop: `validate_config(cfg)`.

The blocks every strategy reads (outer, final, compare) are checked here; then each strategy
the run uses (`outer.strategy` and every `compare.methods` entry) checks its own fields in its
`check_config` (the Meta-Optimizer strategies the `meta` block, evolution its `evolution`
block, population strategies that the inner loop returns policies). The generic blocks (seed,
domain, policy, inner, grpo, mesh) are `derl_jax.config.validate`'s.
"""

from __future__ import annotations

from typing import Any, Sequence

from derl_jax.config import (
    ConfigError,
    boolean,
    choice,
    config_value,
    has_field,
    int_at_least,
    int_tuple,
    model_sizes,
    number,
)
from derl_jax.expr.parse import MAX_NESTING
from derl_jax.meta.strategies.registry import get_strategy, is_known_strategy, strategy_names


def validate_config(cfg: Any) -> None:
    """Raise ConfigError naming the first bad outer-loop field, e.g.
    `config.outer.num_candidates must be >= 2, got 1`."""
    strategy = config_value(cfg, "outer.strategy")
    if not is_known_strategy(strategy):
        raise ConfigError(f"config.outer.strategy must be one of {strategy_names()}, got {strategy!r}")
    int_at_least(cfg, "outer.iterations", 1)
    int_at_least(cfg, "outer.num_candidates", 2)
    int_at_least(cfg, "outer.split_seed", 0)
    if has_field(cfg, "outer.population_inner_steps"):
        int_at_least(cfg, "outer.population_inner_steps", 0)
    int_at_least(cfg, "final.steps", 1)

    methods = config_value(cfg, "compare.methods")
    if isinstance(methods, str) or not isinstance(methods, Sequence) or not methods:
        raise ConfigError(f"config.compare.methods must be a non-empty tuple of method names, got {methods!r}")
    for method in methods:
        if not is_known_strategy(method):
            raise ConfigError(f"config.compare.methods: unknown method {method!r}; expected names from {strategy_names()}")
    if len(set(methods)) != len(methods):
        raise ConfigError(f"config.compare.methods must not repeat a method, got {tuple(methods)!r}")
    int_tuple(cfg, "compare.seeds", minimum=0)
    boolean(cfg, "compare.per_iteration_test")
    if has_field(cfg, "compare.candidate_test"):
        boolean(cfg, "compare.candidate_test")
    if has_field(cfg, "compare.keep_final_policies"):
        boolean(cfg, "compare.keep_final_policies")
    compare_levels(cfg)
    if has_field(cfg, "compare.workers"):
        int_at_least(cfg, "compare.workers", 0)

    for name in dict.fromkeys([strategy, *methods]):
        get_strategy(name).check_config(cfg, name)


def check_meta_block(cfg: Any) -> None:
    """The Meta-Optimizer's fields (`config.meta`), for strategies that sample from it."""
    backbone = choice(cfg, "meta.backbone", ("scratch", "hf"))
    if backbone == "hf" and not str(config_value(cfg, "meta.hf_path")).strip():
        raise ConfigError("config.meta.hf_path must name a local checkpoint directory when config.meta.backbone='hf'")
    if backbone == "scratch":
        model_sizes(cfg, "meta")
    number(cfg, "meta.temperature", minimum=0.0, strict=True)
    int_at_least(cfg, "meta.max_symbols", 2)
    depth = int_at_least(cfg, "meta.max_depth", 1)
    if depth > MAX_NESTING:
        raise ConfigError(f"config.meta.max_depth must be <= {MAX_NESTING}, got {depth}")
    int_at_least(cfg, "meta.cold_start_corpus", 1)
    int_at_least(cfg, "meta.cold_start_steps", 0)
    number(cfg, "meta.cold_start_lr", minimum=0.0, strict=True)
    number(cfg, "meta.lr", minimum=0.0, strict=True)
    number(cfg, "meta.kl", minimum=0.0, strict=False)
    int_at_least(cfg, "meta.epochs", 1)


def check_evolution_block(cfg: Any, inits: Sequence[str]) -> None:
    """`config.evolution` (and the Meta-Optimizer's block when it cold-starts the population)."""
    initialisation = choice(cfg, "evolution.init", inits)
    int_at_least(cfg, "evolution.capacity", 1)
    int_at_least(cfg, "evolution.tournament", 1)
    rate = number(cfg, "evolution.mutation_rate", minimum=0.0, strict=False)
    if rate > 1.0:
        raise ConfigError(f"config.evolution.mutation_rate must be in [0, 1], got {rate!r}")
    initial_depth = int_at_least(cfg, "evolution.initial_depth", 1)
    if initial_depth > MAX_NESTING:
        raise ConfigError(f"config.evolution.initial_depth must be <= {MAX_NESTING}, got {initial_depth}")
    if initialisation == "cold_start":
        check_meta_block(cfg)


def check_population_config(cfg: Any, name: str) -> None:
    """A population strategy needs the inner loop to hand back the trained policies."""
    if has_field(cfg, "inner.return_params") and not config_value(cfg, "inner.return_params"):
        raise ConfigError(
            f"config.inner.return_params=False cannot run {name!r}: a population strategy starts each "
            "iteration from the previous iteration's best policy, which the inner loop must return"
        )


def compare_levels(cfg: Any) -> tuple[str, ...]:
    """`config.compare.levels`: the domain's generalisation levels the compare runs one after another
    (each in `<workdir>/<level>`), () for the configured `domain.level` alone."""
    if not has_field(cfg, "compare.levels"):
        return ()
    levels = config_value(cfg, "compare.levels")
    if isinstance(levels, str) or not isinstance(levels, Sequence) or not all(isinstance(v, str) and v for v in levels):
        raise ConfigError(f"config.compare.levels must be a tuple of level names, got {levels!r}")
    if len(set(levels)) != len(levels):
        raise ConfigError(f"config.compare.levels must not repeat a level, got {tuple(levels)!r}")
    if levels and not has_field(cfg, "domain.level"):
        raise ConfigError(f"config.compare.levels={tuple(levels)!r}: the domain {config_value(cfg, 'domain.kind')!r} "
                          f"has no generalisation levels (no config.domain.level)")
    return tuple(levels)
