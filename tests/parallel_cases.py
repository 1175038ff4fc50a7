"""Mesh construction, shardings and multi-host detection on 8 fake CPU devices.

The cases live here and run through `test_parallel.py`: in the test process when it has the
8 CPU devices `conftest.py` sets up, otherwise in a subprocess started with them.
"""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from derl_jax import parallel
DEVICES = 8
DEVICE_COUNT_FLAG = re.compile(r"--xla_force_host_platform_device_count=\S*")


def have_eight_cpu_devices() -> bool:
    """True when this process's JAX runs on exactly `DEVICES` CPU devices."""
    devices = jax.devices()
    return len(devices) == DEVICES and all(d.platform == "cpu" for d in devices)


def eight_cpu_device_env(environ=os.environ) -> dict[str, str]:
    """`environ` with JAX on CPU and XLA_FLAGS asking for `DEVICES` host devices (other flags kept)."""
    flags = DEVICE_COUNT_FLAG.sub("", environ.get("XLA_FLAGS", "")).split()
    return dict(environ, JAX_PLATFORMS="cpu",
                XLA_FLAGS=" ".join([f"--xla_force_host_platform_device_count={DEVICES}", *flags]))


from derl_jax.parallel import (  # noqa: E402
    candidate_sharding,
    data_sharding,
    distributed_requested,
    logical_to_mesh,
    make_mesh,
    maybe_initialize_distributed,
    param_sharding,
    replicated,
    shard_candidates,
)


@pytest.mark.parametrize(
    "sizes, expected",
    [
        ({"cand": 8, "data": 1, "model": 1}, (8, 1, 1)),
        ({"cand": 2, "data": 2, "model": 2}, (2, 2, 2)),
        ({"cand": 1, "data": 8, "model": 1}, (1, 8, 1)),
        ({}, (1, 1, 8)),
        ({"cand": 2, "data": -1, "model": 2}, (2, 2, 2)),
        ({"cand": -1, "data": 1, "model": 1}, (8, 1, 1)),
    ],
)
def test_mesh_shapes(sizes, expected):
    mesh = make_mesh(**sizes)
    assert mesh.axis_names == ("cand", "data", "model")
    assert tuple(mesh.shape[a] for a in mesh.axis_names) == expected
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in jax.devices())


def test_mesh_over_given_devices_keeps_their_order():
    devices = jax.devices()[::-1][:4]
    mesh = make_mesh(cand=2, data=2, model=1, devices=devices)
    assert [d.id for d in mesh.devices.flat] == [d.id for d in devices]


@pytest.mark.parametrize(
    "sizes, message",
    [
        ({"cand": 3, "data": 1, "model": 1}, "= 3, but there are 8 devices"),
        ({"cand": 3, "data": -1, "model": 1}, "8 is not a multiple of 3"),
        ({"cand": -1, "data": -1, "model": 1}, "only one axis may be -1"),
        ({"cand": 0, "data": 1, "model": -1}, "cand must be a positive int"),
        ({"cand": 16, "data": 1, "model": 1}, "but there are 8 devices"),
    ],
)
def test_bad_mesh_sizes_raise(sizes, message):
    with pytest.raises(ValueError, match=message):
        make_mesh(**sizes)


def test_sharding_specs():
    mesh = make_mesh(cand=2, data=2, model=2)
    assert candidate_sharding(mesh, 3).spec == P("cand", None, None)
    assert data_sharding(mesh, 2).spec == P("data", None)
    assert data_sharding(mesh, 3, axis=-1).spec == P(None, None, "data")
    assert replicated(mesh).spec == P()
    with pytest.raises(ValueError, match="axis 3 out of range"):
        data_sharding(mesh, 2, axis=3)
    with pytest.raises(ValueError, match="ndim must be an int >= 1"):
        candidate_sharding(mesh, 0)


def candidate_score(weights, inputs):
    """Per candidate: sum over a batch of tanh(inputs @ weights). weights f32[D, H], inputs f32[B, D]."""
    return jnp.tanh(inputs @ weights).sum(axis=0)


def test_jitted_vmap_over_candidates_matches_unsharded():
    mesh = make_mesh(cand=4, data=2, model=1)
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(8, 5, 3)).astype(np.float32)  # [K, D, H]
    inputs = rng.normal(size=(6, 5)).astype(np.float32)  # [B, D]
    expected = np.stack([np.tanh(inputs @ w).sum(axis=0) for w in weights])

    sharded_fn = jax.jit(
        jax.vmap(candidate_score, in_axes=(0, None)),
        in_shardings=(candidate_sharding(mesh, 3), data_sharding(mesh, 2)),
        out_shardings=candidate_sharding(mesh, 2),
    )
    out = sharded_fn(shard_candidates(weights, mesh), jax.device_put(inputs, data_sharding(mesh, 2)))
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)
    # the 'data' axis splits the sum over the batch into two partial sums: float32 rounding differs
    np.testing.assert_allclose(
        np.asarray(out), np.asarray(jax.vmap(candidate_score, in_axes=(0, None))(weights, inputs)), rtol=1e-5
    )
    assert out.sharding.spec == P("cand", None)
    blocks = {(s.index[0].start, s.index[0].stop) for s in out.addressable_shards}
    assert blocks == {(0, 2), (2, 4), (4, 6), (6, 8)}  # each device holds one block of 2 candidates


