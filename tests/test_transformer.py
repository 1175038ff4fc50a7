"""Qwen2 transformer: shapes, a NumPy reference forward, KV cache, remat, sharding."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, traverse_util
from jax.sharding import AxisType, PartitionSpec

from derl_jax.models import attention
from derl_jax.models import transformer as tr


def _numpy_forward(config: tr.ModelConfig, params, tokens: np.ndarray, positions: np.ndarray,
                   mask: np.ndarray) -> np.ndarray:
    """Qwen2 forward written independently in float64 NumPy: logits [B, T, V]."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), nnx.to_pure_dict(params))
    h, k_heads, dh = config.num_heads, config.num_kv_heads, config.head_dim

    def rms(x, scale):
        return x / np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True) + config.rms_norm_eps) * scale

    def rope(x):  # x [B, T, heads, Dh]
        freq = config.rope_theta ** (-np.arange(0, dh, 2) / dh)
        angle = positions[:, :, None, None] * np.concatenate([freq, freq])
        half = dh // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * np.cos(angle) + rotated * np.sin(angle)

    batch, length = tokens.shape
    x = p["embed"]["embedding"][tokens]
    for i in range(config.num_layers):
        layer = p["layers"][i]
        a = layer["attn"]
        y = rms(x, layer["input_norm"]["scale"])
        q = (y @ a["q_proj"]["kernel"] + a["q_proj"]["bias"]).reshape(batch, length, h, dh)
        k = (y @ a["k_proj"]["kernel"] + a["k_proj"]["bias"]).reshape(batch, length, k_heads, dh)
        v = (y @ a["v_proj"]["kernel"] + a["v_proj"]["bias"]).reshape(batch, length, k_heads, dh)
        q, k = rope(q), rope(k)
        repeat = h // k_heads
        k, v = np.repeat(k, repeat, axis=2), np.repeat(v, repeat, axis=2)
        scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(dh)
        scores = np.where(mask[:, None], scores, -1e30)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        out = np.einsum("bhts,bshd->bthd", weights, v).reshape(batch, length, h * dh)
        x = x + out @ a["o_proj"]["kernel"]
        m = layer["mlp"]
        y = rms(x, layer["post_attn_norm"]["scale"])
        gate = y @ m["gate_proj"]["kernel"]
        x = x + (gate / (1 + np.exp(-gate)) * (y @ m["up_proj"]["kernel"])) @ m["down_proj"]["kernel"]
    x = rms(x, p["final_norm"]["scale"])
    head = p["embed"]["embedding"].T if config.tie_embeddings else p["lm_head"]["kernel"]
    return x @ head


def random_model(config: tr.ModelConfig, seed: int, scale: float = 0.3):
    """(graphdef, params) with every entry drawn from NumPy: weights N(0, scale^2), norm scales 1 + N(0, scale^2)."""
    graphdef, abstract = tr.abstract_model(config)
    rng = np.random.default_rng(seed)
    values = {path: jnp.asarray((path[-1] == "scale") + scale * rng.standard_normal(var.shape), var.dtype)
              for path, var in nnx.to_flat_state(abstract)}
    nnx.replace_by_pure_dict(abstract, traverse_util.unflatten_dict(values))
    return graphdef, abstract


def _small(vocab_size: int = 24, **overrides) -> tr.ModelConfig:
    base = dict(hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                rope_theta=100.0, max_position=64)
    base.update(overrides)
    return tr.tiny_config(vocab_size, **base)


_forward = jax.jit(tr.apply, static_argnums=0)


@pytest.fixture(scope="module")
def model():
    config = _small()
    graphdef, params = random_model(config, 2, scale=0.1)
    return config, graphdef, params


@pytest.mark.parametrize("preset, shapes, expected", [
    (tr.qwen2_5_0_5b, (896, 4864, 24, 14), 494_032_768),
    (tr.qwen2_5_1_5b, (1536, 8960, 28, 12), 1_543_714_304),
    (tr.qwen2_5_3b, (2048, 11008, 36, 16), 3_085_938_688),
])
def test_qwen2_5_presets_have_published_shapes(preset, shapes, expected):
    config = preset()
    hidden, inter, layers, heads = shapes
    assert (config.hidden_size, config.intermediate_size, config.num_layers, config.num_heads) == shapes
    assert (config.num_kv_heads, config.vocab_size, config.rope_theta, config.rms_norm_eps) == (2, 151936, 1e6, 1e-6)
    assert config.tie_embeddings and config.head_dim == hidden // heads
    kv = 2 * config.head_dim
    per_layer = hidden * hidden + hidden + 2 * (hidden * kv + kv) + hidden * hidden + 3 * hidden * inter + 2 * hidden
    by_hand = 151936 * hidden + layers * per_layer + hidden
    assert by_hand == expected
    assert tr.count_params(tr.abstract_model(config)[1]) == expected


