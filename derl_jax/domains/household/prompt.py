"""Each turn's prompt from the task, a window of past turns and the current observation.

    <bos> description  (<obs> obs_i <act> action_i)  for the last W turns, oldest first
    <obs> current_obs <act>

Pad tokens (and anything from an action's first eos on) are dropped and the prompt is
left-padded to `prompt_length(W)`, so the policy continues right after the final <act>.
`push_history` slides the window by one turn. Both are pure and jit/vmap-able; the SFT corpus
(corpus.py) and the multi-turn rollout build prompts with the same two functions.

Shapes: D description tokens, W window turns, O observation tokens, A action tokens,
P = prompt_length(W).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from derl_jax.domains.household import text, vocab
from derl_jax.domains.household.actions import ACTION_LENGTH, truncate_at_eos
from derl_jax.domains.household.env import OBS_LENGTH
from derl_jax.domains.household.tasks import DESCRIPTION_LENGTH


def prompt_length(window: int, obs_length: int = OBS_LENGTH, action_length: int = ACTION_LENGTH,
                  description_length: int = DESCRIPTION_LENGTH) -> int:
    """P: the longest prompt of a window of `window` past turns."""
    if window < 0:
        raise ValueError(f"household prompt window must be >= 0, got {window}")
    return 1 + description_length + window * (2 + obs_length + action_length) + 2 + obs_length


@struct.dataclass
class History:
    """The last W turns: obs i32[W, O], actions i32[W, A], count i32[] (turns held, <= W; the
    newest turn is the last row)."""

    obs: jax.Array
    actions: jax.Array
    count: jax.Array


def empty_history(window: int, obs_length: int = OBS_LENGTH, action_length: int = ACTION_LENGTH) -> History:
    return History(obs=jnp.full((window, obs_length), vocab.PAD_ID, jnp.int32),
                   actions=jnp.full((window, action_length), vocab.PAD_ID, jnp.int32),
                   count=jnp.int32(0))


def push_history(history: History, obs: jax.Array, action: jax.Array) -> History:
    """The window after a turn that saw `obs` i32[O] and took `action` i32[A] (the oldest turn drops out)."""
    window = history.obs.shape[0]
    if window == 0:
        return history
    return History(obs=jnp.concatenate([history.obs[1:], obs[None].astype(jnp.int32)]),
                   actions=jnp.concatenate([history.actions[1:], truncate_at_eos(action)[None]]),
                   count=jnp.minimum(history.count + 1, window).astype(jnp.int32))


def build_prompt(description: jax.Array, history: History, obs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(tokens i32[P], mask bool[P]): the left-padded prompt of a turn (see the module docstring)."""
    window, obs_length = history.obs.shape
    action_length = history.actions.shape[1]
    held = jnp.arange(window) >= window - history.count                       # bool[W]
    obs_marker = jnp.full((window, 1), vocab.OBS_ID, jnp.int32)
    act_marker = jnp.full((window, 1), vocab.ACT_ID, jnp.int32)
    turns = jnp.concatenate([obs_marker, history.obs, act_marker, truncate_at_eos(history.actions)], axis=1)
    turn_mask = (turns != vocab.PAD_ID) & held[:, None]
    tokens = jnp.concatenate([jnp.array([vocab.BOS_ID], jnp.int32), description.astype(jnp.int32),
                              turns.reshape(-1), jnp.array([vocab.OBS_ID], jnp.int32), obs.astype(jnp.int32),
                              jnp.array([vocab.ACT_ID], jnp.int32)])
    mask = jnp.concatenate([jnp.array([True]), description != vocab.PAD_ID, turn_mask.reshape(-1),
                            jnp.array([True]), obs != vocab.PAD_ID, jnp.array([True])])
    length = prompt_length(window, obs_length, action_length, description.shape[0])
    packed = text.pack(tokens, mask, length, left=True)
    return packed, jnp.arange(length) >= length - jnp.sum(mask)
