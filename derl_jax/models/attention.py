"""Attention arithmetic of the transformer: key/value caches, rotary position embedding,
grouped-query attention and the causal mask, as pure functions of arrays.

Shapes: B batch, T query tokens, S key positions (cache length, or T without a cache),
H query heads, K key/value heads, Dh head size, L layers.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from derl_jax.models.config import ModelConfig

MASKED_SCORE = float(np.finfo(np.float32).min)


@struct.dataclass
class KVCache:
    """Static-size key/value cache of every layer.

    k, v: [L, B, S, K, Dh] in the compute dtype. Position s of the cache holds the keys and
    values written by the forward call whose `cache_index` range covered s; which positions a
    query may read is decided by the attention mask, never by the cache itself.
    """

    k: jax.Array
    v: jax.Array

    @property
    def length(self) -> int:
        """S, the number of key positions."""
        return int(self.k.shape[2])


def init_cache(config: ModelConfig, batch_size: int, length: int, dtype: Any = None) -> KVCache:
    """Zero KVCache with k, v: [L, batch_size, length, K, Dh]."""
    shape = (config.num_layers, batch_size, length, config.num_kv_heads, config.head_dim)
    dtype = dtype or config.compute_dtype
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))


@struct.dataclass
class HeadMajorCache:
    """A KV cache laid out for decoding: k, v are tuples of L arrays [B, K, S, Dh], one per
    layer, so attention reads each head's keys as they are stored (a `KVCache` is transposed
    on every read) and each layer's write touches only its own buffer. Same semantics as
    `KVCache`; `Transformer` accepts either.
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    keys_last: bool = struct.field(pytree_node=False, default=False)
    """Whether k holds [B, K, Dh, S] per layer (the decode's layout: a one-query step's scores
    are then a plain matmul over Dh); v is always [B, K, S, Dh]."""

    @property
    def length(self) -> int:
        """S, the number of key positions."""
        return int(self.v[0].shape[2])

    @property
    def batch_size(self) -> int:
        """B, the number of rows."""
        return int(self.k[0].shape[0])

    def repeat(self, times: int) -> "HeadMajorCache":
        """Every row repeated `times` times, copies adjacent ([B, ...] -> [B*times, ...])."""
        def rows(arrays):
            return tuple(jnp.repeat(a, times, axis=0) for a in arrays)
        return HeadMajorCache(k=rows(self.k), v=rows(self.v), keys_last=self.keys_last)

    def with_keys_last(self, keys_last: bool) -> "HeadMajorCache":
        """The same cache with k laid out [B, K, Dh, S] (True) or [B, K, S, Dh] (False)."""
        if keys_last == self.keys_last:
            return self
        return HeadMajorCache(k=tuple(a.swapaxes(2, 3) for a in self.k), v=self.v, keys_last=keys_last)


def init_head_major_cache(config: ModelConfig, batch_size: int, length: int, dtype: Any = None) -> HeadMajorCache:
    """Zero HeadMajorCache: per layer k, v [batch_size, K, length, Dh]."""
    shape = (batch_size, config.num_kv_heads, length, config.head_dim)
    dtype = dtype or config.compute_dtype
    zeros = tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))
    return HeadMajorCache(k=zeros, v=zeros)


Cache = KVCache | HeadMajorCache