def test_init_params_statistics_and_determinism():
    config = _small(num_layers=1)
    graphdef, params = tr.init_params(config, jax.random.key(0))
    _, again = tr.init_params(config, jax.random.key(0))
    values = nnx.to_pure_dict(params)
    layer = values["layers"][0]
    for kernel in (values["embed"]["embedding"], layer["attn"]["q_proj"]["kernel"], layer["mlp"]["up_proj"]["kernel"]):
        assert abs(float(kernel.std()) - tr.INIT_STDDEV) < 0.003 and abs(float(kernel.mean())) < 0.002
    assert float(jnp.abs(layer["attn"]["k_proj"]["bias"]).max()) == 0.0
    assert float(jnp.abs(layer["input_norm"]["scale"] - 1).max()) == 0.0
    assert not np.allclose(layer["mlp"]["gate_proj"]["kernel"], layer["mlp"]["up_proj"]["kernel"])
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(again)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Small draws split the parameters over several PRNG calls; entries stay independent.
    chunked = jax.jit(lambda key: tr._initial_values(params, key, max_draw=3000))(jax.random.key(0))
    gate, up = chunked[("layers", 0, "mlp", "gate_proj", "kernel")], chunked[("layers", 0, "mlp", "up_proj", "kernel")]
    assert abs(float(gate.std()) - tr.INIT_STDDEV) < 0.003 and not np.allclose(gate, up)


def test_tiny_config_is_a_few_hundred_thousand_parameters():
    config = tr.tiny_config(32)
    _, params = tr.abstract_model(config)
    assert 200_000 < tr.count_params(params) < 600_000
    assert config.dtype == "float32" and config.head_dim == 32


@pytest.mark.parametrize("overrides, padded", [
    (dict(num_kv_heads=2, tie_embeddings=True), False),
    (dict(num_kv_heads=1, tie_embeddings=False, head_dim=6), True),
])
def test_forward_matches_numpy_reference(overrides, padded):
    config = _small(**overrides)
    graphdef, params = random_model(config, 1)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (2, 7))
    positions = np.array([np.arange(7), np.arange(3, 10)])
    mask = np.tril(np.ones((7, 7), bool))[None].repeat(2, 0)
    if padded:  # row 1 treats token 0 as padding
        mask[1, 1:, 0] = False
    logits, cache = _forward(graphdef, params, jnp.asarray(tokens), jnp.asarray(positions),
                             jnp.asarray(mask) if padded else None)  # None: the default causal mask
    assert cache is None and logits.dtype == jnp.float32 and logits.shape == (2, 7, config.vocab_size)
    expected = _numpy_forward(config, params, tokens, positions, mask)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=2e-5, rtol=1e-5)


def test_cached_decode_matches_full_forward_at_every_step():
    config = _small(num_kv_heads=1)
    graphdef, params = random_model(config, 4)
    batch, prompt_len, total = 2, 4, 9
    tokens = jnp.asarray(np.random.default_rng(2).integers(0, config.vocab_size, (batch, total)))
    positions = jnp.broadcast_to(jnp.arange(total), (batch, total))
    causal = np.tril(np.ones((total, total), bool))[None].repeat(batch, 0)
    full = _numpy_forward(config, params, np.asarray(tokens), np.asarray(positions), causal)

    cache = attention.init_cache(config, batch, total)
    assert cache.k.shape == (config.num_layers, batch, total, 1, config.head_dim)
    prefill, cache = _forward(graphdef, params, tokens[:, :prompt_len], positions[:, :prompt_len],
                              None, cache, 0)
    np.testing.assert_allclose(np.asarray(prefill), full[:, :prompt_len], atol=2e-5)
    for index in range(prompt_len, total):
        logits, cache = _forward(graphdef, params, tokens[:, index:index + 1], positions[:, index:index + 1],
                                 None, cache, index)
        np.testing.assert_allclose(np.asarray(logits[:, 0]), full[:, index], atol=2e-5)


