"""Where candidates and policies live: the candidate axis, its chunks and padding, meshes.

    map_candidates(fn, in_axes, chunk_size, spmd_axis_name)   vmap over K, or K/c chunks of c
    padded_count(K, chunk_size, cand_size)                    K rounded up to what the mesh takes
    run_mesh(cfg, auto_data)                                  the ('cand', 'data', 'model') mesh of config.mesh
    auto_data_size(cfg, inner, num_params)                    what `mesh.data` = 0 (auto) means for a run
    candidate_slices(mesh)                                    one ('data', 'model') sub-mesh per 'cand' index
    place_params(params, mesh)                                policies onto the mesh (off it: parallel.gather_to_host)
    update_split(mesh, rows, group)                           how a GRPO update cuts its rows over 'data'
    compiler_options_for(rollout, platform)                   XLA options for a rollout kind's inner loop
"""

from __future__ import annotations

import importlib.metadata
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from derl_jax.models import transformer as tr
from derl_jax.models.transformer import abstract_model, config_of
from derl_jax.parallel import CAND_AXIS, DATA_AXIS, MODEL_AXIS, host_cores, make_mesh, put_global
from derl_jax.rl.grpo import GRAD_BUCKET_BYTES


# XLA:CPU hands only single matmuls to its YNNPACK library and fuses everything else itself.
# By default the library also takes reductions and the matmuls' elementwise consumers, which at
# the single-turn step's small shapes run slower there (one query's attention output, the
# attention backward's dS); on the multi-turn household step the default is the faster one
# (docs/benchmarks.md, "Inner loop against TRL").
SINGLE_DOT_LIBRARY_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}
SINGLE_DOT_LIBRARY_SINCE = (0, 8, 1)   # the first jaxlib whose XLA has the option


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def compiler_options_for(rollout: str, platform: str, jaxlib_version: str | None = None) -> dict[str, str]:
    """XLA compiler options for an inner loop of rollout kind `rollout` compiled for devices of
    `platform` ("cpu", "gpu", "tpu"): `SINGLE_DOT_LIBRARY_OPTIONS` for single-turn ("device")
    rollouts on CPU with a jaxlib that has them (`jaxlib_version`, default the installed one),
    none otherwise."""
    if rollout != "device" or platform != "cpu":
        return {}
    version = jaxlib_version if jaxlib_version is not None else importlib.metadata.version("jaxlib")
    return dict(SINGLE_DOT_LIBRARY_OPTIONS) if _version(version) >= SINGLE_DOT_LIBRARY_SINCE else {}


def params_candidate_axis(graphdef: nnx.GraphDef, params: Any) -> int | None:
    """0 when every leaf of `params` carries a leading candidate axis K, None when `params`
    is one policy (leaf shapes as the model's); anything else is an error."""
    _, template = abstract_model(config_of(graphdef, params))
    got = [np.ndim(leaf) for leaf in jax.tree_util.tree_leaves(params)]
    want = [len(leaf.shape) for leaf in jax.tree_util.tree_leaves(template)]
    if got == want:
        return None
    if len(got) == len(want) and all(g == w + 1 for g, w in zip(got, want)):
        return 0
    raise ValueError(
        f"params leaves have ranks {got}; one policy has ranks {want}, a stack of policies one more each")


def leading_size(tree: Any, where: str) -> int:
    sizes = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in jax.tree_util.tree_leaves(tree)}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(f"{where}: leaves must share one leading candidate axis, got leading sizes {sizes}")
    return sizes.pop()


