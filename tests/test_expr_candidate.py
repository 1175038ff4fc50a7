"""`derl_jax.expr.examine`: a proposed text is parsed and compiled once, and that one program is
what the check runs, what the structure class measures and what the inner loop gets."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from derl_jax.expr.check import check_text
from derl_jax.expr.program import compile_expr
from derl_jax.expr.structure import structure

# the modules themselves (the package's names `check`, `parse`, `structure` are its functions)
candidate_module = importlib.import_module("derl_jax.expr.candidate")
check_module = importlib.import_module("derl_jax.expr.check")
structure_module = importlib.import_module("derl_jax.expr.structure")

NAMES = ("correct", "boxed", "steps")


@pytest.fixture
def counted(monkeypatch):
    """Counts of parse and compile calls, and the programs the numeric checks evaluated."""
    calls = {"parse": 0, "compile": 0, "evaluated": []}
    real_parse, real_compile, real_eval = candidate_module.parse, check_module.compile_expr, check_module.evaluate_numpy

    def parse(*args, **kwargs):
        calls["parse"] += 1
        return real_parse(*args, **kwargs)

    def compile_(*args, **kwargs):
        calls["compile"] += 1
        return real_compile(*args, **kwargs)

    def evaluate(program, *args, **kwargs):
        calls["evaluated"].append(program)
        return real_eval(program, *args, **kwargs)

    monkeypatch.setattr(candidate_module, "parse", parse)
    monkeypatch.setattr(check_module, "compile_expr", compile_)
    monkeypatch.setattr(structure_module, "compile_expr", compile_)
    monkeypatch.setattr(check_module, "evaluate_numpy", evaluate)
    monkeypatch.setattr(structure_module, "evaluate_numpy", evaluate)
    return calls


@pytest.mark.parametrize("text, structure_class", [("g1 + 0.5*g2", "stable"), ("g1*(g2+0.2)*g3", "unstable"),
                                                   ("-(g1+0.5*g2)", "invalid")])
def test_a_valid_text_is_parsed_and_compiled_once(counted, text, structure_class):
    candidate = candidate_module.examine(text, NAMES)
    assert (counted["parse"], counted["compile"]) == (1, 1)
    assert candidate.program is not None and candidate.valid
    assert all(program is candidate.program for program in counted["evaluated"])  # check and structure: one program
    assert candidate.structure == structure_class == structure(candidate.expr, 3)
    expected = compile_expr(candidate.expr, num_primitives=3)
    np.testing.assert_array_equal(np.asarray(candidate.program.ops), np.asarray(expected.ops))
    np.testing.assert_array_equal(np.asarray(candidate.program.args), np.asarray(expected.args))


@pytest.mark.parametrize("text, reason", [("g1+", "parse error at 3: expression ends where an operand is expected"),
                                          ("g1/(g2-g2)", "not finite (NaN) on a probe point"),
                                          ("2 + 3", "constant: does not depend on any primitive")])
def test_an_invalid_text_keeps_the_checkers_reason_and_has_no_program(text, reason):
    candidate = candidate_module.examine(text, NAMES)
    assert not candidate.valid and candidate.program is None and candidate.structure == "invalid"
    assert candidate.reason == reason == check_text(text, NAMES)[1].reason
