"""Log-probabilities and entropies of given tokens from hidden states, over the whole vocabulary.

A teacher-forced pass (GRPO's update, SFT, the reference policy) needs, for every completion
position, log softmax(logits)[token] and the distribution's entropy. The logits f32[B, T, V]
are the largest single buffer of a large-vocabulary update (151,936 entries per position for
Qwen), and its backward keeps their gradient too. `head_logp_and_entropy` therefore computes
them over chunks of positions once f32[B, T, V] would pass `LOGITS_CHUNK_BYTES`: each chunk's
logits are computed, reduced to two numbers per position and dropped; the backward pass
recomputes them one chunk at a time (`jax.checkpoint` inside a `lax.scan`). Chunks split
positions, not the vocabulary, so a vocabulary sharded over the mesh's 'model' axis stays as
it is. Below the threshold the pass is the plain one, unchanged.

Shapes: B rows, T positions, D hidden size, V vocabulary.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import nnx

from derl_jax.models.transformer import apply_logits, config_of

EXCLUDED_LOGIT = -1e30  # finite, so masked entries give 0 * log 0 = 0 with finite gradients

# f32 logits of one teacher-forced pass above this many bytes are computed in chunks of
# positions (ours: 1 GiB leaves the term small next to the layers' activations of a 1.5B-7B
# policy on an 80-141 GiB device, while a chunk still holds thousands of positions).
LOGITS_CHUNK_BYTES = 1 << 30


def logp_and_entropy(logits: jax.Array, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(log softmax(logits)[tokens], entropy of softmax(logits)) f32[B, T] from logits f32[B, T, V]
    and tokens i32[B, T].

    Written with the log-sum-exp instead of a materialised log-softmax: logp = logit[token] -
    lse and entropy = lse - sum(softmax * logits), so the forward makes two fused passes over
    the [B, T, V] logits and the backward of logp one (softmax * dlse), not a log-softmax array
    and its gradient over the whole vocabulary. The entropy's gradient is exact too.
    """
    top = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    shifted = logits - top
    total = jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True)
    lse = jnp.log(total)
    picked = jnp.take_along_axis(shifted, tokens[..., None], axis=-1)[..., 0]
    probs = jnp.exp(shifted - lse)
    entropy = lse[..., 0] - jnp.sum(probs * shifted, axis=-1)
    return picked - lse[..., 0], entropy


def chunk_positions(rows: int, positions: int, vocab: int, budget_bytes: int | None = None) -> int:
    """Positions per chunk of a pass over `rows` x `positions` tokens: all of them when their f32
    logits [rows, positions, vocab] fit in `budget_bytes` (default `LOGITS_CHUNK_BYTES`), else the
    most that fit (at least 1)."""
    budget_bytes = LOGITS_CHUNK_BYTES if budget_bytes is None else budget_bytes
    per_position = max(rows, 1) * vocab * 4
    return max(1, min(positions, budget_bytes // per_position))


def _masked_logp_and_entropy(graphdef: nnx.GraphDef, params: nnx.State, hidden: jax.Array, tokens: jax.Array,
                             temperature: float, allowed: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    logits = apply_logits(graphdef, params, hidden) / temperature
    if allowed is not None:
        logits = jnp.where(allowed, logits, EXCLUDED_LOGIT)
    return logp_and_entropy(logits, tokens)


def head_logp_and_entropy(graphdef: nnx.GraphDef, params: nnx.State, hidden: jax.Array, tokens: jax.Array,
                          temperature: float = 1.0, allowed: jax.Array | None = None,
                          chunk: int | None = None) -> tuple[jax.Array, jax.Array]:
    """(logp f32[B, T], entropy f32[B, T]) of `tokens` i32[B, T] under the model's head applied to
    `hidden` [B, T, D]: log softmax(logits / temperature)[token], over the tokens in `allowed`
    (bool[B, T, V]) when given.

    chunk: positions per chunk (None: `chunk_positions` of the shape). With chunk < T the
    positions are padded to a multiple of it and scanned; the values equal the one-pass ones
    up to float rounding, and so do the gradients.
    """
    batch, length = tokens.shape
    chex.assert_shape(hidden, (batch, length, None))
    tokens = tokens.astype(jnp.int32)
    vocab = config_of(graphdef, params).vocab_size
    if allowed is not None and allowed.shape != (batch, length, vocab):
        raise ValueError(f"head_logp_and_entropy: allowed must be [B, T, V] = {(batch, length, vocab)}, "
                         f"got {allowed.shape}")
    chunk = chunk_positions(batch, length, vocab) if chunk is None else max(1, min(int(chunk), length))
    if chunk >= length:
        return _masked_logp_and_entropy(graphdef, params, hidden, tokens, temperature, allowed)
    chunks = -(-length // chunk)
    pad = chunks * chunk - length

    def split(x):
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        return jnp.moveaxis(x.reshape(batch, chunks, chunk, *x.shape[2:]), 1, 0)

    @jax.checkpoint
    def one_chunk(params, hidden_c, tokens_c, allowed_c):
        return _masked_logp_and_entropy(graphdef, params, hidden_c, tokens_c, temperature, allowed_c)

    def body(carry, inputs):
        hidden_c, tokens_c, allowed_c = inputs
        return carry, one_chunk(params, hidden_c, tokens_c, allowed_c)

    allowed_chunks = None if allowed is None else split(allowed)
    _, (logp, entropy) = jax.lax.scan(body, None, (split(hidden), split(tokens), allowed_chunks))

    def join(x):
        return jnp.moveaxis(x, 0, 1).reshape(batch, chunks * chunk)[:, :length]

    return join(logp), join(entropy)

