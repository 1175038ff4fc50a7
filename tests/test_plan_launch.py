"""`launch/run.py --mode=plan`: the planner's table for a config, no model built; a bad
accelerator is one line naming it."""

import pytest
import os
import subprocess
import sys

from configs import arith
from derl_jax.domains.registry import get_domain
from derl_jax.plan import analytic, report
from derl_jax.rl import sft

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(*flags):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    return subprocess.run([sys.executable, os.path.join(ROOT, "launch", "run.py"), "--config=configs/arith.py:smoke",
                           "--mode=plan", *flags], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_plan_mode_prints_the_table_of_the_configured_run(tmp_path):
    done = launch("--accelerator=h100,v5e", f"--workdir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| H100") or line.startswith("| TPU v5e")]
    assert len(rows) == 2 and all(row.rstrip().endswith("| yes |") for row in rows)
    cfg = arith.get_config("smoke")
    domain = get_domain("arith").build(cfg)
    shape = report.shape_from_config(cfg, domain=domain)
    assert analytic.param_shapes(shape.model) == analytic.param_shapes(sft.policy_model_config(domain, cfg.policy))
    assert shape.model.dtype == "bfloat16"  # planned for an accelerator
    params = report.gib(analytic.per_device(shape)["params"])
    assert f"| {params} |" in rows[0]
    assert not (tmp_path / "run").exists()  # planning writes no run directory


@pytest.mark.slow
def test_unknown_accelerator_is_one_line():
    done = launch("--accelerator=h900")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch/run.py: error: accelerator 'h900' is unknown")
