"""A host environment inside the jitted loop, through the same interface as a JAX one.

`HostEnvBridge(env)` wraps a batched NumPy environment (`derl_jax.domains.env.HostEnv`:
ScienceWorld, ALFWorld, any simulator outside JAX) as a pure-looking JAX environment whose
`reset` / `step` are `jax.pure_callback`s, so the multi-turn rollout (`derl_jax.rl.rollout`)
runs it inside the same `lax.scan` (and under `vmap` over K programs: every callback sees all
episodes of a call at once, flattened to one batch, which is what a batched simulator wants).

The JAX-side state of an episode is one handle i32[] into the bridge's table of simulator
states. The rollout calls `step` exactly `max_turns` times per episode; an episode that is
done is not stepped again (the bridge answers with its last observation and done = True), and
its table entry is dropped after its last call. Simulator calls happen on the host thread that
runs the callback; a lock makes concurrent calls (several candidates in flight) safe.

The step's info carries the interface's step_score and success, and self_reward f32[] too
when the environment writes self-assessments (`env.self_guide`, Self-Guide).
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from derl_jax.domains.env import STEP_INFO_KEYS, checked_host_step

SELF_REWARD_KEY = "self_reward"


def _flat(array: np.ndarray, batch_ndim: int) -> np.ndarray:
    array = np.asarray(array)
    return array.reshape((-1,) + array.shape[batch_ndim:])


class HostEnvBridge:
    """A `HostEnv` behind the JAX environment interface (module docstring)."""

    host = False

    def __init__(self, env: Any):
        self.env = env
        self.obs_length, self.action_length, self.max_turns = int(env.obs_length), int(env.action_length), int(env.max_turns)
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._episodes: dict[int, dict[str, Any]] = {}
        self.info_keys = STEP_INFO_KEYS + ((SELF_REWARD_KEY,) if getattr(env, "self_guide", False) else ())

    # ------------------------------------------------------------------ host side

    def _reset_host(self, keys: np.ndarray, tasks: Any) -> tuple[np.ndarray, np.ndarray]:
        batch_shape = keys.shape[:-1]
        flat_keys = _flat(keys, len(batch_shape)).astype(np.uint32)
        flat_tasks = jax.tree_util.tree_map(lambda x: _flat(x, len(batch_shape)), tasks)
        with self._lock:
            obs, states = checked_host_step(self.env, self.env.reset(flat_keys, flat_tasks), flat_keys.shape[0])
            handles = np.array([next(self._ids) for _ in range(flat_keys.shape[0])], np.int32)
            for row, handle in enumerate(handles):
                self._episodes[int(handle)] = {"state": states[row], "obs": np.asarray(obs[row], np.int32),
                                               "done": False, "success": 0.0, "calls": 0}
        return (np.asarray(obs, np.int32).reshape(batch_shape + (self.obs_length,)), handles.reshape(batch_shape))

    def _step_host(self, handles: np.ndarray, actions: np.ndarray):
        batch_shape = handles.shape
        flat_handles, flat_actions = handles.reshape(-1), _flat(actions, len(batch_shape)).astype(np.int32)
        count = flat_handles.size
        obs = np.zeros((count, self.obs_length), np.int32)
        reward, done = np.zeros(count, np.float32), np.ones(count, bool)
        info = {name: np.zeros(count, np.float32) for name in self.info_keys}
        with self._lock:
            episodes = [self._episodes[int(h)] for h in flat_handles]
            live = [row for row, episode in enumerate(episodes) if not episode["done"]]
            if live:
                states = [episodes[row]["state"] for row in live]
                out = checked_host_step(self.env, self.env.step(states, flat_actions[live]), len(live))
                new_obs, new_states, new_reward, new_done, new_info = out
                for i, row in enumerate(live):
                    episode = episodes[row]
                    episode.update(state=new_states[i], obs=np.asarray(new_obs[i], np.int32), done=bool(new_done[i]),
                                   success=float(new_info["success"][i]))
                    reward[row], done[row] = new_reward[i], new_done[i]
                    for name in self.info_keys:
                        if name != "success":   # success is the episode's, reported below for every row
                            info[name][row] = new_info[name][i]
            for row, (handle, episode) in enumerate(zip(flat_handles, episodes)):
                obs[row], info["success"][row] = episode["obs"], episode["success"]
                episode["calls"] += 1
                if episode["calls"] >= self.max_turns:
                    del self._episodes[int(handle)]
        shaped = lambda x: x.reshape(batch_shape + x.shape[1:])  # noqa: E731
        return shaped(obs), handles, shaped(reward), shaped(done), {k: shaped(v) for k, v in info.items()}

    # ------------------------------------------------------------------ the JAX environment interface

    def reset(self, key: jax.Array, task: Any) -> tuple[jax.Array, jax.Array]:
        """(obs i32[O], handle i32[]) of a fresh episode of `task` on the host."""
        key_data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
        shapes = (jax.ShapeDtypeStruct((self.obs_length,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32))
        return jax.pure_callback(self._reset_host, shapes, key_data, task, vmap_method="broadcast_all")

    def step(self, state: jax.Array, action: jax.Array):
        """(obs i32[O], handle, reward f32[], done bool[], info) after `action` i32[A], on the host."""
        scalar = jax.ShapeDtypeStruct((), jnp.float32)
        shapes = (jax.ShapeDtypeStruct((self.obs_length,), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32), scalar,
                  jax.ShapeDtypeStruct((), jnp.bool_), {name: scalar for name in self.info_keys})
        return jax.pure_callback(self._step_host, shapes, state, action, vmap_method="broadcast_all")