@pytest.mark.parametrize("last, remat, cache_kind", [(1, False, "head_major"), (3, True, "layer_major"),
                                                      (7, False, None)])
@pytest.mark.slow
def test_keeping_the_last_positions_matches_the_full_forward(last, remat, cache_kind):
    # `last=n` runs the last layer's queries and MLP on n positions only: the same values there,
    # the same cache, the same gradients, and the NumPy reference's logits
    config = _small(remat=remat)
    graphdef, params = random_model(config, 6, scale=0.2)
    batch, length, cache_length = 2, 7, 10
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, config.vocab_size, (batch, length)))
    mask = np.tril(np.ones((length, length), bool))[None].repeat(batch, 0)
    mask[1, :, :2] = False   # row 1 is left-padded by two positions
    positions = np.array([np.arange(length), np.maximum(np.arange(length) - 2, 0)])
    full_mask = np.pad(mask, ((0, 0), (0, 0), (0, cache_length - length))) if cache_kind else mask
    init = {"head_major": attention.init_head_major_cache, "layer_major": attention.init_cache}.get(cache_kind)
    cache = init(config, batch, cache_length) if init else None

    def run(params, keep):
        return tr.apply_hidden(graphdef, params, tokens, jnp.asarray(positions), jnp.asarray(full_mask), cache, 0,
                               last=keep)

    # compiled: run op by op, the forward and its gradient compile hundreds of small programs
    (full, full_cache), (kept, kept_cache) = (jax.jit(run, static_argnums=1)(params, keep) for keep in (None, last))
    assert kept.shape == (batch, last, config.hidden_size)
    np.testing.assert_allclose(np.asarray(kept), np.asarray(full[:, -last:]), atol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(full_cache), jax.tree_util.tree_leaves(kept_cache)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    expected = _numpy_forward(config, params, np.asarray(tokens), positions, mask)[:, -last:]
    logits = tr.apply_logits(graphdef, params, kept)
    # the last position of each row (row 1's first two queries see no key at all: no reference there)
    np.testing.assert_allclose(np.asarray(logits)[:, -1], expected[:, -1], atol=2e-5, rtol=1e-5)

    def loss(params, keep):   # reads the last position and, through the cache, every key and value
        hidden, new_cache = run(params, keep)
        extra = 0.0 if new_cache is None else sum(jnp.sum(x ** 2) for x in jax.tree_util.tree_leaves(new_cache))
        return jnp.sum(tr.apply_logits(graphdef, params, hidden[:, -1]) ** 2) + extra

    grads_full, grads_kept = (jax.jit(jax.grad(loss), static_argnums=1)(params, keep) for keep in (None, last))
    for a, b in zip(jax.tree_util.tree_leaves(grads_full), jax.tree_util.tree_leaves(grads_kept)):
        a, b = np.asarray(a), np.asarray(b)   # float32 sums of terms up to ~100: relative to the leaf's scale
        np.testing.assert_allclose(b, a, atol=1e-6 * np.abs(a).max(), rtol=0)
    with pytest.raises(ValueError, match="last must be an int in"):
        run(params, length + 1)


def test_remat_gives_the_same_loss_and_gradients():
    config = _small(num_layers=1)
    graphdef, params = random_model(config, 5, scale=0.1)
    graphdef_remat, _ = tr.abstract_model(config.replace(remat=True))
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, config.vocab_size, (2, 6)))
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))

    def loss(graphdef, params):
        logits, _ = tr.apply(graphdef, params, tokens, positions)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    def uses_remat(graphdef):
        jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums=1), static_argnums=0)(graphdef, params))
        return re.search(r"= (remat\w*|checkpoint)\[", jaxpr) is not None

    assert uses_remat(graphdef_remat) and not uses_remat(graphdef)
    plain = jax.jit(jax.value_and_grad(loss, argnums=1), static_argnums=0)
    value, grads = plain(graphdef, params)
    value_remat, grads_remat = plain(graphdef_remat, params)
    np.testing.assert_allclose(float(value), float(value_remat), rtol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(grads_remat)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
    assert max(float(jnp.abs(g).max()) for g in jax.tree_util.tree_leaves(grads)) > 0


def test_bfloat16_compute_is_close_to_float32(model):
    config, graphdef, params = model
    graphdef16, _ = tr.abstract_model(config.replace(dtype="bfloat16"))
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, config.vocab_size, (1, 6)))
    positions = jnp.arange(6)[None]
    exact, _ = _forward(graphdef, params, tokens, positions, None)
    rough, _ = _forward(graphdef16, params, tokens, positions, None)
    assert rough.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(rough), np.asarray(exact), atol=0.05)