def map_candidates(fn: Callable, in_axes: tuple, chunk_size: int, spmd_axis_name: str | None) -> Callable:
    """`jax.vmap(fn, in_axes)` over a candidate axis, or in chunks of `chunk_size`.

    Chunked: K (a multiple of chunk_size) becomes K / chunk_size sequential chunks
    (`lax.map`), each vmapping chunk_size candidates; candidate k goes to chunk
    k % (K / chunk_size), position k // (K / chunk_size), so a 'cand'-sharded K axis maps
    onto the within-chunk axis. Results come back in the original order.
    """
    vmapped = jax.vmap(fn, in_axes=in_axes, spmd_axis_name=spmd_axis_name)
    if not chunk_size:
        return vmapped

    def chunked(*args):
        mapped = [i for i, axis in enumerate(in_axes) if axis == 0]
        num = leading_size([args[i] for i in mapped], "map_candidates")
        if num % chunk_size:
            raise ValueError(f"map_candidates: {num} candidates do not split into chunks of chunk_size={chunk_size}")
        chunks = num // chunk_size

        def to_chunks(x):
            return jnp.swapaxes(x.reshape(chunk_size, chunks, *x.shape[1:]), 0, 1)

        def from_chunks(y):
            return jnp.swapaxes(y, 0, 1).reshape(num, *y.shape[2:])

        def one_chunk(chunk_args):
            full = list(args)
            for i, value in zip(mapped, chunk_args):
                full[i] = value
            return vmapped(*full)

        chunked_args = tuple(jax.tree_util.tree_map(to_chunks, args[i]) for i in mapped)
        return jax.tree_util.tree_map(from_chunks, jax.lax.map(one_chunk, chunked_args))

    return chunked


