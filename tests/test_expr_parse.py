"""Parser, printer and canonical form of reward expressions."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from derl_jax.expr import (
    MAX_NESTING,
    MAX_NODES,
    MAX_TEXT_LENGTH,
    Binary,
    Call,
    ExpressionError,
    Num,
    Prim,
    Unary,
    Var,
    canonical,
    evaluate_numpy,
    node_count,
    parse,
    to_latex,
    to_text,
)
from derl_jax.expr.canonical import FALLBACK_PREFIX, fallback_key
from expr_strategies import commuted, exprs
from primitives.registry import Primitive, symbol_table

G1, G2, G3, G4 = (Prim(i, f"g{i + 1}") for i in range(4))


def rejected(text, names=None) -> ExpressionError:
    with pytest.raises(ExpressionError) as info:
        parse(text, names)
    return info.value


# ----------------------------------------------------------------------------- the language


@pytest.mark.parametrize(
    "text, tree",
    [
        ("g1", G1),
        ("g1+g2*g3", Binary("+", G1, Binary("*", G2, G3))),
        ("g1-g2-g3", Binary("-", Binary("-", G1, G2), G3)),
        ("g1/g2/g3", Binary("/", Binary("/", G1, G2), G3)),
        ("-g1**2", Unary("neg", Binary("**", G1, Num(2.0)))),
        ("2**3**2", Binary("**", Num(2.0), Binary("**", Num(3.0), Num(2.0)))),
        ("g1**-2", Binary("**", G1, Unary("neg", Num(2.0)))),
        ("+g1", G1),
        ("- -g1", Unary("neg", Unary("neg", G1))),
        ("-g1*g2", Binary("*", Unary("neg", G1), G2)),
        ("u*g4", Binary("*", Var("u"), G4)),
        ("min(g1, max(g2,u))", Call("min", (G1, Call("max", (G2, Var("u")))))),
        ("abs(g1)", Call("abs", (G1,))),
        ("clip(g1, 0, 1)", Call("clip", (G1, Num(0.0), Num(1.0)))),
        (" \t( g1 \n+ g2 ) ", Binary("+", G1, G2)),
    ],
)
def test_parse_trees(text, tree):
    assert parse(text) == tree


@pytest.mark.parametrize(
    "text, value", [("3", 3.0), ("0.5", 0.5), (".5", 0.5), ("2.", 2.0), ("1e-3", 1e-3), ("2.5E+2", 250.0), ("7e2", 700.0)]
)
def test_numbers(text, value):
    assert parse(text) == Num(value)


def test_paper_examples():
    a = parse("g1*(g2-1)*(1-0.5)+0.5**2*(g3-1)*(1-0.25)")
    prims = np.array([[1.0, 0.0, 0.0], [0.5, 0.25, 1.0]], np.float32)
    g1, g2, g3 = prims.T
    expected = g1 * (g2 - 1) * 0.5 + 0.25 * (g3 - 1) * 0.75
    np.testing.assert_allclose(evaluate_numpy(a, prims, 0.0), expected, rtol=1e-6)

    b = parse("-(g1+0.5*(g2+0.3*(g3-0.2*(g4+0.1*1)))+0.1*1)/1.2")
    assert isinstance(b, Binary) and b.op == "/" and isinstance(b.left, Unary)

    err = rejected("g1+0.5*(g2+0.5*(g3+0.5*(g4))))")
    assert err.position == 29 and "')'" in err.reason


def test_aliases_sequence_and_mapping():
    names = ["outcome", "format", "steps"]
    assert parse("outcome + 0.5*format - steps", names) == parse("g1+0.5*g2-g3")
    prims = [Primitive("correct", None, "host", "math", aliases=("outcome",)), Primitive("boxed", None, "host", "math")]
    table = symbol_table(prims)
    assert parse("outcome*correct + boxed + g2", table) == parse("g1*g1+g2+g2")
    assert parse("g1", names).name == "g1"
    assert rejected("g4", names).reason.startswith("unknown primitive")
    assert rejected("g3", table).position == 0


@pytest.mark.parametrize(
    "text, position, words",
    [
        ("", 0, "empty"),
        ("   ", 3, "empty"),
        ("g0", 0, "g1"),
        ("g1+g5", 3, "unknown primitive"),
        ("g1 + foo", 5, "unknown name"),
        ("g1 g2", 3, "after a complete expression"),
        ("(g1+g2", 6, "to close"),
        ("g1+g2)", 5, "')'"),
        ("g1+", 3, "operand"),
        ("g1**g2", 4, "constant"),
        ("g1**(u+1)", 4, "constant"),
        ("min(g1)", 6, "2 arguments"),
        ("min(g1, g2, g3)", 10, "2 arguments"),
        ("abs()", 4, "1 argument"),
        ("clip(g1, 0)", 10, "3 arguments"),
        ("max g1", 4, "'('"),
        ("1e+", 3, "exponent"),
        ("g1 $ 2", 3, "character"),
        ("g1 ² ", 3, "character"),
        ("()", 1, "empty parentheses"),
        ("g01", 0, "g1"),
        ("1e999", 0, "range"),
        ("g1,g2", 2, "','"),
    ],
)
def test_rejections_have_positions(text, position, words):
    err = rejected(text, ["a", "b", "c", "d"])
    assert isinstance(err, ValueError)
    assert err.position == position, (err.reason, err.position)
    assert words in err.reason
    shown = str(err)
    assert err.reason in shown and shown.splitlines()[-1].index("^") == position + 2


def test_error_pickles():
    err = rejected("g1+")
    again = pickle.loads(pickle.dumps(err))
    assert (again.reason, again.position, again.text) == (err.reason, err.position, err.text)


def test_limits():
    assert parse("g1" + " " * (MAX_TEXT_LENGTH - 2)) == G1
    too_long = "g1" + " " * (MAX_TEXT_LENGTH - 1)
    assert len(too_long) == MAX_TEXT_LENGTH + 1
    err = rejected(too_long)
    assert str(MAX_TEXT_LENGTH) in err.reason and err.position == MAX_TEXT_LENGTH

    parse("(" * MAX_NESTING + "g1" + ")" * MAX_NESTING)
    err = rejected("(" * (MAX_NESTING + 1) + "g1" + ")" * (MAX_NESTING + 1))
    assert "nested" in err.reason and err.position == MAX_NESTING
    err = rejected("abs(" * (MAX_NESTING + 1) + "g1" + ")" * (MAX_NESTING + 1))
    assert "nested" in err.reason

    assert node_count(parse("-g1" + "+g1" * 63)) == MAX_NODES
    err = rejected("g1" + "+g1" * 64)
    assert str(MAX_NODES) in err.reason and "nodes" in err.reason
    assert node_count(parse("+" * 200 + "g1")) == 1  # unary plus makes no node


# ----------------------------------------------------------------------------- fuzz, round trip

LANGUAGE = "g1234567890u.+-*/()e, minaxbsclp\t"


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(alphabet=LANGUAGE, max_size=60), st.text(max_size=40), st.text(alphabet="()+-*g1", max_size=300)))
def test_fuzz_only_expression_errors(text):
    try:
        expr = parse(text, ["alpha", "beta"])
    except ExpressionError as err:
        assert 0 <= err.position <= len(text)
        assert isinstance(err.reason, str) and err.reason
    else:
        assert parse(to_text(expr), ["alpha", "beta"]) == expr


@settings(max_examples=800, deadline=None)
@given(exprs(max_leaves=20))
def test_round_trip(expr):
    text = to_text(expr)
    assume(len(text) <= MAX_TEXT_LENGTH)  # longer texts are outside the language (test_limits)
    assert parse(text) == expr, text


def test_to_text_minimal_parentheses():
    assert to_text(parse("((g1)+(g2*(g3)))")) == "g1+g2*g3"
    assert to_text(parse("(g1-g2)-(g3-g4)")) == "g1-g2-(g3-g4)"
    assert to_text(parse("(-g1)**2")) == "(-g1)**2"
    assert to_text(parse("-(g1**2)")) == "-g1**2"
    assert to_text(parse("(g1**2)**3")) == "(g1**2)**3"
    assert to_text(parse("g1*(-g2)")) == "g1*-g2"


# ----------------------------------------------------------------------------- canonical


@pytest.mark.parametrize(
    "group",
    [
        ["g1+0.5*g2", "0.5*g2 + g1", "g2/2+g1", "g1 + g2*0.5000000001"],
        ["(g1+g2)*2", "2*g1+2*g2", "g2*2+g1+g1"],
        ["g1*(g2+0.2)*g3", "g3*g1*g2 + 0.2*g1*g3"],
        ["min(g1, g2+1)", "min(1+g2, g1)"],
        ["g1/(g2+1)", "g1*(1+g2)**-1"],
    ],
)
def test_canonical_merges_equivalent_forms(group):
    keys = {canonical(parse(text)) for text in group}
    assert len(keys) == 1, keys


def test_canonical_keeps_different_forms_apart():
    texts = ["g1+g2", "g1-g2", "g1*g2", "g1/g2", "g1+0.5*g2", "g1+0.6*g2", "min(g1,g2)", "max(g1,g2)", "g1+u*g2"]
    assert len({canonical(parse(t)) for t in texts}) == len(texts)


def test_canonical_falls_back_deterministically_on_huge_expansions():
    big = parse("(g1+g2+g3+g4+u)**16*(g1-g2)**9")
    key = canonical(big)
    assert key.startswith(FALLBACK_PREFIX) and key == fallback_key(big)
    assert fallback_key(parse("g2+g1")) == fallback_key(parse("g1+g2"))


def _values(expr, points, progress):
    return evaluate_numpy(expr, points, progress)


@settings(max_examples=300, deadline=None)
@given(exprs(2, max_leaves=5, nice_only=True), exprs(2, max_leaves=5, nice_only=True))
def test_equal_keys_mean_equal_rewards(a, b):
    if canonical(a) != canonical(b):
        return
    rng = np.random.default_rng(0)
    points = rng.uniform(-2, 2, (64, 2)).astype(np.float32)
    for progress in (0.0, 0.7):
        va, vb = _values(a, points, progress), _values(b, points, progress)
        both = np.isfinite(va) & np.isfinite(vb)
        scale = 1 + np.maximum(np.abs(va), np.abs(vb))
        assert np.all(np.abs(va - vb)[both] <= 1e-3 * scale[both]), (to_text(a), to_text(b))


@settings(max_examples=200, deadline=None)
@given(exprs(3, max_leaves=8, nice_only=True))
def test_canonical_ignores_operand_order(expr):
    assert canonical(commuted(expr)) == canonical(expr)


def test_to_latex():
    assert to_latex(parse("g1/(g2+1)")) == r"\frac{g_{1}}{g_{2} + 1}"
    assert to_latex(parse("0.5*g1 + abs(u-g2)")) == r"0.5 \cdot g_{1} + \left|u - g_{2}\right|"
    assert to_latex(parse("(g1/2)**2")) == r"\left(\frac{g_{1}}{2}\right)^{2}"
    assert to_latex(parse("clip(g1, 0, 1e-7)")) == r"\operatorname{clip}\left(g_{1}, 0, 1 \cdot 10^{-7}\right)"
