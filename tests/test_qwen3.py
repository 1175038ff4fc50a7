"""Qwen3 checkpoints: logits, cached decoding, streams and replayed products against transformers;
round trips; config forms and refusals; the Qwen3-1.7B / 4B shapes."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx, traverse_util
from safetensors import safe_open

from derl_jax.models import hf
from hf_reference import our_logits, torch_logits
from derl_jax.models import sampling as sm
from derl_jax.models import streams as st
from derl_jax.models import transformer as tr

VOCAB = 96
HEAD_DIM = 24   # not hidden / heads (64 / 4 = 16), as in Qwen3 models


def _torch_model(tied: bool, seed: int = 0) -> transformers.Qwen3ForCausalLM:
    """A tiny random float32 Qwen3 with non-trivial norm scales (q/k norms included)."""
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=HEAD_DIM, tie_word_embeddings=tied, rope_theta=5000.0, rms_norm_eps=1e-6,
        max_position_embeddings=128)
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            param.copy_(base + 0.2 * torch.randn_like(param))
    return model




def _softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(-1, keepdims=True)
    return np.exp(x) / np.exp(x).sum(-1, keepdims=True)


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    """(torch model, directory) of a tied Qwen3 saved as several shards."""
    model = _torch_model(tied=True, seed=1)
    path = str(tmp_path_factory.mktemp("qwen3_tied"))
    model.save_pretrained(path, max_shard_size="60KB")
    return model, path


@pytest.fixture(scope="module")
def untied(tmp_path_factory):
    model = _torch_model(tied=False, seed=2)
    path = str(tmp_path_factory.mktemp("qwen3_untied"))
    model.save_pretrained(path)
    return model, path


@pytest.fixture(scope="module")
def prompts():
    """Two prompts of 5 and 3 real tokens, the second left padded."""
    tokens = np.array([[5, 17, 33, 2, 9], [0, 0, 41, 7, 60]])
    mask = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], bool)
    return tokens, mask


@pytest.mark.parametrize("which", ["tied", "untied"])
def test_loaded_qwen3_matches_torch_logits_and_next_token_distribution(request, which):
    model, path = request.getfixturevalue(which)
    config, params = hf.load_hf_checkpoint(path)
    assert (config.family, config.head_dim, config.tie_embeddings, config.rope_theta) == (
        "qwen3", HEAD_DIM, which == "tied", 5000.0)
    layer = nnx.to_pure_dict(params)["layers"][0]["attn"]
    assert "bias" not in layer["q_proj"] and layer["q_norm"]["scale"].shape == (HEAD_DIM,)
    np.testing.assert_array_equal(np.asarray(layer["k_norm"]["scale"]),
                                  model.model.layers[0].self_attn.k_norm.weight.detach().numpy())
    tokens = np.random.default_rng(0).integers(0, VOCAB, (2, 9))
    ours, theirs = our_logits(config, params, tokens), torch_logits(model, tokens)
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
    np.testing.assert_allclose(_softmax(ours[:, -1]), _softmax(theirs[:, -1]), atol=1e-5, rtol=0)


def test_qwen3_matches_torch_with_left_padding(tied):
    model, path = tied
    config, params = hf.load_hf_checkpoint(path)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, VOCAB, (3, 8))
    mask = np.ones((3, 8), bool)
    mask[1, :3] = False
    mask[2, :6] = False
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    ours = our_logits(config, params, tokens, mask, positions)
    theirs = torch_logits(model, tokens, mask.astype(np.int64), positions)
    np.testing.assert_allclose(ours[mask], theirs[mask], atol=1e-5, rtol=0)


def _torch_greedy(model, tokens, mask, steps: int) -> np.ndarray:
    with torch.no_grad():
        out = model.generate(torch.tensor(tokens), attention_mask=torch.tensor(mask.astype(np.int64)),
                             max_new_tokens=steps, do_sample=False, pad_token_id=0, eos_token_id=VOCAB - 1)
    return out.numpy()[:, tokens.shape[1]:]


def test_cached_greedy_decode_matches_torch_generate(tied, prompts):
    model, path = tied
    config, graphdef, params = hf.load_hf_model(path)
    tokens, mask = prompts
    steps = 6
    generated = _torch_greedy(model, tokens, mask, steps)
    assert generated.shape == (2, steps)   # no row stopped early, so every step is compared
    out = sm.sample_jit(graphdef, params, jnp.asarray(tokens, jnp.int32), jnp.asarray(mask), jax.random.key(0),
                        max_new_tokens=steps, eos_id=VOCAB - 1, pad_id=0, greedy=True)
    np.testing.assert_array_equal(np.asarray(out.tokens), generated)
    np.testing.assert_allclose(np.asarray(out.logprobs), _torch_logprobs(model, tokens, mask, generated), atol=1e-5)


def _torch_logprobs(model, tokens: np.ndarray, mask: np.ndarray, completions: np.ndarray) -> np.ndarray:
    """f64[B, T]: transformers' log-probabilities of `completions` after the left-padded prompts."""
    full = np.concatenate([tokens, completions], axis=1)
    full_mask = np.concatenate([mask, np.ones(completions.shape, bool)], axis=1)
    positions = np.maximum(np.cumsum(full_mask, axis=1) - 1, 0)
    logits = torch_logits(model, full, full_mask.astype(np.int64), positions)[:, tokens.shape[1] - 1:-1]
    logp = np.log(_softmax(logits.astype(np.float64)))
    return np.take_along_axis(logp, completions[..., None], axis=-1)[..., 0]


