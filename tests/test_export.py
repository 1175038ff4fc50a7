"""Trained policies as Hugging Face directories: `final_policy_hf/` and `--mode=export`, loaded
back by transformers with the same logits; the tokenizer and chat template beside them; errors."""

from __future__ import annotations

import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import torch
import transformers
from absl import flags
from flax import nnx, traverse_util

from derl_jax.config import InputError
from derl_jax.experiment import export
from derl_jax.experiment.run import run
from derl_jax.models import hf
from derl_jax.models import hf_tokenizer as ht
from derl_jax.models import transformer as tr
from derl_jax.outer import candidate_policies

VOCAB = 96
_forward = jax.jit(tr.apply, static_argnums=0)


def _random_params(config: tr.ModelConfig, seed: int) -> nnx.State:
    _, params = tr.abstract_model(config)
    rng = np.random.default_rng(seed)
    values = {path: jnp.asarray((path[-1] == "scale") + 0.2 * rng.standard_normal(var.shape), var.dtype)
              for path, var in nnx.to_flat_state(params)}
    nnx.replace_by_pure_dict(params, traverse_util.unflatten_dict(values))
    return params


def _ours(config, params, tokens: np.ndarray) -> np.ndarray:
    graphdef, _ = tr.abstract_model(config)
    positions = np.broadcast_to(np.arange(tokens.shape[1]), tokens.shape)
    logits, _ = _forward(graphdef, params, jnp.asarray(tokens, jnp.int32), jnp.asarray(positions, jnp.int32))
    return np.asarray(logits)


def _theirs(path: str, tokens: np.ndarray) -> np.ndarray:
    model = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long)).logits.float().numpy()


@pytest.fixture(scope="module")
def qwen_tokenizer():
    return ht.HFTokenizer.from_directory(ht.bundled_qwen_tokenizer_dir(), chat_template="qwen2.5")


def test_written_policy_loads_in_transformers_with_its_tokenizer_and_chat_template(tmp_path, qwen_tokenizer):
    config = tr.tiny_config(VOCAB, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                            tie_embeddings=False, max_position=64, family="qwen3")
    params = _random_params(config, seed=1)
    graphdef, _ = tr.abstract_model(config)
    path = str(tmp_path / export.FINAL_POLICY_HF_DIR)
    # the tokenizer reached through a wrapper, as an agent domain's SubwordTable holds it
    wrapper = type("Table", (), {"tokenizer": qwen_tokenizer})()
    assert export.write_policy_hf(path, params, graphdef=graphdef, tokenizer=wrapper) == path
    tokens = np.random.default_rng(0).integers(0, VOCAB, (2, 7))
    np.testing.assert_allclose(_theirs(path, tokens), _ours(config, params, tokens), atol=1e-5, rtol=0)
    loaded = transformers.AutoTokenizer.from_pretrained(path)
    text = "Put the apple in the fridge, then <|im_end|> stop."
    assert loaded.encode(text, add_special_tokens=False) == qwen_tokenizer.encode(text)
    messages = [{"role": "user", "content": "go north"}]
    assert loaded.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        qwen_tokenizer.apply_chat_template(messages))
    generation = transformers.GenerationConfig.from_pretrained(path)
    assert generation.eos_token_id == list(qwen_tokenizer.stop_ids) and generation.pad_token_id == qwen_tokenizer.pad_id
    assert not [name for name in os.listdir(tmp_path) if name != export.FINAL_POLICY_HF_DIR]  # no staging left


