"""Multi-turn environments: the interface multi-turn domains implement.

A JAX environment has gymnax's shape: pure, vmappable functions over a `flax.struct`
state, so the multi-turn rollout runs it inside the jitted inner loop and `vmap` over K
reward programs still trains K policies in one call:

    obs, state = env.reset(key, task)                         # task: pytree of arrays of ONE task
    obs, state, reward, done, info = env.step(state, action)

  obs     i32[O]   token ids of the domain's word-level vocabulary, padded with `pad_id`
  action  i32[A]   the policy's action tokens (padded with `pad_id`)
  reward  f32[]    the environment's own reward (reported; rewards come from primitives)
  done    bool[]   the episode has ended; steps after it are ignored by the rollout
  info    dict of arrays; must hold "step_score" f32[] (0..1, e.g. whether the action matched
          the task's tag) and "success" f32[] (1.0 once the task is solved)

A host environment (ScienceWorld, ALFWorld: simulators in Python or Java) offers the
batched NumPy version of the same two calls over a leading batch axis B:

    obs i32[B, O], states = env.reset(keys u32[B, 2], tasks)     # tasks: pytree, leading axis B
    obs, states, reward f32[B], done bool[B], info = env.step(states, actions i32[B, A])

`states` is whatever the adapter keeps per episode (a list of simulator handles is fine).
Both kinds declare `obs_length` (O), `action_length` (A) and `max_turns` (S, the most steps
of an episode). The multi-turn rollout (`derl_jax.rl.rollout`) builds each turn's prompt from
the task, the last W observations and the policy's own last W actions, and hands the
primitives (`primitives/agent.py`) step_scores f32[N, S], step_mask bool[N, S], success f32[N].
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, runtime_checkable

import chex
import jax
import jax.numpy as jnp
import numpy as np

STEP_INFO_KEYS = ("step_score", "success")


class _EnvSizes(Protocol):
    """What both kinds of environment declare: O, A and the most steps of an episode."""

    obs_length: int
    action_length: int
    max_turns: int


@runtime_checkable
class JaxEnv(_EnvSizes, Protocol):
    """A pure JAX environment (see the module docstring)."""

    def reset(self, key: jax.Array, task: Any) -> tuple[jax.Array, Any]:
        """(obs i32[O], state) of a fresh episode of `task`."""

    def step(self, state: Any, action: jax.Array) -> tuple[jax.Array, Any, jax.Array, jax.Array, Mapping[str, jax.Array]]:
        """(obs i32[O], state, reward f32[], done bool[], info) after `action` i32[A]."""


@runtime_checkable
class HostEnv(_EnvSizes, Protocol):
    """A batched host environment with NumPy arrays (see the module docstring)."""

    def reset(self, keys: np.ndarray, tasks: Any) -> tuple[np.ndarray, Any]:
        """(obs i32[B, O], states) of B fresh episodes."""

    def step(self, states: Any, actions: np.ndarray) -> tuple[np.ndarray, Any, np.ndarray, np.ndarray, Mapping[str, np.ndarray]]:
        """(obs i32[B, O], states, reward f32[B], done bool[B], info name -> [B]) after actions i32[B, A]."""


def is_host_env(env: Any) -> bool:
    """True for a host environment (declares `host = True`), False for a JAX one."""
    return bool(getattr(env, "host", False))


def checked_reset(env: JaxEnv, key: jax.Array, task: Any) -> tuple[jax.Array, Any]:
    """`env.reset` with its output checked: obs i32[O]."""
    obs, state = env.reset(key, task)
    chex.assert_shape(obs, (env.obs_length,))
    chex.assert_type(obs, jnp.int32)
    return obs, state


def checked_step(env: JaxEnv, state: Any, action: jax.Array):
    """`env.step` with its inputs and outputs checked (shapes, dtypes, the info keys)."""
    chex.assert_shape(action, (env.action_length,))
    chex.assert_type(action, jnp.int32)
    obs, state, reward, done, info = env.step(state, action)
    chex.assert_shape(obs, (env.obs_length,))
    chex.assert_type(obs, jnp.int32)
    chex.assert_shape([reward, done], ())
    chex.assert_type(reward, jnp.float32)
    chex.assert_type(done, bool)
    missing = [k for k in STEP_INFO_KEYS if k not in info]
    if missing:
        raise KeyError(f"{type(env).__name__}.step: info lacks {missing}; it must hold {STEP_INFO_KEYS}")
    chex.assert_shape([info[k] for k in STEP_INFO_KEYS], ())
    return obs, state, reward, done, info


def checked_host_step(env: HostEnv, outputs: tuple, batch: int):
    """Check a host environment's `step`/`reset` arrays for a batch of `batch` episodes."""
    obs = np.asarray(outputs[0])
    if obs.shape != (batch, env.obs_length) or not np.issubdtype(obs.dtype, np.integer):
        raise ValueError(f"{type(env).__name__}: obs must be int [{batch}, {env.obs_length}], got {obs.dtype} {obs.shape}")
    if len(outputs) == 5:
        _, _, reward, done, info = outputs
        missing = [k for k in STEP_INFO_KEYS if k not in info]
        if missing:
            raise KeyError(f"{type(env).__name__}.step: info lacks {missing}; it must hold {STEP_INFO_KEYS}")
        for name, value in (("reward", reward), ("done", done), *((k, info[k]) for k in STEP_INFO_KEYS)):
            if np.shape(value) != (batch,):
                raise ValueError(f"{type(env).__name__}.step: {name} must have shape ({batch},), got {np.shape(value)}")
    return outputs


# ----------------------------------------------------------------------------- turn prompts


