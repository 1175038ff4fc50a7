"""Where a completion's output is: the token prefix before its first EOS (shared by token-level primitives)."""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp


def output_span(rollout: Mapping[str, jax.Array], eos_id: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(tokens i32[N, T], in_output bool[N, T], output_len i32[N], ended bool[N]) of a rollout's
    `tokens` i32[N, T] and `mask` bool[N, T].

    in_output marks the masked prefix before the first `eos_id`; ended says an EOS was generated.
    """
    tokens = jnp.asarray(rollout["tokens"], jnp.int32)
    mask = jnp.asarray(rollout["mask"], bool)
    positions = jnp.arange(tokens.shape[-1])
    masked_len = jnp.sum(mask, axis=-1)
    eos_here = (tokens == eos_id) & (positions < masked_len[:, None])
    first_eos = jnp.min(jnp.where(eos_here, positions, tokens.shape[-1]), axis=-1)
    output_len = jnp.minimum(first_eos, masked_len)
    return tokens, positions < output_len[:, None], output_len, first_eos < masked_len
