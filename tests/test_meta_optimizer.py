"""The Meta-Optimizer on the scratch backbone: cold-start corpus, constrained sampling, GRPO.

One tiny model (n = 64 samples everywhere, so sampling, log-probs and the update each
compile once) serves the whole module. The learning test is a synthetic outer loop: an
expression scores its correlation with g3 on fixed probe points (0 if ill-defined), and
GRPO must beat random search (the frozen cold-started model) at the same budget.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from derl_jax.checkpoint import CheckpointStore
from derl_jax.expr.check import check_text
from derl_jax.expr.grammar import make_grammar
from derl_jax.expr.parse import parse
from derl_jax.expr.vm import evaluate_numpy
from derl_jax.methods.derl.corpus import FAMILIES, cold_start_corpus
from derl_jax.methods.derl.optimizer import MetaConfig, MetaOptimizer, MetaSample, MetaState
from derl_jax.rl.grpo import kl_estimate

NUM_PRIMITIVES = 4
NAMES = [f"g{i + 1}" for i in range(NUM_PRIMITIVES)]
N = 64
GRAMMAR = make_grammar(NUM_PRIMITIVES, 24, max_depth=4)
META = {
    "backbone": "scratch",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_layers": 1,
    "num_heads": 2,
    "num_kv_heads": 1,
    "head_dim": 16,
    "temperature": 1.0,
    "max_symbols": 24,
    "max_depth": 4,
    "cold_start_corpus": 200,
    "cold_start_steps": 150,
    "cold_start_lr": 3e-3,
    "lr": 3e-3,
    "kl": 0.01,
    "epochs": 2,
}


@pytest.fixture(scope="module")
def optimizer():
    return MetaOptimizer({"meta": META}, GRAMMAR)


@pytest.fixture(scope="module")
def state(optimizer):
    return optimizer.init(jax.random.key(0))


@pytest.fixture(scope="module")
def first_sample(optimizer, state):
    return optimizer.sample(state, jax.random.key(1), N)


def tree_equal(a, b) -> bool:
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(leaves_a) == len(leaves_b) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(leaves_a, leaves_b))


def mean_token_logp(logp, mask) -> np.ndarray:
    return np.asarray(jnp.sum(logp, axis=1) / jnp.sum(mask, axis=1))


# ----------------------------------------------------------------------------- corpus


def test_corpus_is_valid_diverse_and_deterministic():
    corpus = cold_start_corpus(NUM_PRIMITIVES, 200, seed=3, grammar=GRAMMAR)
    assert len(corpus) == 200 and len(set(corpus)) == 200
    assert corpus == cold_start_corpus(NUM_PRIMITIVES, 200, seed=3, grammar=GRAMMAR)
    assert corpus != cold_start_corpus(NUM_PRIMITIVES, 200, seed=4, grammar=GRAMMAR)
    for text in corpus:
        expr, validity = check_text(text, NAMES)
        assert validity.ok, (text, validity)
        GRAMMAR.encode(text)  # raises if the sampling mask could not produce it
    joined = " ".join(corpus)
    for marker in ("min(", "max(", "clip(", "abs(", "u", "/(", "**", "*(", "-"):
        assert marker in joined, marker
    for name in NAMES:
        assert name in joined
    # nested forms like g1+0.5*(g2+0.5*g3)
    assert any(text.count("*(") >= 2 for text in corpus)
    assert len(FAMILIES) >= 7


@pytest.mark.slow
def test_corpus_fills_tight_grammars_and_rejects_bad_arguments():
    tight = make_grammar(1, 4, max_depth=1)
    corpus = cold_start_corpus(1, 30, seed=0, grammar=tight)
    assert len(corpus) == 30
    distinct = set(corpus)
    assert 1 < len(distinct) < 30  # only a few texts of <= 3 symbols exist: repeated in order
    assert corpus[: len(distinct)] == list(dict.fromkeys(corpus))
    for text in distinct:
        assert len(tight.encode(text)) <= 4 and check_text(text, ["g1"])[1].ok
    with pytest.raises(ValueError, match="num_primitives"):
        cold_start_corpus(0, 10, seed=0)
    with pytest.raises(ValueError, match="size"):
        cold_start_corpus(2, 0, seed=0)
    with pytest.raises(ValueError, match="grammar has 4 primitives"):
        cold_start_corpus(3, 10, seed=0, grammar=GRAMMAR)


# ----------------------------------------------------------------------------- config


def test_config_from_run_config_and_errors():
    from configs.arith import get_config
    from derl_jax.experiment.protocol import meta_grammar

    run = get_config("smoke")
    cfg = MetaConfig.from_config(run)
    assert cfg.backbone == "scratch" and cfg.hidden_size == run.meta.hidden_size and cfg.lr == run.meta.lr
    assert cfg.cold_start_corpus == run.meta.cold_start_corpus and cfg.kl == run.meta.kl
    optimizer = MetaOptimizer(run, meta_grammar(run, 3))
    assert optimizer.backbone.max_new_tokens == run.meta.max_symbols
    assert optimizer.backbone.model_config.vocab_size == optimizer.grammar.vocab_size

    with pytest.raises(ValueError, match=r"unknown fields \['hidden'\]"):
        MetaConfig.from_config({"backbone": "scratch", "hidden": 3})
    with pytest.raises(ValueError, match="MetaConfig.backbone='gpt'"):
        MetaConfig.from_config({"backbone": "gpt"})
    with pytest.raises(ValueError, match="MetaConfig.hf_path"):
        MetaConfig.from_config({"backbone": "hf"})
    with pytest.raises(ValueError, match="MetaConfig.temperature"):
        MetaConfig(temperature=0.0)
    with pytest.raises(ValueError, match="MetaConfig.num_heads"):
        MetaConfig(num_heads=3, num_kv_heads=2)
    with pytest.raises(ValueError, match="max_symbols=30 but the grammar has max_symbols=24"):
        MetaOptimizer(dict(META, max_symbols=30), GRAMMAR)
    with pytest.raises(TypeError, match="grammar"):
        MetaOptimizer(META, "g1+g2")


# ----------------------------------------------------------------------------- cold start and sampling


@pytest.mark.slow
def test_init_is_deterministic_and_cold_start_learns(optimizer, state):
    assert int(state.step) == 0
    assert tree_equal(state.params, state.ref_params)
    # init(key) = cold start of the initial params drawn from the first half of key
    param_key, sft_key = jax.random.split(jax.random.key(0))
    initial = optimizer.backbone.initial_params(param_key)
    assert not tree_equal(initial, optimizer.backbone.initial_params(jax.random.key(7)))
    params, losses = optimizer.cold_start(initial, sft_key)
    assert tree_equal(params, state.params)
    losses = np.asarray(losses)
    assert losses.shape == (META["cold_start_steps"],) and np.all(np.isfinite(losses))
    # from about log(#allowed symbols) down to a fraction of it
    assert losses[:10].mean() > 2.0 * losses[-10:].mean()


@pytest.mark.slow
def test_samples_parse_check_and_match_their_symbols(optimizer, first_sample):
    sample = first_sample
    assert isinstance(sample, MetaSample) and len(sample.texts) == N
    symbols, mask, logp = (np.asarray(a) for a in (sample.symbols, sample.mask, sample.logp))
    assert symbols.shape == mask.shape == logp.shape == (N, GRAMMAR.max_length)
    valid = 0
    for row, text in enumerate(sample.texts):
        parse(text, NAMES)  # every sample parses: the grammar guarantees it
        valid += check_text(text, NAMES)[1].ok
        ids = GRAMMAR.encode(text)
        length = int(mask[row].sum())
        assert mask[row, :length].all() and not mask[row, length:].any()
        assert symbols[row, :length].tolist() == ids and ids[-1] == GRAMMAR.eos_id
        assert np.all(symbols[row, length:] == GRAMMAR.pad_id)
        assert np.all(logp[row, :length] <= 0) and np.all(logp[row, length:] == 0)
    assert valid >= math.ceil(0.95 * N), valid
    assert len(set(sample.texts)) > N // 4  # a cold-started model, not a collapsed one


def test_same_key_same_texts_and_temperature(optimizer, state, first_sample):
    assert optimizer.sample(state, jax.random.key(1), N).texts == first_sample.texts
    assert optimizer.sample(state, jax.random.key(2), N).texts != first_sample.texts
    cold = optimizer.sample(state, jax.random.key(1), N, temperature=0.05)
    assert len(set(cold.texts)) < len(set(first_sample.texts)) / 2
    with pytest.raises(ValueError, match="temperature"):
        optimizer.sample(state, jax.random.key(1), N, temperature=0.0)
    with pytest.raises(ValueError, match="n must be"):
        optimizer.sample(state, jax.random.key(1), 0)


def test_sampling_logp_equals_teacher_forced_constrained_logp(optimizer, state, first_sample):
    recomputed = optimizer.logprobs(state.params, first_sample)
    np.testing.assert_allclose(np.asarray(recomputed), np.asarray(first_sample.logp), atol=2e-5)
    # the constrained distribution: each step's probabilities over the allowed symbols sum to 1
    allowed = np.asarray(optimizer.allowed_masks(first_sample.symbols))
    mask = np.asarray(first_sample.mask)
    assert allowed[mask].any(axis=-1).all()
    forced = mask & (allowed.sum(axis=-1) == 1)  # a single allowed symbol has probability 1
    assert forced.any()
    np.testing.assert_allclose(np.asarray(first_sample.logp)[forced], 0.0, atol=1e-5)


# ----------------------------------------------------------------------------- GRPO update


@pytest.mark.slow
def test_update_raises_logp_of_rewarded_sample(optimizer, state, first_sample):
    scores = np.zeros(N, np.float32)
    scores[0] = 1.0
    new_state, metrics = optimizer.update(state, first_sample, scores)
    assert int(new_state.step) == 1
    assert tree_equal(new_state.ref_params, state.ref_params)
    assert not tree_equal(new_state.params, state.params)
    for name in ("loss", "pg_loss", "kl", "entropy", "clip_fraction", "grad_norm", "score_mean"):
        assert np.isfinite(float(metrics[name])), name
    assert float(metrics["score_mean"]) == pytest.approx(1 / N)
    before = mean_token_logp(first_sample.logp, first_sample.mask)
    after = mean_token_logp(optimizer.logprobs(new_state.params, first_sample), first_sample.mask)
    rewarded = first_sample.texts[0]
    others = np.array([text != rewarded for text in first_sample.texts])
    assert after[0] > before[0] + 0.05
    assert (after - before)[others].mean() < 0


def test_zero_variance_scores_give_no_policy_gradient(optimizer, state, first_sample):
    # equal scores: zero advantages and pg loss; the step is the same whatever the common value,
    # so only the KL term (and Adam's state) can move the parameters
    high, metrics = optimizer.update(state, first_sample, np.full(N, 0.7, np.float32))
    low, _ = optimizer.update(state, first_sample, np.zeros(N, np.float32))
    assert float(metrics["advantage_abs_mean"]) == 0.0 and float(metrics["pg_loss"]) == 0.0
    assert float(metrics["clip_fraction"]) == 0.0
    assert tree_equal(high, low)
    assert int(high.step) == 1


def test_kl_term_pulls_toward_reference_when_scores_are_equal(optimizer, state, first_sample):
    scores = np.zeros(N, np.float32)
    scores[:4] = 1.0
    moved, _ = optimizer.update(state, first_sample, scores)
    fresh = MetaState(params=moved.params, opt_state=optimizer.optimizer.init(moved.params),
                      ref_params=moved.ref_params, step=moved.step)
    mask = first_sample.mask
    ref_logp = optimizer.logprobs(state.ref_params, first_sample)

    def kl(params):
        per_token = kl_estimate(optimizer.logprobs(params, first_sample), ref_logp, "k3")
        return float(jnp.sum(jnp.where(mask, per_token, 0.0)) / jnp.sum(mask))

    pulled, metrics = optimizer.update(fresh, first_sample, np.zeros(N, np.float32))
    assert kl(moved.params) > 0
    assert kl(pulled.params) < kl(moved.params)
    assert float(metrics["kl"]) > 0


def test_update_rejects_bad_scores_and_foreign_samples(optimizer, state, first_sample):
    with pytest.raises(ValueError, match=r"scores must have shape \(64,\)"):
        optimizer.update(state, first_sample, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="finite"):
        optimizer.update(state, first_sample, np.full(N, np.nan, np.float32))
    foreign = MetaSample(texts=first_sample.texts, symbols=first_sample.symbols[:, :10],
                         mask=first_sample.mask[:, :10], logp=first_sample.logp[:, :10])
    with pytest.raises(ValueError, match="not drawn by this optimizer"):
        optimizer.update(state, foreign, np.zeros(N, np.float32))


def correlation_score(text: str, cache: dict, points: np.ndarray) -> float:
    """max(0, corr(expression, g3)) on `points`; 0 for ill-defined or constant expressions."""
    if text not in cache:
        expr, validity = check_text(text, NAMES)
        score = 0.0
        if validity.ok:
            values = evaluate_numpy(expr, points, 0.5)
            if np.all(np.isfinite(values)) and values.std() > 1e-9:
                score = max(0.0, float(np.corrcoef(values, points[:, 2])[0, 1]))
        cache[text] = score
    return cache[text]


def test_grpo_outer_loop_beats_random_search(optimizer, state):
    points = np.random.default_rng(0).random((64, NUM_PRIMITIVES)).astype(np.float32)
    cache: dict = {}
    learned, random_search = state, []
    learned_means = []
    for iteration in range(10):
        key = jax.random.fold_in(jax.random.key(11), iteration)
        frozen = optimizer.sample(state, key, N)
        random_search.append(np.mean([correlation_score(t, cache, points) for t in frozen.texts]))
        sample = optimizer.sample(learned, key, N)
        scores = np.array([correlation_score(t, cache, points) for t in sample.texts], np.float32)
        learned_means.append(scores.mean())
        learned, _ = optimizer.update(learned, sample, scores)
    baseline = float(np.mean(random_search))
    assert learned_means[0] == pytest.approx(random_search[0])  # same start, same key
    assert np.mean(learned_means[-3:]) > baseline + 0.25, (learned_means, random_search)


# ----------------------------------------------------------------------------- checkpoint


def test_state_round_trips_through_checkpoint_store(optimizer, state, tmp_path):
    moved, _ = optimizer.update(state, optimizer.sample(state, jax.random.key(3), N), np.linspace(0, 1, N))
    with CheckpointStore(tmp_path / "ckpt") as store:
        store.save(1, arrays={"strategy": moved}, meta={"iteration": 1})
        template = {"strategy": state}
        arrays, meta = store.restore(arrays_template=template)
    restored = arrays["strategy"]
    assert isinstance(restored, MetaState) and meta["iteration"] == 1
    assert jax.tree.structure(restored) == jax.tree.structure(moved)
    assert tree_equal(restored, moved)