def test_partition_specs_follow_the_model_axis_and_sharded_forward_matches():
    config = _small(vocab_size=30, num_kv_heads=1, head_dim=8)
    graphdef, params = random_model(config, 7)
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    specs = nnx.to_pure_dict(tr.param_partition_specs(params, mesh))
    attn, mlp = specs["layers"][0]["attn"], specs["layers"][0]["mlp"]
    assert specs["embed"]["embedding"] == PartitionSpec(None, None)  # 30 rows do not split 4 ways
    assert attn["q_proj"]["kernel"] == PartitionSpec(None, "model")
    assert attn["k_proj"]["bias"] == PartitionSpec("model")
    assert attn["o_proj"]["kernel"] == PartitionSpec("model", None)
    assert mlp["down_proj"]["kernel"] == PartitionSpec("model", None)
    assert specs["final_norm"]["scale"] == PartitionSpec(None)
    unfitted = nnx.to_pure_dict(tr.param_partition_specs(params))
    assert unfitted["embed"]["embedding"] == PartitionSpec("model", None)

    sharded = tr.shard_params(params, mesh)
    kernel = nnx.to_pure_dict(sharded)["layers"][1]["mlp"]["up_proj"]["kernel"]
    assert kernel.sharding.spec == PartitionSpec(None, "model")
    tokens = jnp.asarray(np.random.default_rng(5).integers(0, 30, (2, 5)))
    positions = jnp.broadcast_to(jnp.arange(5), (2, 5))
    expected, _ = _forward(graphdef, params, tokens, positions, None)
    got, _ = _forward(graphdef, sharded, tokens, positions, None)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), atol=1e-5)

    explicit = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    with pytest.raises(ValueError, match="AxisType.Auto"):
        tr.param_shardings(params, explicit)


@pytest.mark.parametrize("overrides, message", [
    (dict(num_heads=4, num_kv_heads=3), "multiple of num_kv_heads"),
    (dict(head_dim=5), "head_dim must be even"),
    (dict(dtype="float64"), "ModelConfig.dtype"),
    (dict(num_layers=0), "num_layers must be a positive integer"),
])
def test_config_rejects_bad_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        _small(**overrides)


def test_bad_shapes_are_named(model):
    config, graphdef, params = model
    tokens = jnp.zeros((2, 3), jnp.int32)
    with pytest.raises(ValueError, match="tokens and positions"):
        tr.apply(graphdef, params, tokens, jnp.zeros((2, 4), jnp.int32))
    with pytest.raises(ValueError, match="attention_mask must be"):
        tr.apply(graphdef, params, tokens, tokens, jnp.ones((2, 3, 5), bool))
    with pytest.raises(ValueError, match="cache k has shape"):
        tr.apply(graphdef, params, tokens, tokens, None, attention.init_cache(config, 3, 8), 0)


@pytest.mark.slow
def test_separate_and_side_by_side_projections_match_the_reference_and_each_other(monkeypatch):
    # large models run q/k/v and gate/up as separate matmuls, small ones with the kernels joined
    config = _small()
    graphdef, params = random_model(config, 3)
    tokens = np.random.default_rng(4).integers(0, config.vocab_size, (2, 6))
    positions = np.tile(np.arange(6), (2, 1))
    expected = _numpy_forward(config, params, tokens, positions, np.tril(np.ones((6, 6), bool))[None].repeat(2, 0))
    results = []
    for limit in (0, 1 << 40):
        monkeypatch.setattr(tr, "FUSE_MAX_KERNEL_BYTES", limit)

        def loss(p):
            logits, _ = tr.apply(graphdef, p, jnp.asarray(tokens), jnp.asarray(positions))
            return jnp.sum(jnp.tanh(logits)), logits

        (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)  # a fresh trace per limit
        np.testing.assert_allclose(np.asarray(logits), expected, atol=2e-5, rtol=1e-5)
        results.append(jax.tree_util.tree_leaves(grads))
    for separate, joined in zip(*results):  # the same sums in another order: float32 reassociation only
        np.testing.assert_allclose(np.asarray(separate), np.asarray(joined), atol=5e-5, rtol=1e-4)


