"""Primitive aliases work wherever a primitive's name does; a registered primitive left out of the
run is named with the way to add it; every mode writes config.json.

The launcher runs in process with the fake inner loop of test_launch (the real arith domain)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from derl_jax.config import InputError
from derl_jax.expr.canonical import canonical
from derl_jax.expr.parse import parse
from derl_jax.experiment.run import check_expression
from primitives import registry
from test_launch import REPO_ROOT, SCRIPT, SMOKE, invoke, launcher  # noqa: F401  (the fixture)

ARITH = ("correct", "boxed", "steps")


def test_the_symbols_of_a_run_are_indices_names_and_aliases():
    table = registry.expression_symbols("arith", ARITH + ("not_registered",))
    assert table == {"g1": 0, "correct": 0, "outcome": 0, "g2": 1, "boxed": 1, "format": 1, "g3": 2, "steps": 2,
                     "g4": 3, "not_registered": 3}
    aliased = "outcome + 0.5*format*(1-u) + g3/format_x"
    assert registry.with_names(aliased, "arith", ARITH) == "correct + 0.5*boxed*(1-u) + g3/format_x"
    text = "outcome+0.25*max(format, steps)"
    assert canonical(parse(registry.with_names(text, "arith", ARITH), ARITH)) == canonical(parse(text, table))
    assert canonical(parse(text, table)) == canonical(parse("g1+0.25*max(g2, g3)", ARITH))


def test_check_expression_reads_aliases_and_suggests_the_extra_primitive():
    assert check_expression("outcome+format", ARITH, domain="arith") == "correct+boxed"
    assert check_expression("g1+0.5*g2", ARITH, domain="arith") == "g1+0.5*g2"
    with pytest.raises(InputError) as info:
        check_expression("correct+gold_anywhere", ARITH, domain="arith")
    assert str(info.value) == ("--expression='correct+gold_anywhere': parse error at 8: unknown name 'gold_anywhere'; "
                               "'gold_anywhere' is a registered arith primitive not in this run: add it with "
                               "--config.primitives.extra=\"('gold_anywhere',)\"")
    with pytest.raises(InputError) as info:
        check_expression("correct+nothing_like_it", ARITH, domain="arith")
    assert "unknown name 'nothing_like_it'" in str(info.value) and "primitives.extra" not in str(info.value)
    with pytest.raises(InputError, match="unknown name 'outcome'"):
        check_expression("outcome", ARITH)      # without the domain no alias is known
    with pytest.raises(InputError, match="^--expression='format\\+outcome\\+': parse error at 15: "):
        check_expression("format+outcome+", ARITH, domain="arith")   # positions in the text as written


@pytest.fixture
def left_out():
    """A primitive registered for arith that the arith runs do not add (removed afterwards)."""
    @registry.register_primitive("ends_early", kind="device", domain="arith", aliases=("early",))
    def ends_early(rollout, context):
        return rollout["mask"].sum(-1) < 4

    yield "ends_early"
    registry.PRIMITIVES.remove(("arith", "ends_early"))


def test_final_mode_with_aliases_trains_the_named_primitives(launcher, tmp_path, capsys, left_out):  # noqa: F811
    invoke(launcher, "--mode=final", f"--workdir={tmp_path / 'alias'}", "--expression=outcome+format")
    invoke(launcher, "--mode=final", f"--workdir={tmp_path / 'names'}", "--expression=correct+boxed")
    aliased = json.load(open(tmp_path / "alias" / "final_result.json"))
    named = json.load(open(tmp_path / "names" / "final_result.json"))
    assert aliased["expression"] == "correct+boxed" and aliased["canonical"] == named["canonical"] == "g1 + g2"
    assert aliased["test"] == named["test"]
    saved = json.load(open(tmp_path / "alias" / "config.json"))     # final mode writes config.json too
    assert saved["domain"]["kind"] == "arith" and saved["name"] == json.load(open(tmp_path / "names" / "config.json"))["name"]
    with pytest.raises(SystemExit) as info:
        invoke(launcher, "--mode=final", f"--workdir={tmp_path / 'missing'}", "--expression=outcome+early")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("launch/run.py: error: --expression='outcome+early': parse error at 8: unknown name 'early'")
    assert err.endswith("add it with --config.primitives.extra=\"('ends_early',)\"") and "\n" not in err
    assert not os.path.exists(tmp_path / "missing" / "config.json")   # nothing written for a rejected input


@pytest.mark.slow
def test_the_script_runs_final_mode_with_aliases(tmp_path):
    command = [sys.executable, SCRIPT, f"--config={SMOKE}", "--mode=final", "--expression=outcome+format",
               f"--workdir={tmp_path}", "--noprogress", "--config.final.steps=2"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    final = json.load(open(tmp_path / "final_result.json"))
    assert final["expression"] == "correct+boxed" and 0.0 <= final["test"] <= 1.0
    assert json.load(open(tmp_path / "config.json"))["final"]["steps"] == 2
