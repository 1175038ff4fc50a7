"""What the planner's memory figures stand on: the share of device memory JAX gets, the
checkpoint's own shape (or a line saying which one was assumed), untied embeddings, the
Meta-Optimizer, and the trained copies the host loop keeps on the devices."""

from __future__ import annotations

import functools
import json

import pytest

from configs import math as math_config
from derl_jax.experiment.runtime import memory_note
from derl_jax.models import hf
from derl_jax.models import transformer as tr
from derl_jax.plan import analytic, report, roofline

GIB = 1 << 30
TINY_HF = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 96, "hidden_size": 16,
           "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 256, "hidden_act": "silu"}


def write_checkpoint_config(directory, **changes) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**TINY_HF, **changes}))
    return str(directory)


def math_cfg(**policy):
    cfg = math_config.get_config()
    cfg.policy.update(**policy)
    return cfg


@pytest.mark.parametrize("environ, fraction", [
    ({}, 0.75),
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, 0.75),       # on demand, up to the same limit
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".95"}, 0.95),
    ({"XLA_CLIENT_MEM_FRACTION": "0.5", "XLA_PYTHON_CLIENT_MEM_FRACTION": ".95"}, 0.5),   # the newer name first
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, 1.0),
])
def test_memory_fraction_is_read_from_the_environment(environ, fraction):
    assert roofline.memory_fraction(environ)[0] == fraction


def test_a_bad_memory_fraction_names_the_variable():
    with pytest.raises(ValueError, match=r"XLA_PYTHON_CLIENT_MEM_FRACTION='1.5' must be a number in \(0, 1\]"):
        roofline.memory_fraction({"XLA_PYTHON_CLIENT_MEM_FRACTION": "1.5"})


def test_the_plan_fits_against_the_fraction_it_reports():
    cfg = math_cfg()
    cfg.mesh.update(cand=2, data=4, model=1)
    peak = report.plan_from_config(cfg, ("h200",), environ={})["plans"][0]["peak_bytes"]
    # an accelerator whose memory puts the peak between 75% and 95% of it
    device = roofline.Accelerator("test", 1e15, 1e12, peak / 0.85)
    results = {}
    for fraction in ("0.75", "0.95"):
        result = report.plan_from_config(cfg, (device,), environ={"XLA_PYTHON_CLIENT_MEM_FRACTION": fraction})
        (planned,) = result["plans"]
        assert planned["usable_bytes"] == pytest.approx(float(fraction) * device.memory)
        assert f"JAX's allocator gets {float(fraction):.0%} of each device (XLA_PYTHON_CLIENT_MEM_FRACTION=" \
               f"{fraction})" in result["table"]
        results[fraction] = planned["fits"]
    assert results == {"0.75": False, "0.95": True}


def test_the_launcher_reports_the_fraction_on_gpus_only():
    assert memory_note("gpu", {}).startswith("GPU memory: JAX's allocator takes 75% of each device")
    assert "60%" in memory_note("gpu", {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.6"})
    assert memory_note("cpu", {}) is None


def torch_parameter_count(config: dict) -> int:
    """The parameters of the same config as a transformers Qwen2 model (the independent count)."""
    transformers = pytest.importorskip("transformers")
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**config))
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("tied", [True, False])
def test_the_checkpoints_config_json_is_planned_with_its_embeddings(tmp_path, tied):
    path = write_checkpoint_config(tmp_path / "ckpt", tie_word_embeddings=tied)
    cfg = math_cfg(checkpoint=path)
    shape = report.shape_from_config(cfg)
    assert shape.model == hf.config_from_hf(hf.read_hf_config(path), param_dtype="float32",
                                            compute_dtype=shape.model.dtype, remat=True)
    assert shape.model.tie_embeddings is tied
    assert analytic.param_count(shape.model) == torch_parameter_count({**TINY_HF, "tie_word_embeddings": tied})
    one_policy = analytic.param_count(shape.model) * 4
    assert analytic.per_device(shape)["params"] == one_policy * (1 + analytic.trained_copies(shape))
    assert report.policy_source(cfg, shape.model).startswith(f"policy shape: {path}/config.json, ")


def test_a_missing_checkpoint_says_which_shape_it_planned(capsys):
    from derl_jax.experiment.run import plan_run

    plan_run(math_cfg(checkpoint="/nonexistent/Qwen2.5-7B"), ("h100",))
    out = capsys.readouterr().out
    line = ("policy shape: /nonexistent/Qwen2.5-7B not found, so planned the policy.* sizes (3.09B parameters: "
            "hidden 2048, 36 layers, 16 heads (2 kv), vocabulary 151,936, tied embeddings)")
    assert line in out.splitlines()


def test_the_meta_optimizer_is_counted_when_the_run_has_one(tmp_path):
    cfg = math_cfg()
    shape = report.shape_from_config(cfg)
    assert shape.meta == tr.qwen2_5_0_5b(param_dtype="float32")   # hf_path not on disk: the paper's 0.5B
    # parameters + reference copy + two AdamW moments, f32, plus AdamW's two int32 counters
    assert analytic.per_device(shape)["meta"] == 4 * 494_032_768 * 4 + 8
    assert analytic.per_device(shape)["meta"] / GIB == pytest.approx(7.36, abs=0.01)
    halved = analytic.per_device(shape.replace(mesh=(1, 1, 2)))["meta"]
    assert halved == 4 * analytic.param_bytes(shape.meta, 2) + 8 < analytic.per_device(shape)["meta"]
    with_meta = analytic.peak_bytes_estimate(shape)
    assert with_meta - analytic.peak_bytes_estimate(shape.replace(meta=None)) == analytic.per_device(shape)["meta"]

    cfg.meta.hf_path = write_checkpoint_config(tmp_path / "meta", tie_word_embeddings=False)
    model, line = report.meta_model_from_run(cfg)
    assert model.vocab_size == 96 and not model.tie_embeddings and "meta/config.json shape" in line

    baselines = math_cfg()
    baselines.outer.strategy = "outcome"
    baselines.compare.methods = ("outcome", "average")
    model, line = report.meta_model_from_run(baselines)
    assert model is None and line.startswith("Meta-Optimizer: none on the devices")
    assert analytic.per_device(report.shape_from_config(baselines))["meta"] == 0


