"""Log-probabilities over chunks of positions equal the one-pass ones, in values and gradients,
and keep less of the logits live; the planner counts one chunk."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from derl_jax.models import logits as lg
from derl_jax.models.sampling import sequence_logprobs
from derl_jax.models.transformer import ModelConfig, apply_logits, init_params

CONFIG = ModelConfig(vocab_size=48, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                     intermediate_size=32, max_position=64, dtype="float32")
B, T = 3, 7


@pytest.fixture(scope="module")
def model():
    return init_params(CONFIG, jax.random.PRNGKey(0))


def numpy_reference(logits, tokens, allowed=None):
    """(logp, entropy) from NumPy's log-softmax of f32[B, T, V] logits over the allowed tokens."""
    logits = np.asarray(logits, np.float64)
    if allowed is not None:
        logits = np.where(allowed, logits, -np.inf)
    shifted = logits - logits.max(-1, keepdims=True)
    logsm = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    probs = np.exp(logsm)
    entropy = -np.sum(probs * np.where(probs > 0, logsm, 0.0), -1)
    return np.take_along_axis(logsm, tokens[..., None], -1)[..., 0], entropy


@pytest.mark.parametrize("chunk, with_allowed", [(3, False), (1, True)])  # 3 pads 7 positions to 9
def test_chunks_give_numpys_values_and_the_one_pass_gradients(model, chunk, with_allowed):
    graphdef, params = model
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    hidden = jax.random.normal(keys[0], (B, T, CONFIG.hidden_size))
    tokens = jax.random.randint(keys[1], (B, T), 0, CONFIG.vocab_size)
    allowed = None
    if with_allowed:
        allowed = jax.random.bernoulli(keys[2], 0.5, (B, T, CONFIG.vocab_size))
        allowed = allowed.at[jnp.arange(B)[:, None], jnp.arange(T)[None, :], tokens].set(True)
    forward = jax.jit(lambda params, hidden: lg.head_logp_and_entropy(graphdef, params, hidden, tokens, 0.7,
                                                                      allowed, chunk=chunk))
    logp, entropy = forward(params, hidden)
    ref_logp, ref_entropy = numpy_reference(apply_logits(graphdef, params, hidden) / 0.7, np.asarray(tokens),
                                            None if allowed is None else np.asarray(allowed))
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(entropy, ref_entropy, rtol=1e-5, atol=1e-5)

    weights = jax.random.normal(jax.random.PRNGKey(2), (2, B, T))

    def objective(params, hidden, chunk):
        logp, entropy = lg.head_logp_and_entropy(graphdef, params, hidden, tokens, 0.7, allowed, chunk=chunk)
        return jnp.sum(weights[0] * logp + weights[1] * entropy)

    gradient = jax.jit(jax.grad(objective, argnums=(0, 1)), static_argnums=2)
    ours, one_pass = gradient(params, hidden, chunk), gradient(params, hidden, T)
    for a, b in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(one_pass)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_chunk_positions_is_the_most_positions_within_the_budget():
    assert lg.chunk_positions(4, 10, 100, budget_bytes=4 * 10 * 100 * 4) == 10
    assert lg.chunk_positions(4, 10, 100, budget_bytes=4 * 10 * 100 * 4 - 1) == 9
    assert lg.chunk_positions(4, 10, 100, budget_bytes=4 * 3 * 100 * 4 + 5) == 3
    assert lg.chunk_positions(4, 10, 100, budget_bytes=1) == 1
    assert lg.chunk_positions(80, 1024, 151_936) == (1 << 30) // (80 * 151_936 * 4)


def test_sequence_logprobs_over_the_byte_threshold_equals_the_one_pass(model, monkeypatch):
    graphdef, params = model
    keys = jax.random.split(jax.random.PRNGKey(3), 2)
    prompts = jax.random.randint(keys[0], (B, 4), 0, CONFIG.vocab_size)
    completions = jax.random.randint(keys[1], (B, T), 0, CONFIG.vocab_size)
    prompt_mask = jnp.ones((B, 4), bool).at[0, 0].set(False)
    completion_mask = jnp.arange(T)[None, :] < jnp.array([[T], [4], [1]])

    def gradients():  # a new function each call, so each call traces with the threshold in force
        def loss(params):
            logp, entropy = sequence_logprobs(graphdef, params, prompts, prompt_mask, completions, completion_mask)
            return jnp.sum(logp) + 0.1 * jnp.sum(entropy), (logp, entropy)
        return jax.jit(jax.grad(loss, has_aux=True))(params)

    one_grads, one_pass = gradients()
    monkeypatch.setattr(lg, "LOGITS_CHUNK_BYTES", B * 2 * CONFIG.vocab_size * 4)  # 2 positions per chunk
    assert lg.chunk_positions(B, T, CONFIG.vocab_size) == 2
    chunked_grads, chunked = gradients()
    for a, b in zip(chunked, one_pass):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(chunked_grads), jax.tree_util.tree_leaves(one_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_the_gradient_keeps_one_chunk_of_logits_live():
    """XLA's compiled temporaries of the gradient: one pass holds f32 [B, T, V] logits and their
    gradient; eight chunks hold about an eighth of that."""
    config = ModelConfig(vocab_size=4096, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                         intermediate_size=32, max_position=64, dtype="float32")
    graphdef, params = init_params(config, jax.random.PRNGKey(0))
    rows, length = 4, 64
    hidden = jnp.ones((rows, length, config.hidden_size))
    tokens = jnp.zeros((rows, length), jnp.int32)

    def temp_bytes(chunk):
        def objective(params, hidden):
            logp, entropy = lg.head_logp_and_entropy(graphdef, params, hidden, tokens, chunk=chunk)
            return jnp.sum(logp) + jnp.sum(entropy)
        compiled = jax.jit(jax.grad(objective, argnums=(0, 1))).lower(params, hidden).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    logits_bytes = rows * length * config.vocab_size * 4
    one_pass, chunked = temp_bytes(length), temp_bytes(length // 8)
    assert one_pass >= logits_bytes
    assert chunked <= one_pass / 3, (chunked, one_pass)
