"""Self-Guide in the household: the expert's self-assessments and actions that carry them.

With the domain's `self_guide` option the policy writes, before each tagged action, one word
assessing its progress so far (vocab.ASSESSMENTS; the rule of derl_jax/domains/selfguide.py), as
the Self-Guide paper's agent writes its guidance z_t from the history and the current
observation before choosing a_t:

    progress+   the last step completed a subgoal (`progress` rose: holding the goal object,
                treating it, placing it);
    progress-   the last action failed ("nothing happens .");
    progress=   otherwise (the first turn included).

The expert's rule reads only what the prompt shows (the last observation and whether a
subgoal was just reached), so a policy can learn it; the environment maps the word to the
internal reward (env.HouseholdEnv.self_rewards) whatever the word is.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from derl_jax.domains.household import vocab
from derl_jax.domains.household.env import HouseholdState
from derl_jax.domains.selfguide import assess


def expert_assessment(state: HouseholdState) -> jax.Array:
    """i32[]: the index (into vocab.ASSESSMENTS) of the expert's assessment before acting in `state`."""
    return assess(state.subgoal_done, state.last_failed, xp=jnp)


def with_assessment(policy):
    """A policy (state, key) -> i32[A+1] that writes the expert's assessment, then `policy`'s
    action i32[A] (perturbed turns keep a sensible assessment: only the action is random)."""
    def assessed(state: HouseholdState, key: jax.Array) -> jax.Array:
        word = jnp.asarray(vocab.ASSESSMENT_IDS)[expert_assessment(state)]
        return jnp.concatenate([word[None], policy(state, key).astype(jnp.int32)])
    return assessed
