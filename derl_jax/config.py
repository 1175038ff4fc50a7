"""Config validation: the shared blocks here, each domain's own fields in its `DomainSpec.validate`.

Every check raises `ConfigError` with one line naming the field, e.g.
`config.inner.group_size must be >= 2, got 1`. `validate(cfg)` runs the checks of the blocks
every run has (seed, name, domain.kind, policy, inner, grpo, mesh, primitives) and then the domain's own;
the strategy blocks (outer, meta, evolution, compare, final) are checked by the strategies
(`derl_jax.meta.strategies.validate_config`). The small checkers below are shared by all of them.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

MODEL_SIZE_FIELDS = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")


class InputError(ValueError):
    """Bad user input (a config value, a data file, a reward expression, a run directory); the
    message names it. The launcher prints such errors as one line and exits with status 2."""


class ConfigError(InputError):
    """A configuration value is missing or out of range; the message names the field."""


# --------------------------------------------------------------------------- checkers


def field_error(owner: Any, field: str, why: str) -> ValueError:
    """ValueError `Owner.field=value: why` for a bad field of a settings dataclass `owner`."""
    return ValueError(f"{type(owner).__name__}.{field}={getattr(owner, field)!r}: {why}")


def config_value(cfg: Any, path: str) -> Any:
    """`cfg.<path>` for a dotted path; ConfigError naming `config.<path>` when missing."""
    node = cfg
    for part in path.split("."):
        try:
            node = node[part] if isinstance(node, Mapping) else getattr(node, part)
        except (KeyError, AttributeError, TypeError):
            raise ConfigError(f"config.{path} is missing") from None
    return node


def has_field(cfg: Any, path: str) -> bool:
    """Whether `cfg.<path>` exists."""
    try:
        config_value(cfg, path)
    except ConfigError:
        return False
    return True


def is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def int_at_least(cfg: Any, path: str, minimum: int) -> int:
    """`cfg.<path>` as an int >= minimum."""
    value = config_value(cfg, path)
    if not is_int(value):
        raise ConfigError(f"config.{path} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"config.{path} must be >= {minimum}, got {value!r}")
    return int(value)


def number(cfg: Any, path: str, *, minimum: float, strict: bool) -> float:
    """`cfg.<path>` as a finite float > minimum (strict) or >= minimum."""
    value = config_value(cfg, path)
    ok = is_number(value) and math.isfinite(float(value)) and (value > minimum if strict else value >= minimum)
    if not ok:
        relation = ">" if strict else ">="
        raise ConfigError(f"config.{path} must be a number {relation} {minimum}, got {value!r}")
    return float(value)


def choice(cfg: Any, path: str, options: Sequence[str]) -> str:
    """`cfg.<path>`, which must be one of `options`."""
    value = config_value(cfg, path)
    if value not in options:
        raise ConfigError(f"config.{path} must be one of {tuple(options)}, got {value!r}")
    return value


def boolean(cfg: Any, path: str) -> bool:
    """`cfg.<path>`, which must be True or False."""
    value = config_value(cfg, path)
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"config.{path} must be True or False, got {value!r}")
    return bool(value)


def int_tuple(cfg: Any, path: str, *, minimum: int, allowed: Sequence[int] | None = None) -> tuple[int, ...]:
    """`cfg.<path>` as a non-empty tuple of distinct ints >= minimum (and in `allowed` when given)."""
    value = config_value(cfg, path)
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
        raise ConfigError(f"config.{path} must be a non-empty tuple of integers, got {value!r}")
    for item in value:
        if not is_int(item) or item < minimum or (allowed is not None and item not in allowed):
            where = f"in {tuple(allowed)}" if allowed is not None else f">= {minimum}"
            raise ConfigError(f"config.{path} must hold integers {where}, got {value!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"config.{path} must not repeat values, got {value!r}")
    return tuple(int(v) for v in value)


def held_out_split(cfg: Any, items_path: str, held_out_path: str, noun: str) -> None:
    """An agent domain's generalisation split: `held_out_path` names some of `items_path` (task
    kinds or names; at level L2 some but not all), and the trained ones x `domain.num_train` leave
    at least 5 rows for the 8:2 inner-train/validation cut."""
    items = tuple(config_value(cfg, items_path))
    held_path = held_out_path.rsplit(".", 1)
    held_out = tuple(config_value(cfg, held_path[0]).get(held_path[1], ()))
    outside = [k for k in held_out if k not in items]
    if outside:
        raise ConfigError(f"config.{held_out_path} {outside} are not in config.{items_path}")
    level = config_value(cfg, "domain.level")
    if level == "L2" and not 0 < len(held_out) < len(items):
        raise ConfigError(f"config.{held_out_path} must name some but not all of config.{items_path} for level L2")
    trained = len(items) - (len(held_out) if level == "L2" else 0)
    rows = int(config_value(cfg, "domain.num_train"))
    if trained * rows < 5:
        raise ConfigError(f"config.domain.num_train x training {noun} must be >= 5 (the 8:2 inner-train/validation "
                          f"cut), got {rows} x {trained}")


def optional_fraction(cfg: Any, path: str, default: float) -> float:
    """`cfg.<path>` (the `default` when absent), a number in [0, 1]."""
    block, field = path.rsplit(".", 1)
    value = config_value(cfg, block).get(field, default)
    if not is_number(value) or not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"config.{path} must be a number in [0, 1], got {value!r}")
    return float(value)


def model_sizes(cfg: Any, section: str) -> None:
    """The transformer sizes of `config.<section>`: positive ints, heads a multiple of kv heads."""
    for name in MODEL_SIZE_FIELDS:
        int_at_least(cfg, f"{section}.{name}", 1)
    heads, kv_heads = config_value(cfg, f"{section}.num_heads"), config_value(cfg, f"{section}.num_kv_heads")
    if heads % kv_heads:
        raise ConfigError(
            f"config.{section}.num_heads must be a multiple of config.{section}.num_kv_heads, got {heads} and {kv_heads}"
        )


# --------------------------------------------------------------------------- the shared blocks


def validate_shared(cfg: Any) -> None:
    """Seed, name, domain.kind (a name), policy, inner and GRPO keys, mesh, primitives.modules / extra; no domain lookup."""
    int_at_least(cfg, "seed", 0)
    name = config_value(cfg, "name")
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise ConfigError(f"config.name must be a non-empty name without '/', got {name!r}")
    kind = config_value(cfg, "domain.kind")
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"config.domain.kind must name a domain, got {kind!r}")

    model_sizes(cfg, "policy")
    int_at_least(cfg, "policy.sft_steps", 0)
    number(cfg, "policy.sft_lr", minimum=0.0, strict=True)
    int_at_least(cfg, "policy.sft_batch_size", 1)

    int_at_least(cfg, "inner.steps", 1)
    int_at_least(cfg, "inner.prompts_per_step", 1)
    int_at_least(cfg, "inner.group_size", 2)
    number(cfg, "inner.lr", minimum=0.0, strict=True)
    number(cfg, "inner.kl", minimum=0.0, strict=False)
    int_at_least(cfg, "inner.chunk_size", 0)
    number(cfg, "inner.temperature", minimum=0.0, strict=True)
    for block in ("inner", "grpo"):
        if has_field(cfg, block):
            _optional_inner_fields(cfg, block)

    for axis in ("cand", "data", "model"):
        size = config_value(cfg, f"mesh.{axis}")
        auto = axis == "data" and size == 0
        if not is_int(size) or (size < 1 and size != -1 and not auto):
            also = ", -1 (fill) or 0 (auto: one per CPU core)" if axis == "data" else " or -1 (fill)"
            raise ConfigError(f"config.mesh.{axis} must be a positive integer{also}, got {size!r}")
    for field, what in (("modules", "module names"), ("extra", "primitive names")):
        if has_field(cfg, f"primitives.{field}"):
            names = config_value(cfg, f"primitives.{field}")
            if isinstance(names, str) or not isinstance(names, Sequence) or not all(isinstance(n, str) and n for n in names):
                raise ConfigError(f"config.primitives.{field} must be a tuple of {what}, got {names!r}")


def _optional_inner_fields(cfg: Any, block: str) -> None:
    """The optional keys of the inner loop / GRPO in `config.<block>`, each checked when present."""
    from derl_jax.rl.config import BUDGET_REFERENCES, DISPATCH_MODES
    from derl_jax.rl.grpo import KL_KINDS, LOSS_AGGREGATIONS

    present = lambda field: has_field(cfg, f"{block}.{field}")  # noqa: E731
    for field in ("clip_low", "clip_high", "weight_decay", "budget_factor", "time_limit_s"):
        if present(field):
            number(cfg, f"{block}.{field}", minimum=0.0, strict=False)
    if present("clip_low") and config_value(cfg, f"{block}.clip_low") >= 1:
        raise ConfigError(f"config.{block}.clip_low must be < 1, got {config_value(cfg, f'{block}.clip_low')!r}")
    for field, minimum in (("epochs", 1), ("minibatches", 1), ("warmup_steps", 0), ("top_k", 0),
                           ("eval_batch_size", 1), ("budget_tokens", 0), ("host_workers", 1)):
        if present(field):
            int_at_least(cfg, f"{block}.{field}", minimum)
    if present("max_grad_norm") and config_value(cfg, f"{block}.max_grad_norm") is not None:
        number(cfg, f"{block}.max_grad_norm", minimum=0.0, strict=False)
    for field, options in (("kl_kind", KL_KINDS), ("loss_agg", LOSS_AGGREGATIONS), ("dispatch", DISPATCH_MODES),
                           ("budget_reference", BUDGET_REFERENCES)):
        if present(field):
            choice(cfg, f"{block}.{field}", options)
    for field in ("normalize_std", "kl_metric", "common_random_numbers", "return_params"):
        if present(field):
            boolean(cfg, f"{block}.{field}")
    if present("minibatches"):
        rollouts = int_at_least(cfg, "inner.prompts_per_step", 1) * int_at_least(cfg, "inner.group_size", 1)
        minibatches = config_value(cfg, f"{block}.minibatches")
        if rollouts % minibatches:
            raise ConfigError(f"config.{block}.minibatches must divide the {rollouts} rollouts per step "
                              f"(inner.prompts_per_step x inner.group_size), got {minibatches}")


def validate(cfg: Any) -> None:
    """The shared blocks, then the domain named by `config.domain.kind` checks its own fields.

    Raises ConfigError naming the first bad field (an unknown domain lists the known ones).
    """
    from derl_jax.domains.registry import get_domain

    validate_shared(cfg)
    get_domain(config_value(cfg, "domain.kind")).validate(cfg)
