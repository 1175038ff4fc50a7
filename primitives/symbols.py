"""Device primitives of the symbols domain (`derl_jax.domains.symbols`): reverse a letter string.

Each is `fn(rollout, context) -> f32[N]` over token arrays:
  rollout: tokens i32[N, T] (generated tokens), mask bool[N, T] (a prefix, True up to and
           including EOS when one was generated);
  context: answer i32[N, A] (the gold string as token ids, pad-filled, A >= the longest gold
           string, A <= T), answer_len i32[N] (m, the gold length, >= 1).

The *output* of a rollout is its masked prefix before the first EOS (n tokens); it *ended*
when that EOS was generated. Pad or BOS tokens generated inside it are ordinary symbols that
match nothing. Text-level definitions (o = the output, g = the gold string, m = len(g)):

  exact     o == g and the output ended. Task success, the validation metric.
  position  #{i < min(n, m): o[i] == g[i]} / max(n, m): the share of aligned matches. It
            is 1 exactly when `exact` is (an output that did not end has n = T > m).
  bag       sum over letters c of min(count_o(c), count_g(c)) / max(n, m): the symbols of
            g present anywhere in o. Any permutation of g scores 1, so copying the prompt's
            string (a permutation of its reverse) does, without solving the task.
  length    the output ended and n == m. Copying the prompt's string satisfies it too.
  marker    1 when the output contains the decoy symbol `#`, which no gold string holds:
            it can only be earned by an output that is wrong.

So `exact` and `position` are aligned with the task (`position` densely), `bag` and `length`
are satisfied by the wrong transform (copying), and `marker` rewards a wrong answer.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from derl_jax.models.tokenizers import CharTokenizer
from primitives.registry import register_primitive
from primitives.spans import output_span

__all__ = ["SYMBOLS_PRIMITIVES", "exact", "position", "bag", "length", "marker"]

LETTERS = "abcdefgh"   # the strings' alphabet (a config takes the first `alphabet_size` letters)
SEPARATOR = "="        # ends every prompt
MARKER = "#"           # the decoy symbol: in no gold string
SYMBOLS_ALPHABET = LETTERS + SEPARATOR + MARKER
SYMBOLS_PRIMITIVES = ("exact", "position", "bag", "length", "marker")


def symbols_tokenizer() -> CharTokenizer:
    """The symbols domain's tokenizer (pad 0, bos 1, eos 2, then `SYMBOLS_ALPHABET`)."""
    return CharTokenizer(SYMBOLS_ALPHABET)


_TOKENIZER = symbols_tokenizer()
EOS_ID = _TOKENIZER.eos_id
LETTER_IDS = np.array([_TOKENIZER.id_of(c) for c in LETTERS], np.int32)  # NumPy: no device work at import
MARKER_ID = _TOKENIZER.id_of(MARKER)


def _gold(context: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(answer i32[N, A], answer_len i32[N])."""
    return jnp.asarray(context["answer"], jnp.int32), jnp.asarray(context["answer_len"], jnp.int32)


def _aligned_hits(tokens: jax.Array, output_len: jax.Array, answer: jax.Array, answer_len: jax.Array) -> jax.Array:
    """i32[N]: positions i < min(n, m) where the output's token equals the gold one."""
    width = answer.shape[-1]
    offsets = jnp.arange(width)
    both = offsets[None, :] < jnp.minimum(output_len, answer_len)[:, None]
    return jnp.sum(both & (tokens[:, :width] == answer), axis=-1)


def _letter_counts(tokens: jax.Array, valid: jax.Array) -> jax.Array:
    """i32[N, len(LETTERS)]: how often each letter occurs among the valid tokens of i32[N, L]."""
    hits = (tokens[..., None] == LETTER_IDS) & valid[..., None]
    return jnp.sum(hits, axis=-2)


def _longer(output_len: jax.Array, answer_len: jax.Array) -> jax.Array:
    """f32[N]: max(n, m, 1), the denominator of the share primitives."""
    return jnp.maximum(jnp.maximum(output_len, answer_len), 1).astype(jnp.float32)


@register_primitive("exact", kind="device", domain="symbols", aliases=("outcome",))
def exact(rollout, context):
    """1 when the output is the gold string and then EOS, else 0."""
    tokens, _, output_len, ended = output_span(rollout, EOS_ID)
    answer, answer_len = _gold(context)
    hits = _aligned_hits(tokens, output_len, answer, answer_len)
    return (ended & (output_len == answer_len) & (hits == answer_len)).astype(jnp.float32)


@register_primitive("position", kind="device", domain="symbols", aliases=("dense",))
def position(rollout, context):
    """Aligned matches / max(output length, gold length), in [0, 1]."""
    tokens, _, output_len, _ = output_span(rollout, EOS_ID)
    answer, answer_len = _gold(context)
    hits = _aligned_hits(tokens, output_len, answer, answer_len)
    return hits.astype(jnp.float32) / _longer(output_len, answer_len)


@register_primitive("bag", kind="device", domain="symbols")
def bag(rollout, context):
    """Multiset overlap of the output's and the gold string's letters / max(output, gold length)."""
    tokens, in_output, output_len, _ = output_span(rollout, EOS_ID)
    answer, answer_len = _gold(context)
    gold_valid = jnp.arange(answer.shape[-1])[None, :] < answer_len[:, None]
    overlap = jnp.sum(jnp.minimum(_letter_counts(tokens, in_output), _letter_counts(answer, gold_valid)), axis=-1)
    return overlap.astype(jnp.float32) / _longer(output_len, answer_len)


@register_primitive("length", kind="device", domain="symbols")
def length(rollout, context):
    """1 when the output has the gold string's length and then EOS, else 0."""
    _, _, output_len, ended = output_span(rollout, EOS_ID)
    _, answer_len = _gold(context)
    return (ended & (output_len == answer_len)).astype(jnp.float32)


@register_primitive("marker", kind="device", domain="symbols", aliases=("decoy",))
def marker(rollout, context):
    """1 when the output contains the decoy symbol `#` anywhere, else 0."""
    del context
    tokens, in_output, _, _ = output_span(rollout, EOS_ID)
    return jnp.any(in_output & (tokens == MARKER_ID), axis=-1).astype(jnp.float32)
