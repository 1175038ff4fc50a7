"""DAPO as the inner algorithm: its settings and checks, the step's rewards, and what the loops train on.

References: NumPy reimplementations of the overlong penalty, of the group selection and of
group advantages; a GRPO update on the rows NumPy selects (device loop), a plain update on
those rows with the penalty written into a primitive (host loop); the plain GRPO loop.
"""

from __future__ import annotations

import dataclasses
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from configs import arith, common
from derl_jax.config import ConfigError
from derl_jax.expr import compile_expr, parse, stack_programs
from derl_jax.expr.vm import evaluate_numpy
from derl_jax.experiment.checks import validate_config
from derl_jax.rl import dapo, host_batches, host_loop, host_policy
from derl_jax.parallel import make_mesh
from derl_jax.rl.config import InnerConfig, check_rollout_kind, inner_config, metric_names
from derl_jax.rl.device_evaluator import DeviceEvaluator
from derl_jax.rl.grpo import GRPOConfig, grpo_update, make_optimizer
from derl_jax.rl.loop import make_inner_loop, rewards_and_advantages
from derl_jax.rl.rollout import device_rollout
from test_inner_sharding import FAST_COMPILE, INNER, KEY
from test_inner_sharding import setup as tiny_setup
from test_math_pipeline import assets, run  # noqa: F401  (module fixtures: the tiny Qwen math setup)

NAMES = ("a", "b")
score = jax.jit(rewards_and_advantages, static_argnums=(3, 4),
                static_argnames=("max_new_tokens", "overlong_buffer", "oversample"))


def program_of(text, names=NAMES):
    return compile_expr(parse(text, list(names)), num_primitives=len(names))


# ----------------------------------------------------------------------------- NumPy references


def np_penalty(lengths, limit, buffer):
    return np.clip(((limit - buffer) - np.asarray(lengths, np.float64)) / buffer, -1.0, 0.0).astype(np.float32)


def np_select(shaped, group, keep):
    """(rows, shortfall, informative fraction): informative groups first, each side in sampled order."""
    groups = np.asarray(shaped).reshape(-1, group)
    informative = groups.max(axis=1) > groups.min(axis=1)
    order = [g for g in range(len(groups)) if informative[g]] + [g for g in range(len(groups)) if not informative[g]]
    kept = np.asarray(order[:keep])
    rows = (kept[:, None] * group + np.arange(group)).reshape(-1)
    return rows, keep - min(int(informative.sum()), keep), float(informative.mean())


def np_advantages(rewards, group, eps=1e-6):
    groups = np.asarray(rewards, np.float64).reshape(-1, group)
    centred = groups - groups.mean(axis=1, keepdims=True)
    scaled = centred / (np.sqrt((centred**2).sum(axis=1, keepdims=True) / (group - 1)) + eps)
    return np.where(groups.max(axis=1, keepdims=True) == groups.min(axis=1, keepdims=True), 0.0, scaled).reshape(-1)


def prims_with_equal_groups(groups, group, seed):
    """f32[groups*G, 2] in {0, 1}: every third group all ones (its rewards all equal)."""
    prims = np.random.default_rng(seed).integers(0, 2, (groups * group, 2)).astype(np.float32)
    for g in range(0, groups, 3):
        prims[g * group:(g + 1) * group] = 1.0
    return prims


# ----------------------------------------------------------------------------- settings and checks


