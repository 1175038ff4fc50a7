"""Per-turn credit of Self-Guide's self-rewards (`inner.self_reward_credit="turn"`): the per-turn
rewards, their group-relative advantages against a NumPy reference, the GRPO loss with one
advantage per turn equal to the same turns as rows, and a household inner run with the full
prompt history (slow; the windowed one is test_selfguide_train.py's run)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from derl_jax.expr.parse import parse
from derl_jax.expr.program import compile_expr
from derl_jax.rl import grpo
from derl_jax.rl.config import InnerConfig
from derl_jax.rl.loop import turn_rewards

NAMES = ("outcome", "phase_first", "phase_middle", "phase_last", "g_sg")


def numpy_turn_advantages(rewards, mask, group, normalize=True, eps=1e-6):
    """The definition, one group at a time: every taken turn of the group's episodes is a sample."""
    out = np.zeros_like(rewards, np.float64)
    for start in range(0, rewards.shape[0], group):
        r, m = rewards[start:start + group], mask[start:start + group]
        taken = r[m].astype(np.float64)
        if taken.size == 0 or taken.max() == taken.min():
            continue
        centred = r - taken.mean()
        if normalize:
            centred = centred / (taken.std(ddof=1) + eps)
        out[start:start + group] = np.where(m, centred, 0.0)
    return out


def test_turn_rewards_put_each_turns_self_reward_in_g_sg():
    rng = np.random.default_rng(0)
    prims = rng.uniform(size=(4, 5)).astype(np.float32)
    self_rewards = rng.choice([0.1, 0.0, -0.1], size=(4, 3)).astype(np.float32)
    u = jnp.float32(0.5)
    rewards_of = jax.jit(turn_rewards, static_argnums=3)   # one compiled VM for both programs
    composite = compile_expr(parse("g1+clip(min((u-0.2)/0.2,(1-u)/0.2),0,1)*g5", NAMES))   # lambda(0.5) = 1
    got = rewards_of(composite, jnp.asarray(prims), jnp.asarray(self_rewards), 4, u)
    np.testing.assert_allclose(got, prims[:, :1] + self_rewards, atol=1e-6)
    outcome = compile_expr(parse("g1+0.5*g2", NAMES))   # no g_sg: every turn gets the episode's reward
    got = rewards_of(outcome, jnp.asarray(prims), jnp.asarray(self_rewards), 4, u)
    np.testing.assert_allclose(got, np.repeat(prims[:, :1] + 0.5 * prims[:, 1:2], 3, axis=1), atol=1e-6)


@pytest.mark.parametrize("normalize", [True, False])
def test_turn_advantages_match_the_definition(normalize):
    rng = np.random.default_rng(1)
    rewards = rng.choice([1.1, 1.0, 0.9, 0.0], size=(12, 5)).astype(np.float32)
    lengths = rng.integers(0, 6, size=12)
    mask = np.arange(5)[None, :] < lengths[:, None]
    rewards[8:12] = 0.3                      # a constant group
    mask[4:8] = False                        # a group that took no turn
    got = np.asarray(grpo.turn_advantages(jnp.asarray(rewards), jnp.asarray(mask), 4, normalize_std=normalize))
    np.testing.assert_allclose(got, numpy_turn_advantages(rewards, mask, 4, normalize), rtol=1e-5, atol=1e-6)
    assert (got[~mask] == 0).all() and (got[4:12] == 0).all()
    with pytest.raises(ValueError, match="group_size=5"):
        grpo.turn_advantages(jnp.asarray(rewards), jnp.asarray(mask), 5)