def test_stream_decode_matches_torch_generate(tied, prompts):
    # the prompts appended to streams (packed, no padding), then decoded from the stream's cache
    model, path = tied
    _, graphdef, params = hf.load_hf_model(path)
    tokens, mask = prompts
    steps = 5
    generated = _torch_greedy(model, tokens, mask, steps)

    @jax.jit
    def run(params, tokens, mask):
        stream = st.start_stream(graphdef, params, 2, capacity=8, scratch=steps, pad_id=0)
        stream = st.append(graphdef, params, stream, tokens, mask)
        return st.stream_decode(graphdef, params, stream, jax.random.key(0), max_new_tokens=steps, eos_id=VOCAB - 1,
                                pad_id=0, greedy=True, reads=1)

    out = run(params, jnp.asarray(tokens, jnp.int32), jnp.asarray(mask))
    np.testing.assert_array_equal(np.asarray(out.tokens), generated)


@pytest.mark.slow
def test_replayed_decode_products_give_torch_logprobs_and_the_same_gradients(untied, prompts):
    # sampled tokens, their log-probs from the decode, from the teacher-forced pass that replays
    # the decode's products, and from transformers agree; the replayed pass's gradients (q/k norm
    # scales included) equal those of recomputing the products
    model, path = untied
    _, graphdef, params = hf.load_hf_model(path)
    tokens, mask = prompts
    steps = 5
    out = sm.sample_jit(graphdef, params, jnp.asarray(tokens, jnp.int32), jnp.asarray(mask), jax.random.key(3),
                        max_new_tokens=steps, eos_id=VOCAB, pad_id=0, keep_products=True)
    logp_torch = _torch_logprobs(model, tokens, mask, np.asarray(out.tokens))
    np.testing.assert_allclose(np.asarray(out.logprobs), logp_torch, atol=1e-5)
    weights = jnp.asarray(np.random.default_rng(4).normal(size=out.tokens.shape), jnp.float32)

    def objective(params, saved):
        logp, _ = sm.sequence_logprobs(graphdef, params, jnp.asarray(tokens, jnp.int32), jnp.asarray(mask),
                                       out.tokens, out.mask, saved=saved)
        return jnp.sum(logp * weights), logp

    run = jax.jit(jax.value_and_grad(objective, has_aux=True))
    (_, logp), grads = run(params, None)
    (_, logp_replayed), grads_replayed = run(params, out.products)
    np.testing.assert_allclose(np.asarray(logp), logp_torch, atol=1e-5)
    np.testing.assert_allclose(np.asarray(logp_replayed), logp_torch, atol=1e-5)
    want_all = dict(nnx.to_flat_state(grads))
    assert ("layers", 0, "attn", "q_norm", "scale") in want_all
    for path_, got in nnx.to_flat_state(grads_replayed):
        want = np.asarray(want_all[path_].get_value())
        assert np.abs(want).max() > 0, path_
        np.testing.assert_allclose(np.asarray(got.get_value()), want, atol=1e-5 * np.abs(want).max(), rtol=1e-4,
                                   err_msg=str(path_))


def _random_qwen3(tied: bool, seed: int = 3):
    config = tr.tiny_config(VOCAB, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                            head_dim=12, tie_embeddings=tied, max_position=128, rope_theta=7000.0, family="qwen3")
    _, params = tr.abstract_model(config)
    rng = np.random.default_rng(seed)
    values = {path: jnp.asarray((path[-1] == "scale") + 0.2 * rng.standard_normal(var.shape), var.dtype)
              for path, var in nnx.to_flat_state(params)}
    nnx.replace_by_pure_dict(params, traverse_util.unflatten_dict(values))
    return config, params


