"""DAPO on multi-turn episodes: the per-turn overlong penalty, dynamic sampling over episode
groups, and a DAPO step of the device loop on the counter environment against a NumPy
reference (the same episodes, NumPy-shaped rewards and selection, one GRPO update on those rows).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from derl_jax.expr import compile_expr, parse
from derl_jax.expr.vm import evaluate_numpy
from derl_jax.rl import dapo
from derl_jax.rl.grpo import GRPOConfig, grpo_update, make_optimizer
from derl_jax.rl.loop import make_inner_loop, rewards_and_advantages
from test_multiturn import CFG, FAST_COMPILE, tiny_policy, window_rollout  # noqa: F401

KEY = jax.random.key(3)
score = jax.jit(rewards_and_advantages, static_argnums=(3, 4),
                static_argnames=("max_new_tokens", "overlong_buffer", "oversample"))


def np_turn_penalty(lengths, taken, limit, buffer):
    penalty = np.clip(((limit - buffer) - np.asarray(lengths, np.float64)) / buffer, -1.0, 0.0)
    return np.where(taken, penalty, 0.0).astype(np.float32)


def np_episode_penalty(lengths, taken, limit, buffer):
    return (np_turn_penalty(lengths, taken, limit, buffer).sum(axis=1) / np.maximum(taken.sum(axis=1), 1)).astype(np.float32)


def np_select(shaped, group, keep):
    groups = np.asarray(shaped).reshape(-1, group)
    informative = groups.max(axis=1) > groups.min(axis=1)
    order = [g for g in range(len(groups)) if informative[g]] + [g for g in range(len(groups)) if not informative[g]]
    kept = np.asarray(order[:keep])
    return (kept[:, None] * group + np.arange(group)).reshape(-1), keep - min(int(informative.sum()), keep)


def np_advantages(rewards, group, eps=1e-6):
    """GRPO's group advantages: (r - mean) / (sample std + eps), exactly 0 in a constant group."""
    groups = np.asarray(rewards, np.float64).reshape(-1, group)
    centred = groups - groups.mean(axis=1, keepdims=True)
    scaled = centred / (np.sqrt((centred**2).sum(axis=1, keepdims=True) / (group - 1)) + eps)
    return np.where(groups.max(axis=1, keepdims=True) == groups.min(axis=1, keepdims=True), 0.0, scaled).reshape(-1)


def leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def test_the_overlong_penalty_per_turn_and_per_episode_by_hand():
    # action limit 8 tokens, buffer 4: turns of 4 or fewer tokens cost nothing, 8 tokens cost -1
    lengths = np.array([[2, 6, 8], [5, 0, 0], [0, 0, 0]])
    taken = np.array([[True, True, True], [True, False, False], [False, False, False]])
    np.testing.assert_allclose(np.asarray(dapo.turn_overlong_penalty(lengths, taken, 8, 4)),
                               [[0, -0.5, -1], [-0.25, 0, 0], [0, 0, 0]])
    np.testing.assert_allclose(np.asarray(dapo.episode_overlong_penalty(lengths, taken, 8, 4)),
                               [-0.5, -0.25, 0.0])
    rng = np.random.default_rng(0)
    lengths, taken = rng.integers(0, 9, (6, 5)), rng.random((6, 5)) < 0.7
    np.testing.assert_allclose(np.asarray(dapo.episode_overlong_penalty(lengths, taken, 8, 3)),
                               np_episode_penalty(lengths, taken, 8, 3), rtol=1e-6)


def test_episode_rewards_take_the_mean_turn_penalty_and_groups_are_selected_on_it():
    rng = np.random.default_rng(1)
    group, keep, oversample = 4, 2, 2
    rows = group * keep * oversample
    prims = rng.integers(0, 2, (rows, 4)).astype(np.float32)
    prims[:group] = prims[0]            # group 0: identical episodes ...
    lengths = rng.integers(1, 3, (rows, 3))
    lengths[:group] = lengths[0]        # ... with identical actions: uninformative
    taken = np.ones((rows, 3), bool)
    program = compile_expr(parse("g1 + 0.5*g2", ["a", "b", "c", "d"]), num_primitives=4)
    out = score(program, jnp.asarray(prims), jnp.float32(0.0), group, True, jnp.asarray(lengths),
                max_new_tokens=2, overlong_buffer=1, oversample=oversample, taken=jnp.asarray(taken))
    rewards = evaluate_numpy(program, prims, 0.0)
    shaped = rewards + np_episode_penalty(lengths, taken, 2, 1)
    selected, shortfall = np_select(shaped, group, keep)
    np.testing.assert_allclose(np.asarray(out.rewards), rewards, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(out.rows), selected)
    assert 0 not in selected[::group] or shortfall > 0
    np.testing.assert_allclose(np.asarray(out.advantages), np_advantages(shaped[selected], group), rtol=1e-4, atol=1e-5)
    assert int(out.stats["shortfall"]) == shortfall