def test_one_advantage_per_turn_is_the_same_loss_as_turns_as_rows():
    rng = np.random.default_rng(2)
    n, s, t = 4, 3, 5
    x = jnp.asarray(rng.normal(size=(n, s, t)), jnp.float32)
    mask = jnp.asarray(rng.uniform(size=(n, s, t)) < 0.8)
    advantages = jnp.asarray(rng.normal(size=(n, s)), jnp.float32)
    old_logp = jnp.asarray(-rng.uniform(size=(n, s, t)), jnp.float32)

    def logprob_fn(params, batch):
        return jnp.where(batch["mask"], params["w"] * batch["x"] - 1.0, 0.0), jnp.zeros_like(batch["x"])

    params = {"w": jnp.float32(0.3)}
    for agg in grpo.LOSS_AGGREGATIONS:
        cfg = grpo.GRPOConfig(loss_agg=agg, clip_low=0.1, clip_high=0.1)
        nested = {"x": x, "mask": mask, "old_logp": old_logp, "advantages": advantages}
        flat = {name: value.reshape(n * s, *value.shape[2:]) for name, value in nested.items()}
        if agg == "episode_mean":   # turn rows carry their episode's tokens
            flat["episode_tokens"] = jnp.repeat(jnp.sum(mask, axis=(1, 2)).astype(jnp.float32), s)
        (loss, metrics), grads = jax.value_and_grad(grpo.grpo_loss, has_aux=True)(params, nested, logprob_fn, cfg)
        (flat_loss, flat_metrics), flat_grads = jax.value_and_grad(grpo.grpo_loss, has_aux=True)(params, flat,
                                                                                                   logprob_fn, cfg)
        np.testing.assert_allclose(loss, flat_loss, rtol=1e-6)
        np.testing.assert_allclose(grads["w"], flat_grads["w"], rtol=1e-5)
        np.testing.assert_allclose(metrics["clip_fraction"], flat_metrics["clip_fraction"], rtol=1e-6)
    with pytest.raises(AssertionError):   # advantages must be per row or per turn
        grpo.grpo_loss(params, dict(nested, advantages=advantages[:, :2]), logprob_fn, cfg)


def test_the_credit_setting_is_checked():
    with pytest.raises(ValueError, match="self_reward_credit"):
        InnerConfig(steps=1, prompts_per_step=1, group_size=2, max_new_tokens=4, self_reward_credit="step")


@pytest.mark.slow
def test_a_household_run_credits_turns(tmp_path):
    """Full history (windowed history with per-turn credit: test_selfguide_train.py)."""
    from configs import household
    from derl_jax.domains.registry import get_domain
    from derl_jax.experiment.checks import validate_config
    from derl_jax.rl import sft
    from derl_jax.rl.config import inner_config
    from derl_jax.rl.loop import make_inner_loop
    from derl_jax.selfguide import TrustSchedule, composite_text

    cfg = household.get_config("sg_smoke")
    cfg.domain.update(num_train=10, num_test=4, max_turns=4, window=1, history="full", prompt_budget=0)
    cfg.policy.update(sft_steps=30, sft_lr=1e-2, sft_batch_size=32)   # it writes assessment words
    cfg.inner.update(steps=3, prompts_per_step=2, group_size=2, kl_metric=False, self_reward_credit="turn")
    validate_config(cfg)
    domain = get_domain("household").build(cfg)
    graphdef, params = sft.base_policy(domain, cfg.policy, tmp_path / "base", seed=0)
    text = composite_text(domain.primitive_names, TrustSchedule(0.0, 0.0, 1.0))   # lambda = 1 throughout
    program = compile_expr(parse(text, domain.primitive_names))
    loop = make_inner_loop(domain, graphdef, inner_config(cfg, domain.max_new_tokens))
    trained, metrics = jax.device_get(jax.jit(loop.train)(params, program, jax.random.key(0), domain.train))
    assert all(np.isfinite(values).all() for values in metrics.values())
    assert np.abs(metrics["primitive/g_sg"]).max() > 0, "no self-reward was earned: the check would be vacuous"
    # the logged reward is still the episode's: R_env + the summed self-reward
    np.testing.assert_allclose(metrics["reward_mean"], metrics["primitive/outcome"] + metrics["primitive/g_sg"],
                               atol=1e-5)
    moved = jax.tree_util.tree_map(lambda a, b: float(np.max(np.abs(a - b))), trained, jax.device_get(params))
    assert max(jax.tree_util.tree_leaves(moved)) > 0
    plain = get_domain("household").build(household.get_config("smoke"))
    with pytest.raises(ValueError, match="self_reward_credit='turn'"):
        make_inner_loop(plain, graphdef, inner_config(cfg, plain.max_new_tokens))
