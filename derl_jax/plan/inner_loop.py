"""The compiler's view of the whole inner loop of a device-rollout domain: the run's own
`make_inner_loop(domain, graphdef, cfg, mesh).train_many` (every step's rollout, primitives,
reward program, advantages, reference pass and GRPO update in one `lax.scan`, vmapped over
the K candidates) lowered and compiled on abstract inputs.

    stats = compile_train_many(domain, model_config, run_cfg, num_candidates=8, mesh=mesh)
    stats["memory"]   # per-device argument / output / temp / aliased bytes, peak
    stats["flops"]    # XLA's count: one step of the scan (its body is counted once)

Host-scored domains (`domain.rollout == "host"`) train through a host-driven loop with no
single executable; `derl_jax.plan.compiled` covers them piece by piece.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from derl_jax.expr.program import MAX_PROGRAM_LENGTH, Program
from derl_jax.models import transformer as tr
from derl_jax.plan.compiled import cost_flops, memory_stats
from derl_jax.rl.config import inner_config
from derl_jax.rl.loop import make_inner_loop


def _abstract(tree: Any, sharding: Any = None) -> Any:
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding), tree)


def compile_train_many(domain: Any, model: tr.ModelConfig, run_cfg: Any, num_candidates: int,
                       mesh: Mesh | None = None, program_length: int = MAX_PROGRAM_LENGTH,
                       compiler_options: dict | None = None) -> dict:
    """Compile `train_many` of `num_candidates` candidates from one shared starting policy (as
    the evaluator calls it) on `domain.train`, shardings as `DeviceEvaluator` places them.
    `compiler_options` go to XLA (e.g. {"xla_backend_optimization_level": 0} for a fast CPU
    compile; argument and output sizes do not depend on it)."""
    if domain.rollout == "host":
        raise ValueError(f"plan: domain {domain.name!r} scores on the host; its loop is not one executable "
                         f"(use derl_jax.plan.compiled)")
    graphdef, params = tr.abstract_model(model)
    loop = make_inner_loop(domain, graphdef, inner_config(run_cfg, domain.max_new_tokens), mesh)

    def placed(spec: PartitionSpec):
        return None if mesh is None else NamedSharding(mesh, spec)

    if mesh is not None:
        specs = tr.param_partition_specs(params, mesh)
        params = jax.tree_util.tree_map(
            lambda leaf, spec: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=placed(spec)), params, specs,
            is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
    k, length = num_candidates, program_length
    by_candidate = placed(PartitionSpec("cand"))
    programs = Program(ops=jax.ShapeDtypeStruct((k, length), jnp.int32, sharding=by_candidate),
                       args=jax.ShapeDtypeStruct((k, length), jnp.float32, sharding=by_candidate),
                       size=jax.ShapeDtypeStruct((k,), jnp.int32, sharding=by_candidate))
    key = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), k))
    keys = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=by_candidate)
    dataset = _abstract(domain.train, placed(PartitionSpec()))
    # keep_unused: the caller allocates every argument, read or not (some context fields may be unread)
    compiled = jax.jit(loop.train_many, keep_unused=True).lower(params, programs, keys, dataset).compile(
        compiler_options)
    return {"memory": memory_stats(compiled), "flops": cost_flops(compiled)}
