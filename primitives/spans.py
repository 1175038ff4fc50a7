"""Helpers for token-level (device) primitives: where a completion's output is, which tokens are
which, and the gold answer a token domain's context carries.

    tokens, in_output, output_len, ended = output_span(rollout, eos_id)
    answer, answer_len = gold(context)                 # arith, symbols: the CONTEXT_KEYS
    digits = token_ids(arith_tokenizer(), "0123456789")
    last = last_position(in_output & is_one_of(tokens, digits))   # i32[N], -1 when none
    after = token_at(tokens, last + 1)                 # i32[N], index clipped into range

Every function is pure `jnp` on arrays with a leading batch axis N, so it runs inside the
jitted inner loop (docs/extending.md has a worked example).
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["CONTEXT_KEYS", "gold", "is_one_of", "last_position", "output_span", "token_at", "token_ids"]

# What the context rows of each token-level domain hold (device primitives read them).
CONTEXT_KEYS = {
    "arith": {"answer": "i32[N, A] the gold answer's digits as token ids, pad-filled",
              "answer_len": "i32[N] its number of digits"},
    "symbols": {"answer": "i32[N, A] the gold string as token ids, pad-filled (A <= T)",
                "answer_len": "i32[N] its length (>= 1)"},
}


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


def token_ids(tokenizer: Any, chars: str) -> np.ndarray:
    """i32[len(chars)]: the id of each character under a character tokenizer (`id_of`); NumPy,
    so a module can compute its ids at import without device work."""
    return np.array([tokenizer.id_of(c) for c in chars], np.int32)


def is_one_of(tokens: jax.Array, ids: Any) -> jax.Array:
    """bool[...]: where `tokens` holds one of `ids` (a sequence of token ids)."""
    return jnp.any(tokens[..., None] == jnp.asarray(ids, jnp.int32), axis=-1)


def last_position(flags: jax.Array) -> jax.Array:
    """i32[N]: the last index where bool[N, T] flags is True, -1 when none is."""
    positions = jnp.arange(flags.shape[-1])
    return jnp.max(jnp.where(flags, positions, -1), axis=-1)


def token_at(tokens: jax.Array, index: jax.Array) -> jax.Array:
    """i32[N]: tokens[n, index[n]] with the index clipped into range (callers check validity)."""
    safe = jnp.clip(index, 0, tokens.shape[-1] - 1)
    return jnp.take_along_axis(tokens, safe[:, None], axis=-1)[:, 0]


def gold(context: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(answer i32[N, A], answer_len i32[N]) of a token domain's context (`CONTEXT_KEYS`)."""
    return jnp.asarray(context["answer"], jnp.int32), jnp.asarray(context["answer_len"], jnp.int32)
