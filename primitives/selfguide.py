"""The Self-Guide primitive of the multi-turn agent domains: the episode's summed self-reward.

An agent domain with self-assessment (household, scienceworld, alfworld:
`config.domain.self_guide=True`) has the environment map the policy's assessment of every turn
(a word for a scratch policy; for a pretrained one a sentence in `<assess>` tags ending in its
verdict, derl_jax/domains/agent_prompt.py) to an internal reward r_sg_t (+0.1 / 0 / -0.1 by
default; 0 for a malformed assessment); the multi-turn rollout hands
them to primitives as `self_rewards f32[N, S]` next to `step_mask bool[N, S]`.

  * ``g_sg`` = sum over the steps the episode took of r_sg_t  -> f32[N].

The Self-Guide reward R_env + lambda(u) * g_sg is a reward expression over it
(`derl_jax.selfguide.composite_text`), and DERL's grammar, which has `u`, may find others.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from primitives.agent import DOMAIN, _field
from primitives.registry import register_primitive

from derl_jax.selfguide import SELF_REWARD_PRIMITIVE  # "g_sg"


@register_primitive(SELF_REWARD_PRIMITIVE, kind="device", domain=DOMAIN, aliases=("self_reward",))
def summed_self_reward(rollout: Mapping[str, Any], context: Any) -> jax.Array:
    """Sum of the self-rewards f32[N, S] over the taken steps (step_mask) -> f32[N]."""
    if "self_rewards" not in rollout:
        raise KeyError("primitive g_sg: the rollout has no 'self_rewards': the environment writes no "
                       "self-assessment (household, scienceworld, alfworld: set config.domain.self_guide=True)")
    rewards = _field(rollout, "self_rewards", 2).astype(jnp.float32)
    mask = _field(rollout, "step_mask", 2).astype(bool)
    if rewards.shape != mask.shape:
        raise ValueError(f"primitive g_sg: self_rewards has shape {rewards.shape} but step_mask has {mask.shape}")
    return jnp.sum(jnp.where(mask, rewards, 0.0), axis=-1)
