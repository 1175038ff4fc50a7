"""The planner: exact analytic bytes against real models, compiled FLOPs against the analytic
count, roofline arithmetic and layout suggestions."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from derl_jax.models import attention
from derl_jax.models import transformer as tr
from derl_jax.plan import analytic, compiled, report, roofline
from derl_jax.plan.analytic import RunShape
from derl_jax.rl.grpo import GRPOConfig, make_optimizer

CONFIGS = [
    tr.tiny_config(96, hidden_size=32, intermediate_size=80, num_layers=2, num_heads=4, num_kv_heads=2),
    tr.tiny_config(50, hidden_size=24, intermediate_size=40, num_layers=3, num_heads=6, num_kv_heads=3,
                   head_dim=10, tie_embeddings=False, dtype="bfloat16", param_dtype="bfloat16"),
]


def nbytes(tree) -> int:
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(tree))


@pytest.mark.parametrize("config", CONFIGS, ids=["tied-f32", "untied-bf16"])
def test_parameter_optimizer_and_cache_bytes_are_exact(config):
    _, params = tr.init_params(config, jax.random.key(0))
    flat = {".".join(map(str, path)): value.shape for path, value in nnx.to_flat_state(params)}
    assert flat == {name: shape for name, (shape, _) in analytic.param_shapes(config).items()}
    assert analytic.param_count(config) == tr.count_params(params)
    assert analytic.param_bytes(config) == nbytes(params)
    for optimizer in ("adamw", "adam", "sgd"):
        state = make_optimizer(GRPOConfig(optimizer=optimizer, weight_decay=0.0)).init(params)
        assert analytic.optimizer_bytes(config, optimizer) == nbytes(state), optimizer
    for batch, length in ((3, 7), (8, 33)):
        assert analytic.kv_cache_bytes(config, batch, length) == nbytes(attention.init_head_major_cache(config, batch, length))
        assert analytic.kv_cache_bytes(config, batch, length) == nbytes(attention.init_cache(config, batch, length))


def test_model_axis_split_matches_the_partition_specs():
    config = CONFIGS[1]  # 3 kv heads and 6 heads: a 2-way axis splits some tensors and not others
    _, params = tr.abstract_model(config)
    for model_axis in (1, 2, 3, 4):
        mesh = jax.sharding.AbstractMesh((1, 1, model_axis), ("cand", "data", "model"))
        specs = tr.param_partition_specs(params, mesh)
        leaves = jax.tree_util.tree_leaves(params)
        spec_leaves = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
        expected = sum(leaf.size * leaf.dtype.itemsize // (model_axis if "model" in tuple(spec) else 1)
                       for leaf, spec in zip(leaves, spec_leaves))
        assert analytic.param_bytes(config, model_axis) == expected


def test_qwen_shapes_have_the_published_parameter_counts():
    assert analytic.param_count(tr.qwen2_5_0_5b()) == 494_032_768
    assert analytic.param_count(tr.qwen2_5_1_5b()) == 1_543_714_304
    assert analytic.param_count(tr.qwen2_5_3b()) == 3_085_938_688


FLOP_MODEL = tr.tiny_config(1024, hidden_size=256, intermediate_size=1024, num_layers=1, num_heads=4, num_kv_heads=2)


@pytest.mark.parametrize("variant", [
    dict(),
    dict(remat=True, reference=True, minibatches=2),
], ids=["plain", "remat-reference-minibatches"])
@pytest.mark.slow
def test_compiled_flops_are_within_five_percent_of_the_analytic_count(variant):
    """XLA also counts elementwise ops (softmax, norms, the optimizer), so it is a little above the
    matmul-only count; a wrong matmul term (e.g. no remat recompute) would be 10-30% off."""
    variant = dict(variant)
    model = FLOP_MODEL.replace(remat=variant.pop("remat", False))
    shape = RunShape(model, num_candidates=3, prompts_per_step=2, group_size=4, prompt_tokens=16, new_tokens=16,
                     **variant)
    check = compiled.flop_check(shape, compiler_options={"xla_backend_optimization_level": 0})  # faster compile
    assert set(check) == {"sampling", "reference", "update", "total"}
    for name, entry in check.items():
        if entry["analytic"]:
            assert 1.0 <= entry["ratio"] < 1.05, (name, entry)
    assert (check["reference"]["analytic"] > 0) == shape.reference


def test_analytic_flops_scale_as_the_formula_says():
    shape = RunShape(FLOP_MODEL, num_candidates=2, prompts_per_step=2, group_size=4, prompt_tokens=16, new_tokens=16)
    flops = analytic.step_flops(shape)
    assert analytic.step_flops(shape.replace(num_candidates=4))["total"] == 2 * flops["total"]
    assert analytic.step_flops(shape.replace(epochs=3))["update"] == 3 * flops["update"]
    # one decode step by hand: N rows x (2 L P + 4 L H Dh S + 2 Dh^2) + N x 2 D V
    n, s = 8, 32
    p = 256 * (4 + 4) * 64 + 256 * 256 + 3 * 256 * 1024
    for layers in (1, 3):
        by_hand = n * (2 * layers * p + 4 * layers * 4 * 64 * s + 2 * 64 * 64) + n * 2 * 256 * 1024
        assert analytic.forward_flops(FLOP_MODEL.replace(num_layers=layers), n, s, n) == by_hand


def test_run_shape_rejects_bad_fields_by_name():
    with pytest.raises(ValueError, match="RunShape.group_size"):
        RunShape(FLOP_MODEL, group_size=0)
    with pytest.raises(ValueError, match="RunShape.minibatches"):
        RunShape(FLOP_MODEL, prompts_per_step=3, minibatches=2)
    with pytest.raises(ValueError, match="RunShape.chunk_size"):
        RunShape(FLOP_MODEL, num_candidates=4, chunk_size=3)


def test_roofline_time_and_fit():
    device = roofline.Accelerator("test", peak_flops=100.0, bandwidth=10.0, memory=1000.0)
    times = roofline.roofline_seconds({"sampling": 50.0, "update": 800.0, "total": 850.0},
                                      {"sampling": 40.0, "update": 10.0}, device)
    assert times == {"sampling": 4.0, "update": 8.0, "step": 12.0}
    assert roofline.fits(900, device, 0.9) and not roofline.fits(901, device, 0.9)
    assert roofline.fits(750, device, 0.75) and not roofline.fits(751, device, 0.75)


def test_accelerator_table_and_user_entries():
    assert roofline.accelerator("H100").peak_flops == 989e12
    assert roofline.accelerator("v5p").bandwidth == 2765e9
    custom = roofline.accelerator("mine:4e14:2e12:6.4e10")
    assert (custom.name, custom.peak_flops, custom.memory) == ("mine", 4e14, 6.4e10)
    roofline.register_accelerator("mine2", custom)
    assert roofline.accelerator("MINE2") is custom
    with pytest.raises(ValueError, match="unknown"):
        roofline.accelerator("h900")
    with pytest.raises(ValueError, match="4 fields"):
        roofline.accelerator("x:1:2")
    with pytest.raises(ValueError, match="bandwidth must be a positive"):
        roofline.Accelerator("x", 1.0, -1.0, 1.0)


def test_suggestion_is_the_least_model_parallel_layout_that_fits():
    shape = report.PRESETS["math_3b"]().replace(mesh=(8, 1, 1))
    device = roofline.accelerator("h100")
    assert not roofline.fits(analytic.peak_bytes_estimate(shape), device)
    choice = roofline.suggest(shape, device)
    assert choice["devices"] == 8 and math.prod(choice["mesh"]) == 8
    chosen = shape.replace(mesh=tuple(choice["mesh"]), chunk_size=choice["chunk_size"])
    assert roofline.fits(analytic.peak_bytes_estimate(chosen), device)
    for option in roofline.layouts(shape, 8):  # nothing with less model parallelism fits
        if option.mesh[2] < choice["mesh"][2]:
            assert not roofline.fits(analytic.peak_bytes_estimate(option), device)


def test_plan_of_a_preset_is_consistent():
    shape = report.PRESETS["agent_1_5b"]().replace(mesh=(8, 8, 1))
    result = report.plan(shape, "h200")
    assert result["flops_per_device"]["total"] * 64 == pytest.approx(analytic.step_flops(shape)["total"], rel=1e-9)
    assert result["params_bytes"] == 2 * analytic.param_bytes(shape.model)  # base + this device's one candidate
    assert result["fits"] == (result["peak_bytes"] <= 0.9 * 141e9)
    table = report.format_table([result])
    assert "H200 SXM" in table and "(8, 8, 1)" in table
    assert result["roofline_seconds"]["step"] >= result["flops_per_device"]["total"] / 989e12


def test_shape_from_a_run_config():
    from configs import math as math_config

    cfg = math_config.get_config()
    cfg.policy.checkpoint = "/nonexistent"
    cfg.policy.vocab_size = 151936
    cfg.mesh.update(cand=8, model=1)
    shape = report.shape_from_config(cfg)
    assert shape.model == tr.qwen2_5_3b(dtype="bfloat16", remat=True).replace(rope_theta=10000.0)  # no effect on size
    assert (shape.num_candidates, shape.rollouts, shape.prompt_tokens, shape.new_tokens) == (8, 320, 512, 512)
    assert shape.reference and shape.mesh == (8, 1, 1) and shape.minibatches == 4
    del cfg.policy["vocab_size"]
    with pytest.raises(ValueError, match="policy.vocab_size"):
        report.shape_from_config(cfg)
