"""Multi-turn episodes inside the jitted inner loop: a counter to be moved to a target value.

The environment is a few lines (below): the task names a target, each observation shows the
counter, the first action token `inc` / `dec` moves it by one. A tiny policy trained from
random initialisation by the same loop as the single-turn domains must learn to read the
target; episodes are checked against a plain-Python replay of the same environment. With the
whole history (`history="full"`, one token stream per episode) every turn is checked against
sampling after its whole prompt written out in Python, and the packed update against one row
per turn.
"""

from __future__ import annotations

import dataclasses
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from derl_jax.domains.base import Domain, TokenDataset
from derl_jax.domains.env import checked_step, turn_prompts
from derl_jax.expr import compile_expr, parse, stack_programs
from derl_jax.models import sampling
from derl_jax.models.transformer import init_params, tiny_config
from derl_jax.parallel import make_mesh
from derl_jax.rl import rollout as rollout_lib
from derl_jax.rl.config import InnerConfig
from derl_jax.rl.device_evaluator import DeviceEvaluator
from derl_jax.rl.grpo import GRPOConfig, grpo_loss
from derl_jax.rl.loop import make_inner_loop, rewards_and_advantages, step_draws
from primitives import registry
from primitives.agent import AGENT_PRIMITIVES

PAD, BOS, EOS = 0, 1, 2
WORDS = ("inc", "dec", "wait", "target", "at") + tuple(str(d) for d in range(10))
ID = {word: 3 + i for i, word in enumerate(WORDS)}
VOCAB = 3 + len(WORDS)
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


@struct.dataclass
class CounterState:
    counter: jax.Array
    target: jax.Array


class CounterEnv:
    """Move a counter (0..9) to the task's target; `inc` / `dec` as the first action token."""

    obs_length, action_length, max_turns = 2, 2, 3

    def reset(self, key, task):
        del key
        state = CounterState(counter=jnp.int32(task["start"]), target=jnp.int32(task["target"]))
        return self.observe(state), state

    def observe(self, state):
        return jnp.stack([jnp.int32(ID["at"]), ID["0"] + state.counter]).astype(jnp.int32)

    def step(self, state, action):
        move = jnp.where(action[0] == ID["inc"], 1, jnp.where(action[0] == ID["dec"], -1, 0))
        counter = jnp.clip(state.counter + move, 0, 9)
        toward = jnp.abs(state.target - counter) < jnp.abs(state.target - state.counter)
        state = CounterState(counter=counter, target=state.target)
        success = (counter == state.target).astype(jnp.float32)
        info = {"step_score": toward.astype(jnp.float32), "success": success}
        return self.observe(state), state, success, counter == state.target, info


class WordTokenizer:
    vocab_size, pad_id, eos_id = VOCAB, PAD, EOS


def counter_split(count: int, seed: int) -> TokenDataset:
    rng = np.random.default_rng(seed)
    start = np.full(count, 5, np.int32)  # the target alone says whether to `inc` or `dec`
    target = (start + rng.choice([-1, 1], count)).astype(np.int32)
    prompts = np.stack([np.full(count, BOS), np.full(count, ID["target"]), ID["0"] + target], axis=1).astype(np.int32)
    return TokenDataset(prompts=jnp.asarray(prompts), prompt_mask=jnp.ones(prompts.shape, bool),
                        context={"start": jnp.asarray(start), "target": jnp.asarray(target)})


@functools.lru_cache(maxsize=None)
def counter_domain(history: int | str = 2) -> Domain:
    return Domain(name="counter", primitives=registry.resolve("agent", AGENT_PRIMITIVES), outcome_index=0,
                  train=counter_split(64, 0), test=counter_split(32, 1), tokenizer=WordTokenizer(), max_new_tokens=2,
                  eos_id=EOS, pad_id=PAD, rollout="env", env=CounterEnv(), history=history)


def tiny_policy(domain: Domain, seed: int = 0):
    config = tiny_config(VOCAB, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                         max_position=domain.prompt_length + domain.max_new_tokens)
    return init_params(config, jax.random.key(seed))


CFG = InnerConfig(steps=40, prompts_per_step=8, group_size=4, max_new_tokens=2, temperature=1.0, eval_batch_size=32,
                  grpo=GRPOConfig(learning_rate=3e-3), kl_metric=False)


