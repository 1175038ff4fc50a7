"""Qwen2 / Qwen3 decoder-only transformer in flax.nnx, used functionally.

Architecture (as Hugging Face `Qwen2ForCausalLM` / `Qwen3ForCausalLM`): token embedding; per
layer RMSNorm -> grouped-query attention (q/k/v projections, with bias for Qwen2, output
projection without; for Qwen3 an RMSNorm over each query and key head) with rotary position
embedding (rotate-half convention) -> residual, RMSNorm -> SwiGLU MLP -> residual; final
RMSNorm; language-model head tied to the embedding or separate (`ModelConfig.family`).

Every projection runs as one 2-D matmul over the flattened tokens, q/k/v and gate/up each as
one matmul with their kernels side by side while those are small (`project_side_by_side`),
and attention runs head-major (batched matmuls over
rows and key/value heads): few, transpose-free kernels, which is what tiny models on CPU need.
The key/value cache is a `KVCache` ([L, B, S, K, Dh]) or a `HeadMajorCache` (per layer
[B, K, S, Dh], what `sampling` decodes with); both, and the attention arithmetic, live in
`derl_jax.models.attention`.

Shapes: B batch, T query tokens, S key positions (cache length, or T without a cache),
D hidden size, H query heads, K key/value heads, Dh head size, F MLP width, V vocabulary,
L layers.

Parameter layout (paths in the params `nnx.State`, kernels stored [in, out]):

    embed.embedding                      [V, D]       sharding ('model', None)
    layers.{i}.input_norm.scale          [D]          (None,)
    layers.{i}.attn.q_proj.kernel        [D, H*Dh]    (None, 'model')   .bias [H*Dh] ('model',)
    layers.{i}.attn.k_proj.kernel        [D, K*Dh]    (None, 'model')   .bias [K*Dh] ('model',)
    layers.{i}.attn.v_proj.kernel        [D, K*Dh]    (None, 'model')   .bias [K*Dh] ('model',)
    layers.{i}.attn.o_proj.kernel        [H*Dh, D]    ('model', None)
    layers.{i}.attn.{q,k}_norm.scale     [Dh]         (None,)           Qwen3 only (and no q/k/v biases)
    layers.{i}.post_attn_norm.scale      [D]          (None,)
    layers.{i}.mlp.gate_proj.kernel      [D, F]       (None, 'model')
    layers.{i}.mlp.up_proj.kernel        [D, F]       (None, 'model')
    layers.{i}.mlp.down_proj.kernel      [F, D]       ('model', None)
    final_norm.scale                     [D]          (None,)
    lm_head.kernel                       [D, V]       (None, 'model')   only when untied

The sharding tuples are `nnx.Param` metadata naming the `model` mesh axis (Megatron-style:
vocabulary, attention heads and MLP width are split; norms are replicated). They are never
applied eagerly, so the model runs unchanged on one device; `param_partition_specs` /
`shard_params` turn them into placements for a mesh, replicating any dimension that the
`model` axis does not divide.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, traverse_util
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from derl_jax.models.attention import (
    MASKED_SCORE, Cache, HeadMajorCache, apply_rotary, attend, attend_replayed, causal_mask, rotary_tables,
    write_cache)
from derl_jax.models.config import DTYPES, ModelConfig, default_compute_dtype  # noqa: F401  (re-exported)

MODEL_AXIS = "model"
INIT_STDDEV = 0.02
def tiny_config(vocab_size: int, *, hidden_size: int = 128, intermediate_size: int = 384,
                num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2,
                head_dim: int | None = None, rope_theta: float = 10000.0,
                tie_embeddings: bool = True, max_position: int = 1024,
                dtype: str = "float32", param_dtype: str = "float32",
                remat: bool = False, family: str = "qwen2") -> ModelConfig:
    """A small model (about 0.4M parameters plus 128 per vocabulary entry) for CPU tests and toy domains."""
    return ModelConfig(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_dim=head_dim or hidden_size // num_heads, rope_theta=rope_theta, rms_norm_eps=1e-6,
        tie_embeddings=tie_embeddings, max_position=max_position, dtype=dtype,
        param_dtype=param_dtype, remat=remat, family=family)


def _qwen2_5(hidden: int, inter: int, layers: int, heads: int, dtype: str | None,
             param_dtype: str, remat: bool) -> ModelConfig:
    return ModelConfig(
        vocab_size=151936, hidden_size=hidden, intermediate_size=inter, num_layers=layers,
        num_heads=heads, num_kv_heads=2, head_dim=hidden // heads, rope_theta=1_000_000.0,
        rms_norm_eps=1e-6, tie_embeddings=True, max_position=32768,
        dtype=dtype or default_compute_dtype(), param_dtype=param_dtype, remat=remat)


def qwen2_5_0_5b(dtype: str | None = None, param_dtype: str = "float32", remat: bool = False) -> ModelConfig:
    """Qwen2.5-0.5B shapes (494,032,768 parameters)."""
    return _qwen2_5(896, 4864, 24, 14, dtype, param_dtype, remat)


def qwen2_5_1_5b(dtype: str | None = None, param_dtype: str = "float32", remat: bool = False) -> ModelConfig:
    """Qwen2.5-1.5B shapes (1,543,714,304 parameters)."""
    return _qwen2_5(1536, 8960, 28, 12, dtype, param_dtype, remat)


def qwen2_5_3b(dtype: str | None = None, param_dtype: str = "float32", remat: bool = False) -> ModelConfig:
    """Qwen2.5-3B shapes (3,085,938,688 parameters)."""
    return _qwen2_5(2048, 11008, 36, 16, dtype, param_dtype, remat)


def _qwen3(hidden: int, inter: int, layers: int, heads: int, dtype: str | None, param_dtype: str,
           remat: bool) -> ModelConfig:
    """Shapes from the public config.json of Qwen/Qwen3-1.7B and Qwen/Qwen3-4B: 8 kv heads of 128,
    vocabulary 151,936, tied embeddings, rope_theta 1e6, 40,960 positions."""
    return ModelConfig(
        vocab_size=151936, hidden_size=hidden, intermediate_size=inter, num_layers=layers, num_heads=heads,
        num_kv_heads=8, head_dim=128, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_embeddings=True,
        max_position=40960, dtype=dtype or default_compute_dtype(), param_dtype=param_dtype, remat=remat,
        family="qwen3")


def qwen3_1_7b(dtype: str | None = None, param_dtype: str = "float32", remat: bool = False) -> ModelConfig:
    """Qwen3-1.7B shapes (1,720,574,976 parameters, the embedding tied)."""
    return _qwen3(2048, 6144, 28, 16, dtype, param_dtype, remat)


def qwen3_4b(dtype: str | None = None, param_dtype: str = "float32", remat: bool = False) -> ModelConfig:
    """Qwen3-4B shapes (4,022,468,096 parameters, the embedding tied)."""
    return _qwen3(2560, 9728, 36, 32, dtype, param_dtype, remat)


def _param(shape: tuple[int, ...], dtype: Any, sharding: tuple, fill: float = 0.0) -> nnx.Param:
    """A parameter filled with `fill` (Transformer.__init__ then draws the random ones)."""
    return nnx.Param(jnp.full(shape, fill, dtype), sharding=sharding, eager_sharding=False)


class Dense(nnx.Module):
    """x[..., in] @ kernel[in, out] (+ bias[out]), computed in `dtype`."""

    def __init__(self, in_features: int, out_features: int, *, use_bias: bool, shard_input: bool,
                 dtype: Any, param_dtype: Any):
        sharding = (MODEL_AXIS, None) if shard_input else (None, MODEL_AXIS)
        self.kernel = _param((in_features, out_features), param_dtype, sharding)
        self.bias = (_param((out_features,), param_dtype, (MODEL_AXIS,))
                     if use_bias else None)
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        bias = None if self.bias is None else self.bias[...]
        return project(x, self.kernel[...], bias, self.dtype)


def project(x: jax.Array, kernel: jax.Array, bias: jax.Array | None, dtype: Any) -> jax.Array:
    """x[..., in] @ kernel[in, out] (+ bias[out]) in `dtype`, as one 2-D matmul over the
    flattened leading dimensions (XLA:CPU then needs no transposes, also in the backward pass)."""
    lead = x.shape[:-1]
    y = jnp.dot(x.reshape(-1, x.shape[-1]).astype(dtype), kernel.astype(dtype))
    if bias is not None:
        y = y + bias.astype(dtype)
    return y.reshape(*lead, kernel.shape[-1])


FUSE_MAX_KERNEL_BYTES = 1 << 20
"""`project_side_by_side` joins kernels of at most this many bytes in all into one matmul."""


def project_side_by_side(x: jax.Array, kernels: list[jax.Array], biases: list[jax.Array] | None,
                         dtype: Any) -> jax.Array:
    """x[..., in] @ [kernel_1 ... kernel_n] (+ biases) -> [..., sum of the out sizes], in `dtype`.

    Small kernels (FUSE_MAX_KERNEL_BYTES in all) are joined side by side into one matmul: for a
    tiny model the number of kernels is what costs. Larger ones run as separate matmuls whose
    outputs are joined: joining the kernels would copy those weights on every forward (and
    their gradient back out in the backward pass), gigabytes of memory traffic per step for a
    model of hundreds of millions of parameters that matmuls of that size do not need.
    """
    size = sum(math.prod(k.shape) for k in kernels) * jnp.dtype(dtype).itemsize
    if size <= FUSE_MAX_KERNEL_BYTES:
        kernel = jnp.concatenate(kernels, axis=1)
        bias = None if biases is None else jnp.concatenate(biases)
        return project(x, kernel, bias, dtype)
    parts = [project(x, kernel, None if biases is None else bias, dtype)
             for kernel, bias in zip(kernels, biases or [None] * len(kernels))]
    return jnp.concatenate(parts, axis=-1)


def replayed(fn: Any, value: Any, *args: Any) -> Any:
    """`fn(*args)` whose value is `value`, the same result computed before (e.g. by the decode
    loop, one token at a time): the forward pass returns `value` without running `fn`, and the
    backward pass takes `fn`'s vjp at `args`. XLA drops what that vjp does not read, such as a
    matmul's product, so a projection replayed this way costs only its backward pass."""
    @jax.custom_vjp
    def same(value, args):
        return value

    def forward(value, args):
        return value, args

    def backward(args, cotangent):
        _, vjp = jax.vjp(fn, *args)
        return jax.tree_util.tree_map(jnp.zeros_like, cotangent), vjp(cotangent)

    same.defvjp(forward, backward)
    return same(value, args)


