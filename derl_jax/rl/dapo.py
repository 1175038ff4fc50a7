"""DAPO's additions to GRPO (Yu et al., 2025), as pure functions the inner loop composes.

`inner.algorithm = "dapo"` turns on all four; each is also a setting of its own:

* clip-higher: a wider upper ratio clip than the lower one (`inner.clip_high` > `inner.clip_low`;
  DAPO's 0.28 against 0.2), so unlikely tokens whose advantage is positive can still rise;
* token-level loss: every token of the batch weighs the same (`inner.loss_agg = "token_mean"`);
* dynamic sampling: each step samples `dynamic_oversample` times the prompts it trains on,
  drops the groups whose rewards are all equal (they carry no gradient) and fills the batch
  with the first informative ones (`informative_groups`); with too few, the batch is topped up
  with uninformative groups, whose advantage is 0, and the shortfall is counted;
* overlong reward shaping: a completion longer than `max_new_tokens - overlong_buffer` tokens
  is penalised linearly up to -1 at the generation limit (`overlong_penalty`), and one cut off
  at the limit gets the full -1.

Shapes: P prompts sampled, B prompts trained on, G completions per prompt.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

ALGORITHMS = ("grpo", "dapo")
DAPO_CLIP_HIGH = 0.28


def overlong_penalty(lengths: jax.Array, max_new_tokens: int, buffer: int) -> jax.Array:
    """DAPO's soft overlong punishment of completions of `lengths` i32[N] tokens -> f32[N].

    0 up to `max_new_tokens - buffer` tokens; then ((max_new_tokens - buffer) - length) / buffer,
    falling linearly to -1 at `max_new_tokens` (a completion the limit cut off).
    """
    if not 0 < buffer <= max_new_tokens:
        raise ValueError(f"overlong_penalty: need 0 < buffer <= max_new_tokens, got {buffer} and {max_new_tokens}")
    lengths = jnp.asarray(lengths, jnp.float32)
    expected = float(max_new_tokens - buffer)
    return jnp.clip((expected - lengths) / float(buffer), -1.0, 0.0)


def informative_groups(rewards: jax.Array, keep: int) -> tuple[jax.Array, jax.Array]:
    """DAPO's dynamic sampling over rewards f32[P, G] of P sampled groups -> (indices i32[keep],
    shortfall i32[]).

    The indices name the first `keep` groups whose rewards are not all equal, in sampled order,
    then (when fewer are informative) the first uninformative ones; `shortfall` is how many of
    the kept groups are uninformative. Static shapes: it runs inside the jitted inner loop.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 2:
        raise ValueError(f"informative_groups: rewards must be f32[P, G], got shape {rewards.shape}")
    if not 0 < keep <= rewards.shape[0]:
        raise ValueError(f"informative_groups: keep must be in 1..{rewards.shape[0]}, got {keep}")
    informative = jnp.max(rewards, axis=1) > jnp.min(rewards, axis=1)
    order = jnp.argsort(~informative, stable=True)   # informative groups first, each side in sampled order
    indices = order[:keep].astype(jnp.int32)
    shortfall = keep - jnp.minimum(jnp.sum(informative, dtype=jnp.int32), keep)
    return indices, shortfall
