"""The inner loop (derl_jax.rl.loop, derl_jax.rl.device_evaluator): K GRPO policies under K reward programs in one call.

One K=3 training from the small SFT base policy (tests/test_sft.py) is shared by most
tests: outcome only, outcome + format terms, and a program that is NaN everywhere. It runs
with loop dispatch (one compiled single-policy `train` and `accuracy`, which the accuracy
tests share); the slow tier checks that batched dispatch trains the same candidates.
Everything compiles with a low XLA optimisation level (compile time dominates these tests;
the level changes speed, not results).
"""

from __future__ import annotations

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from derl_jax.expr import compile_expr, parse, stack_programs
from derl_jax.models import transformer
from derl_jax.rl import device_evaluator, placement, rollout, setup
from derl_jax.rl.config import InnerConfig, inner_config, progress
from derl_jax.rl.grpo import GRPOConfig
from test_inner_sharding import INNER as TINY_INNER
from test_inner_sharding import KEY as TINY_KEY
from test_inner_sharding import setup as tiny_setup
from test_inner_sharding import untrained_setup as tiny_untrained_setup
from test_inner_sharding import unsharded_results as tiny_unsharded_results
from test_sft import greedy_texts, reference_correct, small_base_policy

FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
STEPS = 8   # validation accuracy goes from 0.07 to 0.3-0.4 in 8 steps on every key tried (the test asks +0.05)
INNER = InnerConfig(steps=STEPS, prompts_per_step=8, group_size=4, max_new_tokens=28,
                          grpo=GRPOConfig(learning_rate=3e-4), eval_batch_size=64)
EXPRESSIONS = ("g1", "g1 + 0.5*g2*g3", "g1/(g2-g2)")
ROLLOUTS = INNER.prompts_per_step * INNER.group_size
KEY = jax.random.key(7)


