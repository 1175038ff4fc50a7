"""Device mesh, shardings and multi-host start-up.

The mesh has three axes:

* ``cand``  — reward candidates (the stacked `ProgramBatch` axis K): each slice of devices
  trains its own inner policies;
* ``data``  — the batch of prompts/rollouts inside one inner loop;
* ``model`` — tensor parallelism of the policy's weights (MLP hidden, heads, vocab).

One device means every axis has size 1 and the same code runs unchanged. Axes use
`AxisType.Auto`, so jitted functions take shardings through `in_shardings`/`out_shardings`
and XLA propagates them inside.

Multi-host: call `maybe_initialize_distributed()` first thing in the entry point; it calls
`jax.distributed.initialize()` only when the environment describes a multi-process job:

* ``DERL_DISTRIBUTED=1`` forces it (cluster auto-detection by JAX), ``=0`` forbids it;
* ``JAX_COORDINATOR_ADDRESS`` (host:port of process 0) with ``JAX_NUM_PROCESSES`` and
  ``JAX_PROCESS_ID`` — explicit set-up on any cluster;
* Slurm (``SLURM_JOB_ID`` and ``SLURM_NTASKS`` > 1), Open MPI (``OMPI_COMM_WORLD_SIZE`` > 1),
  multi-host Cloud TPU (``TPU_WORKER_HOSTNAMES``/``TPU_PROCESS_ADDRESSES`` naming more than
  one host, or ``MEGASCALE_COORDINATOR_ADDRESS``) — environments JAX detects by itself.

On a CPU host XLA runs a small program on one core; `host_device_flags` gives XLA one host
device per core (`--xla_force_host_platform_device_count`), so that a mesh over them runs one
step on every core. It must be in XLA_FLAGS before JAX starts its backend.

Across processes only process 0 writes files (`is_primary_process`); values that live on a
mesh spanning processes go on it with `put_global` and come back with `gather_to_host`
(every process calls both together); `sync_processes` is a barrier.
"""

from __future__ import annotations

import math
import os
import platform
from typing import Any, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("cand", "data", "model")
CAND_AXIS, DATA_AXIS, MODEL_AXIS = MESH_AXES

# Logical axis name (as annotated on nnx parameters) -> mesh axis, or None to replicate.
DEFAULT_LOGICAL_RULES: dict[str, str | None] = {
    "embed": None,
    "vocab": MODEL_AXIS,
    "mlp": MODEL_AXIS,
    "heads": MODEL_AXIS,
    "q_heads": MODEL_AXIS,
    "kv_heads": MODEL_AXIS,
    "kv": None,
    "head_dim": None,
    "norm": None,
    "layers": None,
    "batch": DATA_AXIS,
    "length": None,
    "candidates": CAND_AXIS,
}

_SHARDING_METADATA_KEYS = ("out_sharding", "sharding_names", "sharding")


# --------------------------------------------------------------------------- mesh


def mesh_shape(cand: int, data: int, model: int, num_devices: int) -> tuple[int, int, int]:
    """Resolve at most one `-1` ("fill") size so that cand * data * model == num_devices."""
    sizes = {"cand": cand, "data": data, "model": model}
    for name, size in sizes.items():
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or (size < 1 and size != -1):
            raise ValueError(f"make_mesh: {name} must be a positive int or -1 (fill), got {size!r}")
    fill = [name for name, size in sizes.items() if size == -1]
    if len(fill) > 1:
        raise ValueError(f"make_mesh: only one axis may be -1 (fill), got {sizes}")
    fixed = math.prod(size for size in sizes.values() if size != -1)
    if fill:
        if num_devices % fixed:
            raise ValueError(
                f"make_mesh: {num_devices} devices cannot be split into {sizes} "
                f"({num_devices} is not a multiple of {fixed})"
            )
        sizes[fill[0]] = num_devices // fixed
    elif fixed != num_devices:
        raise ValueError(
            f"make_mesh: cand*data*model = {cand}*{data}*{model} = {fixed}, but there are {num_devices} devices"
        )
    return sizes["cand"], sizes["data"], sizes["model"]