def left_pack(tokens: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Move the real tokens of every row of i32[N, L] / bool[N, L] to the right end, in order."""
    order = jnp.argsort(mask.astype(jnp.int32), axis=-1, stable=True)
    return jnp.take_along_axis(tokens, order, axis=-1), jnp.take_along_axis(mask, order, axis=-1)


def prompt_layout(env: Any):
    """The `agent_prompt.AgentLayout` of an environment that renders agent-prompt rows, else None."""
    layout = getattr(env, "prompt_layout", None)
    return layout if layout is not None else getattr(getattr(env, "env", None), "prompt_layout", None)


def window_room(env: Any, window: int) -> int:
    """The most window tokens of a turn's prompt with `window` slots: W * (A + O), or what the
    environment's agent layout keeps (`agent_prompt.window_room`)."""
    layout = prompt_layout(env)
    if layout is None:
        return int(window) * (int(env.action_length) + int(env.obs_length))
    from derl_jax.domains.agent_prompt import window_room as agent_room

    return agent_room(layout, int(window), int(env.obs_length), int(env.action_length))


def window_history(task_mask: jax.Array, actions: jax.Array, action_mask: jax.Array, observations: jax.Array,
                   obs_mask: jax.Array, length: int | None = None, pad_id: int | None = None,
                   width: int | None = None, layout: Any = None) -> tuple[jax.Array, jax.Array]:
    """The window part of one turn's prompts: actions i32[N, W, A], observations i32[N, W, O]
    (slot j: action j and the observation it led to) -> (history i32[N, W*(A+O)], kept bool[N, W*(A+O)]),
    slot by slot, the real tokens that fit marked in `kept`.

    A prompt holds at most `length` tokens (None: no bound), the task's real tokens (task_mask
    bool[N, Tp]) first, so a row keeps its newest min(length - task tokens, `width`) real history
    tokens (`width` None: no second bound); dropped tokens are set to `pad_id` (needed then).

    With an agent `layout` (`derl_jax.domains.agent_prompt.AgentLayout`) the raw actions stay out
    (unless it keeps them), the last `current_only` positions of every observation but the newest
    are dropped, and the layout's suffix i32[X] follows, always whole (it counts in `length` and
    `width`): the outputs are [N, W*(A+O) + X].
    """
    chex.assert_rank([task_mask, actions, observations], [2, 3, 3])
    count = task_mask.shape[0]
    suffix = None
    if layout is not None:
        if not layout.actions_in_window:
            action_mask = jnp.zeros_like(action_mask, bool)
        slots, obs_len = observations.shape[1], observations.shape[2]
        older = np.arange(slots)[:, None] < slots - 1
        current_part = np.arange(obs_len)[None, :] >= obs_len - int(layout.current_only)
        obs_mask = obs_mask.astype(bool) & jnp.asarray(~(older & current_part))[None]
        suffix = jnp.broadcast_to(jnp.asarray(layout.suffix, jnp.int32), (count, len(layout.suffix)))
        if length is not None:
            length = int(length) - len(layout.suffix)
        if width is not None:
            width = int(width) - len(layout.suffix)
    history = jnp.concatenate([actions, observations], axis=-1).reshape(count, -1)
    kept = jnp.concatenate([action_mask, obs_mask], axis=-1).reshape(count, -1).astype(bool)
    room = None if length is None else int(length) - jnp.sum(task_mask, axis=1, keepdims=True)
    if width is not None:
        room = int(width) if room is None else jnp.minimum(room, int(width))
    if room is not None:
        if pad_id is None:
            raise ValueError("window_history: a bounded window needs pad_id")
        newer = jnp.cumsum(kept[:, ::-1], axis=1)[:, ::-1]   # real history tokens from here on
        kept = kept & (newer <= room)
        history = jnp.where(kept, history, pad_id)
    elif suffix is not None and pad_id is not None:
        history = jnp.where(kept, history, pad_id)
    if suffix is None:
        return history, kept
    return (jnp.concatenate([history, suffix.astype(history.dtype)], axis=1),
            jnp.concatenate([kept, jnp.ones(suffix.shape, bool)], axis=1))


def turn_prompts(task: jax.Array, task_mask: jax.Array, actions: jax.Array, action_mask: jax.Array,
                 observations: jax.Array, obs_mask: jax.Array, length: int | None = None,
                 pad_id: int | None = None) -> tuple[jax.Array, jax.Array]:
    """Prompts of one turn: task i32[N, Tp], actions i32[N, W, A], observations i32[N, W, O]
    (slot j: action j and the observation it led to) -> left-padded i32[N, P] and mask bool[N, P].

    P = min(`length`, Tp + W*(A+O)); None: room for every token. When a row's real tokens do not fit
    in P, its oldest history tokens are dropped (`window_history`); the task is always whole, so
    `length` must be >= Tp.
    """
    chex.assert_rank([task, actions, observations], [2, 3, 3])
    full = task.shape[1] + actions.shape[1] * (actions.shape[2] + observations.shape[2])
    length = full if length is None else min(int(length), full)
    if length < task.shape[1]:
        raise ValueError(f"turn_prompts: prompt length {length} leaves no room for the task prompt's "
                         f"{task.shape[1]} tokens")
    if length < full and pad_id is None:
        raise ValueError("turn_prompts: a prompt length below the full width needs pad_id")
    history, history_mask = window_history(task_mask, actions, action_mask, observations, obs_mask,
                                           length if length < full else None, pad_id)
    tokens, mask = left_pack(jnp.concatenate([task, history], axis=1), jnp.concatenate([task_mask, history_mask], axis=1))
    return tokens[:, full - length:], mask[:, full - length:]