@pytest.mark.parametrize("tied", [False, True])
def test_saved_qwen3_loads_in_transformers_with_the_same_logits(tmp_path, tied):
    config, params = _random_qwen3(tied)
    written = hf.save_hf_checkpoint(str(tmp_path), config, params, max_shard_bytes=None if tied else 20_000)
    assert (len(written) > 1) != tied
    with open(tmp_path / hf.CONFIG_FILE) as f:
        saved = json.load(f)
    assert (saved["model_type"], saved["architectures"], saved["attention_bias"], saved["head_dim"]) == (
        "qwen3", ["Qwen3ForCausalLM"], False, 12)
    torch_model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    assert isinstance(torch_model, transformers.Qwen3ForCausalLM)
    tokens = np.random.default_rng(2).integers(0, VOCAB, (2, 7))
    np.testing.assert_allclose(torch_logits(torch_model, tokens), our_logits(config, params, tokens), atol=1e-5, rtol=0)
    loaded_config, loaded = hf.load_hf_checkpoint(str(tmp_path))
    assert loaded_config == config
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(loaded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_qwen3_tensor_names_have_norms_and_no_biases(tmp_path):
    config, params = _random_qwen3(True)
    hf.save_hf_checkpoint(str(tmp_path), config, params, dtype="bfloat16")
    with safe_open(str(tmp_path / hf.SINGLE_WEIGHTS_FILE), framework="np") as reader:
        names = set(reader.keys())
    assert "model.layers.1.self_attn.q_norm.weight" in names and "model.layers.0.self_attn.k_norm.weight" in names
    assert not [n for n in names if n.endswith(".bias")] and "lm_head.weight" not in names
    qwen2 = set(hf.hf_tensor_names(config.replace(family="qwen2")))
    assert names - qwen2 == {f"model.layers.{i}.self_attn.{n}_norm.weight" for i in range(2) for n in "qk"}
    assert qwen2 - names == {f"model.layers.{i}.self_attn.{p}_proj.bias" for i in range(2) for p in "qkv"}


# public config.json of Qwen/Qwen3-1.7B and Qwen/Qwen3-4B (the fields that shape the model)
_PUBLIC = {
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16),
    "4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32),
}


@pytest.mark.parametrize("size, preset", [("1.7b", tr.qwen3_1_7b), ("4b", tr.qwen3_4b)])
def test_qwen3_presets_are_the_public_configs(size, preset):
    public = dict(_PUBLIC[size], architectures=["Qwen3ForCausalLM"], model_type="qwen3", attention_bias=False,
                  head_dim=128, num_key_value_heads=8, vocab_size=151936, tie_word_embeddings=True,
                  rope_theta=1000000, rope_scaling=None, rms_norm_eps=1e-6, max_position_embeddings=40960,
                  torch_dtype="bfloat16", use_sliding_window=False, hidden_act="silu")
    config = hf.config_from_hf(public, param_dtype="float32", compute_dtype="bfloat16")
    assert config == preset(dtype="bfloat16")
    assert hf.config_from_hf(hf.config_to_hf(config), compute_dtype="bfloat16") == config


def test_qwen3_refusals_are_one_line_naming_the_field(tmp_path, tied):
    _, path = tied
    with open(os.path.join(path, hf.CONFIG_FILE)) as f:
        base = json.load(f)
    for change, message in [
        ({"attention_bias": True}, "attention_bias=true is not supported for Qwen3"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn' is not supported"),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}},
         "rope_type 'linear' is not supported"),
        ({"use_sliding_window": True}, "use_sliding_window=true is not supported"),
        ({"model_type": "gemma", "architectures": ["GemmaForCausalLM"]}, "not a Qwen2 or Qwen3 model"),
    ]:
        with pytest.raises(hf.CheckpointError, match=message) as error:
            hf.config_from_hf(dict(base, **change), where="x/config.json")
        assert "\n" not in str(error.value) and str(error.value).startswith("x/config.json: ")
    # the family comes from the architecture when model_type is absent
    no_type = {k: v for k, v in base.items() if k != "model_type"}
    assert hf.config_from_hf(no_type).family == "qwen3"


@pytest.mark.parametrize("config_module", ["alfworld", "scienceworld"])
def test_self_guide_qwen3_presets_plan_the_public_shapes(config_module):
    # the checkpoint directory is absent here, so the plan reads the preset's shape fields
    import importlib

    from derl_jax.plan import analytic
    from derl_jax.plan.report import model_config_from_run

    module = importlib.import_module(f"configs.{config_module}")
    for size, preset in (("1_7b", tr.qwen3_1_7b), ("4b", tr.qwen3_4b)):
        cfg = module.get_config(f"self_guide_qwen3_{size}")
        assert not os.path.isdir(cfg.policy.checkpoint) and cfg.compare.methods[1] == "self_guide"
        config = model_config_from_run(cfg)
        assert config == preset(dtype="bfloat16", remat=True).replace(tie_embeddings=True, rope_theta=10000.0,
                                                                      max_position=32768)
        assert analytic.param_count(config) == tr.count_params(tr.abstract_model(config)[1])
