"""Sharding tests on 8 CPU devices (the cases are in `parallel_cases.py`).

`conftest.py` gives the test process 8 CPU devices; where it could not (JAX_PLATFORMS names an
accelerator, or JAX started before the flag was set), the same cases run in one subprocess
started with `XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu`, and any
failure there fails here. Nothing is skipped.
"""

import pathlib
import re
import subprocess
import sys

from parallel_cases import eight_cpu_device_env, have_eight_cpu_devices

if have_eight_cpu_devices():
    from parallel_cases import *  # noqa: F401,F403 - the cases run in this process

else:

    def test_sharding_cases_in_a_subprocess_with_eight_cpu_devices():
        here = pathlib.Path(__file__)
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(here)],
            cwd=here.parent.parent, env=eight_cpu_device_env(), capture_output=True, text=True, timeout=900,
        )
        summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
        assert run.returncode == 0, f"sharding cases failed on 8 CPU devices:\n{run.stdout[-6000:]}\n{run.stderr[-3000:]}"
        assert re.fullmatch(r"\d+ passed in .*", summary) and "subprocess" not in summary, summary
        assert int(summary.split()[0]) >= 15, summary  # the cases ran, not this test again