def replay(domain: Domain, dataset: TokenDataset, actions: np.ndarray, taken: np.ndarray):
    """(success f32[N], step_scores f32[N, S]) of the recorded actions, by plain Python rules."""
    starts, targets = np.asarray(dataset.context["start"]), np.asarray(dataset.context["target"])
    success = np.zeros(len(starts), np.float32)
    scores = np.zeros(taken.shape, np.float32)
    for n, (counter, target) in enumerate(zip(starts, targets)):
        for t in range(taken.shape[1]):
            if not taken[n, t]:
                assert t > 0 and counter == target  # only a finished episode skips turns
                continue
            first = actions[n, t, 0]
            moved = min(9, max(0, counter + (first == ID["inc"]) - (first == ID["dec"])))
            scores[n, t] = abs(target - moved) < abs(target - counter)
            counter = moved
            if counter == target:
                success[n] = 1.0
    return success, scores


@pytest.mark.slow
@pytest.mark.parametrize("greedy", [True, False])
def test_episodes_match_a_python_replay_of_the_environment(greedy):
    domain, _, _, batch, _, episode, rows = window_episodes(0, greedy)   # 16 episodes, window 2, no budget
    actions, taken = np.asarray(episode["tokens"]), np.asarray(episode["step_mask"])
    success, scores = replay(domain, batch, actions, taken)
    np.testing.assert_array_equal(np.asarray(episode["success"]), success)
    np.testing.assert_array_equal(np.where(taken, np.asarray(episode["step_scores"]), 0.0), scores)
    assert taken[:, 0].all()
    # one update row per episode, training only on taken turns' action tokens
    assert rows["completions"].shape == (16, 3, 2)
    np.testing.assert_array_equal(np.asarray(rows["mask"]).any(-1), taken)
    # every turn's window ends with the latest observation: "at <counter>"
    assert (np.asarray(rows["blocks"])[:, :, -2] == ID["at"]).all()


def test_turn_prompts_hold_the_task_then_the_last_w_actions_and_observations():
    task = jnp.array([[BOS, 6, 7]], jnp.int32)
    actions = jnp.array([[[PAD, PAD], [4, PAD]]], jnp.int32)  # one action so far: [4]
    observations = jnp.array([[[7, 9], [7, 10]]], jnp.int32)
    prompts, mask = turn_prompts(task, task != PAD, actions, actions != PAD, observations,
                                             observations != PAD)
    # reference: drop the padding, keep the order task, a_0 o_0, a_1 o_1, pad on the left
    real = [BOS, 6, 7, 7, 9, 4, 7, 10]
    width = 3 + 2 * (2 + 2)
    np.testing.assert_array_equal(np.asarray(prompts)[0], [PAD] * (width - len(real)) + real)
    np.testing.assert_array_equal(np.asarray(mask)[0], [False] * (width - len(real)) + [True] * len(real))


@pytest.mark.parametrize("length", [3, 5, 8, 11, 40])
def test_turn_prompts_at_a_budget_drop_the_oldest_window_tokens(length):
    """A list reference: keep the whole task, then as many of the newest window tokens as fit."""
    rng = np.random.default_rng(length)
    task = jnp.array([[PAD, BOS, 6], [BOS, 6, 7]], jnp.int32)
    actions = jnp.asarray(np.where(rng.random((2, 2, 3)) < 0.3, PAD, rng.integers(4, 9, (2, 2, 3))), jnp.int32)
    observations = jnp.asarray(np.where(rng.random((2, 2, 3)) < 0.3, PAD, rng.integers(4, 9, (2, 2, 3))), jnp.int32)
    prompts, mask = turn_prompts(task, task != PAD, actions, actions != PAD, observations,
                                             observations != PAD, length, PAD)
    width = min(length, 3 + 2 * (3 + 3))
    assert prompts.shape == mask.shape == (2, width)
    for row in range(2):
        kept = [int(t) for t in np.asarray(task[row]) if t != PAD]
        window = [int(t) for slot in range(2) for t in np.concatenate([np.asarray(actions[row, slot]),
                                                                       np.asarray(observations[row, slot])]) if t != PAD]
        room = width - len(kept)
        real = kept + (window[len(window) - room:] if len(window) > room else window)
        np.testing.assert_array_equal(np.asarray(prompts)[row], [PAD] * (width - len(real)) + real)
        np.testing.assert_array_equal(np.asarray(mask)[row], [False] * (width - len(real)) + [True] * len(real))
    with pytest.raises(ValueError, match="no room for the task prompt"):
        turn_prompts(task, task != PAD, actions, actions != PAD, observations, observations != PAD, 2, PAD)


class EnvStepTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_step_contract_and_values(self):
        env = CounterEnv()
        _, state = env.reset(jax.random.key(0), {"start": jnp.int32(4), "target": jnp.int32(5)})
        step = self.variant(lambda s, a: checked_step(env, s, a))
        obs, state, reward, done, info = step(state, jnp.array([ID["inc"], PAD], jnp.int32))
        np.testing.assert_array_equal(obs, [ID["at"], ID["5"]])
        self.assertEqual(float(reward), 1.0)
        self.assertTrue(bool(done))
        self.assertEqual(float(info["step_score"]), 1.0)
        with self.assertRaises(AssertionError):
            checked_step(env, state, jnp.array([ID["inc"]], jnp.int32))  # action of the wrong length


@pytest.mark.slow
def test_grpo_on_success_teaches_the_policy_to_read_the_target():
    domain = counter_domain()
    graphdef, params = tiny_policy(domain)
    # loop dispatch: the accuracy before and after training is one compiled program
    evaluator = DeviceEvaluator(domain, graphdef, CFG, dispatch="loop", compiler_options=FAST_COMPILE)
    programs = stack_programs([compile_expr(parse("g1", list(domain.primitive_names)))])
    before = evaluator.accuracy(params, domain.test)
    results = evaluator.evaluate_candidates(programs, params, jax.random.key(0), domain.train, domain.test)
    curve = results.curves["primitive/outcome"][0]
    assert results.curves["reward_mean"].shape == (1, CFG.steps)
    assert curve[-8:].mean() > curve[:8].mean() + 0.2
    assert results.scores[0] >= 0.8 > before + 0.3


@functools.lru_cache(maxsize=None)
def three_step_runs(history: int | str):
    """Two programs ("g1", "g2 + u*g1") trained 3 steps at once (`train_many`) and one at a time
    (`train`, compiled once for both), computed once per process: (domain, graphdef, params,
    programs, keys, (stacked params, metrics), [(params, metrics) of program k alone])."""
    domain = counter_domain(history)
    graphdef, params = tiny_policy(counter_domain(3))
    loop = make_inner_loop(domain, graphdef, CFG.replace(steps=3))
    programs = stack_programs([compile_expr(parse(t, list(domain.primitive_names))) for t in ("g1", "g2 + u*g1")])
    keys = jax.random.split(jax.random.key(1), 2)
    many = jax.jit(loop.train_many)(params, programs, keys, domain.train)
    train = jax.jit(loop.train)
    alone = [train(params, jax.tree_util.tree_map(lambda x, k=k: x[k], programs), keys[k], domain.train)
             for k in range(2)]
    return domain, graphdef, params, programs, keys, many, alone


@pytest.mark.slow
@pytest.mark.parametrize("history", [2, "full"])
def test_vmapped_programs_train_like_separate_calls(history):
    *_, (stacked, metrics), alone = three_step_runs(history)
    for k, (alone_params, alone_metrics) in enumerate(alone):
        np.testing.assert_allclose(metrics["reward_mean"][k], alone_metrics["reward_mean"], rtol=1e-5, atol=1e-6)
        for a, b in zip(jax.tree_util.tree_leaves(stacked), jax.tree_util.tree_leaves(alone_params), strict=True):
            np.testing.assert_allclose(np.asarray(a)[k], np.asarray(b), rtol=2e-4, atol=2e-5)


class HostCounterEnv:
    """The counter environment as a batched NumPy simulator with Python-object states."""

    host = True
    obs_length, action_length, max_turns = 2, 2, 3

    def __init__(self):
        self.steps = 0

    def reset(self, keys, tasks):
        states = [{"counter": int(s), "target": int(t)} for s, t in zip(tasks["start"], tasks["target"])]
        return np.array([[ID["at"], ID["0"] + s["counter"]] for s in states], np.int32), states

    def step(self, states, actions):
        self.steps += len(states)
        out, scores, success = [], [], []
        for state, action in zip(states, actions):
            move = 1 if action[0] == ID["inc"] else -1 if action[0] == ID["dec"] else 0
            counter = min(9, max(0, state["counter"] + move))
            scores.append(float(abs(state["target"] - counter) < abs(state["target"] - state["counter"])))
            success.append(float(counter == state["target"]))
            out.append({"counter": counter, "target": state["target"]})
        obs = np.array([[ID["at"], ID["0"] + s["counter"]] for s in out], np.int32)
        done = np.array(success) == 1.0
        info = {"step_score": np.array(scores, np.float32), "success": np.array(success, np.float32)}
        return obs, out, np.array(success, np.float32), done, info