def test_dapo_resolves_its_settings_where_left_at_grpo_defaults():
    base = dict(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=14)
    cfg = InnerConfig(**base, algorithm="dapo")
    assert (cfg.grpo.clip_high, cfg.grpo.clip_low, cfg.dynamic_oversample, cfg.overlong_buffer) == (0.28, 0.2, 2, 3)
    assert cfg.grpo.loss_agg == "token_mean" and cfg.dynamic_sampling and cfg.sampled_per_step == 8
    assert cfg.replace() == cfg   # resolving again changes nothing
    kept = InnerConfig(**base, algorithm="dapo", grpo=GRPOConfig(clip_high=0.3), dynamic_oversample=3,
                       overlong_buffer=5)
    assert (kept.grpo.clip_high, kept.dynamic_oversample, kept.overlong_buffer) == (0.3, 3, 5)
    plain = InnerConfig(**base)
    assert (plain.algorithm, plain.grpo.clip_high, plain.dynamic_oversample, plain.overlong_buffer) == (
        "grpo", 0.2, 1, 0)
    assert not plain.dynamic_sampling and plain.sampled_per_step == plain.rollouts_per_step
    assert InnerConfig(**dict(base, max_new_tokens=3), algorithm="dapo").overlong_buffer == 1
    # from a run config's inner block
    dapo_cfg = inner_config({"inner": {**common.INNER, "algorithm": "dapo"}}, 16)
    assert (dapo_cfg.grpo.clip_high, dapo_cfg.dynamic_oversample, dapo_cfg.overlong_buffer) == (
        dapo.DAPO_CLIP_HIGH, 2, 4)
    assert dapo.GRPO_CLIP_HIGH == common.GRPO["clip_high"]


@pytest.mark.parametrize("field, value, message", [
    ("algorithm", "ppo", r"config\.inner\.algorithm must be one of \('grpo', 'dapo'\), got 'ppo'"),
    ("dynamic_oversample", 0, r"config\.inner\.dynamic_oversample must be >= 1, got 0"),
    ("dynamic_oversample", 1.5, r"config\.inner\.dynamic_oversample must be an integer"),
    ("overlong_buffer", -1, r"config\.inner\.overlong_buffer must be >= 0, got -1"),
    ("overlong_buffer", 17, r"config\.inner\.overlong_buffer must be <= domain\.max_new_tokens \(16\), got 17"),
])
def test_bad_settings_are_config_errors_naming_the_field(field, value, message):
    cfg = arith.get_config("smoke")
    assert cfg.domain.max_new_tokens == 16
    validate_config(cfg)
    blocks = cfg.to_dict()
    blocks["inner"][field] = value   # a plain dict takes any value, as an edited config file would
    with pytest.raises(ConfigError, match=message):
        validate_config(ml_collections.ConfigDict(blocks))


def test_settings_classes_check_the_same_fields():
    base = dict(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=8)
    for changes, field in (({"algorithm": "ppo"}, "algorithm"), ({"dynamic_oversample": 0}, "dynamic_oversample"),
                           ({"overlong_buffer": 9}, "overlong_buffer")):
        with pytest.raises(ValueError, match=f"InnerConfig.{field}="):
            InnerConfig(**base, **changes)


def test_every_rollout_kind_takes_dapo_and_only_episodes_take_per_turn_credit():
    base = dict(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=8)
    for kind in ("device", "host", "env"):
        check_rollout_kind(InnerConfig(**base, algorithm="dapo"), types.SimpleNamespace(name="x", rollout=kind))
    check_rollout_kind(InnerConfig(**base, self_reward_credit="turn"), types.SimpleNamespace(name="x", rollout="env"))
    single = types.SimpleNamespace(name="arith", rollout="device")
    message = r"config\.inner\.self_reward_credit='turn' needs a multi-turn domain; 'arith' has rollout 'device'"
    with pytest.raises(ConfigError, match=message):
        check_rollout_kind(InnerConfig(**base, self_reward_credit="turn"), single)
    with pytest.raises(ConfigError, match=message):   # the loop refuses before building anything
        make_inner_loop(single, None, InnerConfig(**base, self_reward_credit="turn"))


def test_metric_names_add_the_dynamic_sampling_curves_only_when_it_is_on():
    plain = metric_names(("g",), True)
    assert metric_names(("g",), True, dynamic_sampling=True) == plain + ("shortfall", "informative_fraction")
    assert "shortfall" not in plain


# ----------------------------------------------------------------------------- the step's rewards


def test_off_settings_give_plain_grpo_rewards_and_advantages():
    prims = prims_with_equal_groups(6, 4, seed=0)
    program = program_of("a + 0.5*b - u")
    got = score(program, prims, 0.5, 4, True, np.full(24, 7), max_new_tokens=8)
    rewards = evaluate_numpy(program, prims, 0.5)
    assert got.rows is None and got.stats == {}
    np.testing.assert_allclose(np.asarray(got.rewards), rewards, atol=1e-7)
    np.testing.assert_allclose(np.asarray(got.advantages), np_advantages(rewards, 4), atol=1e-5)


