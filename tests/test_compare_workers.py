"""A compare's runs shared out over processes (derl_jax/experiment/workers.py, launch/run.py).

The automatic worker count, claims that hand each run to exactly one process, and the real
launcher: two processes give the same results as one, and both did some of the runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

import ml_collections
import pytest

from derl_jax.config import ConfigError
from derl_jax.experiment.workers import CLAIMS_DIR, MAX_AUTO_WORKERS, Claims, resolve_workers
from test_search import REPO_ROOT

SCRIPT = os.path.join(REPO_ROOT, "launch", "run.py")


def workers_config(workers):
    return ml_collections.ConfigDict({"compare": {"workers": workers}})


@pytest.mark.parametrize("workers, backend, processes, cores, jobs, expected", [
    (0, "cpu", 1, 2, 6, 2),                   # one per core
    (0, "cpu", 1, 2, 1, 1),                   # never more than the runs
    (0, "cpu", 1, 64, 100, MAX_AUTO_WORKERS),
    (0, "gpu", 1, 16, 6, 1),                  # an accelerator's memory belongs to one process
    (0, "cpu", 2, 16, 6, 1),                  # a multi-process job splits its work through the mesh
    (3, "gpu", 1, 1, 6, 3),                   # asked for: as many as asked, up to the runs
    (5, "cpu", 1, 2, 4, 4),
])
def test_worker_count(workers, backend, processes, cores, jobs, expected):
    assert resolve_workers(workers_config(workers), jobs, backend=backend, process_count=processes,
                           cpu_count=cores) == expected


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_a_bad_worker_count_is_named(bad):
    with pytest.raises(ConfigError, match=r"^config.compare.workers must be an integer >= 0"):
        resolve_workers(workers_config(bad), 4, backend="cpu", process_count=1, cpu_count=2)


def test_each_run_is_claimed_once_across_processes_and_threads(tmp_path):
    old = Claims.fresh(str(tmp_path))
    assert old.claim("derl", 0)
    claims = Claims.fresh(str(tmp_path))            # a new compare forgets the old claims
    assert not os.path.exists(old.directory) and os.listdir(tmp_path / CLAIMS_DIR) == [claims.token]
    same = Claims(str(tmp_path), claims.token)       # what another process opens
    runs = [(method, seed) for method in ("derl", "fixed:g1+0.5*g2") for seed in range(20)]
    won: list[list] = [[], [], []]

    def take(index, holder):
        won[index] = [run for run in runs if holder.claim(*run)]

    threads = [threading.Thread(target=take, args=(i, holder)) for i, holder in enumerate((claims, same, same))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(won[0] + won[1] + won[2]) == sorted(runs)          # every run once, none twice
    assert set(claims.owners()) == {"derl.seed_%d" % s for s in range(20)} | {"fixed_g1_0_5_g2.seed_%d" % s for s in range(20)}
    assert set(claims.owners().values()) == {os.getpid()}


def _compare(workdir, workers: int) -> tuple[dict, str]:
    command = [sys.executable, SCRIPT, "--config=configs/arith.py:smoke", "--mode=compare", f"--workdir={workdir}",
               "--noprogress", "--config.compare.methods=('outcome', 'average')", "--config.compare.seeds=(0,)",
               "--config.final.steps=2", f"--config.compare.workers={workers}"]
    # The runs compile the same programs: a persistent compilation cache shared by every process
    # of both compares saves most of the compile time after the first.
    cache = {"JAX_COMPILATION_CACHE_DIR": os.path.join(os.path.dirname(workdir), "compile_cache"),
             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **cache})
    assert done.returncode == 0, done.stderr[-2000:]
    with open(os.path.join(workdir, "results.json"), encoding="utf-8") as handle:
        return json.load(handle), done.stdout + done.stderr


@pytest.mark.slow
def test_two_processes_give_the_results_of_one(tmp_path):
    one, _ = _compare(tmp_path / "one", 1)
    shutil.copytree(tmp_path / "one" / "base_policy", tmp_path / "two" / "base_policy")   # one warm start for both
    two, output = _compare(tmp_path / "two", 2)
    assert two == one
    assert "2 processes share the runs" in output and "stopped early" not in output   # the worker ended cleanly
    assert not (tmp_path / "one" / CLAIMS_DIR).exists()
    (token,) = os.listdir(tmp_path / "two" / CLAIMS_DIR)
    owners = Claims(str(tmp_path / "two"), token).owners()
    assert sorted(owners) == ["average.seed_0", "outcome.seed_0"]