@pytest.mark.slow
def test_a_host_environment_plays_the_same_episodes_inside_the_scan():
    jax_domain, graphdef, params, batch, key, episode, _ = window_episodes(0, True)   # greedy, against the JAX env
    host_env = HostCounterEnv()
    host_domain = dataclasses.replace(jax_domain, env=host_env)
    host_episode, _ = jax.jit(rollout_lib.device_rollout(host_domain, graphdef, CFG).fn, static_argnums=3)(
        params, batch, key, True)
    for name in ("success", "step_scores", "step_mask", "tokens"):
        np.testing.assert_array_equal(np.asarray(episode[name]), np.asarray(host_episode[name]), err_msg=name)
    assert host_env.steps > 0
    # sampled episodes of two candidates trained at once (vmap over programs) against the host simulator
    # train exactly as against the JAX environment
    jax_domain, graphdef, params, programs, keys, (want_params, want), _ = three_step_runs(2)
    host_domain = dataclasses.replace(jax_domain, env=host_env)
    got_params, got = jax.jit(make_inner_loop(host_domain, graphdef, CFG.replace(steps=3)).train_many)(
        params, programs, keys, host_domain.train)
    np.testing.assert_allclose(got["reward_mean"], want["reward_mean"], atol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(got_params), jax.tree_util.tree_leaves(want_params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_evaluate_candidates_trains_for_the_steps_asked():
    """A 3-step evaluation of "g2 + u*g1" (u spans the steps asked) trains as a 3-step `train`."""
    domain, graphdef, params, programs, keys, _, alone = three_step_runs(2)
    evaluator = DeviceEvaluator(domain, graphdef, CFG, dispatch="loop", compiler_options=FAST_COMPILE)
    one = jax.tree_util.tree_map(lambda x: x[1:], programs)
    results = evaluator.evaluate_candidates(one, params, keys[1], domain.train, domain.test, steps=3)
    assert results.curves["reward_mean"].shape == (1, 3)
    np.testing.assert_allclose(results.curves["reward_mean"][0], alone[1][1]["reward_mean"], rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- the whole history


def left_padded(rows, width: int | None = None):
    """i32[B, L] / bool[B, L] prompts of token lists, real tokens packed to the right."""
    width = width or max(len(r) for r in rows)
    tokens = np.full((len(rows), width), PAD, np.int32)
    for b, row in enumerate(rows):
        tokens[b, width - len(row):] = row
    return jnp.asarray(tokens), jnp.asarray(np.arange(width)[None, :] >= width - np.array([len(r) for r in rows])[:, None])


@functools.lru_cache(maxsize=None)
def full_history_episodes(budget: int, greedy: bool, seed: int = 3):
    """(domain, graphdef, params, batch, key, episode, update rows) of 16 sampled full-history
    episodes, sampled once per process (the tests only read them)."""
    domain = dataclasses.replace(counter_domain("full"), prompt_budget=budget)
    graphdef, params = tiny_policy(counter_domain("full"), seed=seed)
    batch = domain.train.take(np.arange(16))
    key = jax.random.key(5)
    run = rollout_lib.device_rollout(domain, graphdef, CFG)
    episode, rows = jax.jit(run.fn, static_argnums=3)(params, batch, key, greedy)
    return domain, graphdef, params, batch, key, episode, rows


# greedy episodes cost a compiled program of their own: checked in the full tier (the daily tier
# plays them in test_grpo_with_the_whole_history_raises_the_success_rate's accuracy)
@pytest.mark.parametrize("budget, greedy", [pytest.param(0, True, marks=pytest.mark.slow), (0, False), (8, False)])
def test_full_history_turns_sample_what_their_whole_prompt_samples(budget, greedy):
    """Turn t of every episode draws, key for key, what `sample` draws after the prompt written out
    in Python: the task, o_0, then each earlier action up to its EOS and the observation it led
    to; a budget ends an episode before a turn whose prompt is longer."""
    domain, graphdef, params, batch, key, episode, rows = full_history_episodes(budget, greedy)
    env, turns = domain.env, domain.env.max_turns
    tokens, mask, taken = (np.asarray(episode[k]) for k in ("tokens", "mask", "step_mask"))
    states, streams, alive, ended_by_budget = [], [], np.ones(16, bool), 0
    for n in range(16):
        obs, state = env.reset(None, {k: v[n] for k, v in batch.context.items()})
        states.append(state)
        task = np.asarray(batch.prompts[n])[np.asarray(batch.prompt_mask[n])].tolist()
        streams.append(task + np.asarray(obs).tolist())
    turn_key = jax.random.split(key)[1]
    for t in range(turns):
        fits = np.array([len(s) <= (budget or 10**6) for s in streams])
        ended_by_budget += int(np.sum(alive & ~fits))
        alive &= fits
        np.testing.assert_array_equal(taken[:, t], alive)
        # one width for every turn and budget (the longest whole-history prompt): one compiled sampler
        # per greedy, the window's too
        prompts, prompt_mask = left_padded(streams, counter_domain("full").prompt_length)
        want = sampling.sample_jit(graphdef, params, prompts, prompt_mask, jax.random.fold_in(turn_key, t),
                                   max_new_tokens=2, eos_id=EOS, pad_id=PAD, greedy=greedy)
        live = np.flatnonzero(alive)
        np.testing.assert_array_equal(tokens[live, t], np.asarray(want.tokens)[live])
        np.testing.assert_array_equal(mask[live, t], np.asarray(want.mask)[live])
        np.testing.assert_allclose(np.asarray(rows["old_logp"])[live, t], np.asarray(want.sampling_logprobs)[live],
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(np.asarray(rows["starts"])[live, t], [len(streams[n]) for n in live])
        for n in live:
            said = [int(x) for x, m in zip(tokens[n, t], mask[n, t]) if m and x != EOS]
            action = jnp.asarray(said + [PAD] * (2 - len(said)), jnp.int32)
            obs, states[n], _, done, _ = env.step(states[n], action)
            streams[n] = streams[n] + said + np.asarray(obs).tolist()
            alive[n] &= not bool(done)
    assert not mask[~taken].any()
    assert (ended_by_budget > 0) == (budget > 0)
    capacity = rows["stream"].shape[1]
    for n in range(16):
        kept = streams[n][:capacity]
        assert np.asarray(rows["stream"][n])[: len(kept)].tolist() == kept
        assert int(np.asarray(rows["stream_valid"][n]).sum()) == len(kept)


@functools.lru_cache(maxsize=None)
def window_rollout(budget: int):
    """(domain, graphdef, rollout, jitted rollout.fn) of the counter with a window of 2 turns at
    `budget`, made once per process, so every test that plays its episodes (with CFG's sampling
    settings) shares one compiled program per batch shape and greedy flag. The policy is the
    whole history's (positions for its longer prompts): the window's prompts written out at the
    whole history's width are sampled and scored by the programs of the whole history's."""
    domain = dataclasses.replace(counter_domain(2), prompt_budget=budget)
    graphdef = tiny_policy(counter_domain("full"))[0]
    rollout = rollout_lib.device_rollout(domain, graphdef, CFG)
    return domain, graphdef, rollout, jax.jit(rollout.fn, static_argnums=3)


@functools.lru_cache(maxsize=None)
def window_episodes(budget: int, greedy: bool, seed: int = 3):
    """(domain, graphdef, params, batch, key, episode, update rows) of 16 sampled episodes with a
    window of 2 turns, sampled once per process (the tests only read them)."""
    domain, graphdef, _, play = window_rollout(budget)
    params = tiny_policy(counter_domain("full"), seed=seed)[1]
    batch = domain.train.take(np.arange(16))
    key = jax.random.key(5)
    episode, rows = play(params, batch, key, greedy)
    return domain, graphdef, params, batch, key, episode, rows


def written_out_window_prompts(domain: Domain, batch: TokenDataset, episode) -> list[list[list[int]]]:
    """[n][t]: turn t's prompt of episode n by plain Python rules: the task's real tokens, then of
    the last W (action up to its EOS, observation) pairs (o_0 alone first) the newest tokens that
    fit in the prompt length, pad tokens left out. The environment is replayed on the recorded
    actions."""
    env, window = domain.env, int(domain.history)
    tokens, mask, taken = (np.asarray(episode[k]) for k in ("tokens", "mask", "step_mask"))
    prompts = []
    for n in range(batch.size):
        obs, state = env.reset(None, {k: v[n] for k, v in batch.context.items()})
        task = np.asarray(batch.prompts[n])[np.asarray(batch.prompt_mask[n])].tolist()
        pairs, per_turn = [[int(t) for t in np.asarray(obs) if t != PAD]], []
        for t in range(tokens.shape[1]):
            recent = [token for pair in pairs[-window:] for token in pair]
            room = domain.prompt_length - len(task)
            per_turn.append(task + recent[max(0, len(recent) - room):])
            if taken[n, t]:
                said = [int(x) for x, m in zip(tokens[n, t], mask[n, t]) if m and x != EOS]
                obs, state, _, _, _ = env.step(state, jnp.asarray(said + [PAD] * (2 - len(said)), jnp.int32))
                pairs.append([x for x in said + np.asarray(obs).tolist() if x != PAD])   # pad tokens said are dropped
        prompts.append(per_turn)
    return prompts


# greedy: the full tier, where the window's greedy episodes are played anyway (the replay and host
# tests); no budget: the full tier too, as a budget of 6 leaves the first turn's prompt whole
@pytest.mark.parametrize("budget, greedy", [pytest.param(0, True, marks=pytest.mark.slow),
                                            pytest.param(0, False, marks=pytest.mark.slow), (6, False)])
def test_window_turns_sample_what_their_whole_prompt_samples(budget, greedy):
    """Every turn of a windowed episode (the task read once, the window appended after it) draws,
    key for key, what `sample` draws after its prompt written out in Python, and its update row
    holds the window's tokens; a budget drops the oldest window tokens."""
    domain, graphdef, params, batch, key, episode, rows = window_episodes(budget, greedy)
    prompts = written_out_window_prompts(domain, batch, episode)
    tokens, mask = np.asarray(episode["tokens"]), np.asarray(episode["mask"])
    taken = np.asarray(episode["step_mask"])
    turn_key = jax.random.split(key)[1]
    task_lengths = np.asarray(batch.prompt_mask).sum(axis=1)
    full = 0
    for t in range(domain.env.max_turns):
        turn = [prompts[n][t] for n in range(16)]
        full += sum(len(p) == domain.prompt_length for p in turn)
        # the whole history's width for every window and budget: one compiled sampler per greedy
        want = sampling.sample_jit(graphdef, params, *left_padded(turn, counter_domain("full").prompt_length),
                                   jax.random.fold_in(turn_key, t), max_new_tokens=2, eos_id=EOS, pad_id=PAD,
                                   greedy=greedy)
        live = np.flatnonzero(taken[:, t])
        np.testing.assert_array_equal(tokens[live, t], np.asarray(want.tokens)[live])
        np.testing.assert_array_equal(mask[live, t], np.asarray(want.mask)[live])
        np.testing.assert_allclose(np.asarray(rows["old_logp"])[live, t], np.asarray(want.sampling_logprobs)[live],
                                   rtol=1e-5, atol=1e-5)
        for n in range(16):
            block = np.asarray(rows["blocks"][n, t])[np.asarray(rows["block_mask"][n, t])].tolist()
            assert block == turn[n][task_lengths[n]:]
    assert full > 0   # prompts at the length (a budget of 6 cuts the 7 to 9 tokens of later turns)


def packed_episodes(history: str):
    """The episodes of the packed-update tests: (domain, graphdef, params, batch, episode, update rows)."""
    if history == "full":
        domain, graphdef, params, batch, _, episode, packed = full_history_episodes(0, False)
    else:
        domain, graphdef, params, batch, _, episode, packed = window_episodes(6, False)
    return domain, graphdef, params, batch, episode, packed


LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "episode_mean")


def losses_and_grads(logprobs, params, batch):
    """(logp of the sampled tokens, {loss_agg: ((loss, metrics), gradient)}) of GRPO (no KL) on
    `batch` under each of LOSS_AGGS, `logprobs(params, batch, 1.0)` reading the tokens. One
    forward pass: each aggregation's gradient is the log-probs' pullback of its loss's cotangent
    (the chain rule, the pullbacks vmapped), so one compiled program serves the three."""
    out, pullback = jax.vjp(lambda p: logprobs(p, batch, 1.0), params)
    values, cotangents = {}, []
    for agg in LOSS_AGGS:
        cfg = GRPOConfig(loss_agg=agg, kl_coef=0.0)
        values[agg], cotangent = jax.value_and_grad(
            lambda o, cfg=cfg: grpo_loss(params, batch, lambda q, c: o, cfg), has_aux=True)(out)
        cotangents.append(cotangent)
    (grads,) = jax.vmap(pullback)(jax.tree_util.tree_map(lambda *c: jnp.stack(c), *cotangents))
    return out[0], {agg: (values[agg], jax.tree_util.tree_map(lambda g, i=i: g[i], grads))
                    for i, agg in enumerate(LOSS_AGGS)}


@functools.lru_cache(maxsize=None)
def row_losses_and_grads(graphdef):
    """`losses_and_grads` through one row per turn (`rollout_lib.row_logprobs`), jitted once per
    policy: the whole history's and the window's rows, written out at one width, share it."""
    return jax.jit(functools.partial(losses_and_grads, rollout_lib.row_logprobs(graphdef)))


@pytest.mark.parametrize("history", ["full", "window"])
def test_the_packed_update_trains_like_one_row_per_turn(history):
    """GRPO's loss, metrics and gradient through one row per episode (the whole history: one
    teacher-forced pass over its stream; a window: the task read once, each turn's window and
    action after it) equal those through one row per turn with its prompt written out, under
    each loss aggregation, and the recomputed log-probs are the sampler's."""
    domain, graphdef, params, batch, episode, packed = packed_episodes(history)
    if history == "full":
        starts = np.asarray(packed["starts"])
        written = [np.asarray(packed["stream"][n])[: starts[n, t]].tolist()
                   for n in range(starts.shape[0]) for t in range(starts.shape[1])]
    else:
        written = [prompt for per_turn in written_out_window_prompts(domain, batch, episode) for prompt in per_turn]
    count, turns, length = packed["completions"].shape
    advantages = jnp.asarray(np.random.default_rng(0).normal(size=count).astype(np.float32))
    prompts, prompt_mask = left_padded(written, counter_domain("full").prompt_length)
    rows = {"prompts": prompts, "prompt_mask": prompt_mask, "advantages": jnp.repeat(advantages, turns),
            **{k: packed[k].reshape(count * turns, length) for k in ("completions", "mask", "old_logp")},
            # the rows of one episode share its token count (read by "episode_mean" only)
            "episode_tokens": jnp.repeat(jnp.sum(packed["mask"], axis=(1, 2)).astype(jnp.float32), turns)}
    run = rollout_lib.device_rollout(domain, graphdef, CFG)
    packed_logp, packed_out = jax.jit(functools.partial(losses_and_grads, run.logprobs))(
        params, dict(packed, advantages=advantages))
    _, row_out = row_losses_and_grads(graphdef)(params, rows)
    taken = np.asarray(packed["mask"])
    np.testing.assert_allclose(np.asarray(packed_logp)[taken], np.asarray(packed["old_logp"])[taken],
                               rtol=1e-5, atol=1e-5)
    for agg in LOSS_AGGS:
        ((packed_loss, packed_metrics), packed_grads), ((row_loss, row_metrics), row_grads) = packed_out[agg], row_out[agg]
        assert abs(float(row_loss)) > 1e-4, agg
        np.testing.assert_allclose(packed_loss, row_loss, rtol=1e-5, atol=1e-7, err_msg=agg)
        for name in row_metrics:
            np.testing.assert_allclose(packed_metrics[name], row_metrics[name], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{agg} {name}")
        for a, b in zip(jax.tree_util.tree_leaves(packed_grads), jax.tree_util.tree_leaves(row_grads), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7, err_msg=agg)


@pytest.mark.slow
def test_full_history_training_over_a_data_axis_equals_one_device():
    domain = counter_domain("full")
    graphdef, params = tiny_policy(domain)
    cfg = CFG.replace(steps=3)
    program = compile_expr(parse("g1 + 0.5*g2", list(domain.primitive_names)))
    key = jax.random.key(7)
    want_params, want = jax.jit(make_inner_loop(domain, graphdef, cfg).train)(params, program, key, domain.train)
    mesh = make_mesh(1, 4, 1, devices=jax.devices()[:4])
    got_params, got = jax.jit(make_inner_loop(domain, graphdef, cfg, mesh).train)(params, program, key, domain.train)
    assert float(np.max(want["grad_norm"])) > 0
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-4, atol=2e-5, err_msg=name)
    for a, b in zip(jax.tree_util.tree_leaves(got_params), jax.tree_util.tree_leaves(want_params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
    again_params, again = jax.jit(make_inner_loop(domain, graphdef, cfg).train)(params, program, key, domain.train)
    for name in want:   # same config and seed: the same run
        np.testing.assert_array_equal(again[name], want[name])


@pytest.mark.slow
def test_one_weight_per_episode_with_a_window_over_a_data_axis_equals_one_device():
    """loss_agg "episode_mean" with a window: episodes cut over 4 devices train as on one, and the
    weights are used (step 0's loss is episode_mean's on the loop's own first episodes, which
    differs from token_mean's and from one weight per turn's). The other aggregations' losses come
    from one compiled loss program (`losses_and_grads`), not from two more training loops."""
    domain = counter_domain(2)
    graphdef, params = tiny_policy(domain)
    program = compile_expr(parse("g1 + 0.5*g2", list(domain.primitive_names)))
    key = jax.random.key(7)
    cfg = CFG.replace(steps=2, grpo=dataclasses.replace(CFG.grpo, loss_agg="episode_mean"))

    def train(mesh=None):
        return jax.jit(make_inner_loop(domain, graphdef, cfg, mesh).train)(params, program, key, domain.train)

    want_params, want = train()
    got_params, got = train(make_mesh(1, 4, 1, devices=jax.devices()[:4]))
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-4, atol=2e-5, err_msg=name)
    for a, b in zip(jax.tree_util.tree_leaves(got_params), jax.tree_util.tree_leaves(want_params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
    # step 0 outside the loop: the same prompts and episodes, the loss under each aggregation
    rows, sample_key, _ = step_draws(key, jnp.asarray(0), domain.train.size, cfg.prompts_per_step)
    chosen = jax.tree_util.tree_map(lambda x: jnp.repeat(x, cfg.group_size, axis=0), domain.train.take(rows))
    rollout = rollout_lib.device_rollout(domain, graphdef, cfg)
    episode, batch = jax.jit(rollout.fn, static_argnums=3)(params, chosen, sample_key, False)
    prims = domain.primitive_values(episode, dict(chosen.context))
    scored = rewards_and_advantages(program, prims, 0.0, cfg.group_size, cfg.grpo.normalize_std,
                                    jnp.sum(batch["mask"], axis=-1), max_new_tokens=cfg.max_new_tokens,
                                    taken=jnp.any(batch["mask"], axis=-1))
    logprobs = functools.partial(rollout.logprobs, group_size=rollout.prefill_group)
    _, out = jax.jit(functools.partial(losses_and_grads, logprobs))(params, dict(batch, advantages=scored.advantages))
    losses = {agg: float(out[agg][0][0]) for agg in LOSS_AGGS}
    assert float(want["loss"][0]) == pytest.approx(losses["episode_mean"], rel=1e-4, abs=1e-6)
    for other in ("token_mean", "seq_mean_token_mean"):   # each turn row as its own episode: different weights
        assert abs(losses[other] - losses["episode_mean"]) > 1e-6, other


def test_grpo_with_the_whole_history_raises_the_success_rate():
    domain = counter_domain("full")
    graphdef, params = tiny_policy(domain)
    # loop dispatch: the accuracy before and after training is one compiled program
    evaluator = DeviceEvaluator(domain, graphdef, CFG, dispatch="loop", compiler_options=FAST_COMPILE)
    programs = stack_programs([compile_expr(parse("g1", list(domain.primitive_names)))])
    before = evaluator.accuracy(params, domain.test)
    results = evaluator.evaluate_candidates(programs, params, jax.random.key(0), domain.train, domain.test)
    curve = results.curves["primitive/outcome"][0]
    assert curve[-8:].mean() > curve[:8].mean() + 0.2
    assert results.scores[0] > before + 0.3
