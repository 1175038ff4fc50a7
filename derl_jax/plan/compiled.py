"""The compiler's view of one inner-loop step: lower and compile the real jitted pieces on
abstract inputs (no arrays are allocated) and read XLA's memory and cost analyses.

Pieces, each `jax.vmap`-ed over the candidates in flight (sharded over 'cand' on a mesh):

    sample     `derl_jax.models.sampling.sample` of N rows (prefill + decode scan)
    reference  `sequence_logprobs` of the reference policy (only when the KL weight is > 0)
    update     `derl_jax.rl.grpo.grpo_update` (E x M optimizer steps, `sequence_logprobs` inside)

`memory_analysis()` gives per-device argument, output, temporary and aliased bytes of each
compiled piece. XLA's `cost_analysis()` counts a while loop's body once, whatever its trip
count, so FLOPs come from loop-free pieces compiled for one candidate on one device (prefill,
one decode step, one reference pass, one optimizer step) multiplied by their trip counts;
`flop_check` sets them next to `analytic.step_flops`.

On a mesh the process needs as many devices as the mesh has; `plan_in_subprocess` runs this
module in a fresh CPU process with `--xla_force_host_platform_device_count` set (fake host
devices), whatever the caller's own device count.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from derl_jax.models import attention
from derl_jax.models import transformer as tr
from derl_jax.models.sampling import prefill, sample, sequence_logprobs
from derl_jax.plan import analytic
from derl_jax.plan.analytic import RunShape
from derl_jax.rl.grpo import GRPOConfig, grpo_update, make_optimizer
from derl_jax.rl.placement import update_split

PAD_ID = 0
NEVER_EOS = -1  # outside the vocabulary: every row decodes all T tokens (the worst case)
MESH_AXES = ("cand", "data", "model")


def grpo_config(shape: RunShape) -> GRPOConfig:
    return GRPOConfig(group_size=shape.group_size, epochs=shape.epochs, minibatches=shape.minibatches,
                      optimizer=shape.optimizer, kl_coef=1e-3 if shape.reference else 0.0,
                      weight_decay=0.01 if shape.optimizer == "adamw" else 0.0)


def make_mesh(shape: RunShape) -> Mesh:
    """A (cand, data, model) mesh over the first prod(mesh) devices of this process."""
    devices = jax.devices()
    if len(devices) < shape.num_devices:
        raise ValueError(
            f"plan: mesh {shape.mesh} needs {shape.num_devices} devices, this process has {len(devices)}; "
            f"use plan_in_subprocess (fake host devices)")
    return jax.make_mesh(shape.mesh, MESH_AXES, axis_types=(AxisType.Auto,) * 3,
                         devices=devices[:shape.num_devices])


# ----------------------------------------------------------------------------- one candidate


def logprob_fn(graphdef, group: int) -> Callable:
    def fn(params, batch):
        return sequence_logprobs(graphdef, params, batch["prompts"], batch["prompt_mask"], batch["completions"],
                                 batch["mask"], 1.0, group_size=group)
    return fn


def candidate_functions(shape: RunShape, graphdef, mesh: Mesh | None = None) -> dict[str, Callable]:
    """{piece: function of one candidate's arrays}, the calls the inner loop makes on `mesh`
    (the update cuts its rows over 'data' as the loop does, `placement.update_split`)."""
    grpo = grpo_config(shape)
    optimizer = make_optimizer(grpo)
    # remat only changes the backward pass; forward-only pieces run the same model without it
    forward_graphdef = tr.abstract_model(shape.model.replace(remat=False))[0] if shape.model.remat else graphdef
    def sample_one(params, prompts, prompt_mask, key):
        out = sample(forward_graphdef, params, prompts, prompt_mask, key, max_new_tokens=shape.new_tokens,
                     eos_id=NEVER_EOS, pad_id=PAD_ID, group_size=shape.prefill_group)
        return out.tokens, out.sampling_logprobs, out.mask

    def reference_one(params, batch):
        return logprob_fn(forward_graphdef, shape.prefill_group)(params, batch)[0]

    data_split = update_split(mesh, shape.update_rows // shape.minibatches, shape.update_group)

    def update_one(params, opt_state, batch, key):
        return grpo_update(params, opt_state, batch, key, logprob_fn(graphdef, shape.update_group), optimizer, grpo,
                           **data_split)

    return {"sample": sample_one, "reference": reference_one, "update": update_one}


def abstract_policy(shape: RunShape):
    """(graphdef, params, optimizer state) of one candidate as ShapeDtypeStructs."""
    graphdef, params = tr.abstract_model(shape.model)
    opt_state = jax.eval_shape(make_optimizer(grpo_config(shape)).init, params)
    return graphdef, params, opt_state


def abstract_batch(shape: RunShape, rows: int) -> dict[str, jax.ShapeDtypeStruct]:
    """The update batch of `rows` rollouts (what the rollout hands `grpo_update`)."""
    tp, t = shape.prompt_tokens, shape.new_tokens
    f32, i32, b = jnp.float32, jnp.int32, jnp.bool_
    return {"prompts": jax.ShapeDtypeStruct((rows, tp), i32), "prompt_mask": jax.ShapeDtypeStruct((rows, tp), b),
            "completions": jax.ShapeDtypeStruct((rows, t), i32), "mask": jax.ShapeDtypeStruct((rows, t), b),
            "old_logp": jax.ShapeDtypeStruct((rows, t), f32), "advantages": jax.ShapeDtypeStruct((rows,), f32),
            **({"ref_logp": jax.ShapeDtypeStruct((rows, t), f32)} if shape.reference else {})}


def abstract_key() -> jax.ShapeDtypeStruct:
    return jax.eval_shape(lambda: jax.random.key(0))


# ----------------------------------------------------------------------------- memory


def _stacked(tree: Any, count: int, specs: Any, mesh: Mesh | None) -> Any:
    """Every leaf given a leading candidate axis of `count`, sharded over 'cand' (+ its spec)."""
    def one(leaf, spec):
        sharding = None if mesh is None else NamedSharding(mesh, PartitionSpec("cand", *spec))
        return jax.ShapeDtypeStruct((count, *leaf.shape), leaf.dtype, sharding=sharding)
    return jax.tree_util.tree_map(one, tree, specs, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


def _specs(tree: Any, mesh: Mesh | None, data_axis: bool) -> Any:
    """Per leaf: the parameter spec (from the 'model' metadata) or rows over 'data'."""
    if data_axis:
        return jax.tree_util.tree_map(lambda leaf: PartitionSpec("data") if mesh is not None else PartitionSpec(),
                                      tree)
    if mesh is None:
        return jax.tree_util.tree_map(lambda leaf: PartitionSpec(), tree)
    return tr.param_partition_specs(tree, mesh)


def memory_stats(compiled) -> dict[str, int] | None:
    """Per-device bytes of a compiled executable, or None when the backend gives none."""
    stats = compiled.memory_analysis()
    if stats is None:
        return None
    out = {"argument_bytes": int(stats.argument_size_in_bytes), "output_bytes": int(stats.output_size_in_bytes),
           "temp_bytes": int(stats.temp_size_in_bytes), "alias_bytes": int(stats.alias_size_in_bytes)}
    out["peak_bytes"] = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
    return out


def cost_flops(compiled) -> float | None:
    """XLA's flop count of a compiled executable (a while body counted once), or None."""
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None
    if not cost or "flops" not in cost:
        return None
    return float(cost["flops"])


def compile_pieces(shape: RunShape, mesh: Mesh | None = None) -> dict[str, Any]:
    """{piece: compiled executable} of the step's pieces for the candidates in flight.

    With `mesh`, candidates run over 'cand', rollouts over 'data' and weights over 'model',
    as in the inner loop; without one, on the default device.
    """
    graphdef, params, opt_state = abstract_policy(shape)
    cand = shape.mesh[0] if mesh is not None else 1
    count = -(-min(shape.in_flight, analytic.padded_candidates(shape)) // cand) * cand
    fns = candidate_functions(shape, graphdef, mesh)
    spmd = "cand" if mesh is not None else None
    stacked_params = _stacked(params, count, _specs(params, mesh, False), mesh)
    stacked_opt = _stacked(opt_state, count, _specs(opt_state, mesh, False), mesh)
    batch = abstract_batch(shape, shape.update_rows)
    stacked_batch = _stacked(batch, count, _specs(batch, mesh, True), mesh)
    keys = _stacked(abstract_key(), count, PartitionSpec(), mesh)
    prompts = _stacked(abstract_batch(shape, shape.rollouts), count, _specs(batch, mesh, True), mesh)
    vmap = lambda fn: jax.vmap(fn, spmd_axis_name=spmd)  # noqa: E731
    compiled = {
        "sample": jax.jit(vmap(fns["sample"])).lower(stacked_params, prompts["prompts"], prompts["prompt_mask"],
                                                     keys).compile(),
        "update": jax.jit(vmap(fns["update"]), donate_argnums=(0, 1)).lower(stacked_params, stacked_opt,
                                                                            stacked_batch, keys).compile(),
    }
    if shape.reference:
        compiled["reference"] = jax.jit(vmap(fns["reference"])).lower(stacked_params, stacked_batch).compile()
    return compiled


# ----------------------------------------------------------------------------- FLOPs


def flop_pieces(shape: RunShape, compiler_options: dict | None = None) -> dict[str, float]:
    """XLA's FLOPs of one candidate's loop-free pieces: prefill (with the first logits), one
    decode step, one reference pass, one optimizer step; and the step total over K candidates.
    `compiler_options` go to XLA (e.g. {"xla_backend_optimization_level": 0}: a faster CPU
    compile; the count is taken on the optimised HLO, before code generation)."""
    graphdef, params, opt_state = abstract_policy(shape)
    config, n, tp, t = shape.model, shape.rollouts, shape.prompt_tokens, shape.new_tokens
    cache_length = tp + t
    batch = abstract_batch(shape, n)

    forward = tr.abstract_model(shape.model.replace(remat=False))[0] if shape.model.remat else graphdef

    def prefill_piece(params, prompts, prompt_mask):
        last, cache = prefill(forward, params, prompts, prompt_mask, cache_length, shape.prefill_group)
        return tr.apply_logits(forward, params, last), cache

    def decode_piece(params, previous, positions, mask, cache, write_at):
        hidden, cache = tr.apply_hidden(forward, params, previous[:, None], positions, mask, cache, write_at)
        return tr.apply_logits(forward, params, hidden[:, 0]), cache

    cache = jax.eval_shape(lambda: attention.init_head_major_cache(config, n, cache_length))
    i32 = jnp.int32
    flops = {
        "prefill": cost_flops(jax.jit(prefill_piece).lower(params, batch["prompts"], batch["prompt_mask"]).compile(
            compiler_options)),
        "decode_step": cost_flops(jax.jit(decode_piece).lower(
            params, jax.ShapeDtypeStruct((n,), i32), jax.ShapeDtypeStruct((n, 1), i32),
            jax.ShapeDtypeStruct((n, 1, cache_length), jnp.bool_), cache,
            jax.ShapeDtypeStruct((), i32)).compile(compiler_options)),
    }
    fns = candidate_functions(shape, graphdef)
    if shape.reference:
        flops["reference"] = cost_flops(jax.jit(fns["reference"]).lower(
            params, abstract_batch(shape, shape.update_rows)).compile(compiler_options))
    one_step = dataclasses.replace(grpo_config(shape), epochs=1, minibatches=1)
    def update_step_piece(params, opt_state, batch, key):
        return grpo_update(params, opt_state, batch, key, logprob_fn(graphdef, shape.update_group),
                           make_optimizer(one_step), one_step)

    flops["update_step"] = cost_flops(jax.jit(update_step_piece).lower(
        params, opt_state, abstract_batch(shape, shape.update_rows // shape.minibatches),
        abstract_key()).compile(compiler_options))
    if any(value is None for value in flops.values()):
        return {}
    k = shape.num_candidates
    sampling = k * shape.turns * (flops["prefill"] + (t - 1) * flops["decode_step"])
    update = k * shape.epochs * shape.minibatches * flops["update_step"]
    flops["step"] = {"sampling": sampling, "reference": k * flops.get("reference", 0.0), "update": update,
                     "total": sampling + k * flops.get("reference", 0.0) + update}
    return flops


def flop_check(shape: RunShape, compiler_options: dict | None = None) -> dict[str, dict[str, float]]:
    """{sampling|reference|update|total: {"compiled", "analytic", "ratio"}}."""
    compiled = flop_pieces(shape, compiler_options).get("step", {})
    analytic_flops = analytic.step_flops(shape)
    return {name: {"compiled": compiled[name], "analytic": float(analytic_flops[name]),
                   "ratio": compiled[name] / analytic_flops[name] if analytic_flops[name] else 1.0}
            for name in compiled}


# ----------------------------------------------------------------------------- entry


def compiled_plan(shape: RunShape, with_flops: bool = True) -> dict[str, Any]:
    """{"memory": {piece: per-device bytes}, "flops": flop_pieces(...)} on this process's devices."""
    mesh = make_mesh(shape) if shape.num_devices > 1 else None
    memory = {name: memory_stats(c) for name, c in compile_pieces(shape, mesh).items()}
    return {"memory": memory, "flops": flop_pieces(shape) if with_flops else {},
            "backend": jax.default_backend(), "devices": shape.num_devices}


def shape_to_json(shape: RunShape) -> str:
    return json.dumps(dataclasses.asdict(shape))


def shape_from_json(text: str) -> RunShape:
    fields = json.loads(text)
    fields["model"] = tr.ModelConfig(**fields["model"])
    fields["meta"] = tr.ModelConfig(**fields["meta"]) if fields.get("meta") else None
    fields["mesh"] = tuple(fields["mesh"])
    return RunShape(**fields)


def plan_in_subprocess(shape: RunShape, with_flops: bool = True, timeout_s: float = 1800.0) -> dict[str, Any]:
    """`compiled_plan` in a fresh CPU process with prod(mesh) fake host devices."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={shape.num_devices}")
    args = [sys.executable, "-m", "derl_jax.plan.compiled", shape_to_json(shape)]
    args += [] if with_flops else ["--no-flops"]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode:
        raise RuntimeError(f"plan: compiling in a subprocess failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(json.dumps(compiled_plan(shape_from_json(sys.argv[1]), with_flops="--no-flops" not in sys.argv)))