def test_overlong_penalty_shapes_the_rewards_the_advantages_see():
    prims = prims_with_equal_groups(3, 4, seed=1)
    lengths = np.array([2, 5, 6, 8, 8, 8, 8, 8, 1, 7, 4, 3])
    program = program_of("a + b")
    got = score(program, prims, 0.0, 4, True, lengths, max_new_tokens=8, overlong_buffer=4)
    rewards = evaluate_numpy(program, prims, 0.0)
    penalty = np_penalty(lengths, 8, 4)
    np.testing.assert_allclose(penalty, [0, -0.25, -0.5, -1, -1, -1, -1, -1, 0, -0.75, 0, 0])
    np.testing.assert_allclose(np.asarray(got.rewards), rewards)   # the program's own rewards are reported
    np.testing.assert_allclose(np.asarray(got.advantages), np_advantages(rewards + penalty, 4), atol=1e-5)
    assert not np.allclose(np.asarray(got.advantages), np_advantages(rewards, 4), atol=1e-3)


# fast: [3-4], the selection with the overlong penalty; without it (the penalty's branch skipped) the
# fast tier selects in test_all_equal_rewards_are_a_full_shortfall
@pytest.mark.parametrize("oversample, buffer", [pytest.param(2, 0, marks=pytest.mark.slow), (3, 4)])
def test_dynamic_sampling_keeps_the_groups_numpy_selects_under_jit_and_vmap(oversample, buffer):
    keep, group = 2, 3
    sampled = oversample * keep
    texts = ("a + b", "a - b*u", "a*b")
    programs = stack_programs([program_of(t) for t in texts])
    prims = prims_with_equal_groups(sampled, group, seed=oversample)
    lengths = np.random.default_rng(9).integers(1, 9, sampled * group)

    def step(program):
        return rewards_and_advantages(program, jnp.asarray(prims), 0.25, group, True, jnp.asarray(lengths),
                                      max_new_tokens=8, overlong_buffer=buffer, oversample=oversample)

    batched = jax.jit(jax.vmap(step))(programs)
    one = jax.jit(step)
    for k, text in enumerate(texts):
        rewards = evaluate_numpy(program_of(text), prims, 0.25)
        shaped = rewards + (np_penalty(lengths, 8, buffer) if buffer else 0.0)
        rows, shortfall, fraction = np_select(shaped, group, keep)
        for got in (one(program_of(text)), jax.tree_util.tree_map(lambda x: x[k], batched)):
            np.testing.assert_array_equal(np.asarray(got.rows), rows)
            np.testing.assert_allclose(np.asarray(got.rewards), rewards, atol=1e-7)
            np.testing.assert_allclose(np.asarray(got.advantages), np_advantages(shaped[rows], group), atol=1e-5)
            assert int(got.stats["shortfall"]) == shortfall
            assert float(got.stats["informative_fraction"]) == pytest.approx(fraction)


def test_all_equal_rewards_are_a_full_shortfall():
    got = score(program_of("u"), np.zeros((12, 2), np.float32), 0.5, 3, True, oversample=2)
    assert int(got.stats["shortfall"]) == 2 and float(got.stats["informative_fraction"]) == 0.0
    np.testing.assert_array_equal(np.asarray(got.rows), np.arange(6))
    np.testing.assert_array_equal(np.asarray(got.advantages), 0.0)


# ----------------------------------------------------------------------------- the device loop


def leaves(tree):
    return [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(tree)]


def tiny_program(text):
    domain = tiny_setup()[0]
    return compile_expr(parse(text, list(domain.primitive_names)))