@pytest.mark.slow
def test_a_multi_turn_dapo_step_trains_on_the_groups_numpy_selects():
    # the window counter's rollout of test_multiturn (its sampling settings are this config's), one
    # compiled program for its 16 sampled episodes and these 2 x 2 groups of 4
    domain, graphdef, rollout, play = window_rollout(0)
    params = tiny_policy(domain)[1]
    # actions of 1-2 tokens against a limit of 2 with a buffer of 1: a 2-token action costs -1
    cfg = CFG.replace(steps=1, prompts_per_step=2, algorithm="dapo", overlong_buffer=1)
    assert (cfg.dynamic_oversample, cfg.grpo.clip_high, cfg.grpo.loss_agg) == (2, dapo.DAPO_CLIP_HIGH, "token_mean")
    program = compile_expr(parse("g1 + g2", list(domain.primitive_names)), num_primitives=len(domain.primitive_names))
    loop = make_inner_loop(domain, graphdef, cfg)
    trained, metrics = jax.jit(loop.train)(params, program, KEY, domain.train)

    # step 0 outside the loop: the same tasks and episodes, NumPy rewards and selection
    sampled, group = cfg.dynamic_oversample * cfg.prompts_per_step, cfg.group_size
    prompt_key, sample_key, update_key = jax.random.split(jax.random.fold_in(KEY, 0), 3)
    rows = jax.random.choice(prompt_key, domain.train.size, (sampled,), replace=sampled > domain.train.size)
    chosen = jax.tree_util.tree_map(lambda x: jnp.repeat(x, group, axis=0), domain.train.take(rows))
    assert rollout.prefill_group == group
    episode, batch = play(params, chosen, sample_key, False)
    prims = np.asarray(domain.primitive_values(episode, dict(chosen.context)))
    mask = np.asarray(batch["mask"])                     # [O*N, S, T]
    lengths, taken = mask.sum(axis=-1), mask.any(axis=-1)
    rewards = evaluate_numpy(program, prims, 0.0)
    shaped = rewards + np_episode_penalty(lengths, taken, cfg.max_new_tokens, cfg.overlong_buffer)
    assert np.any(shaped != rewards)
    selected, shortfall = np_select(shaped, group, cfg.prompts_per_step)
    assert int(metrics["shortfall"][0]) == shortfall
    assert float(metrics["reward_mean"][0]) == pytest.approx(float(rewards.mean()), abs=1e-6)

    update_batch = jax.tree_util.tree_map(lambda value: value[selected], batch)
    update_batch["advantages"] = jnp.asarray(np_advantages(shaped[selected], group), jnp.float32)
    optimizer = make_optimizer(cfg.grpo)

    def logprob_fn(p, rows_):
        return rollout.logprobs(p, rows_, cfg.temperature, rollout.prefill_group)

    expected, _, _ = jax.jit(lambda p, b, k: grpo_update(p, optimizer.init(p), b, k, logprob_fn, optimizer, cfg.grpo))(
        params, update_batch, update_key)
    moved = 0
    for got, want, before in zip(leaves(trained), leaves(expected), leaves(params), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-5)
        moved += not np.allclose(want, before)
    assert moved > 0


def test_grpo_config_stays_plain_when_dapo_is_off():
    assert CFG.algorithm == "grpo" and (CFG.dynamic_oversample, CFG.overlong_buffer) == (1, 0)
    assert CFG.grpo.clip_high == GRPOConfig().clip_high


@pytest.mark.slow
def test_a_household_search_trains_with_dapo_and_per_turn_credit(tmp_path):
    """End to end through the launcher: the Self-Guide household at smoke sizes, DERL's search
    with DAPO and per-turn credit of the self-rewards (the dynamic-sampling curves of every
    trained candidate are logged and in range)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    workdir = tmp_path / "run"
    done = subprocess.run([sys.executable, os.path.join("launch", "run.py"), "--noprogress",
                           "--config=configs/household.py:sg_smoke", "--mode=search", "--config.outer.strategy=derl",
                           "--config.inner.algorithm=dapo", "--config.inner.self_reward_credit=turn",
                           f"--workdir={workdir}"], capture_output=True, text=True, cwd=root, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((workdir / "config.json").read_text())
    inner = config["inner"]
    assert (inner["algorithm"], inner["self_reward_credit"]) == ("dapo", "turn")
    records = [json.loads(line) for line in (workdir / "history.jsonl").read_text().splitlines()]
    assert len(records) == config["outer"]["iterations"] * config["outer"]["num_candidates"]
    trained = [r for r in records if r["trained"]]
    assert trained
    for record in trained:
        curves = record["curves"]
        shortfall, fraction = np.asarray(curves["shortfall"]), np.asarray(curves["informative_fraction"])
        assert shortfall.shape == fraction.shape == (inner["steps"],)
        assert np.all((shortfall >= 0) & (shortfall <= inner["prompts_per_step"]))
        assert np.all((fraction >= 0) & (fraction <= 1)) and np.all(np.isfinite(curves["reward_mean"]))
