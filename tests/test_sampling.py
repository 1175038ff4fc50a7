"""KV-cache sampling against uncached references; constraints; teacher-forced log-probs."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx, struct, traverse_util

from derl_jax.models import logits as logits_lib
from derl_jax.models import sampling as sm
from derl_jax.models import transformer as tr

VOCAB = 20
MAX_NEW = 6
NEVER = VOCAB  # an eos id no token can equal
PAD = 0


@pytest.fixture(scope="module")
def model():
    return _model()


def _model():
    config = tr.tiny_config(VOCAB, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                            num_kv_heads=2, rope_theta=100.0, max_position=64)
    graphdef, abstract = tr.abstract_model(config)
    rng = np.random.default_rng(0)
    values = {path: jnp.asarray((path[-1] == "scale") + 0.25 * rng.standard_normal(var.shape), var.dtype)
              for path, var in nnx.to_flat_state(abstract)}
    nnx.replace_by_pure_dict(abstract, traverse_util.unflatten_dict(values))
    return config, graphdef, abstract


@pytest.fixture(scope="module")
def batch():
    return _batch()


def _batch():
    """Three prompts of 6, 4 and 2 real tokens, left padded with junk (not PAD) to Tp = 6."""
    rng = np.random.default_rng(1)
    real = [rng.integers(1, VOCAB, n) for n in (6, 4, 2)]
    prompts = rng.integers(1, VOCAB, (3, 6))
    mask = np.zeros((3, 6), bool)
    for row, tokens in enumerate(real):
        prompts[row, 6 - len(tokens):] = tokens
        mask[row, 6 - len(tokens):] = True
    return real, jnp.asarray(prompts, jnp.int32), jnp.asarray(mask)


_forward = jax.jit(tr.apply, static_argnums=0)


def _uncached_logits(graphdef, params, sequence: np.ndarray, length: int) -> np.ndarray:
    """f32[V]: next-token logits after sequence[:length], from a full causal forward without cache."""
    width = 16 if length <= 16 else 64
    buffer = np.zeros((1, width), np.int32)
    buffer[0, :length] = sequence[:length]
    positions = jnp.arange(width)[None]
    logits, _ = _forward(graphdef, params, jnp.asarray(buffer), positions, None)
    return np.asarray(logits[0, length - 1], np.float64)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max()
    return shifted - np.log(np.exp(shifted).sum())


def _drawn_reference_logprobs(graphdef, params, prompt: np.ndarray, drawn: np.ndarray) -> np.ndarray:
    """f64[T]: the temperature-1 log-prob of each drawn token i32[T] after the prompt and the
    tokens drawn before it, from full uncached forwards."""
    sequence = np.concatenate([prompt, drawn])
    return np.array([_log_softmax(_uncached_logits(graphdef, params, sequence, len(prompt) + t))[token]
                     for t, token in enumerate(drawn)])


def _greedy_reference(graphdef, params, prompt: np.ndarray, steps: int, allowed=None):
    """(tokens, logprobs) by repeated argmax over full uncached forwards of the unpadded prompt."""
    sequence = list(prompt)
    tokens, logprobs = [], []
    for _ in range(steps):
        logits = _uncached_logits(graphdef, params, np.array(sequence), len(sequence))
        masked = logits if allowed is None else np.where(allowed, logits, -np.inf)
        token = int(np.argmax(masked))
        tokens.append(token)
        logprobs.append(_log_softmax(logits)[token])
        sequence.append(token)
    return np.array(tokens), np.array(logprobs)


def _sample(graphdef, params, prompts, mask, key=0, **kwargs):
    # the temperature always passed (traced): draws at every temperature share one compiled sampler
    options = dict(max_new_tokens=MAX_NEW, eos_id=NEVER, pad_id=PAD, temperature=1.0)
    options.update(kwargs)
    return sm.sample_jit(graphdef, params, prompts, mask, jax.random.key(key), **options)


def test_greedy_matches_uncached_argmax_reference(model, batch):
    _, graphdef, params = model
    real, prompts, mask = batch
    out = _sample(graphdef, params, prompts, mask, greedy=True)
    assert out.tokens.shape == (3, MAX_NEW) and out.tokens.dtype == jnp.int32
    for row, prompt in enumerate(real):
        tokens, logprobs = _greedy_reference(graphdef, params, prompt, MAX_NEW)
        np.testing.assert_array_equal(np.asarray(out.tokens[row]), tokens)
        np.testing.assert_allclose(np.asarray(out.logprobs[row]), logprobs, atol=2e-5)
    assert bool(out.mask.all()) and out.lengths.tolist() == [MAX_NEW] * 3


@pytest.mark.slow
@pytest.mark.parametrize("write_from, steps, cache_length", [(6, 6, 12), (7, 28, 35), (6, 40, 46), (0, 1024, 1224),
                                                           (128, 8, 135), (15, 2, 17), (3, 1, 4), (16, 17, 33)])
def test_decode_phases_run_every_step_once_and_read_the_slots_it_needs(write_from, steps, cache_length):
    phases = sm.decode_phases(write_from, steps, cache_length)
    covered = [step for start, end, _ in phases for step in range(start, end)]
    assert covered == list(range(1, steps))   # every step after the first, once, in order
    block = sm.DECODE_BLOCK * max(1, -(-cache_length // (sm.DECODE_MAX_PHASES * sm.DECODE_BLOCK)))
    for start, end, slots in phases:
        assert start < end and write_from + end - 1 <= slots <= cache_length   # the last step reads slots < that
        assert slots == cache_length or slots % block == 0
        assert slots == cache_length or end == steps or write_from + end > slots   # a phase uses its slots
    assert [slots for *_, slots in phases] == sorted({slots for *_, slots in phases})
    assert len(phases) <= sm.DECODE_MAX_PHASES + 1


@pytest.mark.slow
def test_a_greedy_decode_in_phases_matches_the_uncached_argmax_reference(model, batch):
    """Every row decodes 40 tokens, through all three phases (the fast tier's sampled rows of
    test_a_decode_in_phases_... end at an EOS, one of them in the last phase)."""
    _, graphdef, params = model
    real, prompts, mask = batch
    greedy = _sample(graphdef, params, prompts, mask, greedy=True, max_new_tokens=40)
    for row, prompt in enumerate(real):
        tokens, logprobs = _greedy_reference(graphdef, params, prompt, 40)
        np.testing.assert_array_equal(np.asarray(greedy.tokens[row]), tokens)
        np.testing.assert_allclose(np.asarray(greedy.logprobs[row]), logprobs, atol=5e-5)


def test_a_decode_in_phases_matches_the_uncached_reference_and_one_phase(model, batch, monkeypatch):
    """Up to 40 new tokens after 6-token prompts read a 46-slot cache in three phases (16, 32, 46
    slots): the drawn tokens' log-probs match full uncached forwards, and sampling draws what one
    phase over the whole cache draws."""
    _, graphdef, params = model
    real, prompts, mask = batch
    assert [slots for *_, slots in sm.decode_phases(6, 40, 46)] == [16, 32, 46]

    def sample():   # jitted afresh: traced under the decode_phases in place at the call
        return jax.jit(functools.partial(sm.sample, max_new_tokens=40, eos_id=5, pad_id=PAD), static_argnums=0)(
            graphdef, params, prompts, mask, jax.random.key(3))

    phased = sample()
    assert int(phased.lengths.max()) > 32   # some row reads the last phase's slots
    for row, prompt in enumerate(real):
        length = int(phased.lengths[row])
        drawn = np.asarray(phased.tokens[row, :length])
        np.testing.assert_allclose(np.asarray(phased.logprobs[row, :length]),
                                   _drawn_reference_logprobs(graphdef, params, prompt, drawn), atol=5e-5)
    traced = []
    monkeypatch.setattr(sm, "decode_phases",
                        lambda write_from, steps, length: traced.append(steps) or [(1, steps, length)])
    single = sample()
    assert traced == [40]   # the second draw was traced with one phase
    np.testing.assert_array_equal(np.asarray(phased.tokens), np.asarray(single.tokens))
    np.testing.assert_array_equal(np.asarray(phased.mask), np.asarray(single.mask))
    np.testing.assert_allclose(np.asarray(phased.logprobs), np.asarray(single.logprobs), rtol=1e-5, atol=1e-5)


def test_eos_ends_each_row_and_later_tokens_are_masked_pad(model, batch):
    _, graphdef, params = model
    real, prompts, mask = batch
    free = np.asarray(_sample(graphdef, params, prompts, mask, greedy=True).tokens)
    eos = int(free[0, 2]) if free[0, 2] not in free[0, :2] else int(free[0, 3])
    out = _sample(graphdef, params, prompts, mask, greedy=True, eos_id=eos)
    for row in range(3):
        hits = np.flatnonzero(free[row] == eos)
        length = int(hits[0]) + 1 if hits.size else MAX_NEW
        expected = np.where(np.arange(MAX_NEW) < length, free[row], PAD)
        np.testing.assert_array_equal(np.asarray(out.tokens[row]), expected)
        np.testing.assert_array_equal(np.asarray(out.mask[row]), np.arange(MAX_NEW) < length)
        assert int(out.lengths[row]) == length
        assert np.all(np.asarray(out.logprobs[row, length:]) == 0.0)
    assert int(out.lengths[0]) < MAX_NEW


@pytest.mark.slow
def test_left_padding_does_not_change_samples(model, batch):
    _, graphdef, params = model
    _, padded, _ = batch
    rng = np.random.default_rng(2)
    prompts = jnp.asarray(rng.integers(1, VOCAB, (3, 3)), jnp.int32)
    padded = padded.at[:, 3:].set(prompts)  # junk in the first three columns, masked out
    padded_mask = jnp.asarray(np.arange(6) >= 3).reshape(1, 6).repeat(3, 0)
    plain = _sample(graphdef, params, prompts, jnp.ones((3, 3), bool), key=5)
    shifted = _sample(graphdef, params, padded, padded_mask, key=5)
    np.testing.assert_array_equal(np.asarray(plain.tokens), np.asarray(shifted.tokens))
    np.testing.assert_allclose(np.asarray(plain.logprobs), np.asarray(shifted.logprobs), atol=2e-5)


def test_top_k_one_is_greedy(model, batch):
    _, graphdef, params = model
    _, prompts, mask = batch
    greedy = _sample(graphdef, params, prompts, mask, greedy=True)
    top1 = _sample(graphdef, params, prompts, mask, key=3, top_k=1, temperature=0.7)
    np.testing.assert_array_equal(np.asarray(top1.tokens), np.asarray(greedy.tokens))
    np.testing.assert_allclose(np.asarray(top1.sampling_logprobs), 0.0, atol=1e-6)
    np.testing.assert_allclose(np.asarray(top1.logprobs), np.asarray(greedy.logprobs), atol=1e-6)


def test_top_k_keeps_samples_among_the_k_most_likely(model, batch):
    _, graphdef, params = model
    _, prompts, mask = batch
    out = _sample(graphdef, params, prompts, mask, key=4, top_k=3, temperature=3.0)
    full = jnp.concatenate([prompts, out.tokens], axis=1)
    full_mask = jnp.concatenate([mask, out.mask], axis=1)
    positions = sm.prompt_positions(full_mask)
    attention = full_mask[:, None, :] & jnp.tril(jnp.ones((12, 12), bool))[None]
    logits, _ = _forward(graphdef, params, full, positions, attention)
    ranks = np.argsort(-np.asarray(logits[:, 5:11]), axis=-1)[..., :3]
    chosen = np.asarray(out.tokens)[..., None]
    assert np.all((ranks == chosen).any(-1))


@struct.dataclass
class ParityByStep:
    """Allows even tokens at even steps and odd tokens at odd steps (state: steps taken, i32[B])."""

    vocab_size: int = struct.field(pytree_node=False)

    def init(self, batch_size):
        return jnp.zeros((batch_size,), jnp.int32)

    def allowed(self, steps):
        return (jnp.arange(self.vocab_size)[None, :] % 2) == (steps[:, None] % 2)

    def advance(self, steps, tokens):
        return steps + 1


@pytest.mark.slow
def test_constraints_are_respected_when_sampling_and_greedy(model, batch):
    _, graphdef, params = model
    real, prompts, mask = batch
    constraint = ParityByStep(VOCAB)
    assert isinstance(constraint, sm.Constraint)
    out = _sample(graphdef, params, prompts, mask, key=6, temperature=3.0, constraint=constraint)
    parity = np.asarray(out.tokens) % 2
    np.testing.assert_array_equal(parity, np.broadcast_to(np.arange(MAX_NEW) % 2, parity.shape))
    masks = sm.constraint_masks(constraint, out.tokens)
    np.testing.assert_array_equal(np.asarray(masks[:, 3]), np.broadcast_to(np.arange(VOCAB) % 2 == 1, (3, VOCAB)))
    constrained, entropy = jax.jit(sm.sequence_logprobs, static_argnums=0)(
        graphdef, params, prompts, mask, out.tokens, out.mask, 3.0, masks)
    np.testing.assert_allclose(np.asarray(constrained), np.asarray(out.sampling_logprobs), atol=2e-5)
    assert np.all(np.isfinite(np.asarray(entropy))) and np.all(np.asarray(entropy) <= np.log(VOCAB // 2) + 1e-5)

    subset = np.zeros(VOCAB, bool)
    subset[[3, 5, 8, 13]] = True
    greedy = _sample(graphdef, params, prompts, mask, greedy=True, constraint=sm.AllowedTokens(jnp.asarray(subset)))
    assert subset[np.asarray(greedy.tokens)].all()
    for row in (0, 1):
        tokens, logprobs = _greedy_reference(graphdef, params, real[row], MAX_NEW, allowed=subset)
        np.testing.assert_array_equal(np.asarray(greedy.tokens[row]), tokens)
        np.testing.assert_allclose(np.asarray(greedy.logprobs[row]), logprobs, atol=2e-5)
    assert len(np.unique(np.asarray(greedy.tokens))) > 1


def test_sequence_logprobs_equal_sampler_logprobs(model, batch):
    _, graphdef, params = model
    real, prompts, mask = batch
    teacher = jax.jit(sm.sequence_logprobs, static_argnums=0)
    free = np.asarray(_sample(graphdef, params, prompts, mask, key=8).tokens)
    eos = int(free[0, 1]) if free[0, 1] != free[0, 0] else int(free[0, 2])
    out = _sample(graphdef, params, prompts, mask, key=8, eos_id=eos)
    assert int(out.lengths[0]) <= 3  # some row ended early, so masking is exercised
    logp, entropy = teacher(graphdef, params, prompts, mask, out.tokens, out.mask, 1.0)
    np.testing.assert_allclose(np.asarray(logp), np.asarray(out.logprobs), atol=2e-5)
    np.testing.assert_allclose(np.asarray(out.sampling_logprobs), np.asarray(out.logprobs), atol=2e-5)
    assert np.all(np.asarray(entropy)[~np.asarray(out.mask)] == 0.0)
    sequence = np.concatenate([real[2], np.asarray(out.tokens[2])])
    first = _uncached_logits(graphdef, params, sequence, len(real[2]))
    probs = np.exp(_log_softmax(first))
    np.testing.assert_allclose(float(entropy[2, 0]), -(probs * np.log(probs)).sum(), atol=2e-5)

    hot = _sample(graphdef, params, prompts, mask, key=9, temperature=0.7)
    logp_hot, _ = teacher(graphdef, params, prompts, mask, hot.tokens, hot.mask, 0.7)
    np.testing.assert_allclose(np.asarray(logp_hot), np.asarray(hot.sampling_logprobs), atol=2e-5)
    logp_cold, _ = teacher(graphdef, params, prompts, mask, hot.tokens, hot.mask, 1.0)
    np.testing.assert_allclose(np.asarray(logp_cold), np.asarray(hot.logprobs), atol=2e-5)


def test_replayed_runs_fn_only_for_its_gradient():
    # the value is the one given, the gradient fn's at the arguments
    x = jnp.asarray([[1.0, 2.0], [3.0, -1.0]])
    w = jnp.asarray([[0.5, -1.0, 2.0], [1.5, 0.25, -0.5]])
    given = jnp.full((2, 3), 7.0)
    np.testing.assert_array_equal(np.asarray(tr.replayed(jnp.dot, given, x, w)), np.asarray(given))
    weights = jnp.asarray([[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]])
    got = jax.grad(lambda x, w: jnp.sum(tr.replayed(jnp.dot, given, x, w) * weights), argnums=(0, 1))(x, w)
    want = jax.grad(lambda x, w: jnp.sum(jnp.dot(x, w) * weights), argnums=(0, 1))(x, w)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)


# group size 1: the full tier; a group of 3 replays the same products after one prefill per group
@pytest.mark.parametrize("group_size", [pytest.param(1, marks=pytest.mark.slow), 3])
def test_decode_products_replayed_give_the_same_logprobs_and_gradients(model, group_size):
    # the decode's products (SampleOutput.products) replayed in the teacher-forced pass: the same
    # log-probs, entropies and parameter gradients as recomputing them, with left padding, a
    # prompt shared by a group and rows that end early (EOS)
    _, graphdef, params = model
    _, prompts, mask = _batch()
    prompts, mask = jnp.repeat(prompts, group_size, axis=0), jnp.repeat(mask, group_size, axis=0)
    # eos_id is traced: the draw without EOS and the one with it share one compiled sampler
    free = np.asarray(_sample(graphdef, params, prompts, mask, key=8, group_size=group_size, keep_products=True).tokens)
    eos = int(free[0, 1])
    out = _sample(graphdef, params, prompts, mask, key=8, eos_id=eos, group_size=group_size, keep_products=True)
    assert int(out.lengths.min()) < MAX_NEW
    assert len(out.products) == 2 and set(out.products[0]) == set(tr.PRODUCTS)
    assert out.products[0]["qkv"].shape == (prompts.shape[0], MAX_NEW - 1, (4 + 2 * 2) * 8)
    assert out.products[1]["gate_up"].shape == (prompts.shape[0], MAX_NEW - 1, 2 * 48)
    assert jax.eval_shape(lambda p: _sample(graphdef, p, prompts, mask, key=8, group_size=group_size),
                          params).products is None
    weights = jnp.asarray(np.random.default_rng(5).normal(size=out.tokens.shape), jnp.float32)

    def objective(params, saved):
        logp, entropy = sm.sequence_logprobs(graphdef, params, prompts, mask, out.tokens, out.mask, 1.0,
                                             group_size=group_size, saved=saved)
        return jnp.sum(logp * weights) + 0.1 * jnp.sum(entropy), (logp, entropy)

    run = jax.jit(jax.value_and_grad(objective, has_aux=True))
    (_, (logp, entropy)), grads = run(params, None)
    (_, (logp_replayed, entropy_replayed)), grads_replayed = run(params, out.products)
    np.testing.assert_allclose(np.asarray(logp_replayed), np.asarray(logp), atol=2e-6)
    np.testing.assert_allclose(np.asarray(logp_replayed), np.asarray(out.logprobs), atol=2e-5)
    np.testing.assert_allclose(np.asarray(entropy_replayed), np.asarray(entropy), atol=2e-6)
    for path, got in nnx.to_flat_state(grads_replayed):
        want = np.asarray(dict(nnx.to_flat_state(grads))[path].get_value())
        got = np.asarray(got.get_value())
        assert np.abs(want).max() > 0, path
        np.testing.assert_allclose(got, want, atol=1e-5 * np.abs(want).max(), rtol=1e-4, err_msg=str(path))


def test_the_decode_overwrites_every_element_of_the_product_scratch(model, monkeypatch):
    # product_scratch (the buffers of the step before) may hold anything: the decode writes every
    # element, so garbage in it changes neither the products nor the draws (against zeros: one
    # compiled sampler for both); the probabilities are 0 on the key slots a step did not read
    # (the first phase reads fewer than the buffer holds)
    config, graphdef, params = model
    _, prompts, mask = _batch()
    monkeypatch.setattr(sm, "DECODE_BLOCK", 4)   # phases of 8 and 12 slots: the first reads fewer than 11
    assert len(sm.decode_phases(6, MAX_NEW, 6 + MAX_NEW)) == 2
    sample = jax.jit(functools.partial(sm.sample, max_new_tokens=MAX_NEW, eos_id=NEVER, pad_id=PAD, keep_products=True),
                     static_argnums=0)   # compiled here, under the patched block

    def _sample(graphdef, params, prompts, mask, key, keep_products, product_scratch=None):
        return sample(graphdef, params, prompts, mask, jax.random.key(key), product_scratch=product_scratch)

    shapes = jax.eval_shape(lambda: sm.product_buffers(config, 3, MAX_NEW - 1, 6 + MAX_NEW - 1))
    zeros = jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
    zeroed = _sample(graphdef, params, prompts, mask, key=4, keep_products=True, product_scratch=zeros)
    rng = np.random.default_rng(9)
    garbage = jax.tree_util.tree_map(lambda a: jnp.asarray(rng.normal(size=a.shape) + 7.0, a.dtype), shapes)
    reused = _sample(graphdef, params, prompts, mask, key=4, keep_products=True, product_scratch=garbage)
    chex.assert_trees_all_equal(reused.tokens, zeroed.tokens)
    chex.assert_trees_all_equal(reused.products, zeroed.products)
    probs = np.asarray(zeroed.products[0]["probs"])   # [B, K, G, T - 1, S]
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    assert np.all(probs[:, :, :, 0, 6 + 1:] == 0.0)   # the first fed token reads the prompt and itself
    with pytest.raises(AssertionError):
        _sample(graphdef, params, prompts, mask, key=4, keep_products=True, product_scratch=garbage[:1])


@pytest.mark.slow
def test_sequence_logprobs_have_finite_gradients_with_excluded_tokens(model, batch):
    _, graphdef, params = model
    _, prompts, mask = batch
    out = _sample(graphdef, params, prompts, mask, key=10)
    rng = np.random.default_rng(3)
    chosen = np.asarray(jax.nn.one_hot(out.tokens, VOCAB, dtype=bool))
    allowed = jnp.asarray((rng.random(chosen.shape) < 0.5) | chosen)

    def total(p):
        logp, entropy = sm.sequence_logprobs(graphdef, p, prompts, mask, out.tokens, out.mask, 1.0, allowed)
        return jnp.sum(logp) + jnp.sum(entropy)

    grads = jax.jit(jax.grad(total))(params)
    assert all(bool(jnp.isfinite(g).all()) for g in jax.tree_util.tree_leaves(grads))
    assert float(jnp.abs(nnx.to_pure_dict(grads)["embed"]["embedding"]).max()) > 0


def test_same_key_same_output_and_other_keys_differ(model, batch):
    _, graphdef, params = model
    _, prompts, mask = batch
    first = _sample(graphdef, params, prompts, mask, key=11, temperature=2.0)
    again = _sample(graphdef, params, prompts, mask, key=11, temperature=2.0)
    other = _sample(graphdef, params, prompts, mask, key=12, temperature=2.0)
    np.testing.assert_array_equal(np.asarray(first.tokens), np.asarray(again.tokens))
    np.testing.assert_array_equal(np.asarray(first.logprobs), np.asarray(again.logprobs))
    assert not np.array_equal(np.asarray(first.tokens), np.asarray(other.tokens))


def test_first_token_frequencies_follow_tempered_softmax(model):
    _, graphdef, params = model
    prompt = np.array([3, 7, 11])
    draws = 3000
    prompts = jnp.asarray(np.broadcast_to(prompt, (draws, 3)), jnp.int32)
    out = sm.sample_jit(graphdef, params, prompts, jnp.ones((draws, 3), bool), jax.random.key(13),
                        max_new_tokens=1, eos_id=NEVER, pad_id=PAD, temperature=1.5)
    expected = np.exp(_log_softmax(_uncached_logits(graphdef, params, prompt, 3) / 1.5))
    observed = np.bincount(np.asarray(out.tokens[:, 0]), minlength=VOCAB) / draws
    assert 0.5 * np.abs(observed - expected).sum() < 0.05
    assert expected.max() < 0.9  # the check is informative only for a spread distribution


@pytest.mark.slow
def test_vmap_over_parameter_sets_matches_one_by_one(model, batch):
    config, graphdef, params = model
    _, prompts, mask = batch
    other = jax.tree_util.tree_map(lambda x: x * 1.1, params)
    stacked = jax.tree_util.tree_map(lambda a, b: jnp.stack([a, b]), params, other)
    run = jax.jit(jax.vmap(lambda p: sm.sample(graphdef, p, prompts, mask, jax.random.key(14),
                                               max_new_tokens=MAX_NEW, eos_id=NEVER, pad_id=PAD, greedy=True)))
    together = run(stacked)
    for index, p in enumerate((params, other)):
        alone = _sample(graphdef, p, prompts, mask, greedy=True, key=14)
        np.testing.assert_array_equal(np.asarray(together.tokens[index]), np.asarray(alone.tokens))
        np.testing.assert_allclose(np.asarray(together.logprobs[index]), np.asarray(alone.logprobs), atol=2e-5)


def test_bad_arguments_are_named(model, batch):
    _, graphdef, params = model
    _, prompts, mask = batch
    with pytest.raises(ValueError, match="max_new_tokens"):
        sm.sample(graphdef, params, prompts, mask, jax.random.key(0), max_new_tokens=0, eos_id=1, pad_id=0)
    with pytest.raises(ValueError, match="prompt_mask shape"):
        sm.sample(graphdef, params, prompts, mask[:, :3], jax.random.key(0), max_new_tokens=2, eos_id=1, pad_id=0)
    with pytest.raises(ValueError, match="temperature"):
        sm.sample(graphdef, params, prompts, mask, jax.random.key(0), max_new_tokens=2, eos_id=1, pad_id=0,
                  temperature=0.0)
    with pytest.raises(ValueError, match="pad_id"):
        sm.sample(graphdef, params, prompts, mask, jax.random.key(0), max_new_tokens=2, eos_id=1, pad_id=VOCAB)
    with pytest.raises(ValueError, match="max_position"):
        sm.sample(graphdef, params, prompts, mask, jax.random.key(0), max_new_tokens=100, eos_id=1, pad_id=0)
    with pytest.raises(ValueError, match="constraint.allowed returned shape"):
        sm.sample(graphdef, params, prompts, mask, jax.random.key(0), max_new_tokens=2, eos_id=1, pad_id=0,
                  constraint=sm.AllowedTokens(jnp.ones((VOCAB + 1,), bool)))
    with pytest.raises(ValueError, match="completion_mask shape"):
        sm.sequence_logprobs(graphdef, params, prompts, mask, jnp.zeros((3, 4), jnp.int32), jnp.ones((3, 5), bool))


class SampleAndScoreVariants(chex.TestCase):
    """`sample` and `sequence_logprobs` give the reference numbers with and without `jax.jit`."""

    @chex.variants(with_jit=True, without_jit=True)
    @pytest.mark.slow
    def test_greedy_tokens_and_their_logprobs(self):
        _, graphdef, params = _model()
        real, prompts, mask = _batch()

        def greedy_then_score(params, prompts, mask):
            out = sm.sample(graphdef, params, prompts, mask, jax.random.key(0), max_new_tokens=MAX_NEW, eos_id=NEVER,
                            pad_id=PAD, greedy=True)
            logp, _ = sm.sequence_logprobs(graphdef, params, prompts, mask, out.tokens, out.mask)
            return out.tokens, logp

        tokens, logp = self.variant(greedy_then_score)(params, prompts, mask)
        chex.assert_shape([tokens, logp], (3, MAX_NEW))
        for row, prompt in enumerate(real):
            want_tokens, want_logp = _greedy_reference(graphdef, params, prompt, MAX_NEW)
            np.testing.assert_array_equal(np.asarray(tokens[row]), want_tokens)
            np.testing.assert_allclose(np.asarray(logp[row]), want_logp, atol=2e-5)

    def test_float_prompts_are_rejected(self):
        _, graphdef, params = _model()
        _, prompts, mask = _batch()
        with self.assertRaises(AssertionError):
            sm.sample(graphdef, params, prompts.astype(jnp.float32), mask, jax.random.key(0), max_new_tokens=2,
                      eos_id=NEVER, pad_id=PAD)


@pytest.mark.slow
def test_a_remat_model_samples_what_the_plain_model_samples():
    """Gradient checkpointing changes the backward pass only: decoding inside the sampler's scan
    works with it and draws the same tokens from the same parameters."""
    prompts = jnp.array([[0, 3, 4, 9], [5, 6, 7, 8]], jnp.int32)
    tokens = {}
    for remat in (False, True):
        config = tr.tiny_config(32, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                                num_kv_heads=1, remat=remat)
        graphdef, params = nnx.split(tr.Transformer(config, rngs=nnx.Rngs(0)))
        run = jax.jit(lambda p: sm.sample(graphdef, p, prompts, prompts > 0, jax.random.key(1),
                                          max_new_tokens=5, eos_id=-1, pad_id=0))
        tokens[remat] = np.asarray(run(params).tokens)
    assert tokens[True].shape == (2, 5)
    np.testing.assert_array_equal(tokens[True], tokens[False])


@pytest.mark.slow
def test_logp_and_entropy_match_log_softmax_in_values_and_gradients():
    rng = np.random.default_rng(5)
    logits = jnp.asarray(3.0 * rng.standard_normal((2, 3, 11)), jnp.float32)
    logits = logits.at[0, 1, 4:].set(-1e30)  # excluded tokens, as `sequence_logprobs` writes them
    tokens = jnp.asarray(rng.integers(0, 4, (2, 3)), jnp.int32)

    def reference(x):
        log_probs = jax.nn.log_softmax(x, axis=-1)
        logp = jnp.take_along_axis(log_probs, tokens[..., None], axis=-1)[..., 0]
        return logp, -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)

    for ours, expected in zip(jax.jit(logits_lib.logp_and_entropy)(logits, tokens), jax.jit(reference)(logits)):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(expected), atol=2e-6, rtol=1e-6)
    weights = jnp.asarray(rng.standard_normal((2, 2, 3)), jnp.float32)

    def objective(fn):
        return lambda x: sum(jnp.sum(w * v) for w, v in zip(weights, fn(x)))

    ours, expected = jax.jit(jax.grad(objective(lambda x: logits_lib.logp_and_entropy(x, tokens))))(logits), \
        jax.jit(jax.grad(objective(reference)))(logits)
    assert bool(jnp.isfinite(ours).all())
    np.testing.assert_allclose(np.asarray(ours), np.asarray(expected), atol=2e-6, rtol=1e-6)


def test_first_argmax_matches_jnp_argmax_with_ties_infinities_and_nan():
    rng = np.random.default_rng(0)
    x = rng.integers(-3, 4, size=(64, 11)).astype(np.float32)   # many ties
    x[5] = -np.inf
    x[6, 3] = np.inf
    x[7, [2, 8]] = np.nan
    x[8, :] = np.nan
    x[9, [1, 4]] = np.inf
    got = jax.jit(sm.first_argmax)(jnp.asarray(x))
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), np.argmax(x, axis=-1))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.argmax(jnp.asarray(x), axis=-1)))
