"""Observation text as token arrays, built inside jitted code.

A text is a list of pieces, each (tokens i32[k], mask bool[k]); `compose` concatenates them and
moves the masked-out tokens to the end, so alternatives ("the fridge 1 is closed ." or "on the
fridge 1 , you see ...") are written side by side with complementary masks and the result has a
static length. Shapes: K items of a listing, O observation tokens.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from derl_jax.domains.household import vocab

Piece = tuple[jax.Array, jax.Array]
_VOCAB = vocab.WordVocab()


@functools.lru_cache(maxsize=None)
def _word_ids(text: str) -> tuple[int, ...]:
    return tuple(_VOCAB.encode(text))


def words(text: str, show=True) -> Piece:
    """The words of `text` as a piece, shown where `show` (bool[]) holds."""
    ids = np.array(_word_ids(text), np.int32)
    return jnp.asarray(ids), jnp.broadcast_to(jnp.asarray(show, bool), ids.shape)


def entity(name_word: jax.Array, number: jax.Array, show=True) -> Piece:
    """"name number" (e.g. "cabinet 2") from a name word id and an instance number."""
    tokens = jnp.stack([name_word, jnp.asarray(vocab.NUMBER_WORD)[number]]).astype(jnp.int32)
    return tokens, jnp.broadcast_to(jnp.asarray(show, bool), (2,))


def listing(name_words: jax.Array, numbers: jax.Array, show: jax.Array) -> Piece:
    """"a apple 1 , a mug 2" over the shown items of i32[K] / i32[K] / bool[K], or "nothing"."""
    count = name_words.shape[0]
    number_words = jnp.asarray(vocab.NUMBER_WORD)[numbers]
    comma = jnp.full((count,), vocab.ID[","], jnp.int32)
    article = jnp.full((count,), vocab.ID["a"], jnp.int32)
    tokens = jnp.stack([comma, article, name_words.astype(jnp.int32), number_words], axis=1).reshape(-1)
    after_first = jnp.cumsum(show) > 1
    mask = jnp.stack([show & after_first, show, show, show], axis=1).reshape(-1)
    nothing, nothing_mask = words("nothing", ~jnp.any(show))
    return jnp.concatenate([tokens, nothing]), jnp.concatenate([mask, nothing_mask])


def gate(pieces: Sequence[Piece], show) -> list[Piece]:
    """`pieces` shown only where `show` (bool[]) holds."""
    return [(tokens, mask & show) for tokens, mask in pieces]


def flatten(pieces: Sequence[Piece], length: int | None = None) -> Piece:
    """`pieces` concatenated into one piece, padded (hidden) to `length` tokens when given."""
    tokens = jnp.concatenate([t for t, _ in pieces])
    mask = jnp.concatenate([m for _, m in pieces])
    if length is not None:
        extra = length - tokens.shape[0]
        tokens = jnp.pad(tokens, (0, extra), constant_values=vocab.PAD_ID)
        mask = jnp.pad(mask, (0, extra), constant_values=False)
    return tokens, mask


def compose(pieces: Sequence[Piece], length: int) -> jax.Array:
    """i32[length]: the shown tokens of `pieces` in order, right-padded with pad (cut at `length`)."""
    tokens, mask = flatten(pieces)
    return pack(tokens, mask, length, left=False)


def pack(tokens: jax.Array, mask: jax.Array, length: int, left: bool) -> jax.Array:
    """i32[length]: the tokens of i32[L] where mask bool[L], in order, padded on the right (or the
    left) with pad; right packing drops what does not fit, left packing needs length >= L."""
    slot = jnp.cumsum(mask) - 1
    if left:
        slot = slot + length - jnp.sum(mask)
    slot = jnp.where(mask, slot, length)  # out of range: dropped
    packed = jnp.full((length,), vocab.PAD_ID, jnp.int32)
    return packed.at[slot].set(tokens.astype(jnp.int32), mode="drop")