def arith_run_config(preset=None):
    """A preset of configs/arith.py, loaded by path as the launcher does."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "arith.py")
    spec = importlib.util.spec_from_file_location("arith_run_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(preset)


def programs_of(texts, names):
    return stack_programs([compile_expr(parse(text, list(names))) for text in texts])


def leaves(tree):
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]


def row(tree, index):
    return jax.tree_util.tree_map(lambda x: x[index], tree)


def assert_trees_close(a, b, rtol=2e-4, atol=1e-4):
    """Two trainings of the same policy agree. Adam's normalised step turns float noise in a
    near-zero gradient entry into a difference of up to the learning rate (3e-4) per step in that
    weight, so a few weights may differ by more than float32 rounding; atol allows a third of it."""
    for x, y in zip(leaves(a), leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=atol)


def assert_same_training(got, want):
    """Two evaluations of the same candidates trained alike (gradients flowed in `got`)."""
    assert np.all(got.curves["grad_norm"].max(axis=1) > 0)
    np.testing.assert_allclose(got.scores, want.scores, atol=1e-6)
    assert_trees_close(got.params, want.params)
    assert set(got.curves) == set(want.curves)
    for name, values in got.curves.items():
        np.testing.assert_allclose(values, want.curves[name], rtol=2e-4, atol=2e-5, err_msg=name)


@pytest.fixture(scope="module")
def base():
    return small_base_policy()


@pytest.fixture(scope="module")
def evaluator(base):
    return device_evaluator.DeviceEvaluator(base.domain, base.graphdef, INNER, dispatch="loop",
                                            compiler_options=FAST_COMPILE)


@pytest.fixture(scope="module")
def programs(base):
    return programs_of(EXPRESSIONS, base.domain.primitive_names)


@pytest.fixture(scope="module")
def results(base, evaluator, programs):
    return evaluator.evaluate_candidates(programs, base.params, KEY, base.inner_train, base.validation)


# ----------------------------------------------------------------------------- one K=3 run


@pytest.mark.slow
def test_results_have_one_row_per_candidate_and_step(base, evaluator, results):
    assert results.scores.shape == (3,) and results.scores.dtype == np.float32
    assert set(results.curves) == set(evaluator.search_loop.metric_names)
    assert {f"primitive/{n}" for n in base.domain.primitive_names} <= set(results.curves)
    for name, curve in results.curves.items():
        assert curve.shape == (3, STEPS), name
    for leaf, template in zip(leaves(results.params), leaves(base.params), strict=True):
        assert leaf.shape == (3, *template.shape)
    curves = results.curves
    # the outcome-only reward is the correct primitive itself
    np.testing.assert_allclose(curves["reward_mean"][0], curves["primitive/correct"][0], atol=1e-6)
    # g1 <= g1 + 0.5*g2*g3 <= g1 + 0.5 for primitives in {0, 1}
    assert np.all(curves["reward_mean"][1] >= curves["primitive/correct"][1] - 1e-6)
    assert np.all(curves["reward_mean"][1] <= curves["primitive/correct"][1] + 0.5 + 1e-6)
    assert np.all((curves["response_length"] >= 1) & (curves["response_length"] <= INNER.max_new_tokens))
    assert np.all(curves["clip_fraction"] >= 0) and np.all(curves["clip_fraction"] <= 1)
    np.testing.assert_allclose(curves["kl"][:, 0], 0.0, atol=1e-6)  # step 0 updates the reference itself
    np.testing.assert_allclose(curves["kl"][2], 0.0, atol=1e-6)  # the NaN program never moves the policy


def test_item_scores_are_each_examples_greedy_success_and_average_to_the_accuracy(base, evaluator):
    items = evaluator.item_scores(base.params, base.validation)
    assert items.shape == (base.validation.size,) and set(np.unique(items)) <= {0.0, 1.0}
    assert evaluator.accuracy(base.params, base.validation) == pytest.approx(float(items.mean()), abs=1e-7)
    # the same policy on the rows in another order (the same shapes: no new compilation)
    order = np.random.default_rng(0).permutation(base.validation.size)
    np.testing.assert_array_equal(evaluator.item_scores(base.params, base.validation.take(order)), items[order])


def test_nan_program_gives_zero_rewards_counted_and_no_update(base, results):
    curves = results.curves
    np.testing.assert_array_equal(curves["nonfinite"][2], ROLLOUTS)
    np.testing.assert_array_equal(curves["nonfinite"][:2], 0)
    np.testing.assert_array_equal(curves["reward_mean"][2], 0.0)
    np.testing.assert_array_equal(curves["grad_norm"][2], 0.0)
    assert all(np.all(np.isfinite(leaf)) for leaf in leaves(results.params))
    # zero advantages everywhere: the policy never moves
    for trained, initial in zip(leaves(row(results.params, 2)), leaves(base.params), strict=True):
        np.testing.assert_array_equal(trained, initial)


def test_grpo_on_the_outcome_raises_validation_accuracy(base, evaluator, results):
    before = evaluator.accuracy(base.params, base.validation)
    after = float(results.scores[0])
    print(f"greedy validation accuracy: base {before:.3f}, after {STEPS} GRPO steps on g1 {after:.3f}, "
          f"on {EXPRESSIONS[1]} {results.scores[1]:.3f}")
    assert after >= before + 0.05
    # the format reward helps too; the NaN program's policy is the base policy
    assert results.scores[1] >= before + 0.05
    assert results.scores[2] == pytest.approx(before)


def test_accuracy_matches_a_text_level_reference(base, evaluator):
    validation = base.validation
    answers = np.asarray(validation.context["answer_value"])
    texts = greedy_texts(base, validation)
    reference = np.mean([reference_correct(t, a) for t, a in zip(texts, answers)])
    assert evaluator.accuracy(base.params, validation) == pytest.approx(reference, abs=1e-6)


@pytest.mark.slow
def test_vmapped_candidates_equal_separate_train_calls(base, evaluator, programs, results):
    # `results` trained each candidate with its own `train` call (loop dispatch)
    assert evaluator.cache_sizes()["train"] == 1  # one compilation for the three programs
    batched = evaluator.with_dispatch("batched").evaluate_candidates(programs, base.params, KEY, base.inner_train,
                                                                     base.validation)
    assert np.all(results.curves["grad_norm"][:2].max(axis=1) > 0)
    np.testing.assert_allclose(batched.scores, results.scores, atol=1e-6)
    assert_trees_close(batched.params, results.params)
    assert set(batched.curves) == set(results.curves)
    for name, values in batched.curves.items():
        np.testing.assert_allclose(values, results.curves[name], rtol=2e-4, atol=2e-5, err_msg=name)
    assert evaluator.cache_sizes()["train_many"] == 1
    # train_final with candidate k's key is candidate k of the loop
    keys = evaluator.candidate_keys(KEY, 3)
    params, curves = evaluator.train_final(row(programs, 1), base.params, keys[1], base.inner_train)
    for a, b in zip(leaves(params), leaves(row(results.params, 1)), strict=True):
        np.testing.assert_array_equal(a, b)
    for name, curve in curves.items():
        np.testing.assert_array_equal(curve, results.curves[name][1], err_msg=name)
    assert evaluator.cache_sizes()["train"] == 1  # the compilation the loop made serves `train_final`


@pytest.mark.slow
@pytest.mark.parametrize("chunk_size, kl_metric", [(2, False)])
def test_chunked_equals_fully_vmapped(chunk_size, kl_metric):
    # K=3 padded to 4: two chunks of two candidates, the padding copy dropped
    # the tiny SFT policy of the sharding tests: cheap to compile, and its rollouts differ in reward
    domain, graphdef, params, programs, train, validation = tiny_setup()
    vmapped = tiny_unsharded_results()
    cfg = TINY_INNER.replace(chunk_size=chunk_size, kl_metric=kl_metric)
    chunked = device_evaluator.DeviceEvaluator(domain, graphdef, cfg, compiler_options=FAST_COMPILE)
    results = chunked.evaluate_candidates(programs, params, TINY_KEY, train, validation)
    assert np.all(vmapped.curves["grad_norm"].max(axis=1) > 0)
    np.testing.assert_allclose(results.scores, vmapped.scores, atol=1e-6)
    assert_trees_close(results.params, vmapped.params)
    # without the KL metric (kl_coef is 0) nothing but the "kl" curve changes
    assert set(results.curves) == set(vmapped.curves) - ({"kl"} if not kl_metric else set())
    for name, values in results.curves.items():
        np.testing.assert_allclose(values, vmapped.curves[name], rtol=2e-4, atol=2e-5, err_msg=name)


@pytest.mark.slow
def test_replaying_the_decode_products_trains_as_recomputing_them(monkeypatch):
    # by default the update replays the products the decode kept (rollout.keeps_products); with
    # their budget at 0 it recomputes them: the same training up to float rounding
    domain, graphdef, params, programs, train, validation = tiny_setup()
    config, rows, prompt_tokens = transformer.config_of(graphdef, params), TINY_INNER.rollouts_per_step, train.prompts.shape[1]
    assert rollout.keeps_products(config, TINY_INNER, rows, prompt_tokens)
    replayed = tiny_unsharded_results()
    monkeypatch.setattr(rollout, "PRODUCTS_MAX_BYTES", 0)
    assert not rollout.keeps_products(config, TINY_INNER, rows, prompt_tokens)
    evaluator = device_evaluator.DeviceEvaluator(domain, graphdef, TINY_INNER, compiler_options=FAST_COMPILE)
    recomputed = evaluator.evaluate_candidates(programs, params, TINY_KEY, train, validation)
    assert_same_training(recomputed, replayed)


@pytest.mark.slow
def test_the_single_dot_library_option_trains_as_the_default_fusions():
    # what a run on CPU compiles a single-turn loop with (rl.setup.make_evaluator)
    options = placement.compiler_options_for("device", "cpu")
    assert options == placement.SINGLE_DOT_LIBRARY_OPTIONS
    domain, graphdef, params, programs, train, validation = tiny_setup()
    default = tiny_unsharded_results()
    evaluator = device_evaluator.DeviceEvaluator(domain, graphdef, TINY_INNER,
                                                 compiler_options={**FAST_COMPILE, **options})
    single_dot = evaluator.evaluate_candidates(programs, params, TINY_KEY, train, validation)
    assert_same_training(single_dot, default)


def test_the_single_dot_library_option_keeps_reductions_out_of_the_library():
    # a product summed over keys, as one query's attention output: by default XLA:CPU gives the
    # fused multiply-and-reduce to its library; with the option only matmuls go there
    def weighted_sum(weights, values):
        return jnp.sum(weights[..., None] * values[:, :, None], axis=-2), weights @ values[0, 0]

    args = (jnp.ones((8, 2, 2, 32)), jnp.ones((8, 2, 32, 16)))
    library_fusions = {}
    for name, options in (("default", {}), ("single dot", placement.compiler_options_for("device", "cpu"))):
        text = jax.jit(weighted_sum).lower(*args).compile(options).as_text()
        fusions = [line for line in text.splitlines() if '"kind":"__ynn_fusion"' in line]
        library_fusions[name] = sorted("reduce" in line.split("op_name=")[1].split("/")[-1] for line in fusions)
    if not library_fusions["default"]:
        pytest.skip("this jaxlib's XLA:CPU gives nothing to its library by default")
    assert True in library_fusions["default"]  # the reduction went to the library
    assert library_fusions["single dot"] == [False]  # only the matmul did


def test_compiler_options_are_set_for_single_turn_loops_on_cpu_only():
    single_dot = placement.SINGLE_DOT_LIBRARY_OPTIONS
    assert placement.compiler_options_for("device", "cpu", "0.10.2") == single_dot
    assert placement.compiler_options_for("device", "cpu", "0.8.1") == single_dot
    assert placement.compiler_options_for("device", "cpu", "0.8.0") == {}  # its XLA lacks the option
    assert placement.compiler_options_for("device", "cpu", "0.4.35") == {}
    for rollout_kind, platform in (("env", "cpu"), ("host", "cpu"), ("device", "gpu"), ("device", "tpu")):
        assert placement.compiler_options_for(rollout_kind, platform, "0.10.2") == {}


def test_the_decode_keeps_its_products_only_for_one_update_at_the_sampling_params():
    config = transformer.tiny_config(21, hidden_size=64, intermediate_size=128, num_heads=4, num_kv_heads=2)
    keeps = rollout.keeps_products
    assert keeps(config, INNER, ROLLOUTS, 7)
    assert not keeps(config, INNER.replace(grpo=GRPOConfig(epochs=2)), ROLLOUTS, 7)
    assert not keeps(config, INNER.replace(grpo=GRPOConfig(minibatches=2)), ROLLOUTS, 7)
    assert not keeps(config.replace(remat=True), INNER, ROLLOUTS, 7)
    assert not keeps(config, INNER.replace(max_new_tokens=1), ROLLOUTS, 7)
    # per fed token (27 after 7 prompt tokens) and layer: q/k/v 128, attention output 64, output
    # projection 64, gate/up 256 and down 64 floats, and 4 heads' probabilities over 34 keys
    per_row = 27 * 2 * 4 * (128 + 64 + 64 + 256 + 64 + 4 * 34)
    assert keeps(config, INNER, rollout.PRODUCTS_MAX_BYTES // per_row, 7)
    assert not keeps(config, INNER, rollout.PRODUCTS_MAX_BYTES // per_row + 1, 7)


def test_the_single_turn_scratch_has_the_shapes_of_the_products_it_is_replaced_by():
    # the loop carries update_batch["products"] into the next step's decode as its scratch: the
    # two must be the same tree of shapes; no scratch where the decode keeps no products
    domain, graphdef, params, train = tiny_untrained_setup()
    rows = TINY_INNER.rollouts_per_step
    batch = train.take(jnp.repeat(jnp.arange(TINY_INNER.prompts_per_step), TINY_INNER.group_size))
    device = rollout.single_turn(domain, graphdef, TINY_INNER)
    scratch = device.scratch(params, rows, batch.prompts.shape[1])
    assert scratch is not None and len(scratch) == transformer.config_of(graphdef, params).num_layers
    # one compiled decode: what it leaves in the buffers is the same whatever they held before,
    # the loop's first (zeroed) scratch or garbage
    garbage = jax.tree_util.tree_map(lambda a: jnp.full(a.shape, 3.0, a.dtype), scratch)
    decode = jax.jit(device.fn, static_argnums=3)
    _, update_batch = decode(params, batch, TINY_KEY, False, garbage)
    _, fresh = decode(params, batch, TINY_KEY, False, scratch)
    assert all(not np.any(np.asarray(leaf)) for leaf in jax.tree_util.tree_leaves(scratch))
    assert jax.tree_util.tree_structure(update_batch["products"]) == jax.tree_util.tree_structure(scratch)
    for got, want, like in zip(*map(jax.tree_util.tree_leaves, (update_batch["products"], fresh["products"], scratch))):
        assert got.shape == like.shape and got.dtype == like.dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    epochs = TINY_INNER.replace(grpo=GRPOConfig(epochs=2))
    assert rollout.single_turn(domain, graphdef, epochs).scratch(params, rows, batch.prompts.shape[1]) is None


@pytest.mark.slow
def test_common_random_numbers_make_affine_equivalent_rewards_train_alike():
    # group-normalised advantages do not change under r -> a*r + b (a > 0): with one shared key
    # the two candidates train the same policy; with split keys they see different rollouts
    domain, graphdef, params, _, train, validation = tiny_setup()
    programs = programs_of(("g1 + g2", "2*(g1 + g2) + 1", "g1 + g2"), domain.primitive_names)
    shared = device_evaluator.DeviceEvaluator(domain, graphdef, TINY_INNER, compiler_options=FAST_COMPILE)
    assert TINY_INNER.common_random_numbers
    together = shared.evaluate_candidates(programs, params, TINY_KEY, train, validation)
    assert_trees_close(row(together.params, 0), row(together.params, 1))
    np.testing.assert_allclose(together.curves["primitive/correct"][0], together.curves["primitive/correct"][1],
                               atol=1e-6)
    split = device_evaluator.DeviceEvaluator(domain, graphdef, TINY_INNER.replace(common_random_numbers=False),
                                 compiler_options=FAST_COMPILE)
    apart = split.evaluate_candidates(programs, params, TINY_KEY, train, validation)
    assert not np.array_equal(apart.curves["response_length"][0], apart.curves["response_length"][2])
    keys = split.candidate_keys(TINY_KEY, 3)
    assert_trees_close(row(apart.params, 2), split.train_final(row(programs, 2), params, keys[2], train)[0])


@pytest.mark.slow
def test_same_seed_same_result_and_programs_are_data(base, evaluator, results):
    compiled = evaluator.cache_sizes()
    assert compiled["train"] == 1 and compiled["accuracy"] == 1
    texts = (EXPRESSIONS[0], "g1*g2 - 0.1", "max(g1, u*g3)")
    other = evaluator.evaluate_candidates(programs_of(texts, base.domain.primitive_names), base.params, KEY,
                                          base.inner_train, base.validation)
    assert evaluator.cache_sizes() == compiled  # new expressions: no new compilation
    # candidate 0 has the same program and key as before: the same policy, bit for bit
    for a, b in zip(leaves(row(other.params, 0)), leaves(row(results.params, 0)), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(other.curves["reward_mean"][0], results.curves["reward_mean"][0])
    assert other.scores[0] == results.scores[0]
    assert not np.array_equal(other.curves["reward_mean"][1:], results.curves["reward_mean"][1:])


def test_every_primitive_carries_signal_in_the_base_policys_rollouts(base, results):
    step_zero = {name: results.curves[f"primitive/{name}"][:, 0].mean() for name in base.domain.primitive_names}
    print("primitive means over the base policy's first rollouts:", step_zero)
    assert all(0.05 < value < 0.95 for value in step_zero.values())


# ----------------------------------------------------------------------------- small pieces


def test_map_candidates_chunks_keep_the_candidate_order():
    def fn(x, y):
        return {"sum": x["a"] * 10 + y, "pair": jnp.stack([x["a"], x["b"]])}

    xs = {"a": jnp.arange(6.0), "b": -jnp.arange(6.0)}
    full = placement.map_candidates(fn, (0, None), 0, None)(xs, 1.0)
    for chunk in (1, 2, 3, 6):
        chunked = jax.jit(placement.map_candidates(fn, (0, None), chunk, None))(xs, 1.0)
        for name in full:
            np.testing.assert_array_equal(np.asarray(chunked[name]), np.asarray(full[name]))
    np.testing.assert_array_equal(np.asarray(full["sum"]), np.arange(6.0) * 10 + 1)
    with pytest.raises(ValueError, match="6 candidates do not split into chunks of chunk_size=4"):
        placement.map_candidates(fn, (0, None), 4, None)(xs, 1.0)


def test_padded_count():
    assert [placement.padded_count(k, 0, 1) for k in (1, 2, 3)] == [1, 2, 3]
    assert [placement.padded_count(k, 4, 1) for k in (1, 4, 5)] == [4, 4, 8]
    assert [placement.padded_count(k, 0, 4) for k in (1, 3, 5)] == [4, 4, 8]
    assert placement.padded_count(3, 8, 4) == 8


def test_bad_inputs_are_named(base, evaluator, programs):
    with pytest.raises(ValueError, match="InnerConfig.group_size=0"):
        INNER.replace(group_size=0)
    with pytest.raises(ValueError, match="minibatches=3 must divide the 32 rollouts"):
        INNER.replace(grpo=GRPOConfig(minibatches=3))
    stacked = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), base.params)
    with pytest.raises(ValueError, match="init_params must be one policy"):
        evaluator.evaluate_candidates(programs, stacked, KEY, base.inner_train, base.validation)
    with pytest.raises(ValueError, match="init_params must be one policy"):
        evaluator.with_dispatch("loop").evaluate_candidates(programs, stacked, KEY, base.inner_train, base.validation)
    with pytest.raises(ValueError, match="dispatch must be one of"):
        evaluator.with_dispatch("threads")
    with pytest.raises(ValueError, match="programs must be a stacked Program"):
        evaluator.evaluate_candidates(row(programs, 0), base.params, KEY, base.inner_train, base.validation)
    with pytest.raises(ValueError, match="one policy has ranks"):
        placement.params_candidate_axis(base.graphdef, jax.tree_util.tree_map(lambda x: x[None, None], base.params))


def test_inner_config_from_the_run_config():
    from derl_jax.domains.arith import make_arith_domain

    cfg = arith_run_config()
    domain = make_arith_domain(cfg.domain)
    built = inner_config(cfg, domain.max_new_tokens)
    assert (built.steps, built.prompts_per_step, built.group_size) == (cfg.inner.steps, cfg.inner.prompts_per_step,
                                                                      cfg.inner.group_size)
    assert built.grpo.learning_rate == cfg.inner.lr and built.grpo.kl_coef == cfg.inner.kl
    assert built.grpo.group_size == cfg.inner.group_size and built.final_steps == cfg.final.steps
    assert built.max_new_tokens == domain.max_new_tokens and built.chunk_size == cfg.inner.chunk_size
    assert built.common_random_numbers is cfg.inner.common_random_numbers
    cfg.inner.common_random_numbers = False
    cfg.inner.clip_low, cfg.inner.clip_high, cfg.inner.max_grad_norm = 0.1, 0.3, 0.0
    built = inner_config(cfg, domain.max_new_tokens)
    assert not built.common_random_numbers
    assert (built.grpo.clip_low, built.grpo.clip_high, built.grpo.max_grad_norm) == (0.1, 0.3, None)
    del cfg.inner["lr"]
    with pytest.raises(ValueError, match="config.inner.lr is missing"):
        inner_config(cfg, domain.max_new_tokens)


def test_progress_is_exactly_zero_first_and_one_last():
    for steps in (2, 3, 7, 24, 1000):
        values = [progress(step, steps) for step in range(steps)]
        assert values[0] == 0.0 and values[-1] == 1.0
        assert all(b > a for a, b in zip(values, values[1:]))
        traced = jax.jit(lambda s, n=steps: progress(s.astype(jnp.float32), n))
        assert float(traced(jnp.int32(0))) == 0.0 and float(traced(jnp.int32(steps - 1))) == 1.0
    assert progress(0, 1) == 0.0
    with pytest.raises(ValueError, match="steps must be >= 1"):
        progress(0, 0)


def test_run_level_evaluator_and_base_policy(tmp_path, monkeypatch):
    import json

    from derl_jax.domains.arith import make_arith_domain
    from derl_jax.domains.base import split_train
    from derl_jax.models.transformer import abstract_model
    from derl_jax.rl import sft

    cfg = arith_run_config("smoke")
    domain = make_arith_domain(cfg.domain)
    graphdef, _ = abstract_model(sft.policy_model_config(domain, cfg.policy))
    evaluator = setup.make_evaluator(domain, graphdef, cfg)
    assert evaluator.dispatch == "loop"  # "auto" on one CPU device
    assert evaluator.compiler_options == placement.compiler_options_for("device", "cpu")
    assert evaluator.final_loop.cfg.steps == cfg.final.steps and evaluator.cfg.steps == cfg.inner.steps
    cfg.mesh.data = 2
    split = setup.make_evaluator(domain, graphdef, cfg)
    assert split.dispatch == "loop" and dict(split.mesh.shape) == {"cand": 1, "data": 2, "model": 1}
    cfg.mesh.data = 1
    cfg.mesh.cand = 2
    assert setup.make_evaluator(domain, graphdef, cfg).dispatch == "batched"
    cfg.mesh.cand = 1
    cfg.inner.dispatch = "batched"
    assert setup.make_evaluator(domain, graphdef, cfg).dispatch == "batched"

    # the base policy's corpus leaves out exactly the validation rows of the run's split
    rows = setup.validation_rows(domain.train.size, cfg.outer.split_seed)
    _, validation = split_train(domain.train, cfg.outer.split_seed)
    np.testing.assert_array_equal(np.asarray(domain.train.take(rows).prompts), np.asarray(validation.prompts))
    seen = []
    monkeypatch.setattr(sft, "train_sft", lambda g, p, data, c: (seen.append(data.size), (p, jnp.zeros(c.steps)))[1])
    _, params = setup.base_policy(domain, cfg, tmp_path)
    assert seen == [domain.train.size - rows.size]
    (record,) = [json.load(open(path)) for path in (tmp_path / "base_policy").glob("*.json")]
    assert record["held_out_rows"] == rows.size and record["corpus_size"] == seen[0]
    assert placement.params_candidate_axis(evaluator.graphdef, params) is None
