"""The whole config's check (`validate_config`) and the blocks the experiment owns: `final`, `compare`.

`validate_config(cfg)` imports every package that owns a config block (each registers its
check with `derl_jax.config.register_check` on import) and runs them all, in
`derl_jax.config.BLOCK_ORDER`; it raises ConfigError naming the first bad field, e.g.
`config.outer.num_candidates must be >= 2, got 1`. It is what every run calls before
anything is built.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import primitives.registry  # noqa: F401  (registers the `primitives` check)
from derl_jax import config
from derl_jax.config import (
    ConfigError,
    boolean,
    config_value,
    has_field,
    int_at_least,
    int_tuple,
    register_check,
)
from derl_jax.domains import registry as domain_registry  # noqa: F401  (registers the `domain` check)
from derl_jax.experiment import reevaluate
from derl_jax.outer import checks as outer_checks  # noqa: F401  (registers `outer` and `methods`)
from derl_jax.experiment.runtime import platform_devices
from derl_jax.outer.registry import is_known_strategy, strategy_names
from derl_jax.parallel import check_mesh_fits
from derl_jax.rl import checks as inner_checks  # noqa: F401  (registers `policy`, `inner`, `mesh`)


def validate_config(cfg: Any, skip: Sequence[str] = ()) -> None:
    """Every block's check (module docstring), but those of the blocks in `skip`."""
    blocks = None if not skip else tuple(b for b in config.BLOCK_ORDER if b not in skip)
    config.validate(cfg, blocks)


def check_devices(cfg: Any) -> tuple[int, int, int]:
    """The mesh block against this process's devices, before anything is built: the platform
    JAX_PLATFORMS names starts, and the mesh fits its devices (`parallel.check_mesh_fits`);
    returns the (cand, data, model) sizes (data 0 = auto counted as 1). InputError otherwise."""
    devices = platform_devices(os.environ)
    sizes = [config_value(cfg, f"mesh.{axis}") for axis in ("cand", "data", "model")]
    try:
        return check_mesh_fits(*sizes, num_devices=len(devices), platform=devices[0].platform)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_mesh_rows(cfg: Any, rollout_kind: str) -> None:
    """A device-rollout domain shards every step's N = prompts_per_step x group_size rows over
    'data', so an explicit `mesh.data` must divide N (the host kind replicates rows instead)."""
    data = config_value(cfg, "mesh.data")
    rows = int(config_value(cfg, "inner.prompts_per_step")) * int(config_value(cfg, "inner.group_size"))
    if rollout_kind != "host" and data > 1 and rows % data:
        raise ConfigError(f"config.mesh.data={data} must divide the {rows} rollouts of a step "
                          f"(inner.prompts_per_step x inner.group_size)")


def check_final_block(cfg: Any) -> None:
    """`final.steps` (every search method's final policy) and `final.baseline_steps` (the fixed
    baselines'; 0: `final.steps`), which may not be fewer than `final.steps`: the paper's
    protocol gives DERL no more final training than a baseline (Appendix B)."""
    steps = int_at_least(cfg, "final.steps", 1)
    if has_field(cfg, "final.baseline_steps"):
        baseline = int_at_least(cfg, "final.baseline_steps", 0)
        if 0 < baseline < steps:
            raise ConfigError(f"config.final.baseline_steps={baseline} is fewer than config.final.steps={steps}: "
                              "a search method's final policy may not train longer than a baseline's (0 = the same)")
    reevaluate.final_repeats(cfg), reevaluate.top_k(cfg)   # ConfigError when negative


def check_compare_block(cfg: Any) -> None:
    """Methods (known, not repeated), seeds, the reporting switches, levels and workers."""
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
    for field in ("candidate_test", "keep_final_policies"):
        if has_field(cfg, f"compare.{field}"):
            boolean(cfg, f"compare.{field}")
    compare_levels(cfg)
    if has_field(cfg, "compare.workers"):
        int_at_least(cfg, "compare.workers", 0)


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


def at_level(cfg: Any, level: str) -> Any:
    """A copy of `cfg` at generalisation level `level`."""
    copy = cfg.copy_and_resolve_references()
    with copy.unlocked():
        copy.domain.level = level
    return copy


def checked_levels(cfg: Any) -> tuple[str, ...]:
    """`config.compare.levels`, the whole config checked at each level (before anything is built)."""
    levels = compare_levels(cfg)
    for level in levels:
        try:
            validate_config(at_level(cfg, level))
        except ConfigError as err:
            raise ConfigError(f"config.compare.levels: level {level!r}: {err}") from None
    return levels


register_check("final", check_final_block)
register_check("compare", check_compare_block)
