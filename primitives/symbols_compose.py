"""Device primitives of the composed symbols tasks (`derl_jax.domains.symbols_compose`).

The task composes up to three aspects of the prompt string s (L letters, lower case):
  reverse  the letters in reverse order         (always on)
  upper    every letter in upper case           (aspects >= 2)
  end      the terminator `!` after the letters  (aspects >= 3)
so with all three the answer to `cabd=` is `DBAC!`.

Each is `fn(rollout, context) -> f32[N]`:
  rollout: tokens i32[N, T], mask bool[N, T] (True up to and including EOS when generated);
  context: answer i32[N, A] (the gold tokens, pad-filled), answer_len i32[N] (its length),
           source i32[N, A] (s in lower case, pad-filled), source_len i32[N] (L >= 1).

o is the output (tokens before the first EOS, n of them), nL its letter tokens (either case),
"letter" means a letter of either case and "same letter" compares case-insensitively:

  exact  o == the gold answer and the output ended (task success)
  order  #{i < min(n, L): o[i] is the same letter as reversed(s)[i]} / max(nL, L)   aspect reverse
  case   #{i < min(n, L): o[i] is an upper-case letter} / max(nL, L)               aspect upper
  end    the output ended, n == L + 1 and o[L] == `!`                               aspect end
  marker o contains `#` (no answer does: only a wrong output earns it)              decoy
  bag    sum over letters c of min(count_o(c), count_s(c)) / max(nL, L)              copy earns it
  length the output ended and nL == L                                               copy earns it
  echo   #{i < min(n, L): o[i] is the same letter as s[i]} / max(nL, L)              copy earns it
  ended  the output ended (an EOS was generated)                                    copy earns it
  letters nL / max(n, 1): the share of the output's tokens that are letters         copy earns it
  start  o[0] is a letter of s (either case)                                        copy earns it

`order`, `case` and `end` each measure one aspect whatever the others do; `echo` rewards the
wrong transform (copying) and `marker` a wrong symbol; `bag`, `length`, `ended`, `letters` and
`start` are neutral features (the answer and the copy earn them alike).
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from derl_jax.models.tokenizers import CharTokenizer
from primitives.registry import register_primitive
from primitives.spans import output_span

DOMAIN = "symbols_compose"
LOWER = "abcdefgh"
UPPER = LOWER.upper()
SEPARATOR, MARKER, TERMINATOR = "=", "#", "!"
COMPOSE_ALPHABET = LOWER + UPPER + SEPARATOR + MARKER + TERMINATOR
ASPECTS = ("reverse", "upper", "end")
ASPECT_PRIMITIVES = ("order", "case", "end")        # one aligned dense primitive per aspect, same order
# the decoys and neutral features, added in this order as D grows
DECOY_PRIMITIVES = ("marker", "echo", "bag", "length", "ended", "letters", "start")


def compose_tokenizer() -> CharTokenizer:
    """pad 0, bos 1, eos 2, then `COMPOSE_ALPHABET` (a..h, A..H, `=`, `#`, `!`)."""
    return CharTokenizer(COMPOSE_ALPHABET)


_TOKENIZER = compose_tokenizer()
EOS_ID = _TOKENIZER.eos_id
MARKER_ID = _TOKENIZER.id_of(MARKER)
TERMINATOR_ID = _TOKENIZER.id_of(TERMINATOR)
# per token id: the letter's index in LOWER (either case) or -1; whether it is an upper-case letter
LETTER_INDEX = np.full(_TOKENIZER.vocab_size, -1, np.int32)
IS_UPPER = np.zeros(_TOKENIZER.vocab_size, bool)
for _k, (_lo, _up) in enumerate(zip(LOWER, UPPER)):
    LETTER_INDEX[_TOKENIZER.id_of(_lo)] = LETTER_INDEX[_TOKENIZER.id_of(_up)] = _k
    IS_UPPER[_TOKENIZER.id_of(_up)] = True


def _letters(tokens: jax.Array) -> jax.Array:
    """i32[N, W]: the letter index of each token (-1 for non-letters and ids outside the vocabulary)."""
    table = jnp.asarray(LETTER_INDEX)
    inside = (tokens >= 0) & (tokens < table.shape[0])
    return jnp.where(inside, table[jnp.clip(tokens, 0, table.shape[0] - 1)], -1)


def _span(rollout, context):
    """(tokens, in_output, n, ended, L, nL, denominator f32[N] = max(nL, L, 1))."""
    tokens, in_output, output_len, ended = output_span(rollout, EOS_ID)
    source_len = jnp.asarray(context["source_len"], jnp.int32)
    letter_count = jnp.sum(in_output & (_letters(tokens) >= 0), axis=-1)
    denominator = jnp.maximum(jnp.maximum(letter_count, source_len), 1).astype(jnp.float32)
    return tokens, in_output, output_len, ended, source_len, letter_count, denominator


def _aligned_same_letter(tokens, output_len, reference, source_len) -> jax.Array:
    """i32[N]: positions i < min(n, L) where tokens[:, i] is the same letter as reference[:, i]."""
    width = reference.shape[-1]
    inside = jnp.arange(width)[None, :] < jnp.minimum(output_len, source_len)[:, None]
    ours = _letters(tokens[:, :width])
    return jnp.sum(inside & (ours >= 0) & (ours == _letters(reference)), axis=-1)


@register_primitive("exact", kind="device", domain=DOMAIN, aliases=("outcome",))
def exact(rollout, context):
    """1 when the output is the gold answer and then EOS, else 0."""
    tokens, _, output_len, ended = output_span(rollout, EOS_ID)
    answer = jnp.asarray(context["answer"], jnp.int32)
    answer_len = jnp.asarray(context["answer_len"], jnp.int32)
    width = answer.shape[-1]
    inside = jnp.arange(width)[None, :] < answer_len[:, None]
    same = jnp.all(~inside | (tokens[:, :width] == answer), axis=-1)
    return (ended & (output_len == answer_len) & same).astype(jnp.float32)


@register_primitive("order", kind="device", domain=DOMAIN)
def order(rollout, context):
    """Aligned same-letter matches with the reversed string (either case) / max(letters, L)."""
    tokens, _, output_len, _, source_len, _, denominator = _span(rollout, context)
    source = jnp.asarray(context["source"], jnp.int32)
    width = source.shape[-1]
    # reversed(s)[i] = s[L - 1 - i]: gather within each row's own length
    back = jnp.clip(source_len[:, None] - 1 - jnp.arange(width)[None, :], 0, width - 1)
    reversed_source = jnp.take_along_axis(source, back, axis=-1)
    return _aligned_same_letter(tokens, output_len, reversed_source, source_len) / denominator


@register_primitive("case", kind="device", domain=DOMAIN)
def case(rollout, context):
    """Upper-case letters among the first min(n, L) output tokens / max(letters, L)."""
    tokens, _, output_len, _, source_len, _, denominator = _span(rollout, context)
    width = int(context["source"].shape[-1])
    inside = jnp.arange(width)[None, :] < jnp.minimum(output_len, source_len)[:, None]
    upper = jnp.asarray(IS_UPPER)[jnp.clip(tokens[:, :width], 0, IS_UPPER.shape[0] - 1)]
    return jnp.sum(inside & upper, axis=-1) / denominator


@register_primitive("end", kind="device", domain=DOMAIN)
def end(rollout, context):
    """1 when the output ended right after `!` at position L (the letters' count), else 0."""
    tokens, _, output_len, ended, source_len, _, _ = _span(rollout, context)
    at_end = jnp.take_along_axis(tokens, jnp.clip(source_len, 0, tokens.shape[-1] - 1)[:, None], axis=-1)[:, 0]
    return (ended & (output_len == source_len + 1) & (at_end == TERMINATOR_ID)).astype(jnp.float32)


@register_primitive("marker", kind="device", domain=DOMAIN, aliases=("decoy",))
def marker(rollout, context):
    """1 when the output contains the decoy symbol `#`, else 0."""
    del context
    tokens, in_output, _, _ = output_span(rollout, EOS_ID)
    return jnp.any(in_output & (tokens == MARKER_ID), axis=-1).astype(jnp.float32)


@register_primitive("echo", kind="device", domain=DOMAIN)
def echo(rollout, context):
    """Aligned same-letter matches with the prompt's string itself (copying) / max(letters, L)."""
    tokens, _, output_len, _, source_len, _, denominator = _span(rollout, context)
    source = jnp.asarray(context["source"], jnp.int32)
    return _aligned_same_letter(tokens, output_len, source, source_len) / denominator


@register_primitive("bag", kind="device", domain=DOMAIN)
def bag(rollout, context):
    """Multiset overlap of the output's and the string's letters (either case) / max(letters, L)."""
    tokens, in_output, _, _, source_len, _, denominator = _span(rollout, context)
    source = jnp.asarray(context["source"], jnp.int32)
    source_valid = jnp.arange(source.shape[-1])[None, :] < source_len[:, None]
    kinds = jnp.arange(len(LOWER))
    ours = jnp.sum((_letters(tokens)[..., None] == kinds) & in_output[..., None], axis=-2)
    theirs = jnp.sum((_letters(source)[..., None] == kinds) & source_valid[..., None], axis=-2)
    return jnp.sum(jnp.minimum(ours, theirs), axis=-1) / denominator


@register_primitive("length", kind="device", domain=DOMAIN)
def length(rollout, context):
    """1 when the output ended with exactly L letters (either case), else 0."""
    _, _, _, ended, source_len, letter_count, _ = _span(rollout, context)
    return (ended & (letter_count == source_len)).astype(jnp.float32)


@register_primitive("ended", kind="device", domain=DOMAIN)
def ended(rollout, context):
    """1 when the output ended (an EOS was generated), else 0."""
    del context
    return output_span(rollout, EOS_ID)[3].astype(jnp.float32)


@register_primitive("letters", kind="device", domain=DOMAIN)
def letters(rollout, context):
    """The share of the output's tokens that are letters (either case): nL / max(n, 1)."""
    _, _, output_len, _, _, letter_count, _ = _span(rollout, context)
    return letter_count / jnp.maximum(output_len, 1).astype(jnp.float32)


@register_primitive("start", kind="device", domain=DOMAIN)
def start(rollout, context):
    """1 when the output's first token is a letter (either case) that the string contains, else 0."""
    tokens, _, _, _, source_len, _, _ = _span(rollout, context)
    source = jnp.asarray(context["source"], jnp.int32)
    source_valid = jnp.arange(source.shape[-1])[None, :] < source_len[:, None]
    first = _letters(tokens[:, :1])   # [N, 1]; an empty output's first token is EOS, not a letter
    return jnp.any(source_valid & (_letters(source) == first) & (first >= 0), axis=-1).astype(jnp.float32)


def compose_primitive_names(aspects: int, decoys: int) -> tuple[str, ...]:
    """g1 = exact, then the aligned primitive of each of the first `aspects` aspects, then the first
    `decoys` of DECOY_PRIMITIVES."""
    if not 1 <= aspects <= len(ASPECTS):
        raise ValueError(f"compose_primitive_names: aspects must be in [1, {len(ASPECTS)}], got {aspects}")
    if not 0 <= decoys <= len(DECOY_PRIMITIVES):
        raise ValueError(f"compose_primitive_names: decoys must be in [0, {len(DECOY_PRIMITIVES)}], got {decoys}")
    return ("exact",) + ASPECT_PRIMITIVES[:aspects] + DECOY_PRIMITIVES[:decoys]


def context_arrays(answer: np.ndarray, answer_len: np.ndarray, source: np.ndarray, source_len: np.ndarray
                   ) -> Mapping[str, jax.Array]:
    """The context mapping of a split (see the module docstring for shapes)."""
    return {"answer": jnp.asarray(answer, jnp.int32), "answer_len": jnp.asarray(answer_len, jnp.int32),
            "source": jnp.asarray(source, jnp.int32), "source_len": jnp.asarray(source_len, jnp.int32)}
