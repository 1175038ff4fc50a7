"""Mesh and device errors stop a run before any model is built: one line naming the input, exit 2.

Two cases go through the launcher, as concurrent subprocesses (one module-scoped fixture) on a
fixed number of fake CPU devices (XLA_FLAGS), so they do not depend on the host's cores: a mesh
larger than the devices, and a platform that does not start (only a fresh process shows it).
The other mesh errors are raised by the same checks of `derl_jax.experiment.run.run` in this
process, on its 8 fake CPU devices (tests/conftest.py).
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time

import pytest

from derl_jax.config import InputError
from derl_jax.experiment.run import run
from derl_jax.parallel import check_mesh_fits
from test_search import get_config

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = "--config=configs/arith.py:smoke"
PREFIX = "launch/run.py: error: "
TWO_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
# A run that gets past its checks warm-starts the policy (sft_steps > 0) into <workdir>/base_policy.
BUILT = ("base_policy", "domain.json")


def test_check_mesh_fits_resolves_and_rejects():
    assert check_mesh_fits(2, 0, 1, num_devices=2, platform="cpu") == (2, 1, 1)
    assert check_mesh_fits(1, 1, -1, num_devices=8, platform="gpu") == (1, 1, 8)
    assert check_mesh_fits(2, 2, 1, num_devices=8, platform="gpu") == (2, 2, 1)   # the first 4 of 8 devices
    with pytest.raises(ValueError, match=r"^config\.mesh \(cand=3 data=0 \(auto\) model=1\) needs 3 devices, "
                                         r"this process sees 2 \(cpu\)"):
        check_mesh_fits(3, 0, 1, num_devices=2, platform="cpu")
    with pytest.raises(ValueError, match="-1 fills the rest of the 8 gpu devices, but 8 is not a multiple of 3"):
        check_mesh_fits(3, 1, -1, num_devices=8, platform="gpu")
    with pytest.raises(ValueError, match="sees 4 \\(gpu\\)$"):   # the CPU hint only on CPU
        check_mesh_fits(2, 1, 4, num_devices=4, platform="gpu")


def launch(workdir: str, *args: str, env: dict) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, os.path.join("launch", "run.py"), "--noprogress", SMOKE, "--mode=search",
                           f"--workdir={workdir}", *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=300, env={**os.environ, **env})
    return done, time.monotonic() - started


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (CompletedProcess, seconds, workdir, expected first line)."""
    root = tmp_path_factory.mktemp("mesh")
    specs = {
        "larger_than_the_devices": (
            ["--config.mesh.cand=3", "--config.mesh.data=1"], TWO_DEVICES,
            "config.mesh (cand=3 data=1 model=1) needs 3 devices, this process sees 2 (cpu); on CPU set "
            "config.mesh.data=0 (one device per core) or XLA_FLAGS=--xla_force_host_platform_device_count=N"),
        "a_platform_that_is_not_there": (
            [], {"JAX_PLATFORMS": "tpu"}, "JAX_PLATFORMS='tpu': that platform does not start in this process ("),
    }
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(launch, str(root / name), *args, env=env)
                   for name, (args, env, _) in specs.items()}
        return {name: (*futures[name].result(), str(root / name), specs[name][2]) for name in specs}


@pytest.mark.parametrize("name", ["larger_than_the_devices", "a_platform_that_is_not_there"])
def test_a_mesh_or_device_error_is_one_line_before_any_model(cases, name):
    done, seconds, workdir, expected = cases[name]
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert lines[0].startswith(PREFIX + expected), lines[0]
    assert not any(os.path.exists(os.path.join(workdir, built)) for built in BUILT)
    assert seconds < 60, seconds   # the interpreter's start-up and imports, no warm start


@pytest.mark.parametrize("overrides, expected", [
    ({"mesh.cand": 3, "mesh.data": 1, "mesh.model": -1},
     "config.mesh (cand=3 data=1 model=-1): -1 fills the rest of the 8 cpu devices, but 8 is not a multiple of 3"),
    ({"mesh.data": 4, "inner.prompts_per_step": 3},
     "config.mesh.data=4 must divide the 6 rollouts of a step (inner.prompts_per_step x inner.group_size)"),
], ids=["fill_that_does_not_divide", "data_that_does_not_split_the_rollouts"])
def test_a_mesh_error_stops_the_run_before_any_model(tmp_path, overrides, expected):
    cfg = get_config("smoke")
    for field, value in overrides.items():
        block, name = field.split(".")
        cfg[block][name] = value
    with pytest.raises(InputError) as info:
        run(cfg, str(tmp_path / "run"), "search", progress=False)
    assert str(info.value).splitlines()[0] == expected
    assert not any(os.path.exists(tmp_path / "run" / built) for built in BUILT)