@pytest.mark.slow
def test_settings_at_their_off_values_train_exactly_like_plain_grpo():
    domain, graphdef, params, _, train, _ = tiny_setup()
    off = INNER.replace(steps=2, final_steps=2, algorithm="grpo", dynamic_oversample=1, overlong_buffer=0,
                        grpo=dataclasses.replace(INNER.grpo, clip_high=INNER.grpo.clip_low))
    plain = InnerConfig(steps=2, prompts_per_step=INNER.prompts_per_step, group_size=INNER.group_size,
                        max_new_tokens=INNER.max_new_tokens, grpo=GRPOConfig(learning_rate=INNER.grpo.learning_rate),
                        eval_batch_size=INNER.eval_batch_size)
    # every field equal: the loop `make_inner_loop` builds from either is the plain GRPO loop
    assert off == plain
    assert not off.dynamic_sampling and off.sampled_per_step == plain.rollouts_per_step
    loop = make_inner_loop(domain, graphdef, off)
    assert loop.metric_names == make_inner_loop(domain, graphdef, plain).metric_names
    trained, metrics = jax.jit(loop.train)(params, tiny_program("g1 + g2"), KEY, train)
    assert set(metrics) == set(loop.metric_names) and "shortfall" not in metrics
    assert np.asarray(metrics["grad_norm"]).max() > 0   # the policy moves
    assert any(not np.array_equal(a, b) for a, b in zip(leaves(trained), leaves(params), strict=True))


@pytest.mark.slow
def test_a_dapo_step_trains_on_the_groups_numpy_selects_with_the_penalty_numpy_computes():
    domain, graphdef, params, _, train, _ = tiny_setup()
    # buffer 8 of 14 tokens: the tiny policy's completions (about 9 tokens) are penalised
    cfg = INNER.replace(steps=1, algorithm="dapo", overlong_buffer=8, kl_metric=False)
    assert (cfg.dynamic_oversample, cfg.grpo.clip_high) == (2, dapo.DAPO_CLIP_HIGH)
    program = tiny_program("g1 + g2")
    loop = make_inner_loop(domain, graphdef, cfg)
    trained, metrics = jax.jit(loop.train)(params, program, KEY, train)

    # step 0 outside the loop: the same prompts and samples, NumPy rewards and selection
    sampled, group = cfg.dynamic_oversample * cfg.prompts_per_step, cfg.group_size
    prompt_key, sample_key, update_key = jax.random.split(jax.random.fold_in(KEY, 0), 3)
    rows = jax.random.choice(prompt_key, train.size, (sampled,), replace=sampled > train.size)
    chosen = jax.tree_util.tree_map(lambda x: jnp.repeat(x, group, axis=0), train.take(rows))
    rollout = device_rollout(domain, graphdef, cfg)
    episode, batch = jax.jit(rollout.fn, static_argnums=3)(params, chosen, sample_key, False)
    prims = np.asarray(domain.primitive_values(episode, dict(chosen.context)))
    lengths = np.asarray(batch["mask"]).sum(axis=1)
    rewards = evaluate_numpy(program, prims, 0.0)
    shaped = rewards + np_penalty(lengths, cfg.max_new_tokens, cfg.overlong_buffer)
    assert np.any(shaped != rewards)
    selected, shortfall, fraction = np_select(shaped, group, cfg.prompts_per_step)
    assert int(metrics["shortfall"][0]) == shortfall
    assert float(metrics["informative_fraction"][0]) == pytest.approx(fraction)
    assert float(metrics["reward_mean"][0]) == pytest.approx(float(rewards.mean()), abs=1e-6)
    assert float(metrics["response_length"][0]) == pytest.approx(lengths.sum() / max((lengths > 0).sum(), 1), abs=1e-5)

    # one GRPO update on those rows with those advantages is the loop's step
    update_batch = jax.tree_util.tree_map(lambda value: value[selected], batch)
    update_batch["advantages"] = jnp.asarray(np_advantages(shaped[selected], group), jnp.float32)
    optimizer = make_optimizer(cfg.grpo)

    def logprob_fn(p, rows_):
        return rollout.logprobs(p, rows_, cfg.temperature, group)

    expected, _, _ = jax.jit(lambda p, b, k: grpo_update(p, optimizer.init(p), b, k, logprob_fn, optimizer, cfg.grpo))(
        params, update_batch, update_key)
    moved = 0
    for got, want, before in zip(leaves(trained), leaves(expected), leaves(params), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-5)
        moved += not np.allclose(want, before)
    assert moved > 0


