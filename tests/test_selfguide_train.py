"""One inner-loop run with Self-Guide on a tiny household config (windowed history, per-turn credit
of the self-rewards): it trains end to end, and the logged reward of every step is still the
episode's, R_env + lambda(u) * sum_t r_sg_t, recomputed in NumPy from the recorded episodes (the
assessment word of each action read from the sampled tokens). Full history with per-turn credit:
test_selfguide_credit.py; episode credit end to end: test_selfguide_engines.py."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from derl_jax.domains.household import vocab
from derl_jax.domains.registry import get_domain
from derl_jax.expr.parse import parse
from derl_jax.expr.program import compile_expr
from derl_jax.rl import sft
from derl_jax.rl.config import inner_config
from derl_jax.rl.loop import make_inner_loop
from derl_jax.selfguide import TrustSchedule, composite_text
from primitives import registry
from primitives.registry import register_primitive

SELF_REWARDS = (0.3, 0.05, -0.2)     # distinct from the defaults, neutral not zero: every word counts
SCHEDULE = TrustSchedule(warmup=0.1, ramp_end=0.6, anneal_start=0.7)
STEPS = 5                            # u = 0, .25, .5, .75, 1 -> lambda = 0, .3, .8, .833, 0
RECORDED: list[dict] = []


@register_primitive("record_episode", kind="device", domain="selfguide_train_test")
def record_episode(rollout, context):
    """Zeros; hands the episode of every training step to the host (in step order)."""
    fields = {name: rollout[name] for name in ("tokens", "mask", "step_mask", "success", "self_rewards")}
    jax.debug.callback(lambda tree: RECORDED.append(jax.tree_util.tree_map(np.asarray, tree)), fields, ordered=True)
    return jnp.zeros(rollout["success"].shape, jnp.float32)


def reference_trust(u):
    w, r, a = SCHEDULE.warmup, SCHEDULE.ramp_end, SCHEDULE.anneal_start
    return 0.0 if u < w else (u - w) / (r - w) if u < r else 1.0 if u <= a else (1.0 - u) / (1.0 - a)


def numpy_self_reward(episode) -> np.ndarray:
    """f32[N]: sum over taken turns of the reward of the action's first token, if it is an assessment word."""
    first, generated = episode["tokens"][:, :, 0], episode["mask"][:, :, 0]
    values = np.zeros(first.shape)
    for index, token in enumerate(vocab.ASSESSMENT_IDS):
        values[(first == token) & generated] = SELF_REWARDS[index]
    return (values * episode["step_mask"]).sum(axis=1)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from configs import household

    cfg = household.get_config("sg_smoke")
    cfg.domain.update(num_train=10, num_test=4, max_turns=4, window=1, self_rewards=SELF_REWARDS)
    cfg.policy.update(sft_steps=30, sft_lr=1e-2, sft_batch_size=32)
    cfg.inner.update(steps=STEPS, prompts_per_step=2, group_size=2, kl_metric=False, self_reward_credit="turn")
    spec = get_domain("household")
    spec.validate(cfg)
    domain = spec.build(cfg)
    graphdef, params = sft.base_policy(domain, cfg.policy, tmp_path_factory.mktemp("base"), seed=0)
    return cfg, domain, graphdef, params


@pytest.mark.slow
def test_one_self_guide_run_trains_on_the_composite_reward(setup):
    cfg, domain, graphdef, params = setup
    recorder = registry.get("selfguide_train_test", "record_episode")
    recording = dataclasses.replace(domain, primitives=domain.primitives + (recorder,))
    text = composite_text(recording.primitive_names, SCHEDULE)
    assert text == "g1+clip(min((u-0.1)/0.5,(1-u)/0.3),0,1)*g5"
    program = compile_expr(parse(text, recording.primitive_names))
    loop = make_inner_loop(recording, graphdef, inner_config(cfg, domain.max_new_tokens))
    RECORDED.clear()
    trained, metrics = jax.jit(loop.train)(params, program, jax.random.key(3), domain.train)
    metrics = jax.device_get(metrics)
    jax.effects_barrier()

    assert len(RECORDED) == STEPS
    moved = jax.tree_util.tree_map(lambda a, b: float(jnp.max(jnp.abs(a - b))), trained, params)
    assert max(jax.tree_util.tree_leaves(moved)) > 0 and all(np.isfinite(metrics["loss"]))
    written = 0
    for step, episode in enumerate(RECORDED):
        self_reward = numpy_self_reward(episode)
        # The environment's self-rewards are the words the policy wrote.
        np.testing.assert_allclose((episode["self_rewards"] * episode["step_mask"]).sum(axis=1), self_reward, atol=1e-6)
        u = step / (STEPS - 1)
        reward = episode["success"] + reference_trust(u) * self_reward
        np.testing.assert_allclose(metrics["reward_mean"][step], reward.mean(), atol=1e-5)
        np.testing.assert_allclose(metrics["primitive/g_sg"][step], self_reward.mean(), atol=1e-6)
        np.testing.assert_allclose(metrics["primitive/outcome"][step], episode["success"].mean(), atol=1e-6)
        written += int(np.count_nonzero(self_reward)) if 0 < reference_trust(u) else 0
    assert written > 0, "the warm-started policy wrote no assessment while lambda > 0: the check would be vacuous"