def test_shard_candidates_places_leaves_and_checks_leading_axis():
    mesh = make_mesh(cand=4, data=1, model=2)
    tree = {"ops": np.arange(8 * 3).reshape(8, 3), "size": np.arange(8)}
    placed = shard_candidates(tree, mesh)
    assert placed["ops"].sharding.spec == P("cand", None)
    assert placed["size"].sharding.spec == P("cand")
    np.testing.assert_array_equal(np.asarray(placed["ops"]), tree["ops"])
    with pytest.raises(ValueError, match=r"leaf \['size'\] has 6 candidates, not divisible by the 'cand' axis size 4"):
        shard_candidates({"size": np.arange(6)}, mesh)
    with pytest.raises(ValueError, match="is a scalar"):
        shard_candidates({"n": np.float32(1)}, mesh)


def test_logical_to_mesh_rules():
    assert logical_to_mesh(("embed", "mlp")) == P(None, "model")
    assert logical_to_mesh(("vocab", "embed")) == P("model", None)
    assert logical_to_mesh(("heads", "mlp")) == P("model", None)  # 'model' used once
    assert logical_to_mesh(("unknown", None)) == P(None, None)
    assert logical_to_mesh(None) == P()
    assert logical_to_mesh(("embed", "mlp"), rules={"embed": "data"}) == P("data", None)


class TinyBlock(nnx.Module):
    def __init__(self, rngs):
        init = nnx.initializers.lecun_normal()
        self.up = nnx.Linear(4, 8, kernel_init=nnx.with_partitioning(init, ("embed", "mlp")), rngs=rngs)
        self.kv = nnx.Param(jnp.ones((4, 3)), sharding=("embed", "kv_heads"))  # 3 not divisible by 2
        self.scale = nnx.Param(jnp.ones(4))


def test_param_sharding_maps_nnx_metadata_and_replicates_the_rest():
    mesh = make_mesh(cand=2, data=2, model=2)
    with nnx.use_eager_sharding(False):
        model = TinyBlock(nnx.Rngs(0))
    _, state = nnx.split(model)
    shardings = param_sharding(state, mesh)
    assert jax.tree.structure(shardings) == jax.tree.structure(state)
    named = nnx.to_pure_dict(shardings)
    assert named["up"]["kernel"].spec == P(None, "model")
    assert named["up"]["bias"].spec == P()
    assert named["kv"].spec == P(None, None)
    assert named["scale"].spec == P()

    placed = jax.device_put(state, shardings)
    assert nnx.to_pure_dict(placed)["up"]["kernel"].sharding.spec == P(None, "model")

    def forward(state, x):
        return nnx.merge(nnx.graphdef(model), state).up(x)

    x = jnp.ones((2, 4))
    out = jax.jit(forward, in_shardings=(shardings, replicated(mesh)))(placed, x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(model.up(x)), rtol=1e-6)

    plain = {"w": jnp.ones((4, 4))}
    assert param_sharding(plain, mesh)["w"].spec == P()


def test_distributed_detection_rules():
    assert not distributed_requested({})
    assert distributed_requested({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"})
    assert distributed_requested({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"})
    assert not distributed_requested({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "1"})
    assert distributed_requested({"OMPI_COMM_WORLD_SIZE": "2"})
    assert distributed_requested({"TPU_WORKER_HOSTNAMES": "h0,h1"})
    assert not distributed_requested({"TPU_WORKER_HOSTNAMES": "h0"})
    assert distributed_requested({"MEGASCALE_COORDINATOR_ADDRESS": "h0:8080"})
    assert not distributed_requested({"DERL_DISTRIBUTED": "0", "JAX_COORDINATOR_ADDRESS": "h:1"})
    assert distributed_requested({"DERL_DISTRIBUTED": "1"})


def test_maybe_initialize_distributed_passes_explicit_settings(monkeypatch):
    calls = []
    monkeypatch.setattr(parallel.jax.distributed, "initialize", lambda **kw: calls.append(kw))
    monkeypatch.setattr(parallel.jax.distributed, "is_initialized", lambda: False)
    assert maybe_initialize_distributed({}) is False and calls == []
    env = {"JAX_COORDINATOR_ADDRESS": "h0:1234", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"}
    assert maybe_initialize_distributed(env) is True
    assert calls == [{"coordinator_address": "h0:1234", "num_processes": 2, "process_id": 1}]
    assert maybe_initialize_distributed({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2"}) is True
    assert calls[-1] == {}
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES must be an int"):
        maybe_initialize_distributed({"JAX_COORDINATOR_ADDRESS": "h0:1", "JAX_NUM_PROCESSES": "two"})
    monkeypatch.setattr(parallel.jax.distributed, "is_initialized", lambda: True)
    assert maybe_initialize_distributed(env) is False
