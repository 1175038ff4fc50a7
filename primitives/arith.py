"""Device primitives of the arithmetic domain (`derl_jax.domains.arith`).

Each is `fn(rollout, context) -> f32[N]` over token arrays:
  rollout: tokens i32[N, T] (generated tokens), mask bool[N, T] (a prefix, True up to and
           including EOS when one was generated);
  context: answer i32[N, A] (gold answer digits as token ids, pad-filled), answer_len i32[N].

The *output* of a rollout is its masked prefix before the first EOS. Pad or BOS tokens
generated inside it are ordinary non-alphabet symbols: they are neither digits nor markers.
Text-level definitions (s = the output as text):
  correct        the final box holds exactly the gold answer: take the last `]` in s and the
                 last `[` before it; the characters between them equal the gold digits
                 (leading zeros count as different). Trailing text after the box is allowed.
  boxed          s ends with `[` one-or-more digits `]` and EOS was generated right after it.
  steps          s contains the step marker `1:` not preceded by a digit (so `11:` is no marker).
  gold_anywhere  the gold digits occur in s as a whole number: neither the character before
                 nor the one after the occurrence is a digit (the output's ends count as
                 non-digits, so a truncated output ending in the gold digits counts).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from derl_jax.models.tokenizers import CharTokenizer
from primitives.registry import register_primitive
from primitives.spans import gold, is_one_of, last_position, output_span, token_at, token_ids

__all__ = ["ARITH_PRIMITIVES", "ARITH_ALPHABET", "EOS_ID", "DIGIT_IDS", "arith_tokenizer", "correct", "boxed", "steps",
           "gold_anywhere"]

# The arithmetic domain's characters (one token each) and its device primitives in g1..g4 order.
ARITH_ALPHABET = "0123456789+-*=:;[]"
STEP_MARK = ":"
STEP_END = ";"
BOX_OPEN = "["
BOX_CLOSE = "]"
ARITH_PRIMITIVES = ("correct", "boxed", "steps", "gold_anywhere")


def arith_tokenizer() -> CharTokenizer:
    """The arithmetic domain's tokenizer (pad 0, bos 1, eos 2, then `ARITH_ALPHABET`)."""
    return CharTokenizer(ARITH_ALPHABET)


_TOKENIZER = arith_tokenizer()
EOS_ID = _TOKENIZER.eos_id
DIGIT_IDS = token_ids(_TOKENIZER, "0123456789")
ONE_ID = _TOKENIZER.id_of("1")
STEP_MARK_ID = _TOKENIZER.id_of(STEP_MARK)
BOX_OPEN_ID = _TOKENIZER.id_of(BOX_OPEN)
BOX_CLOSE_ID = _TOKENIZER.id_of(BOX_CLOSE)


def _is_digit(tokens: jax.Array) -> jax.Array:
    return is_one_of(tokens, DIGIT_IDS)


@register_primitive("correct", kind="device", domain="arith", aliases=("outcome",))
def correct(rollout, context):
    """1 when the final box `[...]` holds exactly the gold answer, else 0."""
    tokens, in_output, _, _ = output_span(rollout, EOS_ID)
    answer, answer_len = gold(context)
    positions = jnp.arange(tokens.shape[-1])
    close = last_position(in_output & (tokens == BOX_CLOSE_ID))
    open_ = last_position(in_output & (tokens == BOX_OPEN_ID) & (positions < close[:, None]))
    offsets = jnp.arange(answer.shape[-1])
    inside = jnp.take_along_axis(tokens, jnp.clip(open_[:, None] + 1 + offsets, 0, tokens.shape[-1] - 1), axis=-1)
    digits_match = jnp.all((offsets >= answer_len[:, None]) | (inside == answer), axis=-1)
    hit = (close >= 0) & (open_ >= 0) & (answer_len >= 1) & (close - open_ - 1 == answer_len) & digits_match
    return hit.astype(jnp.float32)


@register_primitive("boxed", kind="device", domain="arith", aliases=("format",))
def boxed(rollout, context):
    """1 when the output ends with `[digits]` directly followed by EOS, else 0."""
    del context
    tokens, in_output, output_len, ended = output_span(rollout, EOS_ID)
    positions = jnp.arange(tokens.shape[-1])
    last = output_len - 1
    ends_with_close = (output_len >= 1) & (token_at(tokens, last) == BOX_CLOSE_ID)
    non_digit = last_position(in_output & ~_is_digit(tokens) & (positions < last[:, None]))
    opened = (non_digit >= 0) & (token_at(tokens, non_digit) == BOX_OPEN_ID)
    has_digits = last - non_digit >= 2
    return (ended & ends_with_close & opened & has_digits).astype(jnp.float32)


@register_primitive("steps", kind="device", domain="arith")
def steps(rollout, context):
    """1 when the step marker `1:` (not preceded by a digit) appears in the output, else 0."""
    del context
    tokens, in_output, _, _ = output_span(rollout, EOS_ID)
    pad_column = jnp.zeros_like(tokens[:, :1])
    next_token = jnp.concatenate([tokens[:, 1:], pad_column], axis=-1)
    next_in_output = jnp.concatenate([in_output[:, 1:], pad_column.astype(bool)], axis=-1)
    prev_digit = jnp.concatenate([pad_column.astype(bool), (in_output & _is_digit(tokens))[:, :-1]], axis=-1)
    marker = in_output & (tokens == ONE_ID) & next_in_output & (next_token == STEP_MARK_ID) & ~prev_digit
    return jnp.any(marker, axis=-1).astype(jnp.float32)


@register_primitive("gold_anywhere", kind="device", domain="arith")
def gold_anywhere(rollout, context):
    """1 when the gold answer appears as a whole number anywhere in the output, else 0."""
    tokens, in_output, _, _ = output_span(rollout, EOS_ID)
    answer, answer_len = gold(context)
    length = tokens.shape[-1]
    starts = jnp.arange(length)
    offsets = jnp.arange(answer.shape[-1])
    window = jnp.clip(starts[:, None] + offsets[None, :], 0, length - 1)  # [T, A]
    inside = (starts[:, None] + offsets[None, :]) < length
    window_tokens = tokens[:, window]  # [N, T, A]
    window_in_output = in_output[:, window] & inside
    needed = offsets[None, None, :] < answer_len[:, None, None]
    char_ok = ~needed | (window_in_output & (window_tokens == answer[:, None, :]))
    digit_in_output = in_output & _is_digit(tokens)
    digit_before = jnp.concatenate([jnp.zeros_like(digit_in_output[:, :1]), digit_in_output[:, :-1]], axis=-1)
    after = starts[None, :] + answer_len[:, None]  # [N, T]
    digit_after = (after < length) & jnp.take_along_axis(digit_in_output, jnp.clip(after, 0, length - 1), axis=-1)
    found = jnp.all(char_ok, axis=-1) & ~digit_before & ~digit_after & (answer_len[:, None] >= 1)
    return jnp.any(found, axis=-1).astype(jnp.float32)
