"""The compiled policy functions of the host-driven inner loop (`derl_jax.rl.host_loop`) on one
('data', 'model') mesh: sampling, reference log-probs, and the reward + GRPO update of one step.

    fns = shared_policy_functions(graphdef, mesh, max_new_tokens=T, temperature=1.0, top_k=0,
                                  grpo=GRPOConfig(...), eos_id=eos, pad_id=pad, stop_ids=(eos,))
    rollouts = fns.sample(params, prompts, prompt_mask, key)          # device, jit
    params, opt_state, metrics = fns.update(params, opt_state, program, prims, u, rollouts, ref_logp, key)

The host decodes `rollouts` and computes `prims` f32[N, P] between the two calls.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from derl_jax.expr.program import Program
from derl_jax.models import sampling
from derl_jax.parallel import DATA_AXIS, MODEL_AXIS, put_global
from derl_jax.rl.grpo import GRPOConfig, grpo_update, make_optimizer
from derl_jax.rl.loop import rewards_and_advantages
from derl_jax.rl.placement import optimizer_state_shardings, place_params, update_split
from derl_jax.rl.rollout import Rollouts, completion_logprobs, sample_rollouts


def reward_and_update(graphdef: nnx.GraphDef, optimizer, grpo: GRPOConfig, params: nnx.State, opt_state: Any,
                      program: Program, prims: jax.Array, progress: jax.Array, rollouts: Rollouts,
                      ref_logp: jax.Array | None, key: jax.Array, *, max_new_tokens: int = 0,
                      overlong_buffer: int = 0, oversample: int = 1,
                      **data_split) -> tuple[nnx.State, Any, dict[str, jax.Array]]:
    """Rewards of `program` on prims f32[O*N, P] at progress u (shaped and selected as
    `derl_jax.rl.loop.rewards_and_advantages` says; O = oversample), group advantages, one GRPO
    update of the N rows trained on (`data_split`: how it cuts rows over 'data',
    `derl_jax.rl.placement.update_split`).

    Returns (params, opt_state, metrics: reward_mean, nonfinite, entropy, clip_fraction, loss,
    grad_norm, kl when `ref_logp` is given, shortfall and informative_fraction when O > 1).
    """
    scored = rewards_and_advantages(program, prims, progress, grpo.group_size, grpo.normalize_std, rollouts.lengths,
                                    max_new_tokens=max_new_tokens, overlong_buffer=overlong_buffer,
                                    oversample=oversample)
    batch = {"prompts": rollouts.prompts, "prompt_mask": rollouts.prompt_mask, "completions": rollouts.completions,
             "mask": rollouts.mask, "old_logp": rollouts.logprobs}
    if ref_logp is not None:
        batch["ref_logp"] = ref_logp
    if scored.rows is not None:
        batch = {name: value[scored.rows] for name, value in batch.items()}
    batch["advantages"] = scored.advantages

    def logprob_fn(p, rows):
        return sampling.sequence_logprobs(graphdef, p, rows["prompts"], rows["prompt_mask"], rows["completions"],
                                          rows["mask"])

    params, opt_state, metrics = grpo_update(params, opt_state, batch, key, logprob_fn, optimizer, grpo,
                                             **data_split)
    metrics = {name: metrics[name] for name in ("entropy", "clip_fraction", "loss", "grad_norm")
               + (("kl",) if ref_logp is not None else ())}
    metrics.update(reward_mean=jnp.mean(scored.rewards), nonfinite=scored.nonfinite.astype(jnp.float32),
                   **scored.stats)
    return params, opt_state, metrics


class PolicyFunctions:
    """Jitted sampling, reference log-probs and GRPO update of a policy on one ('data', 'model') mesh."""

    def __init__(self, graphdef: nnx.GraphDef, mesh: Mesh, *, max_new_tokens: int, temperature: float, top_k: int,
                 grpo: GRPOConfig, eos_id: int, pad_id: int, stop_ids: Sequence[int], dynamic_oversample: int = 1,
                 overlong_buffer: int = 0):
        missing = {DATA_AXIS, MODEL_AXIS} - set(mesh.axis_names)
        if missing:
            raise ValueError(f"PolicyFunctions: the mesh needs axes 'data' and 'model', has {mesh.axis_names}")
        self.mesh = mesh
        self.optimizer = make_optimizer(grpo)
        self.minibatches = grpo.minibatches
        self.oversample = int(dynamic_oversample)
        decode = dict(max_new_tokens=int(max_new_tokens), eos_id=int(eos_id), pad_id=int(pad_id),
                      stop_ids=tuple(int(s) for s in stop_ids), top_k=int(top_k))
        self._sample = jax.jit(functools.partial(sample_rollouts, graphdef, temperature=float(temperature),
                                                 greedy=False, **decode))
        self._greedy = jax.jit(functools.partial(sample_rollouts, graphdef, temperature=1.0, greedy=True, **decode))
        self._reference = jax.jit(functools.partial(completion_logprobs, graphdef))
        self._update_fn = functools.partial(reward_and_update, graphdef, self.optimizer, grpo,
                                            max_new_tokens=int(max_new_tokens), overlong_buffer=int(overlong_buffer),
                                            oversample=self.oversample)
        self._updates: dict[tuple, Any] = {}
        self._optimizer_inits: dict[tuple, Any] = {}

    @property
    def data_size(self) -> int:
        return int(self.mesh.shape[DATA_AXIS])

    def place(self, params: nnx.State) -> nnx.State:
        return place_params(params, self.mesh)

    def rows(self, array: np.ndarray) -> jax.Array:
        """A host array [N, ...] on the mesh, rows over 'data' (replicated when 'data' does not divide N)."""
        array = np.asarray(array)
        spec = [None] * array.ndim
        if array.ndim and array.shape[0] % self.data_size == 0:
            spec[0] = DATA_AXIS
        return put_global(array, NamedSharding(self.mesh, PartitionSpec(*spec)))

    def sample(self, params: nnx.State, prompts: jax.Array, prompt_mask: jax.Array, key: jax.Array,
               greedy: bool = False) -> Rollouts:
        return (self._greedy if greedy else self._sample)(params, prompts, prompt_mask, key)

    def reference_logprobs(self, ref_params: nnx.State, rollouts: Rollouts) -> jax.Array:
        return self._reference(ref_params, rollouts)

    def init_optimizer(self, params: nnx.State) -> Any:
        """Optimizer state of `params`, created in place: moments sharded like their parameters,
        everything else (step counts) replicated on the mesh."""
        param_shardings = jax.tree.map(lambda x: x.sharding, params)
        signature = tuple(jax.tree.leaves(param_shardings))
        if signature not in self._optimizer_inits:
            self._optimizer_inits[signature] = jax.jit(
                self.optimizer.init, out_shardings=optimizer_state_shardings(self.optimizer, params, self.mesh))
        return self._optimizer_inits[signature](params)

    def update(self, params, opt_state, program: Program, prims: np.ndarray, progress: float, rollouts: Rollouts,
               ref_logp: jax.Array | None, key: jax.Array):
        """(params, opt_state, metrics) after one GRPO update of the rows trained on (1 / dynamic_oversample
        of `rollouts`); params and opt_state are donated and come back with the shardings they went
        in with (one compiled version per placement)."""
        shardings = (jax.tree.map(lambda x: x.sharding, params), jax.tree.map(lambda x: x.sharding, opt_state))
        data_split = update_split(self.mesh, rollouts.mask.shape[0] // self.oversample // self.minibatches)
        signature = (tuple(jax.tree.leaves(shardings)), tuple(sorted(data_split.items())))
        if signature not in self._updates:
            self._updates[signature] = jax.jit(functools.partial(self._update_fn, **data_split), donate_argnums=(0, 1),
                                               out_shardings=(*shardings, None))
        return self._updates[signature](params, opt_state, program, self.rows(np.asarray(prims, np.float32)),
                                        jnp.float32(progress), rollouts, ref_logp, key)


@functools.lru_cache(maxsize=16)
def shared_policy_functions(graphdef: nnx.GraphDef, mesh: Mesh, *, max_new_tokens: int, temperature: float,
                            top_k: int, grpo: GRPOConfig, eos_id: int, pad_id: int,
                            stop_ids: tuple[int, ...], dynamic_oversample: int = 1,
                            overlong_buffer: int = 0) -> PolicyFunctions:
    """One `PolicyFunctions` per distinct setting, so evaluators that differ only in budgets,
    step counts or batch schedules share their compiled functions."""
    return PolicyFunctions(graphdef, mesh, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                           grpo=grpo, eos_id=eos_id, pad_id=pad_id, stop_ids=stop_ids,
                           dynamic_oversample=dynamic_oversample, overlong_buffer=overlong_buffer)
