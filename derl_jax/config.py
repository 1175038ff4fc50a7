"""Config checks: the small checkers every block's check uses, and the registry of block checks.

Every check raises `ConfigError` with one line naming the field, e.g.
`config.inner.group_size must be >= 2, got 1`. The package that owns a config block registers
its check here (`register_check`): the run fields below, `policy`, `inner` and `mesh` in
`derl_jax.rl.checks`, `primitives` in `primitives.registry`,
`domain` in `derl_jax.domains.registry` (which calls the domain's own `validate`), `outer` and
`methods` in `derl_jax.outer.checks` (each method checks its own fields), `final` and `compare`
in `derl_jax.experiment.checks`. This module imports nothing of the project.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

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
    at least 5 rows for the 8:2 inner-train/validation cut (num_train 0: the whole split)."""
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
    if rows and trained * rows < 5:  # 0: every row of the benchmark's split, counted when it is read
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


# --------------------------------------------------------------------------- block checks


BLOCK_ORDER = ("run", "policy", "inner", "mesh", "domain", "primitives", "outer", "final", "compare", "methods")
_CHECKS: dict[str, Callable[[Any], None]] = {}


def register_check(block: str, check: Callable[[Any], None]) -> Callable[[Any], None]:
    """Register `check(cfg)`, which raises ConfigError naming the first bad field of `block`.

    The package that owns a config block registers its check when it is imported (the inner
    loop `inner`, the domains `domain`, the outer loop `outer`, ...); `validate` runs them in
    `BLOCK_ORDER`, so the first bad field a user is told of does not depend on import order.
    """
    if block not in BLOCK_ORDER:
        raise ValueError(f"register_check: block must be one of {BLOCK_ORDER}, got {block!r}")
    known = _CHECKS.get(block)
    if known is not None and (known.__module__, known.__qualname__) != (check.__module__, check.__qualname__):
        raise ValueError(f"register_check: block {block!r} is already checked by {known.__module__}.{known.__qualname__}")
    _CHECKS[block] = check
    return check


def registered_checks() -> tuple[str, ...]:
    """The blocks with a registered check, in the order `validate` runs them."""
    return tuple(block for block in BLOCK_ORDER if block in _CHECKS)


def validate(cfg: Any, blocks: Sequence[str] | None = None) -> None:
    """The registered checks of `blocks` (default: every registered block), in `BLOCK_ORDER`;
    ConfigError naming the first bad field.

    Only the checks of imported packages are registered: `derl_jax.experiment.checks.validate_config`
    imports every owner first and is what a run calls.
    """
    unknown = set(blocks or ()) - set(BLOCK_ORDER)
    if unknown:
        raise ValueError(f"validate: unknown blocks {sorted(unknown)}; blocks are {BLOCK_ORDER}")
    for block in registered_checks():
        if blocks is None or block in blocks:
            _CHECKS[block](cfg)


def check_run_fields(cfg: Any) -> None:
    """`seed` and `name`, the fields of the run itself."""
    int_at_least(cfg, "seed", 0)
    name = config_value(cfg, "name")
    if not isinstance(name, str) or not name.strip() or "/" in name:
        raise ConfigError(f"config.name must be a non-empty name without '/', got {name!r}")


register_check("run", check_run_fields)
