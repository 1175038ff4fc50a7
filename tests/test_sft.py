"""The base policy (derl_jax.rl.sft): supervised warm start, its corpus and its cache.

`small_base_policy()` builds the small base policy that tests/test_inner.py starts GRPO
from; it is built once per test session (tests/conftest.py `shared_build_dir`) and read by
every other process that needs it.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import session_lock, shared_build_dir
from derl_jax.domains.arith import BOX_CLOSE, BOX_OPEN, make_arith_domain
from derl_jax.models.sampling import sample_jit
from derl_jax.models.transformer import apply, init_params
from derl_jax.parallel import cpu_name
from derl_jax.rl import sft, setup

SMALL_DOMAIN = {"seed": 0, "num_train": 300, "num_test": 60, "levels": (1, 2), "max_new_tokens": 28}
# Half of the stepwise solutions in the corpus leave the answer unboxed, so the base policy
# often computes the right number and still fails the outcome check: format is something
# GRPO can fix quickly, and every primitive varies across sampled rollouts.
FORMAT_GAP_MIX = {"steps": 0.35, "no_box": 0.35, "no_steps": 0.1, "wrong_step": 0.1, "plain": 0.1}
SMALL_POLICY = {
    "hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
    "head_dim": 16, "sft_steps": 600, "sft_lr": 5e-3, "sft_batch_size": 32, "sft_extra_problems": 1000,
    "sft_mix": FORMAT_GAP_MIX,
}
SPLIT_SEED = 0
# A tiny setup for the cache, determinism and loss tests, and (after a short SFT that makes
# its outputs varied enough for GRPO to see reward differences) the inner-loop
# equivalence and sharding tests.
TINY_DOMAIN = {"seed": 2, "num_train": 40, "num_test": 10, "levels": (1,), "max_new_tokens": 14}
TINY_POLICY = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1,
               "head_dim": 16, "sft_steps": 60, "sft_lr": 1e-2, "sft_batch_size": 16}


@dataclasses.dataclass(frozen=True)
class BaseSetup:
    domain: object
    validation_rows: np.ndarray
    graphdef: object
    params: object
    losses: np.ndarray
    cache_file: str

    @property
    def validation(self):
        return self.domain.train.take(self.validation_rows)

    @property
    def inner_train(self):
        keep = np.setdiff1d(np.arange(self.domain.train.size), self.validation_rows)
        return self.domain.train.take(keep)


@functools.lru_cache(maxsize=None)
def small_base_policy() -> BaseSetup:
    """The small base policy, built by `sft.base_policy` in the session's cache (empty when the
    session starts) or read from it."""
    domain = make_arith_domain(SMALL_DOMAIN)
    rows = setup.validation_rows(domain.train.size, SPLIT_SEED)
    cache_dir = shared_build_dir("small_base_policy")
    with session_lock("small_base_policy"):
        graphdef, params = sft.base_policy(domain, SMALL_POLICY, cache_dir, seed=0, holdout_rows=rows)
    (cache_file,) = glob.glob(os.path.join(cache_dir, "*.npz"))
    _, _, losses = sft.load_policy(cache_file, sft.policy_model_config(domain, SMALL_POLICY))
    return BaseSetup(domain, rows, graphdef, params, losses, cache_file)


@dataclasses.dataclass(frozen=True)
class TinySetup:
    domain: object
    graphdef: object
    initial_params: object
    params: object
    data: sft.SFTData


@functools.lru_cache(maxsize=None)
def tiny_policy() -> TinySetup:
    """The tiny model after `TINY_POLICY["sft_steps"]` supervised steps (built once per process)."""
    domain = make_arith_domain(TINY_DOMAIN)
    data = sft.encode_corpus(domain.tokenizer, sft.domain_corpus(domain, 0), int(domain.train.prompts.shape[1]),
                             domain.max_new_tokens)
    graphdef, initial = init_params(sft.policy_model_config(domain, TINY_POLICY), jax.random.key(0))
    params, _ = sft.train_sft(graphdef, initial, data, sft.sft_config_from(TINY_POLICY, seed=0))
    return TinySetup(domain, graphdef, initial, params, data)


def reference_correct(text: str, answer: int) -> bool:
    """Text-level outcome check: the last `[...]` box holds exactly the gold digits."""
    close = text.rfind(BOX_CLOSE)
    open_ = text.rfind(BOX_OPEN, 0, close) if close >= 0 else -1
    return open_ >= 0 and text[open_ + 1:close] == str(answer)


def greedy_texts(setup: BaseSetup, dataset) -> list[str]:
    out = sample_jit(setup.graphdef, setup.params, dataset.prompts, dataset.prompt_mask, jax.random.key(0),
                     max_new_tokens=setup.domain.max_new_tokens, eos_id=setup.domain.eos_id,
                     pad_id=setup.domain.pad_id, greedy=True)
    return setup.domain.tokenizer.decode_batch(out.tokens)


# ----------------------------------------------------------------------------- training


def test_sft_lowers_loss_and_reaches_the_accuracy_band():
    setup = small_base_policy()
    losses = setup.losses
    assert losses.shape == (SMALL_POLICY["sft_steps"],)
    assert np.all(np.isfinite(losses))
    assert losses[:10].mean() > 2.5  # about log(21 tokens) at random initialisation
    assert losses[-50:].mean() < 0.5 * losses[:10].mean()
    validation = setup.validation
    answers = np.asarray(validation.context["answer_value"])
    texts = greedy_texts(setup, validation)
    accuracy = np.mean([reference_correct(t, a) for t, a in zip(texts, answers)])
    print(f"base policy greedy validation accuracy {accuracy:.3f} on {len(texts)} held-out problems")
    # a small, briefly trained policy: float rounding (device count, XLA flags) moves its greedy
    # accuracy on these 60 problems between about 0.07 and 0.28, while a random one scores 0
    assert 0.05 <= accuracy <= 0.6
    # the formatting varies: some greedy answers are boxed and some are not
    boxed = np.mean([t.endswith(BOX_CLOSE) for t in texts])
    assert 0.1 < boxed < 0.95


def test_sft_is_deterministic_given_the_seed():
    tiny = tiny_policy()
    cfg = sft.sft_config_from(TINY_POLICY, seed=0)
    again, _ = sft.train_sft(tiny.graphdef, tiny.initial_params, tiny.data, cfg)
    for a, b in zip(jax.tree_util.tree_leaves(tiny.params), jax.tree_util.tree_leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other, _ = sft.train_sft(tiny.graphdef, tiny.initial_params, tiny.data, dataclasses.replace(cfg, seed=1))
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree_util.tree_leaves(tiny.params), jax.tree_util.tree_leaves(other)))


def test_loss_counts_completion_tokens_only():
    domain = make_arith_domain(TINY_DOMAIN)
    # equal unpadded lengths (17 tokens with BOS and EOS), different prompt/completion splits
    corpus = [("3+4=", "1:3+4=7;[7]"), ("12-5=", "1:12-5=7;7"), ("9*9=", "1:9*9=81;81")]
    data = sft.encode_corpus(domain.tokenizer, corpus, 7, 14)
    graphdef, params = init_params(sft.policy_model_config(domain, TINY_POLICY), jax.random.key(2))
    got = float(jax.jit(sft.completion_nll, static_argnums=0)(graphdef, params, data))
    # reference: a plain causal forward over each unpadded prompt + completion, NLL in NumPy
    prompt_ids = [domain.tokenizer.encode(p, add_bos=True) for p, _ in corpus]
    completion_ids = [domain.tokenizer.encode(c, add_eos=True) for _, c in corpus]
    sequences = np.array([p + c for p, c in zip(prompt_ids, completion_ids)], np.int32)
    positions = np.broadcast_to(np.arange(sequences.shape[1]), sequences.shape)
    forward = jax.jit(lambda p, tokens, where: apply(graphdef, p, tokens, where)[0])
    logits = np.asarray(forward(params, jnp.asarray(sequences), jnp.asarray(positions)), np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    nll = [-log_probs[row, len(p) - 1 + offset, token]
           for row, (p, c) in enumerate(zip(prompt_ids, completion_ids)) for offset, token in enumerate(c)]
    assert got == pytest.approx(np.mean(nll), rel=1e-5)


def test_trimming_padding_columns_keeps_the_loss_and_drops_only_padding():
    domain = make_arith_domain(TINY_DOMAIN)
    corpus = [("3+4=", "1:3+4=7;[7]"), ("12-5=", "1:12-5=7;7"), ("9*9=", "[81]")]
    data = sft.encode_corpus(domain.tokenizer, corpus, 12, 20)
    trimmed = sft.trim_padding(data)
    longest_prompt = max(len(domain.tokenizer.encode(p, add_bos=True)) for p, _ in corpus)
    longest_completion = max(len(domain.tokenizer.encode(c, add_eos=True)) for _, c in corpus)
    assert trimmed.prompts.shape == (3, longest_prompt) and trimmed.completions.shape == (3, longest_completion)
    assert int(trimmed.prompt_mask.sum()) == int(data.prompt_mask.sum())
    assert int(trimmed.completion_mask.sum()) == int(data.completion_mask.sum())
    graphdef, params = init_params(sft.policy_model_config(domain, TINY_POLICY), jax.random.key(2))
    nll = jax.jit(sft.completion_nll, static_argnums=0)
    assert float(nll(graphdef, params, trimmed)) == pytest.approx(float(nll(graphdef, params, data)), rel=1e-5)


def test_encode_corpus_rejects_a_completion_that_does_not_fit():
    domain = make_arith_domain({"seed": 1, "num_train": 8, "num_test": 4, "levels": (1,), "max_new_tokens": 14})
    with pytest.raises(ValueError, match="more than length=5"):
        sft.encode_corpus(domain.tokenizer, [("3+4=", "1:3+4=7;[7]")], 6, 5)
    with pytest.raises(ValueError, match="corpus is empty"):
        sft.encode_corpus(domain.tokenizer, [], 6, 5)


def test_sft_config_rejects_bad_values():
    with pytest.raises(ValueError, match="SFTConfig.batch_size=0"):
        sft.SFTConfig(steps=1, learning_rate=1e-3, batch_size=0)
    with pytest.raises(ValueError, match="policy config has no field 'sft_lr'"):
        sft.sft_config_from({"sft_steps": 1, "sft_batch_size": 2})


# ----------------------------------------------------------------------------- corpus


def test_corpus_leaves_out_held_out_rows_and_adds_only_fresh_problems():
    domain = make_arith_domain({"seed": 3, "num_train": 40, "num_test": 20, "levels": (1, 2), "max_new_tokens": 28})
    train, test = domain.info["train_problems"], domain.info["test_problems"]
    held_out = [0, 5, 7, 39]
    corpus = sft.domain_corpus(domain, 0, held_out, {"sft_extra_problems": 25})
    prompts = [prompt for prompt, _ in corpus]
    assert len(corpus) == 40 - len(held_out) + 25
    kept = [p.prompt for row, p in enumerate(train) if row not in held_out]
    assert prompts[: len(kept)] == kept
    fresh = prompts[len(kept):]
    assert len(set(fresh)) == 25
    assert not set(fresh) & {p.prompt for p in (*train, *test)}
    with pytest.raises(ValueError, match="holdout_rows \\[40\\] are outside the 40 training rows"):
        sft.domain_corpus(domain, 0, [40])
    level_one = make_arith_domain({"seed": 3, "num_train": 200, "num_test": 50, "levels": (1,), "max_new_tokens": 14})
    with pytest.raises(ValueError, match="sft_extra_problems=10: that many fresh problems do not exist"):
        sft.domain_corpus(level_one, 0, (), {"sft_extra_problems": 10})


def test_a_domain_without_a_corpus_cannot_be_warm_started(tmp_path):
    import dataclasses

    domain = dataclasses.replace(make_arith_domain(TINY_DOMAIN), name="plain", corpus=None)
    with pytest.raises(ValueError, match="domain 'plain' provides no supervised corpus"):
        sft.base_policy(domain, TINY_POLICY, tmp_path, seed=0)
    # without SFT steps the random initialisation is the base policy, no corpus needed
    graphdef, params = sft.base_policy(domain, {**TINY_POLICY, "sft_steps": 0}, tmp_path, seed=0)
    _, expected = init_params(sft.policy_model_config(domain, TINY_POLICY), jax.random.key(0))
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_any_domain_with_a_corpus_gets_a_warm_started_policy(tmp_path, counting_trainer):
    import dataclasses

    pairs = [("1+1=", "[2]"), ("2+2=", "[4]"), ("3+3=", "[6]")]
    domain = dataclasses.replace(make_arith_domain(TINY_DOMAIN), name="pairs",
                                 corpus=lambda seed, rows, options: pairs[: 3 - len(rows)])
    sft.base_policy(domain, TINY_POLICY, tmp_path, seed=0, holdout_rows=[0])
    assert counting_trainer[-1]["examples"] == 2


# ----------------------------------------------------------------------------- cache


@pytest.fixture
def counting_trainer(monkeypatch):
    """Replace the SFT run with one that records its calls and returns the initial params."""
    calls = []

    def fake_train(graphdef, params, data, cfg):
        calls.append({"cfg": cfg, "examples": data.size})
        return params, jnp.arange(cfg.steps, dtype=jnp.float32)

    monkeypatch.setattr(sft, "train_sft", fake_train)
    return calls



def test_cache_hit_returns_identical_params(tmp_path, counting_trainer):
    domain = make_arith_domain(TINY_DOMAIN)
    graphdef, params = sft.base_policy(domain, TINY_POLICY, tmp_path, seed=0)
    assert len(counting_trainer) == 1
    assert len(glob.glob(str(tmp_path / "*.npz"))) == 1
    assert len(glob.glob(str(tmp_path / "*.json"))) == 1
    graphdef_again, params_again = sft.base_policy(domain, TINY_POLICY, tmp_path, seed=0)
    assert len(counting_trainer) == 1  # loaded, not trained
    assert graphdef_again == graphdef
    assert jax.tree_util.tree_structure(params_again) == jax.tree_util.tree_structure(params)
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(params_again)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the stored params are the initial ones here; they must match a fresh init bit for bit
    fresh = tiny_policy().initial_params
    for a, b in zip(jax.tree_util.tree_leaves(fresh), jax.tree_util.tree_leaves(params_again), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_the_record_names_the_host_it_was_trained_on(tmp_path, counting_trainer, monkeypatch):
    """The same seed can round differently on another core count or CPU, so the record says where."""
    if hasattr(os, "sched_getaffinity"):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1, 3})
    sft.base_policy(make_arith_domain(TINY_DOMAIN), TINY_POLICY, tmp_path, seed=0)
    (path,) = glob.glob(str(tmp_path / "*.json"))
    with open(path, encoding="utf-8") as handle:
        built_on = json.load(handle)["built_on"]
    cores = 2 if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    assert built_on == {"cpu": cpu_name(), "cores": cores, "backend": jax.default_backend(), "jax": jax.__version__}


@pytest.mark.parametrize("change", [
    {"policy": {"sft_lr": 2e-3}},
    {"policy": {"hidden_size": 48}},
    {"policy": {"sft_extra_problems": 5}},
    {"policy": {"sft_mix": FORMAT_GAP_MIX}},
    {"domain": {"seed": 3}},
    {"seed": 1},
    {"holdout_rows": [0, 1]},
])
def test_a_changed_input_misses_the_cache(tmp_path, counting_trainer, change):
    domain = make_arith_domain(TINY_DOMAIN)
    sft.base_policy(domain, TINY_POLICY, tmp_path, seed=0)
    changed_domain = make_arith_domain({**TINY_DOMAIN, **change.get("domain", {})})
    sft.base_policy(changed_domain, {**TINY_POLICY, **change.get("policy", {})}, tmp_path,
                    seed=change.get("seed", 0), holdout_rows=change.get("holdout_rows", ()))
    assert len(counting_trainer) == 2
    assert len(glob.glob(str(tmp_path / "*.npz"))) == 2


def test_an_unreadable_cache_file_is_rebuilt(tmp_path, counting_trainer):
    domain = make_arith_domain(TINY_DOMAIN)
    sft.base_policy(domain, TINY_POLICY, tmp_path, seed=0)
    (path,) = glob.glob(str(tmp_path / "*.npz"))
    with open(path, "wb") as handle:
        handle.write(b"not a zip archive")
    with pytest.warns(UserWarning, match="is unreadable"):
        _, params = sft.base_policy(domain, TINY_POLICY, tmp_path, seed=0)
    assert len(counting_trainer) == 2
    _, reloaded, _ = sft.load_policy(path, sft.policy_model_config(domain, TINY_POLICY))
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(reloaded), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_stored_file_for_another_shape_is_rejected(tmp_path):
    domain = make_arith_domain(TINY_DOMAIN)
    model_cfg = sft.policy_model_config(domain, TINY_POLICY)
    _, params = init_params(model_cfg, jax.random.key(0))
    path = str(tmp_path / "policy.npz")
    sft.save_policy(path, params, jnp.zeros(2))
    with pytest.raises(ValueError, match="the model needs float32\\[21, 48\\]"):
        sft.load_policy(path, model_cfg.replace(hidden_size=48, head_dim=24))


def test_the_share_benchmark_cut_into_segments_trains_as_one_scan():
    """benchmarks/cold_start_share.py measures between segments of `sft.sft_step`; the segments
    end where `train_sft`'s one scan does, up to float rounding (two compiled programs)."""
    from benchmarks.cold_start_share import segment_fn

    tiny = tiny_policy()
    cfg = sft.sft_config_from({**TINY_POLICY, "sft_steps": 6}, seed=3)
    want, want_losses = sft.train_sft(tiny.graphdef, tiny.initial_params, tiny.data, cfg)
    run, optimizer = segment_fn(tiny.graphdef, cfg, tiny.data)
    params, opt_state = tiny.initial_params, optimizer.init(tiny.initial_params)
    params, opt_state, first = run(params, opt_state, 0, 4)
    params, _, second = run(params, opt_state, 4, 2)
    np.testing.assert_allclose(np.concatenate([first, second]), want_losses, rtol=1e-5, atol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5)
