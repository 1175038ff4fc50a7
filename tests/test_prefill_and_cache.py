"""Shared-prompt prefill, the head-major KV cache, pre-drawn sampling noise and the rotary
tables, each against the plain computation it replaces."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from derl_jax.models import attention
from derl_jax.models import sampling as sm
from derl_jax.models import transformer as tr
from derl_jax.rl import grpo
from test_sampling import VOCAB, model  # noqa: F401  (the random tiny model fixture)

GROUP = 3


@pytest.fixture(scope="module")
def grouped():
    """Two left-padded prompts (5 and 3 real tokens, junk padding), each repeated GROUP times."""
    rng = np.random.default_rng(1)
    prompts = rng.integers(1, VOCAB, (2, 5))
    mask = np.ones((2, 5), bool)
    mask[1, :2] = False
    return jnp.asarray(np.repeat(prompts, GROUP, 0), jnp.int32), jnp.asarray(np.repeat(mask, GROUP, 0))


def _full_forward_logprobs(graphdef, params, prompts, prompt_mask, completions, completion_mask):
    """(logp, entropy) from one uncached causal forward over prompt + completion."""
    tokens = jnp.concatenate([prompts, completions], axis=1)
    token_mask = jnp.concatenate([prompt_mask, completion_mask], axis=1)
    total, start = tokens.shape[1], prompts.shape[1] - 1
    attention = token_mask[:, None, :] & (jnp.arange(total)[None, :] <= jnp.arange(total)[:, None])[None]
    logits, _ = tr.apply(graphdef, params, tokens, sm.prompt_positions(token_mask), attention)
    log_probs = jax.nn.log_softmax(logits[:, start:start + completions.shape[1]], axis=-1)
    logp = jnp.take_along_axis(log_probs, completions[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return jnp.where(completion_mask, logp, 0.0), jnp.where(completion_mask, entropy, 0.0)


def test_rotary_tables_are_the_cosines_and_sines_of_the_repeated_angles():
    positions = jnp.asarray(np.random.default_rng(2).integers(0, 100, (3, 7)), jnp.int32)
    cos, sin = jax.jit(attention.rotary_tables, static_argnums=(1, 2))(positions, 16, 10000.0)
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, 16, 2) / 16))
    angles = np.asarray(positions, np.float64)[..., None] * np.concatenate([inv_freq, inv_freq])
    np.testing.assert_allclose(np.asarray(cos), np.cos(angles), atol=1e-5)
    np.testing.assert_allclose(np.asarray(sin), np.sin(angles), atol=1e-5)
    assert np.array_equal(np.asarray(cos)[..., :8], np.asarray(cos)[..., 8:])


@pytest.mark.slow
def test_head_major_cache_decodes_like_the_kv_cache_and_the_full_forward(model):
    config, graphdef, params = model
    batch, prompt_len, total = 2, 4, 9
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, VOCAB, (batch, total)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(total), (batch, total))
    forward = jax.jit(tr.apply, static_argnums=0)
    full, _ = forward(graphdef, params, tokens, positions)
    caches = {"kv": attention.init_cache(config, batch, total), "head_major": attention.init_head_major_cache(config, batch, total)}
    assert caches["head_major"].length == total and caches["head_major"].k[0].shape == (batch, 2, total, 8)
    logits = {}
    for name, cache in caches.items():
        prefill, cache = forward(graphdef, params, tokens[:, :prompt_len], positions[:, :prompt_len], None, cache, 0)
        steps = [prefill]
        for index in range(prompt_len, total):
            step, cache = forward(graphdef, params, tokens[:, index:index + 1], positions[:, index:index + 1],
                                  None, cache, index)
            steps.append(step)
        logits[name] = np.concatenate([np.asarray(s) for s in steps], axis=1)
    np.testing.assert_allclose(logits["head_major"], np.asarray(full), atol=2e-5)
    np.testing.assert_allclose(logits["head_major"], logits["kv"], atol=2e-5)


def test_a_cache_with_keys_last_decodes_like_the_head_major_one(model):
    # keys stored [B, K, Dh, S] (the decode's layout): the same logits step by step, and the same
    # cache once laid out back; per-token slot writes are refused
    config, graphdef, params = model
    batch, prompt_len, total = 2, 4, 9
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, VOCAB, (batch, total)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(total), (batch, total))
    forward = jax.jit(tr.apply, static_argnums=0)
    _, cache = forward(graphdef, params, tokens[:, :prompt_len], positions[:, :prompt_len], None,
                       attention.init_head_major_cache(config, batch, total), 0)
    caches = {"head_major": cache, "keys_last": cache.with_keys_last(True)}
    assert caches["keys_last"].k[0].shape == (batch, 2, 8, total) and caches["keys_last"].length == total
    assert caches["keys_last"].with_keys_last(True) is caches["keys_last"]
    logits = {name: [] for name in caches}
    for name in caches:
        for index in range(prompt_len, total):
            step, caches[name] = forward(graphdef, params, tokens[:, index:index + 1], positions[:, index:index + 1],
                                         None, caches[name], index)
            logits[name].append(np.asarray(step))
    assert caches["keys_last"].keys_last and not caches["head_major"].keys_last
    np.testing.assert_allclose(np.concatenate(logits["keys_last"], 1), np.concatenate(logits["head_major"], 1),
                               atol=2e-5)
    back = caches["keys_last"].with_keys_last(False)
    for got, want in zip(back.k + back.v, caches["head_major"].k + caches["head_major"].v):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6)
    slots = jnp.zeros((batch, 1), jnp.int32)
    with pytest.raises(ValueError, match="keys_last"):
        attention.write_cache(caches["keys_last"], jnp.zeros((batch, 1, 2, 8)), jnp.zeros((batch, 1, 2, 8)), slots, 0)


@pytest.mark.slow
def test_grouped_prefill_samples_what_the_ungrouped_one_samples(model, grouped):
    _, graphdef, params = model
    prompts, mask = grouped
    options = dict(max_new_tokens=6, eos_id=VOCAB, pad_id=0, temperature=1.3)
    plain = sm.sample_jit(graphdef, params, prompts, mask, jax.random.key(4), **options)
    shared = sm.sample_jit(graphdef, params, prompts, mask, jax.random.key(4), group_size=GROUP, **options)
    assert np.array_equal(np.asarray(plain.tokens), np.asarray(shared.tokens))
    assert len({tuple(row) for row in np.asarray(shared.tokens)[:GROUP]}) > 1  # the copies are sampled apart
    np.testing.assert_allclose(np.asarray(shared.logprobs), np.asarray(plain.logprobs), atol=1e-5)
    with pytest.raises(ValueError, match="group_size"):
        sm.sample(graphdef, params, prompts, mask, jax.random.key(4), group_size=4, **options)


@pytest.mark.slow
def test_grouped_sequence_logprobs_match_a_full_forward_in_values_and_gradients(model, grouped):
    _, graphdef, params = model
    prompts, prompt_mask = grouped
    rng = np.random.default_rng(5)
    completions = jnp.asarray(rng.integers(0, VOCAB, (prompts.shape[0], 5)), jnp.int32)
    completion_mask = jnp.asarray(np.arange(5)[None] < rng.integers(1, 6, (prompts.shape[0], 1)))
    weights = jnp.asarray(rng.standard_normal(completions.shape), jnp.float32)

    def objective(logprob_fn):
        def value(params):
            logp, entropy = logprob_fn(params)
            return jnp.sum(weights * logp), (logp, entropy)
        return jax.jit(jax.value_and_grad(value, has_aux=True))

    reference = objective(lambda p: _full_forward_logprobs(graphdef, p, prompts, prompt_mask, completions,
                                                           completion_mask))
    (_, (logp_ref, entropy_ref)), grads_ref = reference(params)
    for group_size in (1, GROUP):
        run = objective(lambda p, g=group_size: sm.sequence_logprobs(
            graphdef, p, prompts, prompt_mask, completions, completion_mask, 1.0, group_size=g))
        (_, (logp, entropy)), grads = run(params)
        np.testing.assert_allclose(np.asarray(logp), np.asarray(logp_ref), atol=2e-5)
        np.testing.assert_allclose(np.asarray(entropy), np.asarray(entropy_ref), atol=2e-5)
        for got, want in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(grads_ref)):
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4, rtol=1e-4)
    one, _ = jax.jit(sm.sequence_logprobs, static_argnums=0)(graphdef, params, prompts, prompt_mask, completions[:, :1],
                                                             completion_mask[:, :1])
    np.testing.assert_allclose(np.asarray(one), np.asarray(logp_ref)[:, :1], atol=2e-5)


def test_pre_drawn_gumbel_noise_reproduces_categorical_draws():
    key = jax.random.key(6)
    logits = jnp.asarray(np.random.default_rng(7).standard_normal((4, 11)), jnp.float32)
    noise = sm.gumbel_noise(key, 5, logits.shape)
    for step in range(5):
        expected = jax.random.categorical(jax.random.fold_in(key, step), logits, axis=-1)
        assert np.array_equal(np.asarray(jnp.argmax(noise[step] + logits, axis=-1)), np.asarray(expected))


@pytest.mark.slow
def test_noise_drawn_step_by_step_samples_what_the_pre_drawn_noise_samples(model, grouped, monkeypatch):
    # past PREDRAWN_NOISE_MAX_ELEMENTS (long completions, large vocabularies) `sample` draws each
    # step's noise inside the decode loop instead of holding f32[T, B, V]
    _, graphdef, params = model
    prompts, mask = grouped
    options = dict(max_new_tokens=6, eos_id=VOCAB, pad_id=0, temperature=1.3)
    pre_drawn = sm.sample_jit(graphdef, params, prompts, mask, jax.random.key(8), **options)
    monkeypatch.setattr(sm, "PREDRAWN_NOISE_MAX_ELEMENTS", 0)
    # jitted afresh: traced under the patched limit
    per_step = jax.jit(functools.partial(sm.sample, **options), static_argnums=0)(
        graphdef, params, prompts, mask, jax.random.key(8))
    assert np.array_equal(np.asarray(per_step.tokens), np.asarray(pre_drawn.tokens))
    np.testing.assert_allclose(np.asarray(per_step.logprobs), np.asarray(pre_drawn.logprobs), atol=1e-6)


def test_one_minibatch_keeps_the_rows_in_order():
    order = np.asarray(grpo.minibatch_indices(jax.random.key(0), 6, epochs=2, minibatches=1))
    assert np.array_equal(order, np.tile(np.arange(6), (2, 1)))