def _per_head_attention(q, k, v, score_bias):
    """Reference: every query head on its own, key/value heads repeated, plain autodiff.
    q[B, T, H, Dh], k, v[B, K, S, Dh] -> [B, T, H*Dh]."""
    heads, kv_heads, head_dim = q.shape[2], k.shape[1], q.shape[3]
    k = jnp.repeat(k, heads // kv_heads, axis=1).astype(jnp.float32)
    v = jnp.repeat(v, heads // kv_heads, axis=1).astype(jnp.float32)
    outs = []
    for h in range(heads):
        scores = jnp.einsum("btd,bsd->bts", q[:, :, h].astype(jnp.float32), k[:, h]) / np.sqrt(head_dim)
        outs.append(jnp.einsum("bts,bsd->btd", jax.nn.softmax(scores + score_bias, axis=-1), v[:, h]))
    return jnp.concatenate(outs, axis=-1)


@pytest.mark.slow
@pytest.mark.parametrize("head_dim, dtype, tol, length", [(16, jnp.float32, 2e-6, 5), (24, jnp.float32, 2e-6, 5),
                                                          (16, jnp.bfloat16, 3e-2, 5), (16, jnp.float32, 2e-6, 1),
                                                          (24, jnp.float32, 2e-6, 1)])
def test_grouped_attention_backward_matches_autodiff_of_the_per_head_formula(head_dim, dtype, tol, length):
    """`attend` (written-out backward; one query: `attend_one`) against autodiff of a per-head
    reference, with masked keys, for a power-of-two head size (q pre-scaled), another (scores
    scaled) and bfloat16; and (once) under vmap."""
    keys = jax.random.split(jax.random.key(3), 5)
    batch, heads, kv_heads, key_length = 3, 4, 2, 9
    q = jax.random.normal(keys[0], (batch, length, heads, head_dim)).astype(dtype)
    k = jax.random.normal(keys[1], (batch, kv_heads, key_length, head_dim)).astype(dtype)
    v = jax.random.normal(keys[2], (batch, kv_heads, key_length, head_dim)).astype(dtype)
    visible = jax.random.bernoulli(keys[3], 0.7, (batch, length, key_length)).at[:, :, 0].set(True)
    score_bias = jnp.where(visible, 0.0, attention.MASKED_SCORE).astype(jnp.float32)
    weights = jax.random.normal(keys[4], (batch, length, heads * head_dim))

    def loss(fn):
        return lambda q, k, v: jnp.sum(fn(q, k, v, score_bias).astype(jnp.float32) * weights)

    np.testing.assert_allclose(np.asarray(jax.jit(attention.attend)(q, k, v, score_bias), np.float32),
                               np.asarray(jax.jit(_per_head_attention)(q, k, v, score_bias)), atol=tol, rtol=tol)
    ours = jax.jit(jax.grad(loss(attention.attend), argnums=(0, 1, 2)))(q, k, v)
    reference = jax.jit(jax.grad(loss(_per_head_attention), argnums=(0, 1, 2)))(q, k, v)
    for name, got, want in zip("qkv", ours, reference):
        assert got.dtype == dtype, name
        scale = float(jnp.max(jnp.abs(want)))
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                   atol=tol * scale, rtol=tol, err_msg=f"d{name}")

    if head_dim != 16 or dtype != jnp.float32 or length == 1:
        return
    stacked = [jnp.stack([x, 2 * x]) for x in (q, k, v)]
    grads = jax.grad(loss(attention.attend), argnums=(0, 1, 2))
    batched = jax.jit(jax.vmap(grads))(*stacked)
    again = jax.jit(grads)(*(x[1] for x in stacked))
    for got, want in zip(batched, again):
        np.testing.assert_allclose(np.asarray(got[1]), np.asarray(want), rtol=1e-5, atol=1e-6)
