"""Hugging Face Qwen2 checkpoints: logits against PyTorch, round trips, config forms, errors."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from flax import nnx, traverse_util
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from derl_jax.models import hf
from hf_reference import our_logits, torch_logits
from derl_jax.models import sampling as sm
from derl_jax.models import transformer as tr

VOCAB = 96


def _torch_model(num_kv_heads: int, tied: bool, seed: int = 0) -> transformers.Qwen2ForCausalLM:
    """A tiny random float32 Qwen2 with non-trivial biases and norm scales."""
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=num_kv_heads, tie_word_embeddings=tied,
        rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=128)
    model = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            param.copy_(base + 0.2 * torch.randn_like(param))
    return model




@pytest.fixture(scope="module")
def tied_checkpoint(tmp_path_factory):
    """(torch model, directory) of a tied model with 2 kv heads saved as several shards."""
    model = _torch_model(2, tied=True, seed=1)
    path = str(tmp_path_factory.mktemp("tied"))
    model.save_pretrained(path, max_shard_size="60KB")
    return model, path


@pytest.fixture(scope="module")
def own_checkpoint(tmp_path_factory):
    """(config, params, directory) of a random model saved by `save_hf_checkpoint`, untied."""
    config = tr.tiny_config(VOCAB, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                            num_kv_heads=2, tie_embeddings=False, max_position=128, rope_theta=5000.0)
    graphdef, params = tr.abstract_model(config)
    rng = np.random.default_rng(3)
    values = {path: jnp.asarray((path[-1] == "scale") + 0.2 * rng.standard_normal(var.shape), var.dtype)
              for path, var in nnx.to_flat_state(params)}
    nnx.replace_by_pure_dict(params, traverse_util.unflatten_dict(values))
    path = str(tmp_path_factory.mktemp("own"))
    written = hf.save_hf_checkpoint(path, config, params, max_shard_bytes=20_000)
    assert len(written) > 1 and os.path.isfile(os.path.join(path, hf.INDEX_FILE))
    return config, params, path


@pytest.mark.parametrize("num_kv_heads, tied, sharded", [(1, False, False), (4, False, True)])
def test_loaded_checkpoint_matchestorch_logits(tmp_path, num_kv_heads, tied, sharded):
    model = _torch_model(num_kv_heads, tied)
    model.save_pretrained(str(tmp_path), **({"max_shard_size": "60KB"} if sharded else {}))
    assert os.path.isfile(tmp_path / hf.INDEX_FILE) == sharded
    config, params = hf.load_hf_checkpoint(str(tmp_path))
    assert (config.num_kv_heads, config.tie_embeddings, config.head_dim, config.param_dtype) == (
        num_kv_heads, tied, 16, "float32")
    assert ("lm_head" in nnx.to_pure_dict(params)) != tied
    tokens = np.random.default_rng(0).integers(0, VOCAB, (2, 9))
    np.testing.assert_allclose(our_logits(config, params, tokens), torch_logits(model, tokens), atol=1e-5, rtol=0)


def test_tied_sharded_checkpoint_matches_torch_with_left_padding(tied_checkpoint):
    model, path = tied_checkpoint
    assert len([f for f in os.listdir(path) if f.endswith(".safetensors")]) > 1
    config, params = hf.load_hf_checkpoint(path)
    assert config.tie_embeddings and config.num_kv_heads == 2 and "lm_head" not in nnx.to_pure_dict(params)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, VOCAB, (3, 8))
    mask = np.ones((3, 8), bool)
    mask[1, :3] = False
    mask[2, :6] = False
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    ours = our_logits(config, params, tokens, mask, positions)
    theirs = torch_logits(model, tokens, mask.astype(np.int64), positions)
    np.testing.assert_allclose(ours[mask], theirs[mask], atol=1e-5, rtol=0)


def test_greedy_sampling_matches_torch_generate(tied_checkpoint):
    model, path = tied_checkpoint
    config, graphdef, params = hf.load_hf_model(path)
    prompts = np.array([[5, 17, 33, 2, 9], [0, 0, 41, 7, 60]])
    mask = np.array([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]], bool)
    steps, pad = 6, 0
    with torch.no_grad():
        generated = model.generate(torch.tensor(prompts), attention_mask=torch.tensor(mask.astype(np.int64)),
                                   max_new_tokens=steps, do_sample=False, pad_token_id=pad,
                                   eos_token_id=VOCAB - 1).numpy()[:, prompts.shape[1]:]
    out = sm.sample_jit(graphdef, params, jnp.asarray(prompts, jnp.int32), jnp.asarray(mask), jax.random.key(0),
                        max_new_tokens=steps, eos_id=VOCAB - 1, pad_id=pad, greedy=True)
    assert generated.shape == (2, steps)  # no row stopped early, so every step is compared
    np.testing.assert_array_equal(np.asarray(out.tokens), generated)


def test_our_checkpoint_loads_in_transformers_with_the_same_logits(own_checkpoint):
    config, params, path = own_checkpoint
    torch_model = transformers.Qwen2ForCausalLM.from_pretrained(path).eval()
    tokens = np.random.default_rng(2).integers(0, VOCAB, (2, 7))
    np.testing.assert_allclose(torch_logits(torch_model, tokens), our_logits(config, params, tokens), atol=1e-5, rtol=0)
    loaded_config, loaded = hf.load_hf_checkpoint(path)
    assert loaded_config == config
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(loaded)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_tied_round_trip_in_bfloat16(tmp_path, own_checkpoint):
    config, params, _ = own_checkpoint
    tied_config = config.replace(tie_embeddings=True)
    values = nnx.to_pure_dict(params)
    values.pop("lm_head")
    graphdef, tied_params = tr.abstract_model(tied_config)
    nnx.replace_by_pure_dict(tied_params, values)
    assert hf.save_hf_checkpoint(str(tmp_path), tied_config, tied_params, dtype="bfloat16") == [hf.SINGLE_WEIGHTS_FILE]
    with safe_open(str(tmp_path / hf.SINGLE_WEIGHTS_FILE), framework="np") as reader:
        assert "lm_head.weight" not in reader.keys()
        assert reader.get_slice("model.embed_tokens.weight").get_dtype() == "BF16"

    loaded_config, loaded = hf.load_hf_checkpoint(str(tmp_path))
    assert loaded_config.param_dtype == "bfloat16"
    expected = np.asarray(values["layers"][1]["mlp"]["down_proj"]["kernel"]).astype(ml_dtypes.bfloat16)
    got = nnx.to_pure_dict(loaded)["layers"][1]["mlp"]["down_proj"]["kernel"]
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got).astype(np.float32), expected.astype(np.float32))
    _, as_float = hf.load_hf_checkpoint(str(tmp_path), dtype="float32")
    assert nnx.to_pure_dict(as_float)["final_norm"]["scale"].dtype == jnp.float32

    torch_model = transformers.Qwen2ForCausalLM.from_pretrained(str(tmp_path), dtype=torch.bfloat16)
    down = torch_model.model.layers[1].mlp.down_proj.weight.float().detach().numpy()
    np.testing.assert_array_equal(down, expected.astype(np.float32).T)
    assert torch_model.lm_head.weight.data_ptr() == torch_model.model.embed_tokens.weight.data_ptr()


def test_both_config_forms_give_the_same_model_config():
    shapes = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=151936, hidden_size=896,
                  intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                  rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=32768)
    hub = dict(shapes, rope_theta=1000000.0, torch_dtype="bfloat16", rope_scaling=None)
    newer = dict(shapes, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, dtype="bfloat16")
    from_hub = hf.config_from_hf(hub, compute_dtype="float32")
    assert from_hub == hf.config_from_hf(newer, compute_dtype="float32")
    assert from_hub == tr.qwen2_5_0_5b(dtype="float32", param_dtype="bfloat16")
    assert hf.config_from_hf(hf.config_to_hf(from_hub), compute_dtype="float32") == from_hub
    assert hf.config_from_hf(dict(newer, num_key_value_heads=None)).num_kv_heads == 14


def _copy(source: str, target) -> str:
    shutil.copytree(source, str(target))
    return str(target)


def _edit_config(path: str, **changes) -> None:
    config_path = os.path.join(path, hf.CONFIG_FILE)
    with open(config_path) as f:
        config = json.load(f)
    config.update(changes)
    with open(config_path, "w") as f:
        json.dump(config, f)


def _shard_holding(path: str, name: str) -> str:
    with open(os.path.join(path, hf.INDEX_FILE)) as f:
        return os.path.join(path, json.load(f)["weight_map"][name])


def test_missing_files_are_named(tmp_path, own_checkpoint):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        hf.load_hf_checkpoint(missing)
    os.makedirs(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="config.json"):
        hf.load_hf_checkpoint(str(tmp_path / "empty"))
    no_weights = str(tmp_path / "no_weights")
    os.makedirs(no_weights)
    shutil.copy(os.path.join(own_checkpoint[2], hf.CONFIG_FILE), no_weights)
    with pytest.raises(FileNotFoundError, match="no weights"):
        hf.load_hf_checkpoint(no_weights)
    lost_shard = _copy(own_checkpoint[2], tmp_path / "lost_shard")
    os.remove(_shard_holding(lost_shard, "model.norm.weight"))
    with pytest.raises(FileNotFoundError, match="shard files that do not exist"):
        hf.load_hf_checkpoint(lost_shard)


def test_wrong_architecture_is_named(tmp_path, own_checkpoint):
    path = _copy(own_checkpoint[2], tmp_path / "llama")
    _edit_config(path, architectures=["LlamaForCausalLM"], model_type="llama")
    with pytest.raises(hf.CheckpointError, match=r"LlamaForCausalLM.*'llama'"):
        hf.load_hf_checkpoint(path)
    _edit_config(path, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                 rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0})
    with pytest.raises(hf.CheckpointError, match="rope_type 'yarn'"):
        hf.load_hf_checkpoint(path)


def test_missing_and_misshapen_tensors_are_named(tmp_path, own_checkpoint):
    path = _copy(own_checkpoint[2], tmp_path / "missing")
    name = "model.layers.1.self_attn.k_proj.bias"
    shard = _shard_holding(path, name)
    tensors = load_file(shard)
    del tensors[name]
    save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(hf.CheckpointError, match=r"lacks tensors \['model.layers.1.self_attn.k_proj.bias'\]"):
        hf.load_hf_checkpoint(path)

    path = _copy(own_checkpoint[2], tmp_path / "misshapen")
    _edit_config(path, intermediate_size=40)
    with pytest.raises(hf.CheckpointError, match=r"model.layers.0.mlp.gate_proj.weight has shape \(48, 32\), "
                                                 r"expected \(40, 32\)"):
        hf.load_hf_checkpoint(path)