def test_a_policy_without_a_hugging_face_tokenizer_writes_weights_and_config_only(tmp_path):
    config = tr.tiny_config(VOCAB, hidden_size=16, intermediate_size=24, num_layers=1, num_heads=2, num_kv_heads=1)
    params = _random_params(config, seed=2)   # a tied Qwen2, as scratch policies are
    char_table = type("Chars", (), {"vocab_size": VOCAB})()   # derl_jax's own tokenizers have no save_pretrained
    path = export.write_policy_hf(str(tmp_path / "out"), params, config=config, tokenizer=char_table)
    assert sorted(os.listdir(path)) == [hf.CONFIG_FILE, hf.SINGLE_WEIGHTS_FILE]
    assert export.hf_tokenizer_of(char_table) == (None, None)
    tokens = np.random.default_rng(1).integers(0, VOCAB, (2, 5))
    np.testing.assert_allclose(_theirs(path, tokens), _ours(config, params, tokens), atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def checkpoint_run(tmp_path_factory, qwen_tokenizer):
    """(cfg, run directory, base config, trained params): a Qwen3 checkpoint policy (with the
    tokenizer files beside it) whose "trained" final policy is kept as final_policy.npz."""
    root = tmp_path_factory.mktemp("export_run")
    base_config = tr.tiny_config(VOCAB, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                                 num_kv_heads=2, head_dim=12, tie_embeddings=True, max_position=64, family="qwen3")
    checkpoint = str(root / "Qwen3-tiny")
    hf.save_hf_directory(checkpoint, base_config, _random_params(base_config, seed=3),
                         tokenizer=qwen_tokenizer.tokenizer)
    trained = _random_params(base_config, seed=4)
    workdir = root / "run"
    for method in ("derl", "outcome"):
        os.makedirs(workdir / method / "seed_0")
    stacked = jax.tree_util.tree_map(lambda x: np.asarray(x)[None], trained)
    candidate_policies.save_stack(str(workdir / "derl" / "seed_0" / export.FINAL_POLICY_FILE), stacked, [0])
    cfg = ml_collections.ConfigDict({"policy": {"checkpoint": checkpoint, "tokenizer": "", "param_dtype": "float32",
                                                "compute_dtype": "float32"}})
    return cfg, str(workdir), checkpoint, base_config, trained


def test_export_mode_writes_each_kept_policy_beside_it(checkpoint_run):
    cfg, workdir, checkpoint, config, trained = checkpoint_run
    written = export.export_run(cfg, workdir)
    target = os.path.join(workdir, "derl", "seed_0", export.FINAL_POLICY_HF_DIR)
    assert written == [target]
    assert not os.listdir(os.path.join(workdir, "outcome", "seed_0"))
    tokens = np.random.default_rng(5).integers(0, VOCAB, (2, 6))
    theirs = _theirs(target, tokens)
    np.testing.assert_allclose(theirs, _ours(config, trained, tokens), atol=1e-5, rtol=0)
    assert np.abs(theirs - _theirs(checkpoint, tokens)).max() > 0.1   # the trained policy, not the checkpoint
    assert os.path.isfile(os.path.join(target, "tokenizer.json"))
    # exported again over the first: replaced whole, nothing left beside it
    with open(os.path.join(target, "stale.txt"), "w") as f:
        f.write("from before")
    assert export.export_run(cfg, workdir, policy=os.path.join(os.path.dirname(target), "final_policy.npz")) == [target]
    assert "stale.txt" not in os.listdir(target)
    assert sorted(os.listdir(os.path.dirname(target))) == [export.FINAL_POLICY_FILE, export.FINAL_POLICY_HF_DIR]


def test_export_errors_name_the_input(tmp_path, checkpoint_run):
    cfg, workdir, _, config, _ = checkpoint_run
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (dict(workdir=str(empty)), "holds no final_policy.npz"),
        (dict(workdir=str(tmp_path / "nowhere")), "no such directory"),
        (dict(workdir=workdir, policy=str(tmp_path / "missing.npz")), "--policy=.*missing.npz.*no such .npz file"),
    ]
    other = tr.tiny_config(VOCAB, hidden_size=16, intermediate_size=24, num_layers=1, num_heads=2, num_kv_heads=1)
    wrong = str(tmp_path / "wrong.npz")
    stacked = jax.tree_util.tree_map(lambda x: np.asarray(x)[None], _random_params(other, seed=0))
    candidate_policies.save_stack(wrong, stacked, [0])
    cases.append((dict(workdir=workdir, policy=wrong), r"--policy=.*wrong.npz.*the policy template has"))
    for kwargs, message in cases:
        with pytest.raises(InputError, match=message) as error:
            export.export_run(cfg, **kwargs)
        assert "\n" not in str(error.value)
    with pytest.raises(InputError, match="--policy applies to --mode=export only"):
        run(cfg, workdir, "final", policy=wrong)


