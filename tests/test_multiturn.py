"""Multi-turn episodes inside the jitted inner loop: a counter to be moved to a target value.

The environment is a few lines (below): the task names a target, each observation shows the
counter, the first action token `inc` / `dec` moves it by one. A tiny policy trained from
random initialisation by the same loop as the single-turn domains must learn to read the
target; episodes are checked against a plain-Python replay of the same environment.
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from derl_jax.domains.base import Domain, TokenDataset
from derl_jax.domains.env import checked_step
from derl_jax.expr import compile_expr, parse, stack_programs
from derl_jax.models.transformer import init_params, tiny_config
from derl_jax.rl import rollout as rollout_lib
from derl_jax.rl.config import InnerConfig
from derl_jax.rl.device_evaluator import DeviceEvaluator
from derl_jax.rl.grpo import GRPOConfig
from derl_jax.rl.loop import make_inner_loop
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
def counter_domain(history: int = 2) -> Domain:
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
    domain = counter_domain()
    _, params = tiny_policy(domain, seed=3)
    run = rollout_lib.device_rollout(domain, tiny_policy(domain)[0], CFG)
    batch = domain.train.take(np.arange(16))
    episode, rows = jax.jit(run.fn, static_argnums=3)(params, batch, jax.random.key(5), greedy)
    actions, taken = np.asarray(episode["tokens"]), np.asarray(episode["step_mask"])
    success, scores = replay(domain, batch, actions, taken)
    np.testing.assert_array_equal(np.asarray(episode["success"]), success)
    np.testing.assert_array_equal(np.where(taken, np.asarray(episode["step_scores"]), 0.0), scores)
    assert taken[:, 0].all()
    # the update rows are episode-major, one per turn, and train only on taken turns' action tokens
    assert rows["completions"].shape == (16 * 3, 2)
    np.testing.assert_array_equal(np.asarray(rows["mask"]).reshape(16, 3, 2).any(-1), taken)
    # every turn's prompt ends with the latest observation: "at <counter>"
    prompts = np.asarray(rows["prompts"]).reshape(16, 3, -1)
    assert (prompts[:, :, -2] == ID["at"]).all()


def test_turn_prompts_hold_the_task_then_the_last_w_actions_and_observations():
    task = jnp.array([[BOS, 6, 7]], jnp.int32)
    actions = jnp.array([[[PAD, PAD], [4, PAD]]], jnp.int32)  # one action so far: [4]
    observations = jnp.array([[[7, 9], [7, 10]]], jnp.int32)
    prompts, mask = rollout_lib.turn_prompts(task, task != PAD, actions, actions != PAD, observations,
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
    prompts, mask = rollout_lib.turn_prompts(task, task != PAD, actions, actions != PAD, observations,
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
        rollout_lib.turn_prompts(task, task != PAD, actions, actions != PAD, observations, observations != PAD, 2, PAD)


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
    evaluator = DeviceEvaluator(domain, graphdef, CFG, compiler_options=FAST_COMPILE)
    programs = stack_programs([compile_expr(parse("g1", list(domain.primitive_names)))])
    before = evaluator.accuracy(params, domain.test)
    results = evaluator.evaluate_candidates(programs, params, jax.random.key(0), domain.train, domain.test)
    curve = results.curves["primitive/outcome"][0]
    assert results.curves["reward_mean"].shape == (1, CFG.steps)
    assert curve[-8:].mean() > curve[:8].mean() + 0.2
    assert results.scores[0] >= 0.8 > before + 0.3


@pytest.mark.slow
def test_vmapped_programs_train_like_separate_calls():
    domain = counter_domain()
    graphdef, params = tiny_policy(domain)
    cfg = CFG.replace(steps=3)
    loop = make_inner_loop(domain, graphdef, cfg)
    texts = ("g1", "g2 + u*g1")
    programs = stack_programs([compile_expr(parse(t, list(domain.primitive_names))) for t in texts])
    keys = jax.random.split(jax.random.key(1), 2)
    stacked, metrics = jax.jit(loop.train_many)(params, programs, keys, domain.train)
    for k in range(2):
        one = jax.tree_util.tree_map(lambda x, k=k: x[k], programs)
        alone, alone_metrics = jax.jit(loop.train)(params, one, keys[k], domain.train)
        np.testing.assert_allclose(metrics["reward_mean"][k], alone_metrics["reward_mean"], rtol=1e-5, atol=1e-6)
        for a, b in zip(jax.tree_util.tree_leaves(stacked), jax.tree_util.tree_leaves(alone), strict=True):
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
    import dataclasses

    jax_domain = counter_domain()
    host_env = HostCounterEnv()
    host_domain = dataclasses.replace(jax_domain, env=host_env)
    graphdef, params = tiny_policy(jax_domain, seed=3)
    batch = jax_domain.train.take(np.arange(16))
    outs = [jax.jit(rollout_lib.device_rollout(d, graphdef, CFG).fn, static_argnums=3)(
        params, batch, jax.random.key(5), True) for d in (jax_domain, host_domain)]
    for name in ("success", "step_scores", "step_mask", "tokens"):
        np.testing.assert_array_equal(np.asarray(outs[0][0][name]), np.asarray(outs[1][0][name]), err_msg=name)
    assert host_env.steps > 0
    # sampled episodes of two candidates trained at once (vmap over programs) against the host simulator
    # train exactly as against the JAX environment
    programs = stack_programs([compile_expr(parse(t, list(jax_domain.primitive_names))) for t in ("g1", "g2")])
    keys = jax.random.split(jax.random.key(2), 2)
    results = [jax.jit(make_inner_loop(d, graphdef, CFG.replace(steps=2)).train_many)(params, programs, keys, d.train)
               for d in (jax_domain, host_domain)]
    np.testing.assert_allclose(results[0][1]["reward_mean"], results[1][1]["reward_mean"], atol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(results[0][0]), jax.tree_util.tree_leaves(results[1][0]), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_evaluate_candidates_trains_for_the_steps_asked():
    domain = counter_domain()
    graphdef, params = tiny_policy(domain)
    evaluator = DeviceEvaluator(domain, graphdef, CFG, dispatch="loop", compiler_options=FAST_COMPILE)
    programs = stack_programs([compile_expr(parse("g1 + u*g2", list(domain.primitive_names)))])
    key = jax.random.key(4)
    results = evaluator.evaluate_candidates(programs, params, key, domain.train, domain.test, steps=3)
    assert results.curves["reward_mean"].shape == (1, 3)
    _, metrics = jax.jit(make_inner_loop(domain, graphdef, CFG.replace(steps=3)).train)(
        params, jax.tree_util.tree_map(lambda x: x[0], programs), key, domain.train)
    np.testing.assert_allclose(results.curves["reward_mean"][0], metrics["reward_mean"], rtol=1e-5, atol=1e-6)