def rotary_tables(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """(cos, sin): f32[B, T, Dh] for integer positions i32[B, T], frequencies repeated twice.

    The repetition is a matmul with [I I] (exact at HIGHEST precision): a matmul output is
    materialised, so each cosine and sine is evaluated once instead of inside every fused
    loop that reads the tables (per head, forward and backward; scalar libm calls on CPU).
    """
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    halves = jnp.stack([jnp.cos(angles), jnp.sin(angles)], axis=-2)  # [B, T, 2, Dh/2]
    repeat = jnp.tile(jnp.eye(head_dim // 2, dtype=jnp.float32), (1, 2))  # [Dh/2, Dh]
    tables = jnp.einsum("btch,hd->btcd", halves, repeat, precision=jax.lax.Precision.HIGHEST)
    return tables[..., 0, :], tables[..., 1, :]


def apply_rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate x[B, T, heads, Dh] by the tables f32[B, T, Dh] (rotate-half convention)."""
    x32 = x.astype(jnp.float32)
    first, second = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-second, first], axis=-1)
    return (x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]).astype(x.dtype)

def write_cache(cache: Cache | None, k: jax.Array, v: jax.Array, cache_index: jax.Array,
                layer_index: int) -> tuple[Cache | None, jax.Array, jax.Array]:
    """Write this call's k, v[B, T, K, Dh] into layer `layer_index` of the cache -> (cache, the keys
    and values attention reads, head-major [B, K, S, Dh]; without a cache they are this call's
    own, S = T).

    cache_index i32[]: positions [cache_index, cache_index + T) of every row. cache_index
    i32[B, T]: a slot per token (`write_slots`); a slot outside [0, S) is not written.
    """
    if cache is not None and jnp.ndim(cache_index) == 2:
        if isinstance(cache, HeadMajorCache) and cache.keys_last:
            raise ValueError("write_cache: a cache with keys_last=True takes no per-token slots")
        return _write_slots(cache, k, v, cache_index, layer_index)
    if isinstance(cache, HeadMajorCache):
        return _write_head_major(cache, _heads_first(k), _heads_first(v), cache_index, layer_index)
    if cache is not None:
        dtype = k.dtype
        zero = jnp.zeros((), jnp.int32)
        start = (jnp.asarray(layer_index, jnp.int32), zero, cache_index, zero, zero)
        cache = KVCache(
            k=jax.lax.dynamic_update_slice(cache.k, k[None].astype(cache.k.dtype), start),
            v=jax.lax.dynamic_update_slice(cache.v, v[None].astype(cache.v.dtype), start))
        k, v = cache.k[layer_index].astype(dtype), cache.v[layer_index].astype(dtype)
    return cache, _heads_first(k), _heads_first(v)


def write_slots(buffer: jax.Array, values: jax.Array, slots: jax.Array, axis: int) -> jax.Array:
    """`buffer` [B, ..., S (at `axis`), ...] with values [B, T, ...rest] written at slots i32[B, T]
    along `axis` (rest: the buffer's axes after the row axis other than `axis`, in order); a slot
    outside [0, S) is dropped, so a token can be left out by giving it slot S."""
    rows = jnp.arange(buffer.shape[0])[:, None]
    index = [rows] + [slice(None)] * (buffer.ndim - 1)
    index[axis] = slots
    return buffer.at[tuple(index)].set(values.astype(buffer.dtype), mode="drop")


def _write_slots(cache: Cache, k: jax.Array, v: jax.Array, slots: jax.Array, layer_index: int
                 ) -> tuple[Cache, jax.Array, jax.Array]:
    """Write k, v[B, T, K, Dh] token by token at slots i32[B, T] of layer `layer_index` -> (cache,
    that layer's keys and values [B, K, S, Dh])."""
    dtype = k.dtype
    if isinstance(cache, HeadMajorCache):
        # index (rows, :, slots, :) puts the advanced axes first: values are [B, T, K, Dh]
        layer_k = write_slots(cache.k[layer_index], k, slots, axis=2)
        layer_v = write_slots(cache.v[layer_index], v, slots, axis=2)

        def replaced(arrays, new):
            return arrays[:layer_index] + (new,) + arrays[layer_index + 1:]

        cache = HeadMajorCache(k=replaced(cache.k, layer_k), v=replaced(cache.v, layer_v))
        return cache, layer_k.astype(dtype), layer_v.astype(dtype)
    layer_k = write_slots(cache.k[layer_index], k, slots, axis=1)
    layer_v = write_slots(cache.v[layer_index], v, slots, axis=1)
    cache = KVCache(k=cache.k.at[layer_index].set(layer_k), v=cache.v.at[layer_index].set(layer_v))
    return cache, _heads_first(layer_k.astype(dtype)), _heads_first(layer_v.astype(dtype))


def _heads_first(x: jax.Array) -> jax.Array:
    """[B, T, heads, Dh] -> [B, heads, T, Dh]."""
    return x.transpose(0, 2, 1, 3)


def _write_head_major(cache: HeadMajorCache, k: jax.Array, v: jax.Array, cache_index: jax.Array,
                      layer_index: int) -> tuple[HeadMajorCache, jax.Array, jax.Array]:
    """Write k, v[B, K, T, Dh] at positions [cache_index, cache_index + T) of layer
    `layer_index` -> (cache, that layer's keys and values [B, K, S, Dh]; keys [B, K, Dh, S] when
    the cache has `keys_last`)."""
    zero = jnp.zeros((), jnp.int32)
    start = (zero, zero, cache_index, zero)
    key_start = (zero, zero, zero, cache_index) if cache.keys_last else start
    keys = k.swapaxes(2, 3) if cache.keys_last else k
    layer_k = jax.lax.dynamic_update_slice(cache.k[layer_index], keys.astype(cache.k[layer_index].dtype), key_start)
    layer_v = jax.lax.dynamic_update_slice(cache.v[layer_index], v.astype(cache.v[layer_index].dtype), start)

    def replaced(arrays, new):
        return arrays[:layer_index] + (new,) + arrays[layer_index + 1:]

    cache = HeadMajorCache(k=replaced(cache.k, layer_k), v=replaced(cache.v, layer_v), keys_last=cache.keys_last)
    return cache, layer_k.astype(k.dtype), layer_v.astype(v.dtype)


def _grouped_queries(x: jax.Array, kv_heads: int) -> jax.Array:
    """[B, T, H, Dh] -> [B, K, G*T, Dh]: the G = H / K query heads of each key/value head stacked
    along the query axis (rows g*T + t)."""
    batch, length, heads, head_dim = x.shape
    group = heads // kv_heads
    x = x.reshape(batch, length, kv_heads, group, head_dim).transpose(0, 2, 3, 1, 4)
    return x.reshape(batch, kv_heads, group * length, head_dim)


def _ungrouped(x: jax.Array, heads: int) -> jax.Array:
    """The inverse of `_grouped_queries`: [B, K, G*T, Dh] -> [B, T, H, Dh]."""
    batch, kv_heads, rows, head_dim = x.shape
    group = heads // kv_heads
    x = x.reshape(batch, kv_heads, group, rows // group, head_dim).transpose(0, 3, 1, 2, 4)
    return x.reshape(batch, rows // group, heads, head_dim)


def _query_scaling(head_dim: int) -> tuple[float, bool]:
    """(1 / sqrt(Dh), whether it is a power of two: then q is scaled first, which changes no bit)."""
    scale = head_dim ** -0.5
    return scale, math.frexp(scale)[0] == 0.5


def attend(q: jax.Array, k: jax.Array, v: jax.Array, score_bias: jax.Array, record: dict | None = None,
           keys_last: bool = False) -> jax.Array:
    """Grouped-query attention: q[B, T, H, Dh], head-major k, v[B, K, S, Dh], score_bias
    f32[B, T, S] -> [B, T, H*Dh]. Query head j reads key/value head j // (H / K).

    The G = H / K query heads of one key/value head are stacked along the query axis, so
    scores and outputs are single batched matmuls over (B, K) (`grouped_attention`). One query
    (T = 1, a decode step) is `attend_one`; `record` (a dict) then gets its probabilities as
    "probs" f32[B, K, G, S] (what `attend_replayed` replays). keys_last: k is [B, K, Dh, S]."""
    batch, length, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    scale, exact = _query_scaling(head_dim)
    if length == 1:
        q = q.reshape(batch, kv_heads, group, head_dim)
        out = attend_one(q * scale if exact else q, k, v, score_bias, 1.0 if exact else scale,
                         with_probs=record is not None, keys_last=keys_last)
        if record is not None:
            out, record["probs"] = out
        return out.reshape(batch, 1, heads * head_dim)
    if keys_last:
        k = k.swapaxes(2, 3)
    q = _grouped_queries(q, kv_heads)
    out = grouped_attention(q * scale if exact else q, k, v, score_bias, 1.0 if exact else scale, group)
    return _ungrouped(out, heads).reshape(batch, length, heads * head_dim)


def attend_replayed(q: jax.Array, k: jax.Array, v: jax.Array, probs: jax.Array, out: jax.Array) -> jax.Array:
    """`attend(q, k, v, score_bias)` whose value `out` [B, T, H*Dh] and probabilities probs
    f32[B, K, G, T, S] were computed before for these same queries and keys (e.g. kept by the
    decode loop): the forward pass returns `out`, and the backward pass is `grouped_attention`'s
    with these probabilities, so the scores are not computed again. Not differentiable in
    probs or out."""
    heads = q.shape[2]
    scale, exact = _query_scaling(q.shape[3])
    return _attend_replayed(q, k, v, probs, out, heads, 1.0 if exact else scale, scale if exact else 1.0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _attend_replayed(q, k, v, probs, out, heads, score_scale, query_scale):
    return out


def _attend_replayed_fwd(q, k, v, probs, out, heads, score_scale, query_scale):
    return out, (q, k, v, probs, out)


def _attend_replayed_bwd(heads, score_scale, query_scale, residuals, d_out):
    q, k, v, probs, out = residuals
    batch, length = q.shape[:2]
    kv_heads, head_dim = k.shape[1], k.shape[3]
    grouped = functools.partial(_grouped_queries, kv_heads=kv_heads)
    group = heads // kv_heads
    rows = probs.reshape(batch, kv_heads, group * length, probs.shape[-1]).astype(q.dtype)
    as_heads = lambda x: x.reshape(batch, length, heads, head_dim)  # noqa: E731
    d_q, d_k, d_v, _ = _grouped_attention_bwd(score_scale, group, (grouped(q) * query_scale, k, v, rows,
                                              grouped(as_heads(out))), grouped(as_heads(d_out)))
    return (_ungrouped(d_q * query_scale, heads).astype(q.dtype), d_k, d_v, jnp.zeros_like(probs),
            jnp.zeros_like(out))


_attend_replayed.defvjp(_attend_replayed_fwd, _attend_replayed_bwd)


def attend_one(q: jax.Array, k: jax.Array, v: jax.Array, score_bias: jax.Array, scale: float,
               with_probs: bool = False, keys_last: bool = False) -> jax.Array | tuple[jax.Array, jax.Array]:
    """One query per row: q[B, K, G, Dh] (the G query heads of each key/value head), k, v[B, K, S,
    Dh] (k [B, K, Dh, S] with `keys_last`), score_bias f32[B, 1, S] -> [B, K, G, Dh]:
    softmax(scale * q . k + bias) v; with `with_probs`, (that, the softmax f32[B, K, G, S]).

    The output is written as products summed over S rather than as a matmul: with one query a
    "matmul" is B * K products of a [G, S] and an [S, Dh] matrix, which XLA:CPU runs as that many
    small kernels; summed products fuse into one loop over the cache. The scores are such a sum
    over Dh for head-major keys, and a batched matmul for keys laid out [Dh, S] (the decode's
    cache, `HeadMajorCache.keys_last`), which XLA:CPU runs faster than a sum over the minor axis.
    The same values up to float rounding."""
    if keys_last:
        scores = jnp.einsum("bkgd,bkds->bkgs", q, k, preferred_element_type=jnp.float32)
    else:
        scores = jnp.sum(q[:, :, :, None, :].astype(jnp.float32) * k[:, :, None, :, :].astype(jnp.float32), axis=-1)
    if scale != 1.0:
        scores = scores * scale
    scores = scores + score_bias[:, :, None, :]
    weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True))
    out = jnp.sum(weights[..., None] * v[:, :, None, :, :].astype(jnp.float32), axis=-2)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    out = (out / total).astype(q.dtype)
    return (out, weights / total) if with_probs else out


def _attention_weights(q: jax.Array, k: jax.Array, score_bias: jax.Array, scale: float, group: int
                       ) -> tuple[jax.Array, jax.Array]:
    """(weights f32[B, K, G*T, S], inverse f32[B, K, G*T, 1]): the softmax over keys of
    scale * (q . k) + score_bias (broadcast over K and G) is weights * inverse, weights =
    exp(score - its row maximum) and inverse = 1 / (their row sum)."""
    batch, kv_heads, rows, _ = q.shape
    scores = jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32)
    scores = scores.reshape(batch, kv_heads, group, rows // group, k.shape[2])
    if scale != 1.0:
        scores = scores * scale
    scores = scores + score_bias[:, None, None, :, :]
    weights = jnp.exp(scores - jnp.max(scores, axis=-1, keepdims=True)).reshape(batch, kv_heads, rows, k.shape[2])
    return weights, 1.0 / jnp.sum(weights, axis=-1, keepdims=True)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, score_bias: jax.Array, scale: float,
                      group: int) -> jax.Array:
    """softmax(scale * q k^T + bias) v per (batch row, key/value head): q[B, K, G*T, Dh] (the G
    query heads of each key/value head stacked, head-major), k, v[B, K, S, Dh], score_bias
    f32[B, T, S] -> [B, K, G*T, Dh]. Not differentiable in score_bias.

    The backward pass is written out: dS = P * (dP - rowsum(dO * O)) (the row sum over Dh
    rather than over the keys), and the two products that contract over queries take P and dS
    transposed, so every product is a plain batched matmul. Autodiff of the forward fuses a
    reduction into a matmul and leaves two products with transposed operands, which XLA:CPU
    runs about 1.5x slower in all. Same values as autodiff up to float rounding."""
    return _grouped_attention_fwd(q, k, v, score_bias, scale, group)[0]


def _grouped_attention_fwd(q, k, v, score_bias, scale, group):
    # the output is normalised after the product with v (G*T*Dh divisions instead of G*T*S);
    # the probabilities are formed only for the backward pass
    weights, inverse = _attention_weights(q, k, score_bias, scale, group)
    out = (jnp.einsum("bkqs,bksd->bkqd", weights.astype(q.dtype), v, preferred_element_type=jnp.float32)
           * inverse).astype(q.dtype)
    probs = (weights * inverse).astype(q.dtype)
    return out, (q, k, v, probs, out)


def _grouped_attention_bwd(scale, group, residuals, d_out):
    q, k, v, probs, out = residuals
    d_v = jnp.einsum("bksq,bkqd->bksd", probs.swapaxes(2, 3), d_out)
    d_probs = jnp.einsum("bkqd,bksd->bkqs", d_out, v, preferred_element_type=jnp.float32)
    row = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1, keepdims=True)
    d_scores = probs.astype(jnp.float32) * (d_probs - row)
    if scale != 1.0:
        d_scores = d_scores * scale
    d_scores = d_scores.astype(q.dtype)
    d_q = jnp.einsum("bkqs,bksd->bkqd", d_scores, k)
    d_k = jnp.einsum("bksq,bkqd->bksd", d_scores.swapaxes(2, 3), q)
    return d_q, d_k.astype(k.dtype), d_v.astype(v.dtype), None


grouped_attention.defvjp(_grouped_attention_fwd, _grouped_attention_bwd)


def causal_mask(batch_size: int, length: int, cache_length: int, cache_index: jax.Array) -> jax.Array:
    """bool[B, T, S]: query t (at cache position cache_index + t) sees keys s <= cache_index + t."""
    query_at = cache_index + jnp.arange(length)[:, None]
    mask = jnp.arange(cache_length)[None, :] <= query_at
    return jnp.broadcast_to(mask, (batch_size, length, cache_length))