@pytest.mark.slow
def test_all_equal_rewards_report_full_shortfall_and_leave_the_policy_alone():
    domain, graphdef, params, _, train, _ = tiny_setup()
    cfg = INNER.replace(steps=2, dynamic_oversample=2)
    trained, metrics = jax.jit(make_inner_loop(domain, graphdef, cfg).train)(params, tiny_program("u"), KEY, train)
    np.testing.assert_array_equal(np.asarray(metrics["shortfall"]), cfg.prompts_per_step)
    np.testing.assert_array_equal(np.asarray(metrics["informative_fraction"]), 0.0)
    for a, b in zip(leaves(trained), leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)


DAPO = INNER.replace(steps=2, final_steps=2, algorithm="dapo")
DAPO_TEXTS = ("g1 + g2", "g3 - 0.5*g4")


@pytest.fixture(scope="module")
def dapo_alone():
    """{text: (params, curves)}: each DAPO program trained alone on one device (one compilation)."""
    domain, graphdef, params, _, train, _ = tiny_setup()
    evaluator = DeviceEvaluator(domain, graphdef, DAPO, compiler_options=FAST_COMPILE)
    return {text: evaluator.train_final(tiny_program(text), params, KEY, train) for text in DAPO_TEXTS}


@pytest.mark.slow
def test_dapo_vmaps_over_programs_and_the_same_seed_gives_the_same_result(dapo_alone):
    domain, graphdef, params, _, train, _ = tiny_setup()
    loop = make_inner_loop(domain, graphdef, DAPO)
    programs = stack_programs([tiny_program(t) for t in DAPO_TEXTS])
    keys = jnp.stack([KEY, KEY])
    train_many = jax.jit(loop.train_many)
    first = jax.tree_util.tree_map(np.asarray, train_many(params, programs, keys, train))
    again = jax.tree_util.tree_map(np.asarray, train_many(params, programs, keys, train))
    for a, b in zip(jax.tree_util.tree_leaves(first), jax.tree_util.tree_leaves(again), strict=True):
        np.testing.assert_array_equal(a, b)
    stacked, metrics = first
    assert set(metrics) == set(loop.metric_names) >= {"shortfall", "informative_fraction"}
    for k, text in enumerate(DAPO_TEXTS):
        alone, alone_metrics = dapo_alone[text]
        for a, b in zip(leaves(jax.tree_util.tree_map(lambda x: x[k], stacked)), leaves(alone), strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-4, atol=1e-4)
        for name in ("shortfall", "informative_fraction", "reward_mean"):
            np.testing.assert_allclose(metrics[name][k], np.asarray(alone_metrics[name]), atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_dapo_over_a_data_axis_equals_one_device(dapo_alone):
    """The selected groups are gathered from rows split over 'data' (2 of the fake CPU devices)."""
    domain, graphdef, params, _, train, _ = tiny_setup()
    mesh = make_mesh(1, 2, 1, devices=jax.devices()[:2])
    got, got_curves = DeviceEvaluator(domain, graphdef, DAPO, mesh=mesh, compiler_options=FAST_COMPILE).train_final(
        tiny_program(DAPO_TEXTS[0]), params, KEY, train)
    want, want_curves = dapo_alone[DAPO_TEXTS[0]]
    assert np.asarray(want_curves["grad_norm"]).max() > 0
    np.testing.assert_array_equal(got_curves["shortfall"], want_curves["shortfall"])
    for name in want_curves:
        np.testing.assert_allclose(got_curves[name], want_curves[name], rtol=2e-4, atol=2e-5, err_msg=name)
    for a, b in zip(leaves(got), leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


# ----------------------------------------------------------------------------- the host loop


@pytest.mark.slow
def test_the_host_update_trains_on_the_selected_groups_with_the_penalty(run):  # noqa: F811
    """A DAPO update of 4 sampled groups equals a plain update of the 2 NumPy selects, with the
    overlong penalty written into primitive g2 instead."""
    cfg, (domain, base_params, evaluator) = run
    plain = evaluator.slices[0]
    inner = evaluator.config
    assert inner.algorithm == "grpo" and not inner.dynamic_sampling
    fns = host_policy.shared_policy_functions(
        evaluator.graphdef, plain.mesh, max_new_tokens=inner.max_new_tokens, temperature=inner.temperature,
        top_k=inner.top_k, grpo=inner.grpo, eos_id=domain.eos_id, pad_id=domain.pad_id, stop_ids=domain.stop_ids,
        dynamic_oversample=2, overlong_buffer=4)
    group, keep = inner.group_size, inner.prompts_per_step
    prompts, mask, _ = host_batches.HostSplit(domain.train, domain).batch(np.arange(2 * keep), group,
                                                                          domain.bucket_sizes)
    rollout = fns.sample(base_params, fns.rows(prompts), fns.rows(mask), jax.random.key(3))
    prims = prims_with_equal_groups(2 * keep, group, seed=4)
    prims = np.concatenate([prims, np.zeros_like(prims)], axis=1)   # g1, g2 random; g3 = g4 = 0
    program = compile_expr(parse("g1 + g2", domain.primitive_names), num_primitives=4)
    lengths = np.asarray(rollout.lengths)
    shaped_prims = prims.copy()
    shaped_prims[:, 1] += np_penalty(lengths, inner.max_new_tokens, 4)
    selected, shortfall, fraction = np_select(evaluate_numpy(program, shaped_prims, 0.5), group, keep)

    ref = fns.reference_logprobs(base_params, rollout)   # math's inner loop has a KL term
    start = jax.tree.map(lambda x: x.copy(), base_params)
    got, _, metrics = fns.update(start, fns.init_optimizer(start), program, prims, 0.5, rollout, ref,
                                 jax.random.key(4))
    subset = jax.tree.map(lambda x: plain.rows(np.asarray(x)[selected]), rollout)
    start = jax.tree.map(lambda x: x.copy(), base_params)
    want, _, _ = plain.update(start, plain.init_optimizer(start), program, shaped_prims[selected], 0.5, subset,
                              plain.rows(np.asarray(ref)[selected]), jax.random.key(4))
    assert int(metrics["shortfall"]) == shortfall and float(metrics["informative_fraction"]) == pytest.approx(fraction)
    assert float(metrics["reward_mean"]) == pytest.approx(float(evaluate_numpy(program, prims, 0.5).mean()), abs=1e-6)
    moved = 0
    for a, b, before in zip(leaves(got), leaves(want), leaves(base_params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        moved += not np.allclose(b, before)
    assert moved > 0


@pytest.mark.slow
def test_a_dapo_search_on_the_host_kind_samples_twice_the_prompts_and_reports_its_curves(run):  # noqa: F811
    cfg, (domain, base_params, evaluator) = run
    inner = evaluator.config.replace(algorithm="dapo")
    dapo_evaluator = host_loop.HostEvaluator(domain, evaluator.graphdef, inner, evaluator.mesh)
    try:
        programs = stack_programs([compile_expr(parse("g1 + g2", domain.primitive_names), num_primitives=4)])
        train, validation = domain.train.split(0.75, 0)
        results = dapo_evaluator.evaluate_candidates(programs, base_params, jax.random.key(2), train, validation,
                                                     steps=2)
    finally:
        dapo_evaluator.close()
    curves = results.curves
    assert {"shortfall", "informative_fraction", "generated_tokens"} <= set(curves)
    assert all(curve.shape == (1, 2) for curve in curves.values())
    assert np.all((curves["shortfall"] >= 0) & (curves["shortfall"] <= inner.prompts_per_step))
    assert np.all((curves["informative_fraction"] >= 0) & (curves["informative_fraction"] <= 1))
    # every sampled completion counts: O*N of them per step, each of 1..T tokens
    sampled = inner.dynamic_oversample * inner.rollouts_per_step
    assert np.all(curves["generated_tokens"] >= sampled)
    assert np.all(curves["generated_tokens"] / curves["response_length"] == pytest.approx(sampled))