def padded_count(count: int, chunk_size: int, cand_size: int) -> int:
    """Smallest multiple of lcm(chunk_size or 1, cand_size) that is >= count."""
    unit = math.lcm(max(chunk_size, 1), cand_size)
    return -(-count // unit) * unit


def take_rows(tree: Any, rows: np.ndarray) -> Any:
    return jax.tree_util.tree_map(lambda x: x[rows], tree)


def run_mesh(cfg: Any, auto_data: int = 1) -> Mesh:
    """The mesh of a run config's `mesh` block (cand, data, model; one may be -1 = fill;
    `mesh.data` = 0 means `auto_data`, see `auto_data_size`).

    Without a -1 the mesh uses the first cand*data*model devices.
    """
    sizes = [int(cfg.mesh.cand), int(cfg.mesh.data) or int(auto_data), int(cfg.mesh.model)]
    devices = None if -1 in sizes else jax.devices()[: math.prod(sizes)]
    if devices is not None and len(devices) < math.prod(sizes):
        raise ValueError(f"config.mesh asks for {math.prod(sizes)} devices (cand*data*model = {sizes}), "
                         f"only {len(jax.devices())} exist")
    return make_mesh(*sizes, devices=devices)


# A larger policy's step is made of matmuls that XLA:CPU already spreads over the cores, and
# every 'data' shard keeps a copy of the parameters and optimizer state.
AUTO_DATA_MAX_PARAMS = 50_000_000


def auto_data_size(cfg: Any, inner: Any, num_params: int, *, cores: int | None = None, backend: str | None = None,
                   process_count: int | None = None, num_devices: int | None = None) -> int:
    """The size of the 'data' axis when `config.mesh.data` is 0 (auto): on the CPU backend of a
    one-process job, one shard per core (`cores`, default this process's), for a policy of at
    most `AUTO_DATA_MAX_PARAMS` parameters, at most the devices left by cand x model, and
    lowered until it splits a step's rollouts, and each minibatch into whole prompt groups
    (`inner`: the run's `InnerConfig`). Otherwise 1: on accelerators, in multi-process jobs,
    with a -1 (fill) axis, and for an explicit `mesh.data`.
    """
    cand, data, model = (int(cfg.mesh.cand), int(cfg.mesh.data), int(cfg.mesh.model))
    if data != 0:
        return data
    backend = jax.default_backend() if backend is None else backend
    process_count = jax.process_count() if process_count is None else process_count
    num_devices = len(jax.devices()) if num_devices is None else num_devices
    if backend != "cpu" or process_count > 1 or -1 in (cand, model) or num_params > AUTO_DATA_MAX_PARAMS:
        return 1
    size = min(host_cores() if cores is None else cores, num_devices // (cand * model))
    rollouts, minibatches = inner.rollouts_per_step, inner.grpo.minibatches
    group = inner.group_size if minibatches == 1 else 1
    while size > 1 and (rollouts % size or (rollouts // minibatches) % (size * group)):
        size -= 1
    return max(size, 1)


def candidate_slices(mesh: Mesh) -> list[Mesh]:
    """The ('data', 'model') sub-mesh of every index of the 'cand' axis."""
    for axis in (CAND_AXIS, DATA_AXIS, MODEL_AXIS):
        if axis not in mesh.axis_names:
            raise ValueError(f"candidate_slices: the mesh needs axes {(CAND_AXIS, DATA_AXIS, MODEL_AXIS)}, has {mesh.axis_names}")
    devices = np.asarray(mesh.devices).transpose([mesh.axis_names.index(a) for a in (CAND_AXIS, DATA_AXIS, MODEL_AXIS)])
    axis_types = (AxisType.Auto, AxisType.Auto)
    return [Mesh(devices[i], (DATA_AXIS, MODEL_AXIS), axis_types=axis_types) for i in range(devices.shape[0])]


def canonical_sharding(sharding: NamedSharding) -> NamedSharding:
    """The same placement with trailing replicated dimensions dropped from the spec (P(None,) -> P()),
    the form jitted functions return, so that placed inputs and outputs hit one compiled version."""
    spec = list(sharding.spec)
    while spec and spec[-1] is None:
        spec.pop()
    return NamedSharding(sharding.mesh, PartitionSpec(*spec))


def place_params(params: nnx.State, mesh: Mesh) -> nnx.State:
    """`params` (host or device arrays) on `mesh` by the transformer's sharding metadata."""
    return jax.tree.map(lambda leaf, sharding: put_global(leaf, canonical_sharding(sharding)), params,
                        tr.param_shardings(params, mesh))


def optimizer_state_shardings(optimizer: Any, params: Any, mesh: Mesh) -> Any:
    """The shardings of `optimizer`'s state for `params` (arrays placed on `mesh`): moments
    sharded like their parameters, everything else (step counts) replicated on the mesh; the
    `out_shardings` of a jitted `optimizer.init`, which would otherwise leave state that does
    not depend on the parameters' values on one device."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return optax.tree_map_params(
        optimizer, lambda _, sharding: sharding, jax.eval_shape(optimizer.init, params),
        jax.tree.map(lambda x: x.sharding, params), transform_non_params=lambda _: replicated)


def update_split(mesh: Mesh | None, rows: int, group: int = 1) -> dict[str, Any]:
    """Keyword arguments of `grpo.grpo_update` for minibatches of `rows` rows on `mesh`.

    With a 'data' axis of size D > 1 that divides the minibatch into shards of whole groups of
    `group` rows (the prefill groups `logprob_fn` relies on), each device takes its own rows'
    gradient (a `shard_map` manual over 'data' and, on a mesh that has one, 'cand', the axis
    candidates are vmapped over) and the gradients are summed in flat buffers; the buffers hold
    whole parameters only while the 'model' axis is 1 (otherwise every parameter is summed on
    its own, keeping its 'model' sharding). Otherwise no split ({}): XLA reduces the gradient
    of the sharded batch itself.
    """
    data = 1 if mesh is None else int(mesh.shape[DATA_AXIS])
    if data == 1 or rows % (data * group):
        return {}
    flat = int(mesh.shape[MODEL_AXIS]) == 1
    return {"mesh": mesh, "data_axis": DATA_AXIS, "manual_axes": (CAND_AXIS,) if CAND_AXIS in mesh.shape else (),
            "bucket_bytes": GRAD_BUCKET_BYTES if flat else 0}