def check_mesh_fits(cand: int, data: int, model: int, num_devices: int, platform: str) -> tuple[int, int, int]:
    """The (cand, data, model) sizes a run config's mesh block takes on `num_devices` devices of
    `platform`, or ValueError (one line naming `config.mesh` and what is wrong). `data` 0 (auto)
    counts as 1 here (`rl.placement.auto_data_size` may raise it later); one size may be -1."""
    sizes = {"cand": cand, "data": data or 1, "model": model}
    fixed = math.prod(size for size in sizes.values() if size != -1)
    where = f"config.mesh (cand={cand} data={data}{' (auto)' if data == 0 else ''} model={model})"
    more = (f"; on CPU set config.mesh.data=0 (one device per core) or XLA_FLAGS={HOST_DEVICE_FLAG}=N"
            if platform == "cpu" else "")
    if -1 in sizes.values():
        if num_devices % fixed:
            raise ValueError(f"{where}: -1 fills the rest of the {num_devices} {platform} devices, but "
                             f"{num_devices} is not a multiple of {fixed}")
    elif fixed > num_devices:
        raise ValueError(f"{where} needs {fixed} devices, this process sees {num_devices} ({platform}){more}")
    return mesh_shape(*sizes.values(), num_devices if -1 in sizes.values() else fixed)


def make_mesh(cand: int = 1, data: int = 1, model: int = -1, devices: Sequence[Any] | None = None) -> Mesh:
    """A `Mesh` with axes ('cand', 'data', 'model') over `devices` (all devices by default).

    One size may be -1 to take whatever the others leave. With `devices=None` the device
    order comes from `jax.make_mesh` (topology aware); given devices are used in order.
    """
    device_list = list(jax.devices() if devices is None else devices)
    if not device_list:
        raise ValueError("make_mesh: no devices given")
    shape = mesh_shape(cand, data, model, len(device_list))
    axis_types = (AxisType.Auto,) * len(MESH_AXES)
    if devices is None:
        return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types)
    return Mesh(np.asarray(device_list, dtype=object).reshape(shape), MESH_AXES, axis_types=axis_types)


# --------------------------------------------------------------------------- host devices

HOST_DEVICE_FLAG = "--xla_force_host_platform_device_count"


def host_cores() -> int:
    """The CPU cores this process may run on (its affinity mask)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def cpu_name() -> str:
    """The processor's model name (Linux), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_description() -> dict:
    """{"cpu": model name, "cores": `host_cores()`, "backend", "jax": version}: what the rounding of
    a computation here depends on. XLA:CPU sizes its thread pools by the cores a process sees when
    JAX starts, and how a computation is split over them sets its rounding: the same program and
    seed on another core count can give different numbers (docs/benchmarks.md, "Cores and the
    compilation cache")."""
    return {"cpu": cpu_name(), "cores": host_cores(), "backend": jax.default_backend(), "jax": jax.__version__}


def host_device_flags(xla_flags: str, cores: int) -> str:
    """`xla_flags` (an XLA_FLAGS value) with one XLA host device per core; unchanged when it
    already fixes the host device count or when there is one core."""
    if HOST_DEVICE_FLAG in xla_flags or cores <= 1:
        return xla_flags
    return " ".join(part for part in (xla_flags.strip(), f"{HOST_DEVICE_FLAG}={cores}") if part)


# --------------------------------------------------------------------------- multi-host


def distributed_requested(env: Mapping[str, str]) -> bool:
    """Whether `env` (an environment mapping) describes a multi-process JAX job; see module doc."""
    forced = env.get("DERL_DISTRIBUTED", "").strip().lower()
    if forced in ("0", "false", "no", "off"):
        return False
    if forced in ("1", "true", "yes", "on"):
        return True
    if env.get("JAX_COORDINATOR_ADDRESS"):
        return True
    if env.get("SLURM_JOB_ID") and _int(env.get("SLURM_NTASKS", env.get("SLURM_NPROCS"))) > 1:
        return True
    if _int(env.get("OMPI_COMM_WORLD_SIZE")) > 1:
        return True
    tpu_hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES") or ""
    if len([h for h in tpu_hosts.split(",") if h.strip()]) > 1:
        return True
    return bool(env.get("MEGASCALE_COORDINATOR_ADDRESS"))