PRODUCTS = ("qkv", "probs", "attn", "o", "gate_up", "down")
"""What a layer can record and replay (`Transformer.hidden_states`): the q/k/v projection, the
attention's probabilities and output, the output projection, the gate/up projection and the
MLP's down projection."""


def _product(name: str, fn: Any, args: tuple, saved: dict | None, record: dict | None) -> jax.Array:
    """fn(*args), or its value `saved[name]` replayed (`replayed`); recorded under `name`."""
    value = fn(*args) if saved is None else replayed(fn, saved[name], *args)
    if record is not None:
        record[name] = value
    return value


class RMSNorm(nnx.Module):
    """x / rms(x) * scale; the statistics in f32, the result in `dtype`."""

    def __init__(self, size: int, eps: float, *, dtype: Any, param_dtype: Any):
        self.scale = _param((size,), param_dtype, (None,), 1.0)
        self.eps = eps
        self.dtype = dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return self.scale[...].astype(self.dtype) * normed.astype(self.dtype)


def head_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """x[B, T, heads, Dh] RMS-normed over Dh, times scale[heads, Dh]: `RMSNorm` per head (the
    statistics in f32, the result in x's dtype)."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return scale.astype(x.dtype) * normed.astype(x.dtype)


class Attention(nnx.Module):
    """Grouped-query self-attention with rotary embedding and an optional KV cache."""

    def __init__(self, config: ModelConfig):
        d, h, k, dh = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        dense = dict(dtype=config.compute_dtype, param_dtype=config.weight_dtype)
        bias = config.qkv_bias
        self.q_proj = Dense(d, h * dh, use_bias=bias, shard_input=False, **dense)
        self.k_proj = Dense(d, k * dh, use_bias=bias, shard_input=False, **dense)
        self.v_proj = Dense(d, k * dh, use_bias=bias, shard_input=False, **dense)
        self.o_proj = Dense(h * dh, d, use_bias=False, shard_input=True, **dense)
        norm = dict(dtype=config.compute_dtype, param_dtype=config.weight_dtype)
        self.q_norm = RMSNorm(dh, config.rms_norm_eps, **norm) if config.qk_norm else None
        self.k_norm = RMSNorm(dh, config.rms_norm_eps, **norm) if config.qk_norm else None
        self.num_heads, self.num_kv_heads, self.head_dim = h, k, dh

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, score_bias: jax.Array,
                 cache: Cache | None, cache_index: jax.Array, layer_index: int, queries_from: int = 0,
                 saved: dict | None = None, record: dict | None = None) -> tuple[jax.Array, Cache | None]:
        """x[B, T, D], score_bias f32[B, T, S] (0 or very negative) -> (y[B, T - queries_from, D], cache).

        Every position's keys and values are computed (and cached); only positions
        [queries_from, T) query. q, k and v come from one `project_side_by_side` call, and q and
        k are normed per head (Qwen3) and rotated together. The products "qkv" [B, T, (H + 2K) *
        Dh] (before the q/k norm, which is recomputed), "attn" [B, T, H * Dh] (with "probs", the
        attention's probabilities) and "o" [B, T, D] are replayed from `saved` and recorded into
        `record`.
        """
        batch, length, _ = x.shape
        h, kv = self.num_heads, self.num_kv_heads
        projections = (self.q_proj, self.k_proj, self.v_proj)
        biases = None if projections[0].bias is None else [proj.bias[...] for proj in projections]
        qkv = _product("qkv", lambda x, kernels, biases: project_side_by_side(x, kernels, biases, x.dtype),
                       (x, [proj.kernel[...] for proj in projections], biases), saved, record)
        qkv = qkv.reshape(batch, length, h + 2 * kv, self.head_dim)
        qk, v = jnp.split(qkv, [h + kv], axis=2)
        if self.q_norm is not None:
            # one norm over the H query and K key heads side by side, each with its own scale row
            scale = jnp.concatenate([jnp.broadcast_to(self.q_norm.scale[...], (h, self.head_dim)),
                                     jnp.broadcast_to(self.k_norm.scale[...], (kv, self.head_dim))])
            qk = head_norm(qk, scale, self.q_norm.eps)
        q, k = jnp.split(apply_rotary(qk, cos, sin), [h], axis=2)
        cache, k, v = write_cache(cache, k, v, cache_index, layer_index)
        if saved is not None:
            attended = attend_replayed(q[:, queries_from:], k, v, saved["probs"], saved["attn"])
        else:
            attended = attend(q[:, queries_from:], k, v, score_bias[:, queries_from:], record,
                              keys_last=isinstance(cache, HeadMajorCache) and cache.keys_last)
        if record is not None:
            record["attn"] = attended
        dtype = self.o_proj.dtype
        out = _product("o", lambda a, kernel: project(a, kernel, None, dtype), (attended, self.o_proj.kernel[...]),
                       saved, record)
        return out, cache


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig):
        d, f = config.hidden_size, config.intermediate_size
        dense = dict(use_bias=False, dtype=config.compute_dtype, param_dtype=config.weight_dtype)
        self.gate_proj = Dense(d, f, shard_input=False, **dense)
        self.up_proj = Dense(d, f, shard_input=False, **dense)
        self.down_proj = Dense(f, d, shard_input=True, **dense)

    def __call__(self, x: jax.Array, saved: dict | None = None, record: dict | None = None) -> jax.Array:
        """gate and up come from one `project_side_by_side` call; the products "gate_up" [..., 2F]
        and "down" [..., D] are replayed from `saved` and recorded into `record` (`_product`)."""
        dtype = self.gate_proj.dtype
        gate_up = _product("gate_up", lambda x, kernels: project_side_by_side(x, kernels, None, dtype),
                           (x, [self.gate_proj.kernel[...], self.up_proj.kernel[...]]), saved, record)
        gate, up = jnp.split(gate_up, 2, axis=-1)
        return _product("down", lambda h, kernel: project(h, kernel, None, dtype),
                        (jax.nn.silu(gate) * up, self.down_proj.kernel[...]), saved, record)


class DecoderLayer(nnx.Module):
    """Pre-norm attention block and pre-norm MLP block, each with a residual connection."""

    def __init__(self, config: ModelConfig):
        norm = dict(dtype=config.compute_dtype, param_dtype=config.weight_dtype)
        self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **norm)
        self.attn = Attention(config)
        self.post_attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **norm)
        self.mlp = MLP(config)

    def __call__(self, x, cos, sin, score_bias, cache, cache_index, layer_index, queries_from=0, saved=None,
                 record=None):
        """x[B, T, D] -> (y[B, T - queries_from, D], cache): the outputs of positions
        [queries_from, T) only (keys and values of all T are still written). `saved` and
        `record`: this layer's products (`PRODUCTS`), see `Transformer.hidden_states`."""
        attended, cache = self.attn(self.input_norm(x), cos, sin, score_bias, cache, cache_index, layer_index,
                                    queries_from, saved, record)
        x = x[:, queries_from:] + attended
        return x + self.mlp(self.post_attn_norm(x), saved, record), cache


class Embedding(nnx.Module):
    """Token embedding table [V, D]."""

    def __init__(self, vocab_size: int, hidden_size: int, *, param_dtype: Any):
        self.embedding = _param((vocab_size, hidden_size), param_dtype, (MODEL_AXIS, None))


def _run_layer(layer: DecoderLayer, x, cos, sin, score_bias, cache, cache_index, layer_index, queries_from,
               saved=None, record=None):
    return layer(x, cos, sin, score_bias, cache, cache_index, layer_index, queries_from, saved, record)


_run_layer_remat = nnx.remat(_run_layer, static_argnums=(7, 8))


def _initial_values(params: nnx.State, key: jax.Array, max_draw: int = 1 << 27) -> dict:
    """{param path: array}: normal(0.02) kernels and embeddings, zero biases, unit norm scales.

    Only the shapes and dtypes of `params` are read.
    The normal entries come from a few flat draws of at most `max_draw` numbers each (a larger
    parameter gets its own draw), cut into the parameters in order: every PRNG call is
    compiled separately, so few calls keep compilation short and bounded draws keep memory low.
    """
    values, chunks = {}, [[]]
    chunk_size = 0
    for path, variable in nnx.to_flat_state(params):
        if path[-1] == "scale":
            values[path] = jnp.ones(variable.shape, variable.dtype)
        elif path[-1] == "bias":
            values[path] = jnp.zeros(variable.shape, variable.dtype)
        else:
            size = math.prod(variable.shape)
            if chunks[-1] and chunk_size + size > max_draw:
                chunks.append([])
                chunk_size = 0
            chunks[-1].append((path, variable.shape, variable.dtype))
            chunk_size += size
    for chunk_index, chunk in enumerate(chunks):
        total = sum(math.prod(shape) for _, shape, _ in chunk)
        draws = INIT_STDDEV * jax.random.normal(jax.random.fold_in(key, chunk_index), (total,), jnp.float32)
        offset = 0
        for path, shape, dtype in chunk:
            size = math.prod(shape)
            values[path] = draws[offset:offset + size].reshape(shape).astype(dtype)
            offset += size
    return values


class Transformer(nnx.Module):
    """Qwen2 / Qwen3 causal language model (`ModelConfig.family`)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs | None = None):
        """With `rngs`, weights are drawn from normal(0.02) (biases 0, norm scales 1) using
        `rngs.params()`; without, weights and biases are 0 and norm scales 1 (a placeholder to
        load values into)."""
        self.config = config
        dtype, param_dtype = config.compute_dtype, config.weight_dtype
        self.embed = Embedding(config.vocab_size, config.hidden_size, param_dtype=param_dtype)
        self.layers = nnx.List([DecoderLayer(config) for _ in range(config.num_layers)])
        self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype=dtype, param_dtype=param_dtype)
        self.lm_head = None if config.tie_embeddings else Dense(
            config.hidden_size, config.vocab_size, use_bias=False, shard_input=False,
            dtype=dtype, param_dtype=param_dtype)
        if rngs is not None:
            state = nnx.state(self)
            nnx.replace_by_pure_dict(state, traverse_util.unflatten_dict(_initial_values(state, rngs.params())))
            nnx.update(self, state)

    def hidden_states(self, tokens: jax.Array, positions: jax.Array,
                      attention_mask: jax.Array | None = None, cache: Cache | None = None,
                      cache_index: jax.Array | int = 0, last: int | None = None,
                      saved: Sequence[dict] | None = None, record: list | None = None
                      ) -> tuple[jax.Array, Cache | None]:
        """Final-normed hidden states [B, T, D] (compute dtype) and the updated cache.

        tokens, positions: i32[B, T]. attention_mask: bool[B, T, S], True where query t may
        read key s; S is the cache length with a cache, else T. Default: causal over cache
        positions (key s visible to query t iff s <= cache_index + t). With a cache, this call's
        keys/values are written at cache positions [cache_index, cache_index + T), or, with
        cache_index i32[B, T], token t of row b at slot cache_index[b, t] (a slot outside the
        cache is not written; an attention_mask is then required).

        last = n: only the hidden states of the last n positions are wanted ([B, n, D]; a prefill
        wants 1). The last layer then runs its queries, output projection and MLP, and the final
        norm, over those n positions alone; its keys and values still cover all T (the cache is
        the same). Each position's value is the same as in the full result.

        saved: per layer, the products of `PRODUCTS` as computed before for these same tokens
        ([B, T, X] each, "probs" f32[B, K, G, T, S]; e.g. kept by the decode loop): they are
        replayed (`replayed`, `attend_replayed`), so the matmuls that made them run only in the
        backward pass. record: a list that gets one
        dict of this call's products per layer. Neither under `ModelConfig.remat`.
        """
        config = self.config
        if tokens.ndim != 2 or positions.shape != tokens.shape:
            raise ValueError(
                f"Transformer: tokens and positions must both be [B, T], got {tokens.shape} "
                f"and {positions.shape}")
        batch, length = tokens.shape
        cache_index = jnp.asarray(cache_index, jnp.int32)
        key_length = length if cache is None else cache.length
        if isinstance(cache, HeadMajorCache):
            if len(cache.k) != config.num_layers or cache.batch_size != batch:
                raise ValueError(
                    f"Transformer: head-major cache has {len(cache.k)} layers of batch {cache.batch_size}, "
                    f"expected {config.num_layers} layers of batch {batch}")
        elif cache is not None and cache.k.shape[:2] != (config.num_layers, batch):
            raise ValueError(
                f"Transformer: cache k has shape {cache.k.shape}, expected leading dims "
                f"(num_layers={config.num_layers}, batch={batch})")
        if cache_index.ndim not in (0, 2) or (cache_index.ndim == 2 and (
                cache is None or attention_mask is None or cache_index.shape != (batch, length))):
            raise ValueError(
                f"Transformer: cache_index must be a scalar, or slots [B, T] = {(batch, length)} with a cache "
                f"and an attention_mask, got shape {cache_index.shape}")
        if attention_mask is None:
            attention_mask = causal_mask(batch, length, key_length, cache_index)
        elif attention_mask.shape != (batch, length, key_length):
            raise ValueError(
                f"Transformer: attention_mask must be [B, T, S] = {(batch, length, key_length)}, "
                f"got {attention_mask.shape}")
        score_bias = jnp.where(attention_mask, 0.0, MASKED_SCORE).astype(jnp.float32)
        cos, sin = rotary_tables(positions, config.head_dim, config.rope_theta)
        x = jnp.take(self.embed.embedding[...], tokens, axis=0).astype(config.compute_dtype)
        # A one-token decode step keeps no activations worth recomputing, and it runs inside the
        # sampler's scan, where nnx.remat cannot lift the layer's parameters.
        if (saved is not None or record is not None) and config.remat:
            raise ValueError("Transformer: saved or recorded products need ModelConfig.remat=False")
        if saved is not None and len(saved) != config.num_layers:
            raise ValueError(f"Transformer: saved holds {len(saved)} layers, the model {config.num_layers}")
        run = _run_layer_remat if config.remat and length > 1 else _run_layer
        if last is not None and not (isinstance(last, int) and 1 <= last <= length):
            raise ValueError(f"Transformer: last must be an int in [1, {length}] (the positions kept), got {last!r}")
        final = len(self.layers) - 1
        for layer_index, layer in enumerate(self.layers):
            queries_from = length - last if last is not None and layer_index == final else 0
            layer_record = None if record is None else {}
            x, cache = run(layer, x, cos, sin, score_bias, cache, cache_index, layer_index, queries_from,
                           None if saved is None else saved[layer_index], layer_record)
            if record is not None:
                record.append(layer_record)
        return self.final_norm(x), cache

    def logits(self, hidden: jax.Array) -> jax.Array:
        """f32[..., V] from hidden states [..., D]."""
        dtype = self.config.compute_dtype
        if self.lm_head is None:
            table = self.embed.embedding[...].astype(dtype)
            return jnp.einsum("...d,vd->...v", hidden.astype(dtype), table,
                              preferred_element_type=jnp.float32)
        kernel = self.lm_head.kernel[...].astype(dtype)
        return jnp.einsum("...d,dv->...v", hidden.astype(dtype), kernel,
                          preferred_element_type=jnp.float32)

    def __call__(self, tokens: jax.Array, positions: jax.Array,
                 attention_mask: jax.Array | None = None, cache: Cache | None = None,
                 cache_index: jax.Array | int = 0) -> tuple[jax.Array, Cache | None]:
        """(logits f32[B, T, V], updated cache); arguments as in `hidden_states`."""
        hidden, cache = self.hidden_states(tokens, positions, attention_mask, cache, cache_index)
        return self.logits(hidden), cache


def split_model(model: Transformer) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, params): the static structure and the parameter pytree of `model`."""
    graphdef, params = nnx.split(model)
    return graphdef, params


def merge_model(graphdef: nnx.GraphDef, params: nnx.State) -> Transformer:
    """Inverse of `split_model`."""
    return nnx.merge(graphdef, params)


def config_of(graphdef: nnx.GraphDef, params: nnx.State) -> ModelConfig:
    """The ModelConfig a (graphdef, params) pair was built from."""
    return merge_model(graphdef, params).config


def apply(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array, positions: jax.Array,
          attention_mask: jax.Array | None = None, cache: Cache | None = None,
          cache_index: jax.Array | int = 0) -> tuple[jax.Array, Cache | None]:
    """Functional forward pass: (logits f32[B, T, V], cache); see `Transformer.hidden_states`."""
    return merge_model(graphdef, params)(tokens, positions, attention_mask, cache, cache_index)


def apply_hidden(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array, positions: jax.Array,
                 attention_mask: jax.Array | None = None, cache: Cache | None = None,
                 cache_index: jax.Array | int = 0, last: int | None = None, saved: Sequence[dict] | None = None,
                 record: list | None = None) -> tuple[jax.Array, Cache | None]:
    """Functional `Transformer.hidden_states`: (hidden [B, T, D], or [B, last, D] with `last`, cache)."""
    return merge_model(graphdef, params).hidden_states(tokens, positions, attention_mask, cache, cache_index,
                                                       last, saved, record)


def apply_logits(graphdef: nnx.GraphDef, params: nnx.State, hidden: jax.Array) -> jax.Array:
    """Functional `Transformer.logits`: f32[..., V] from hidden [..., D]."""
    return merge_model(graphdef, params).logits(hidden)


def abstract_model(config: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, params of jax.ShapeDtypeStruct) without allocating parameters."""
    return nnx.split(nnx.eval_shape(lambda: Transformer(config)))


@functools.lru_cache(maxsize=16)
def _jitted_init(config: ModelConfig):
    return jax.jit(lambda key: nnx.split(Transformer(config, rngs=nnx.Rngs(key)))[1])


def init_params(config: ModelConfig, key: jax.Array) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, params) of `Transformer(config, rngs=nnx.Rngs(key))`, built under jit."""
    graphdef, _ = abstract_model(config)
    return graphdef, _jitted_init(config)(key)


def count_params(params: Any) -> int:
    """Total number of parameter elements in a params pytree (arrays or ShapeDtypeStructs)."""
    return int(sum(math.prod(leaf.shape) for leaf in jax.tree_util.tree_leaves(params)))


def param_partition_specs(params: nnx.State, mesh: Mesh | None = None) -> Any:
    """PartitionSpec per parameter from its sharding metadata.

    With `mesh`, a dimension the named mesh axis does not divide (or an axis the mesh lacks)
    is replicated instead, so any model fits any mesh.
    """
    specs = nnx.get_partition_spec(params)

    def fit(value, spec):
        if mesh is None or not isinstance(spec, PartitionSpec):
            return spec
        fitted = []
        for size, axis in zip(value.shape, tuple(spec) + (None,) * (len(value.shape) - len(spec))):
            ok = axis is not None and axis in mesh.shape and size % mesh.shape[axis] == 0
            fitted.append(axis if ok else None)
        return PartitionSpec(*fitted)

    return jax.tree_util.tree_map(fit, params, specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def param_shardings(params: nnx.State, mesh: Mesh) -> Any:
    """NamedSharding per parameter on `mesh` (see `param_partition_specs`).

    The mesh axes must be `jax.sharding.AxisType.Auto` (the compiler propagates shardings
    through the model); `jax.make_mesh` needs `axis_types=(AxisType.Auto,) * n` for that.
    """
    explicit = [name for name, kind in zip(mesh.axis_names, mesh.axis_types)
                if kind != jax.sharding.AxisType.Auto]
    if explicit:
        raise ValueError(
            f"param_shardings: mesh axes {explicit} are not AxisType.Auto; build the mesh with "
            f"axis_types=(jax.sharding.AxisType.Auto,) * {len(mesh.axis_names)}")
    specs = param_partition_specs(params, mesh)
    return jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), specs,
                                  is_leaf=lambda x: isinstance(x, PartitionSpec))


def shard_params(params: nnx.State, mesh: Mesh) -> nnx.State:
    """`params` placed on `mesh` by their sharding metadata."""
    return jax.device_put(params, param_shardings(params, mesh))
