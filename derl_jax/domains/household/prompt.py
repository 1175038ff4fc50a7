"""Each turn's prompt: the task, then the last W (action, observation) turns.

The layout is the multi-turn rollout's (`derl_jax.domains.env.turn_prompts`), so the supervised
corpus and the inner loop show the policy the same prompts:

    <bos> description room   a_{t-W} o_{t-W+1}   ...   a_{t-1} o_t

where `room` is the observation at reset (the room's receptacles, as ALFWorld's prompts start
with the task and the first look around the room).

Slot j of the window holds an action and the observation it led to; at reset the last slot
holds only o_0 (its action is padding). Pad tokens (and anything from an action's first eos on)
are dropped and the prompt is left-padded to `prompt_length(W)`, or to a shorter budget that drops
the window's oldest tokens. `task_prompt`, `push_history`
and `build_prompt` are pure and jit/vmap-able.

Shapes: D description tokens, Tp = D + O + 1 task prompt tokens, W window turns, O observation
tokens, A action tokens, P = prompt_length(W).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from derl_jax.domains.household import text, vocab
from derl_jax.domains.household.actions import ACTION_LENGTH, truncate_at_eos
from derl_jax.domains.household.env import OBS_LENGTH
from derl_jax.domains.household.tasks import DESCRIPTION_LENGTH
from derl_jax.domains.env import turn_prompts

TASK_PROMPT_LENGTH = 1 + DESCRIPTION_LENGTH + OBS_LENGTH


def prompt_length(window: int, obs_length: int = OBS_LENGTH, action_length: int = ACTION_LENGTH,
                  task_length: int = TASK_PROMPT_LENGTH) -> int:
    """P: the longest prompt of a window of `window` turns."""
    if window < 1:
        raise ValueError(f"household prompt window must be >= 1, got {window}")
    return task_length + window * (action_length + obs_length)


def task_prompt(description: jax.Array, room: jax.Array) -> jax.Array:
    """i32[D+O+1]: <bos>, the description i32[D] and the observation at reset `room` i32[O],
    left-padded (a row of the domain's prompts)."""
    tokens = jnp.concatenate([jnp.array([vocab.BOS_ID], jnp.int32), description.astype(jnp.int32),
                              room.astype(jnp.int32)])
    return text.pack(tokens, tokens != vocab.PAD_ID, tokens.shape[0], left=True)


@struct.dataclass
class History:
    """The window: actions i32[W, A] and obs i32[W, O]; slot j holds an action and the observation
    it led to, the newest turn in the last slot."""

    actions: jax.Array
    obs: jax.Array


def start_history(window: int, first_obs: jax.Array, action_length: int = ACTION_LENGTH) -> History:
    """The window at reset: padding, with `first_obs` i32[O] in the last slot."""
    obs = jnp.full((window, first_obs.shape[0]), vocab.PAD_ID, jnp.int32).at[-1].set(first_obs.astype(jnp.int32))
    return History(actions=jnp.full((window, action_length), vocab.PAD_ID, jnp.int32), obs=obs)


def push_history(history: History, action: jax.Array, next_obs: jax.Array) -> History:
    """The window after a turn took `action` i32[A] and saw `next_obs` i32[O] (the oldest slot drops out)."""
    return History(actions=jnp.concatenate([history.actions[1:], truncate_at_eos(action)[None]]),
                   obs=jnp.concatenate([history.obs[1:], next_obs[None].astype(jnp.int32)]))


def build_prompt(task_tokens: jax.Array, history: History, length: int | None = None) -> tuple[jax.Array, jax.Array]:
    """(tokens i32[P], mask bool[P]): the left-padded prompt of a turn from the task prompt i32[Tp]
    (`task_prompt`) and the window, exactly as the rollout writes it (`turn_prompts`).

    P = min(`length`, prompt_length(W)); None: room for the whole window. A window too long for P
    loses its oldest tokens.
    """
    actions = truncate_at_eos(history.actions)
    tokens, mask = turn_prompts(task_tokens[None].astype(jnp.int32), task_tokens[None] != vocab.PAD_ID,
                                actions[None], actions[None] != vocab.PAD_ID, history.obs[None],
                                history.obs[None] != vocab.PAD_ID, length, vocab.PAD_ID)
    return tokens[0], mask[0]