def test_launcher_export_of_a_directory_without_policies_exits_2_with_one_line(tmp_path, capsys):
    """launch/run.py's flags and main in this process; a user error through the launcher as a
    process (exit status 2, one line, no traceback) is tests/test_mesh_errors.py's."""
    from test_launch import invoke, load_launcher

    try:
        with pytest.raises(SystemExit) as exited:
            invoke(load_launcher(), "--mode=export", f"--workdir={tmp_path}")
    finally:
        flags.FLAGS.unparse_flags()
    assert exited.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch/run.py: error: --workdir=") and (
        "holds no final_policy.npz" in lines[0])
    assert os.listdir(tmp_path) == []   # nothing written in the run directory


@pytest.mark.slow
def test_a_trained_scratch_policy_is_kept_as_hugging_face_and_exported_again(tmp_path):
    # arith smoke: a scratch policy trained 2 final steps, kept; its final_policy_hf/ loads in
    # transformers with our logits, and --mode=export writes the same tensors again
    from configs import arith
    from derl_jax.experiment import build, protocol
    from safetensors.numpy import load_file

    cfg = arith.get_config("smoke")
    domain = build.build_domain(cfg)
    base_params, evaluator = build.build_inner(domain, cfg, str(tmp_path / "run"), host_cores=1)
    keep = tmp_path / "run" / "derl" / "seed_0"
    keep.mkdir(parents=True)
    final = protocol.train_final("g1", domain, evaluator, protocol.run_keys(0)["final"], base_params, str(keep))
    target = str(keep / export.FINAL_POLICY_HF_DIR)
    assert sorted(os.listdir(target)) == [hf.CONFIG_FILE, hf.SINGLE_WEIGHTS_FILE]   # a character tokenizer
    config = tr.config_of(evaluator.graphdef, final.params)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (2, 9))
    np.testing.assert_allclose(_theirs(target, tokens), _ours(config, final.params, tokens), atol=1e-5, rtol=0)
    first = load_file(os.path.join(target, hf.SINGLE_WEIGHTS_FILE))
    shutil.rmtree(target)
    assert run(cfg, str(tmp_path / "run"), "export") == [target]
    again = load_file(os.path.join(target, hf.SINGLE_WEIGHTS_FILE))
    assert first.keys() == again.keys()
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])


def test_a_checkpoint_we_cannot_run_is_refused_before_anything_is_built(tmp_path, checkpoint_run):
    from configs import arith

    _, _, checkpoint, _, _ = checkpoint_run
    bad = str(tmp_path / "yarn")
    shutil.copytree(checkpoint, bad)
    with open(os.path.join(bad, hf.CONFIG_FILE)) as f:
        config = json.load(f)
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    with open(os.path.join(bad, hf.CONFIG_FILE), "w") as f:
        json.dump(config, f)
    no_weights = str(tmp_path / "no_weights")
    shutil.copytree(checkpoint, no_weights, ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = arith.get_config("smoke")
    for path, message in ((bad, "rope_type 'yarn' is not supported"), (no_weights, "has no weights")):
        cfg.policy.checkpoint = path
        workdir = tmp_path / f"run_{os.path.basename(path)}"
        with pytest.raises(InputError, match=f"^config.policy.checkpoint='{path}': .*{message}") as error:
            run(cfg, str(workdir), "final", expression="g1")
        assert "\n" not in str(error.value) and not workdir.exists()
