"""Config checks of the blocks the inner loop owns: `policy`, `inner` (and a `grpo` block), `mesh`.

Registered with `derl_jax.config.register_check` on import; each raises ConfigError naming the
first bad field, e.g. `config.inner.group_size must be >= 2, got 1`.
"""

from __future__ import annotations

from typing import Any

from derl_jax.config import (
    ConfigError,
    boolean,
    choice,
    config_value,
    has_field,
    int_at_least,
    is_int,
    model_sizes,
    number,
    register_check,
)
from derl_jax.domains.registry import get_domain
from derl_jax.rl.config import BUDGET_REFERENCES, DISPATCH_MODES, SELF_REWARD_CREDITS
from derl_jax.rl.dapo import ALGORITHMS
from derl_jax.rl.grpo import KL_KINDS, LOSS_AGGREGATIONS
from derl_jax.selfguide import SELF_REWARD_PRIMITIVE


def check_policy_block(cfg: Any) -> None:
    """The policy's model sizes and its supervised warm start."""
    model_sizes(cfg, "policy")
    int_at_least(cfg, "policy.sft_steps", 0)
    number(cfg, "policy.sft_lr", minimum=0.0, strict=True)
    int_at_least(cfg, "policy.sft_batch_size", 1)


def check_inner_block(cfg: Any) -> None:
    """The inner GRPO loop's required fields, then its optional ones (and a `grpo` block's), then
    the algorithm's (`inner.algorithm`, `dynamic_oversample`, `overlong_buffer`); per-turn credit
    of self-rewards needs a domain with the primitive g_sg."""
    int_at_least(cfg, "inner.steps", 1)
    int_at_least(cfg, "inner.prompts_per_step", 1)
    int_at_least(cfg, "inner.group_size", 2)
    number(cfg, "inner.lr", minimum=0.0, strict=True)
    number(cfg, "inner.kl", minimum=0.0, strict=False)
    int_at_least(cfg, "inner.chunk_size", 0)
    number(cfg, "inner.temperature", minimum=0.0, strict=True)
    for block in ("inner", "grpo"):
        if has_field(cfg, block):
            _optional_fields(cfg, block)
    credit = config_value(cfg, "inner.self_reward_credit") if has_field(cfg, "inner.self_reward_credit") else "episode"
    if credit == "turn":
        names = get_domain(str(config_value(cfg, "domain.kind"))).primitive_names(cfg)
        if SELF_REWARD_PRIMITIVE not in names:
            raise ConfigError(f"config.inner.self_reward_credit='turn' credits the self-reward "
                              f"{SELF_REWARD_PRIMITIVE!r} of each turn, which domain {config_value(cfg, 'domain.kind')!r} "
                              "lacks with this config (set config.domain.self_guide=True)")
    _algorithm_fields(cfg)


def _algorithm_fields(cfg: Any) -> None:
    """`inner.algorithm`, `inner.dynamic_oversample` and `inner.overlong_buffer`, when present
    (the buffer against `domain.max_new_tokens` where the domain block names it)."""
    if has_field(cfg, "inner.algorithm"):
        choice(cfg, "inner.algorithm", ALGORITHMS)
    if has_field(cfg, "inner.dynamic_oversample"):
        int_at_least(cfg, "inner.dynamic_oversample", 1)
    if has_field(cfg, "inner.overlong_buffer"):
        buffer = int_at_least(cfg, "inner.overlong_buffer", 0)
        limit = config_value(cfg, "domain.max_new_tokens") if has_field(cfg, "domain.max_new_tokens") else None
        if is_int(limit) and buffer > limit:
            raise ConfigError(f"config.inner.overlong_buffer must be <= domain.max_new_tokens ({limit}), got {buffer}")


def _optional_fields(cfg: Any, block: str) -> None:
    """The optional keys of the inner loop / GRPO in `config.<block>`, each checked when present."""
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
                           ("budget_reference", BUDGET_REFERENCES), ("self_reward_credit", SELF_REWARD_CREDITS)):
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


def check_mesh_block(cfg: Any) -> None:
    """Mesh axis sizes: positive, -1 (fill with every device), or data 0 (automatic)."""
    for axis in ("cand", "data", "model"):
        size = config_value(cfg, f"mesh.{axis}")
        auto = axis == "data" and size == 0
        if not is_int(size) or (size < 1 and size != -1 and not auto):
            also = ", -1 (fill) or 0 (auto: one per CPU core)" if axis == "data" else " or -1 (fill)"
            raise ConfigError(f"config.mesh.{axis} must be a positive integer{also}, got {size!r}")


register_check("policy", check_policy_block)
register_check("inner", check_inner_block)
register_check("mesh", check_mesh_block)
