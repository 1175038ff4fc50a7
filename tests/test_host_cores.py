"""One run over every core of a CPU host: `mesh.data` = 0 (auto).

The pure resolution (`placement.auto_data_size`), the XLA flag the launcher adds before JAX
starts (`parallel.host_device_flags`, `run.make_host_devices`) and the cores one run may
take (`run.run_cores`). A real run of the script with no host device count in
XLA_FLAGS: tests/test_launch.py (the compile-cache test).
"""

from __future__ import annotations

import os

import pytest

from derl_jax.parallel import HOST_DEVICE_FLAG, cpu_name, host_device_flags
from derl_jax.rl.config import inner_config
from derl_jax.rl.placement import AUTO_DATA_MAX_PARAMS, auto_data_size
from derl_jax.experiment import runtime
from test_search import get_config

SMALL = 100_000


def config(cand=1, data=0, model=1, prompts=4, group=2, minibatches=1):
    cfg = get_config("smoke")
    cfg.mesh.update(cand=cand, data=data, model=model)
    cfg.inner.update(prompts_per_step=prompts, group_size=group, minibatches=minibatches)
    return cfg


def resolve(cfg, *, params=SMALL, cores=2, backend="cpu", processes=1, devices=8):
    return auto_data_size(cfg, inner_config(cfg, 16), params, cores=cores, backend=backend,
                          process_count=processes, num_devices=devices)


@pytest.mark.parametrize("kwargs, env, expected", [
    ({}, {}, 2),                                            # one shard per core
    ({}, {"cores": 1}, 1),
    ({}, {"cores": 4}, 4),                                  # 8 rollouts, groups of 2: 4 shards of one group
    ({}, {"cores": 8}, 4),                                  # 8 shards would cut the groups
    ({"prompts": 3}, {"cores": 4}, 3),                      # 6 rollouts: 3 shards of one group
    ({"prompts": 3, "minibatches": 2}, {"cores": 4}, 3),    # 3-row minibatches, no group constraint
    ({}, {"cores": 8, "devices": 2}, 2),                    # no more than the devices
    ({"cand": 2}, {"cores": 8, "devices": 4}, 2),           # the devices left by cand x model
    ({}, {"backend": "gpu"}, 1),                            # an accelerator's default is one device
    ({}, {"processes": 2}, 1),                              # a multi-process job splits through the mesh
    ({}, {"params": AUTO_DATA_MAX_PARAMS + 1}, 1),          # XLA spreads a large policy's matmuls itself
    ({"model": -1}, {}, 1),                                 # a fill axis takes every device
    ({"data": 3}, {"cores": 1}, 3),                         # an explicit size is kept
])
def test_auto_data_size(kwargs, env, expected):
    assert resolve(config(**kwargs), **env) == expected


@pytest.mark.parametrize("flags_in, cores, flags_out", [
    ("", 2, f"{HOST_DEVICE_FLAG}=2"),
    ("--xla_cpu_use_thunk_runtime=true", 4, f"--xla_cpu_use_thunk_runtime=true {HOST_DEVICE_FLAG}=4"),
    (f"{HOST_DEVICE_FLAG}=8", 2, f"{HOST_DEVICE_FLAG}=8"),  # a count the user fixed is kept
    ("", 1, ""),
])
def test_host_device_flags(flags_in, cores, flags_out):
    assert host_device_flags(flags_in, cores) == flags_out


def test_the_launcher_adds_host_devices_only_for_an_automatic_one_process_data_axis(monkeypatch):
    monkeypatch.setattr(runtime, "host_cores", lambda: 2)
    for mesh, mode, env, added in [
        ({}, "search", {}, True),
        ({}, "final", {}, True),
        ({}, "compare", {}, False),                 # its runs keep one device each
        ({}, "plan", {}, False),
        ({"data": 1}, "search", {}, False),
        ({"model": -1}, "search", {}, False),
        ({}, "search", {"JAX_COORDINATOR_ADDRESS": "localhost:1234"}, False),
    ]:
        environ = dict(env, XLA_FLAGS="--xla_dump_to=/tmp/x")
        runtime.make_host_devices(config(**mesh), mode, environ)
        expected = "--xla_dump_to=/tmp/x" + (f" {HOST_DEVICE_FLAG}=2" if added else "")
        assert environ["XLA_FLAGS"] == expected, (mesh, mode, env)


def test_a_compare_run_keeps_one_core(monkeypatch):
    """A compare's workers use the cores, and its results must not depend on how many there are."""
    monkeypatch.setattr(runtime, "host_cores", lambda: 4)
    assert (runtime.run_cores("search"), runtime.run_cores("final"), runtime.run_cores("compare")) == (4, 4, 1)


def test_run_info_records_the_cores_this_process_may_use(monkeypatch):
    """Not the machine's count: a process kept to 3 cores (taskset, a container) sizes XLA's threads
    by 3, and the rounding with them."""
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("CPU affinity is Linux's")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5})
    info = runtime.run_info("python launch/run.py", "final")
    assert (info["cores"], info["cpu"]) == (3, cpu_name())
