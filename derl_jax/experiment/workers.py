"""A compare's method x seed runs shared out over several processes of one host.

XLA:CPU runs a small policy's jitted steps on one core, so on a multi-core host the runs of a
compare (independent given the base policy: each depends only on its method, seed and the
config) go to `config.compare.workers` processes. Every process walks the same list of runs
and takes the next one nobody has claimed; a claim is a file created with O_EXCL in a
directory private to this compare (`<workdir>/.claims/<token>/`), so two processes never run
the same run, and a slow run does not hold up the rest; each claim file holds the pid of the
process that ran it (kept until the next compare in that directory). Each run keeps its own resumable
directory, so a process that dies loses nothing: the lead process reads every finished run
back afterwards and runs what is missing itself.

    workers = resolve_workers(cfg, jobs=len(methods) * len(seeds))
    claims = Claims.fresh(workdir)           # lead process, under the run lock
    claims.claim("derl", 0)                  # True once per (method, seed) per compare
    Claims(workdir, claims.token)            # the same claims, in a worker process

`compare.workers` = 0 picks the count: one per CPU core, at most one per run and at most
`MAX_AUTO_WORKERS`, on the CPU backend of a single-process job; 1 on accelerators (their
memory belongs to one process) and in multi-process jobs (their processes already split the
work through the mesh).
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from derl_jax.config import ConfigError, config_value, has_field, is_int
from derl_jax.parallel import host_cores

CLAIMS_DIR = ".claims"
MAX_AUTO_WORKERS = 8


def resolve_workers(cfg: Any, jobs: int, *, backend: str | None = None, process_count: int | None = None,
                    cpu_count: int | None = None) -> int:
    """Processes to run `jobs` runs of a compare with (>= 1); `config.compare.workers` when set
    (> 0), else the automatic count (module docstring). backend / process_count / cpu_count
    default to JAX's and the host's."""
    requested = config_value(cfg, "compare.workers") if has_field(cfg, "compare.workers") else 0
    if not is_int(requested) or requested < 0:
        raise ConfigError(f"config.compare.workers must be an integer >= 0 (0: one per CPU core), got {requested!r}")
    if requested > 0:
        return max(1, min(int(requested), jobs))
    if backend is None or process_count is None:
        import jax

        backend = jax.default_backend() if backend is None else backend
        process_count = jax.process_count() if process_count is None else process_count
    if backend != "cpu" or process_count > 1:
        return 1
    cores = cpu_count if cpu_count is not None else host_cores()
    return max(1, min(cores, jobs, MAX_AUTO_WORKERS))


class Claims:
    """Which runs of one compare a process has taken (module docstring)."""

    def __init__(self, workdir: str, token: str):
        self.token = token
        self.directory = os.path.join(os.fspath(workdir), CLAIMS_DIR, token)

    @classmethod
    def fresh(cls, workdir: str) -> "Claims":
        """New, empty claims for a compare about to start; clears those of earlier compares
        (the caller holds the run lock, so none of them is still running)."""
        shutil.rmtree(os.path.join(os.fspath(workdir), CLAIMS_DIR), ignore_errors=True)
        claims = cls(workdir, f"{os.getpid()}-{time.time_ns()}")
        os.makedirs(claims.directory)
        return claims

    def claim(self, method: str, seed: int) -> bool:
        """True for the first process that asks for (method, seed), False for every later one."""
        from derl_jax.experiment.protocol import method_dir

        name = method_dir("", method, seed).replace(os.sep, ".")
        try:
            handle = os.open(os.path.join(self.directory, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.write(handle, str(os.getpid()).encode())
        os.close(handle)
        return True

    def owners(self) -> dict[str, int]:
        """Run (`<method>.seed_<s>`) -> pid of the process that claimed it."""
        owners = {}
        for name in os.listdir(self.directory):
            with open(os.path.join(self.directory, name), encoding="utf-8") as handle:
                owners[name] = int(handle.read() or 0)
        return owners