def maybe_initialize_distributed(env: Mapping[str, str] | None = None) -> bool:
    """Call `jax.distributed.initialize()` when the environment asks for it; True if it did.

    Must run before anything touches a device. Idempotent: returns False when JAX's
    distributed runtime is already up.
    """
    env = os.environ if env is None else env
    if jax.distributed.is_initialized() or not distributed_requested(env):
        return False
    kwargs = {}
    if env.get("JAX_COORDINATOR_ADDRESS"):
        kwargs["coordinator_address"] = env["JAX_COORDINATOR_ADDRESS"]
    for key, arg in (("JAX_NUM_PROCESSES", "num_processes"), ("JAX_PROCESS_ID", "process_id")):
        if env.get(key):
            try:
                kwargs[arg] = int(env[key])
            except ValueError:
                raise ValueError(f"maybe_initialize_distributed: {key} must be an int, got {env[key]!r}") from None
    jax.distributed.initialize(**kwargs)
    return True


def is_primary_process() -> bool:
    """Whether this process writes the run directory: process 0 (always, in a one-process run)."""
    return jax.process_index() == 0


def sync_processes(name: str) -> None:
    """Wait until every process of a multi-process job reaches the barrier `name` (no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def put_global(tree: Any, sharding: Any) -> Any:
    """`jax.device_put(tree, sharding)` that also places process-local values on a mesh spanning processes.

    `sharding` is one `Sharding` for every leaf or a tree of them (a prefix of `tree`). With
    several processes each leaf that is not yet a global array (NumPy, Python scalars, arrays
    on this process's devices, typed PRNG keys) is built from this process's copy of the
    value, so every process must pass the same values (they are not compared).
    """
    if jax.process_count() == 1:
        return jax.device_put(tree, sharding)

    def put_leaf(leaf, target):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            return jax.device_put(leaf, target)
        if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            data = put_leaf(jax.random.key_data(leaf), target)
            return jax.random.wrap_key_data(data, impl=jax.random.key_impl(leaf))
        host = np.asarray(leaf)
        return jax.make_array_from_callback(host.shape, target, lambda index: host[index])

    if isinstance(sharding, jax.sharding.Sharding):
        return jax.tree_util.tree_map(lambda leaf: put_leaf(leaf, sharding), tree)
    return jax.tree_util.tree_map(
        lambda target, subtree: jax.tree_util.tree_map(lambda leaf: put_leaf(leaf, target), subtree),
        sharding, tree, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))


def put_like(tree: Any, like: Any) -> Any:
    """`tree` (host or device arrays) placed as `like`, a tree of the same structure whose
    array leaves carry the target shardings (`put_global` per leaf, so across processes too)."""
    return jax.tree_util.tree_map(lambda leaf, target: put_global(leaf, target.sharding), tree, like)


def gather_to_host(tree: Any) -> Any:
    """Every array leaf of `tree` as a NumPy array holding its whole value, on every process.

    Arrays spread over several processes are all-gathered, so in a multi-process job every
    process must call this together (with the same tree structure).
    """

    def fetch(leaf):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable and not leaf.is_fully_replicated:
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        return np.asarray(leaf) if isinstance(leaf, (jax.Array, np.ndarray)) else leaf

    return jax.tree_util.tree_map(fetch, tree)


def _int(text: str | None) -> int:
    try:
        return int(text) if text else 0
    except ValueError:
        return 0


# --------------------------------------------------------------------------- shardings


def candidate_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Leading axis over 'cand', the rest replicated: for `[K, ...]` candidate-stacked arrays."""
    _check_ndim(ndim, "candidate_sharding")
    return NamedSharding(mesh, PartitionSpec(CAND_AXIS, *([None] * (ndim - 1))))


def data_sharding(mesh: Mesh, ndim: int, axis: int = 0) -> NamedSharding:
    """Dimension `axis` over 'data', the rest replicated: for batches of prompts/rollouts."""
    _check_ndim(ndim, "data_sharding")
    if not -ndim <= axis < ndim:
        raise ValueError(f"data_sharding: axis {axis} out of range for ndim {ndim}")
    spec = [None] * ndim
    spec[axis % ndim] = DATA_AXIS
    return NamedSharding(mesh, PartitionSpec(*spec))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array."""
    return NamedSharding(mesh, PartitionSpec())


def shard_candidates(tree: Any, mesh: Mesh) -> Any:
    """`jax.device_put` every leaf of `tree` with its leading (candidate) axis over 'cand'.

    Every leaf needs ndim >= 1 and a leading size divisible by the 'cand' axis size. In a
    multi-host run every process must pass the same values.
    """
    cand_size = mesh.shape[CAND_AXIS]

    def put(path, leaf):
        shape = np.shape(leaf)
        where = f"shard_candidates: leaf {jax.tree_util.keystr(path) or '<root>'}"
        if len(shape) == 0:
            raise ValueError(f"{where} is a scalar; it needs a leading candidate axis")
        if shape[0] % cand_size:
            raise ValueError(f"{where} has {shape[0]} candidates, not divisible by the 'cand' axis size {cand_size}")
        return jax.device_put(leaf, candidate_sharding(mesh, len(shape)))

    return jax.tree_util.tree_map_with_path(put, tree)


def logical_to_mesh(spec: Sequence[str | None] | None, rules: Mapping[str, str | None] | None = None) -> PartitionSpec:
    """Translate logical axis names (('embed', 'mlp')) into a mesh `PartitionSpec` (P(None, 'model')).

    Names missing from `rules` are replicated. A mesh axis is used at most once per spec
    (the first dimension that asks for it gets it; later ones are replicated).
    """
    rules = DEFAULT_LOGICAL_RULES if rules is None else rules
    if spec is None:
        return PartitionSpec()
    used: set[str] = set()
    mesh_axes: list[str | None] = []
    for name in spec:
        axis = rules.get(name) if isinstance(name, str) else None
        if axis is not None and axis in used:
            axis = None
        if axis is not None:
            used.add(axis)
        mesh_axes.append(axis)
    return PartitionSpec(*mesh_axes)


def param_sharding(params: Any, mesh: Mesh, rules: Mapping[str, str | None] | None = None) -> Any:
    """Shardings for a parameter pytree, same structure as `params`.

    `params` is an `nnx.State` (from `nnx.split`) or any pytree of arrays. A `nnx.Variable`
    whose metadata names logical axes (`nnx.with_partitioning`, `sharding=`/`out_sharding=`)
    is sharded by `logical_to_mesh`; everything else is replicated. A dimension that the
    mesh axis size does not divide (e.g. 2 KV heads on a 4-way 'model' axis) is replicated.
    Use the result as `jax.jit` in/out shardings or with `jax.device_put(params, shardings)`.
    """
    from flax import nnx

    def for_leaf(leaf):
        if not isinstance(leaf, nnx.Variable):
            return replicated(mesh)
        logical_axes = _logical_axes(leaf)
        if logical_axes is None:
            return leaf.replace(replicated(mesh))
        spec = fit_spec_to_shape(logical_to_mesh(logical_axes, rules), np.shape(leaf.get_value()), mesh)
        return leaf.replace(NamedSharding(mesh, spec))

    return jax.tree.map(for_leaf, params, is_leaf=lambda x: isinstance(x, nnx.Variable))


def fit_spec_to_shape(spec: PartitionSpec, shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """`spec` padded/cut to `len(shape)` dims, replicating dims the mesh axis does not divide."""
    entries = list(spec)[: len(shape)] + [None] * max(0, len(shape) - len(spec))
    fitted = []
    for size, axis in zip(shape, entries):
        axes = (axis,) if isinstance(axis, str) else tuple(axis or ())
        ways = math.prod(mesh.shape[a] for a in axes)
        fitted.append(axis if axes and size % ways == 0 else None)
    return PartitionSpec(*fitted)


def _logical_axes(variable) -> tuple | None:
    metadata = variable.get_metadata()
    for key in _SHARDING_METADATA_KEYS:
        names = metadata.get(key)
        if names:
            return tuple(names)
    return None


def _check_ndim(ndim: int, where: str) -> None:
    if isinstance(ndim, bool) or not isinstance(ndim, (int, np.integer)) or ndim < 1:
        raise ValueError(f"{where}: ndim must be an int >= 1, got {ndim!r}")