def test_the_host_loop_holds_the_candidates_in_flight_not_every_candidate():
    shape = report.shape_from_config(math_cfg())        # MATH scores on the host; 8 candidates, chunk 1
    assert shape.host_loop and shape.num_candidates == 8 and shape.in_flight == 1
    one = analytic.param_bytes(shape.model)
    assert analytic.per_device(shape)["params"] == 2 * one                       # starting policy + 1 in flight
    assert analytic.per_device(shape.replace(chunk_size=4))["params"] == 5 * one
    assert analytic.per_device(shape.replace(host_loop=False))["params"] == 9 * one   # device loop: every output
    assert analytic.per_device(shape.replace(mesh=(2, 1, 1), chunk_size=4))["params"] == 3 * one


def test_the_logits_term_is_reported_apart_from_the_layers():
    shape = report.PRESETS["math_3b"]()
    sizes = analytic.per_device(shape)
    rows = 64 * 5 // 4                                   # one minibatch of rollouts
    live = (1 << 30) // (rows * 151_936 * 4)             # positions per chunk of f32 logits (22 of 512)
    assert live == 22
    assert analytic.logits_bytes_estimate(shape) == 9 * rows * live * 151_936   # LOGITS_BYTES_PER_ELEMENT
    assert sizes["logits"] == 8 * analytic.logits_bytes_estimate(shape)        # all 8 candidates in flight
    split = shape.replace(mesh=(1, 2, 4))                                      # rows over 'data', vocabulary over 'model'
    assert analytic.logits_bytes_estimate(split) == 9 * (rows // 2) * live * 151_936 // 4
    short = shape.replace(new_tokens=16)                 # 80 x 16 positions fit the threshold: one pass
    assert analytic.logits_bytes_estimate(short) == 9 * rows * 16 * 151_936
    planned = report.plan(shape, "h100", fraction=0.75)
    assert planned["logits_bytes"] == sizes["logits"] and planned["meta_bytes"] == sizes["meta"]
    assert planned["peak_bytes"] == (sizes["params"] + sizes["optimizer"] + sizes["meta"]
                                     + max(sizes["kv_cache"] + sizes["sampling"],
                                           sizes["gradients"] + sizes["activations"] + sizes["logits"]))


def test_sampling_counts_the_decode_phases_copy_of_the_cache():
    """arith's shape: 32 rows of 7 prompt + 28 new tokens; the decode's phases read 16, 32, then
    all 35 slots, so a copy of the cache's first 32 slots lives beside the cache (XLA's buffer
    assignment of the compiled sampler shows it); the prefill's layer of 8 prompts is smaller."""
    model = tr.ModelConfig(vocab_size=21, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                           num_kv_heads=2, head_dim=16)
    shape = analytic.RunShape(model=model, num_candidates=8, prompts_per_step=8, group_size=4, prompt_tokens=7,
                              new_tokens=28)
    noise = 16 * 32 * 21 * 28                                        # NOISE_BYTES_PER_ELEMENT x [T, N, V]
    prefix = 2 * 2 * 32 * 2 * 32 * 16 * 4                            # L x (k, v) x rows x Kv x 32 slots x Dh x f32
    assert analytic.layer_buffers_bytes(model, 8, 7, 35) < prefix
    assert analytic.sampling_temp_bytes(shape) == noise + prefix
    short = shape.replace(new_tokens=8)                              # 15 slots: one phase reads them all
    assert analytic.sampling_temp_bytes(short) == 16 * 32 * 21 * 8 + analytic.layer_buffers_bytes(model, 8, 7, 15)


def test_the_agent_prompt_turn_counts_the_admissible_line_and_the_tail_the_rollout_appends(monkeypatch):
    from configs import alfworld as alfworld_config
    from derl_jax.domains import agent_prompt
    from derl_jax.models.hf_tokenizer import HFTokenizer, bundled_qwen_tokenizer_dir

    # the planner counts the tail in a tokenizer read from its folder several times per config: read it once
    monkeypatch.setattr(HFTokenizer, "from_directory", functools.lru_cache(maxsize=None)(HFTokenizer.from_directory))
    table = agent_prompt.load_table(bundled_qwen_tokenizer_dir())
    for preset, self_guide in ((None, False), ("self_guide", True)):
        cfg = alfworld_config.get_config(preset)
        tail = len(agent_prompt.AgentPrompt(table, "alfworld", 256, 256, self_guide=self_guide).suffix)
        assert report.agent_tail_tokens(cfg)[0] == tail
        assert report.turn_shape(cfg) == (255 + 2 * 256 + 256 + tail, 128, 50)
        assert any(line.startswith(f"agent prompt: {255 + 2 * 256 + 256 + tail:,} tokens per turn")
                   for line in report.memory_lines(cfg, report.shape_from_config(cfg), 0.75, "test"))
    cfg = alfworld_config.get_config()
    cfg.policy.prompt_style = "compact"                   # the word layout: <bos>, task, 2 x (observation + action)
    assert report.turn_shape(cfg) == (255 + 1 + 2 * (256 + 128), 128, 50)
