"""Validity (`check`) and structure classes of reward expressions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from derl_jax.expr import INVALID, STABLE, UNSTABLE, Binary, Prim, Validity, check, check_text, parse, structure
from derl_jax.expr.check import NUM_RANDOM_PROBES, probe_points
from derl_jax.expr.structure import has_unbounded_product
from expr_strategies import exprs


def test_valid_expressions():
    for text in ["g1", "0.5*g1+0.8*g2", "g1/(g2+1)", "clip(g1 - u*g3, 0, 1)", "g1*(g2+0.2)*g3", "-(g1+0.5*g2)"]:
        validity = check(parse(text), 4)
        assert validity.ok and validity.reason == "" and validity, text


@pytest.mark.parametrize(
    "text, reason",
    [
        ("g1+g7", "unknown primitive g7"),
        ("g1/g2", "not finite"),  # g2 = 0 on a corner
        ("(g1-0.5)**0.5", "not finite"),  # negative base, fractional exponent
        ("g1*1e30*1e30", "not finite"),  # overflow
        ("g1*20000", "|reward| > 10000"),
        ("-g1/(g2+0.00001)", "|reward| > 10000"),
        ("u", "constant"),
        ("g1-g1", "constant"),
        ("3*u+1", "constant"),
        ("min(g1, 0)*0 + 2", "constant"),
    ],
)
def test_each_invalid_reason(text, reason):
    validity = check(parse(text), 4)
    assert not validity.ok
    assert validity.reason.startswith(reason), validity


def test_too_long_for_a_program():
    tree = Prim(0, "g1")
    for _ in range(64):
        tree = Binary("+", tree, Prim(1, "g2"))  # 129 nodes, only buildable by hand
    validity = check(tree, 2)
    assert not validity.ok and validity.reason.startswith("program:")


def test_reason_detail_names_the_point():
    validity = check(parse("g1/g2"), 3)
    assert "g=(" in validity.detail and "u=" in validity.detail


def test_probe_set():
    points = probe_points(3)
    assert points.shape == (8 + NUM_RANDOM_PROBES, 3) and points.dtype == np.float32
    corners = {tuple(p) for p in points[:8]}
    assert corners == {(a, b, c) for a in (0.0, 1.0) for b in (0.0, 1.0) for c in (0.0, 1.0)}
    assert np.all((points >= 0) & (points <= 1))
    np.testing.assert_array_equal(points, probe_points(3))
    assert probe_points(16).shape[1] == 16  # sampled corners beyond MAX_CORNER_DIM


def test_custom_probes():
    expr = parse("g1/(g2-0.5)")
    assert not check(expr, 2, probes=np.array([[0.0, 0.5]], np.float32)).ok


def test_check_text():
    expr, validity = check_text("outcome + 0.5*format", ["outcome", "format"])
    assert expr == parse("g1+0.5*g2") and validity.ok
    expr, validity = check_text("outcome + ", ["outcome", "format"])
    assert expr is None and validity.reason.startswith("parse error at 10:")
    expr, validity = check_text("g3", {"g1": 0, "g2": 1})
    assert expr is None and "parse error at 0" in validity.reason
    expr, validity = check_text("g1 - g1", ["a"])
    assert expr is not None and validity.reason.startswith("constant")


def test_validity_is_frozen_data():
    v = Validity(False, "constant: does not depend on any primitive")
    with pytest.raises(Exception):
        v.ok = True  # type: ignore[misc]
    assert not v


@settings(max_examples=150, deadline=None, derandomize=True)
@given(exprs(3, max_leaves=10, nice_only=True))
def test_valid_means_finite_bounded_and_varying(expr):
    from derl_jax.expr import evaluate_numpy

    validity = check(expr, 3)
    points = probe_points(3)
    values = np.stack([evaluate_numpy(expr, points, u) for u in (0.0, 0.5, 1.0)])
    if validity.ok:
        assert np.all(np.isfinite(values)) and np.all(np.abs(values) <= 1e4)
        assert np.ptp(values, axis=1).max() > 0
    else:
        finite = np.all(np.isfinite(values))
        assert (not finite) or np.abs(values).max() > 1e4 or np.ptp(values, axis=1).max() <= 1e-6 * max(
            1, np.abs(values).max()
        ), validity


# ----------------------------------------------------------------------------- structure


@pytest.mark.parametrize(
    "text, expected",
    [
        # the paper's examples (§4.2)
        ("0.5*g1+0.8*g2", STABLE),
        ("g1/(g2+1)", STABLE),
        ("g1*(g2+0.2)*g3", UNSTABLE),
        ("-(g1+0.5*g2)", INVALID),
        # more
        ("g1 + u*g2", STABLE),
        ("g1*g2/(g3+1)", STABLE),
        ("clip(g1*g2, 0, 1) + g1", STABLE),
        ("min(g1*g2, g1)", STABLE),
        ("g1 + 0.5*g2*(g3/2)", UNSTABLE),
        ("g1**2 + g2", UNSTABLE),
        ("(g1 + g2)**2", UNSTABLE),
        ("g1**0.5 + g2", STABLE),
        ("g1/(g2+1)*g3", UNSTABLE),
        ("-g1*g2*3", INVALID),  # never rises with the outcome
        ("g2 + g3", INVALID),  # ignores the outcome
        ("g1/g2", INVALID),  # ill-defined
        ("g1 - g1", INVALID),  # constant
        ("2 - g1", INVALID),
        ("g1*(g2-1)*(1-0.5)+0.5**2*(g3-1)*(1-0.25)", INVALID),  # g2 <= 1: more success, less reward
        ("g1*(g2+1)*(1-0.5)+0.5**2*(g3+1)", UNSTABLE),
    ],
)
def test_structure(text, expected):
    assert structure(parse(text), 4, outcome_index=0) == expected


def test_structure_outcome_index_and_none():
    expr = parse("g2 - 0.1*g1")
    assert structure(expr, 3, outcome_index=1) == STABLE
    assert structure(expr, 3, outcome_index=0) == INVALID
    assert structure(expr, 3, outcome_index=None) == STABLE
    assert structure(parse("-(g1+0.5*g2)"), 3, outcome_index=None) == INVALID


def test_unbounded_product_rule():
    assert has_unbounded_product(parse("g1*g2"))
    assert has_unbounded_product(parse("-(g1*g2)/2"))
    assert not has_unbounded_product(parse("u*g1*3"))
    assert not has_unbounded_product(parse("(g1*g2)/(1+g3)"))
    assert has_unbounded_product(parse("(g1*g2)/(1+g3) + g1*g3"))
    assert has_unbounded_product(Binary("**", Prim(0, "g1"), parse("1+1")))
