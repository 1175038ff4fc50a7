"""`python launch/run.py --list`: every registered domain, method and primitive in one listing."""

from __future__ import annotations

import os
import subprocess
import sys

from derl_jax.experiment.catalog import catalog

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_catalog_holds_each_registry():
    found = catalog()
    assert {"arith", "math", "household", "scienceworld", "alfworld"} <= set(found["domains"])
    assert found["domains"]["arith"] == "derl_jax.domains.arith"
    assert list(found["methods"])[:7] == ["derl", "derl_pop", "random", "evolution", "outcome", "outcome_format",
                                          "average"]
    assert "fixed:<arg>" in found["methods"]
    assert found["methods"]["random"].startswith("DERL's proposals from the cold-started Meta-Optimizer")
    assert found["primitives"]["arith/correct"].startswith("device: 1 when the final box")
    assert found["primitives"]["math/correct"].startswith("host:")


def test_the_list_flag_prints_it_without_a_config():
    completed = subprocess.run([sys.executable, "launch/run.py", "--list"], capture_output=True, text=True,
                               cwd=REPO_ROOT, timeout=120)
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.splitlines()
    assert lines[0].startswith("domains (") and any(line.startswith("methods (") for line in lines)
    assert any(line.split()[:1] == ["arith/correct"] for line in lines)
