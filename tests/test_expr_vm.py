"""Programs and the VM against independent references (Python floats, sympy.lambdify)."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from derl_jax.expr import (
    DIV_EPS,
    MAX_PROGRAM_LENGTH,
    STACK_SIZE,
    Binary,
    Call,
    Num,
    Prim,
    ProgramError,
    Unary,
    Var,
    compile_expr,
    evaluate,
    evaluate_batch,
    evaluate_numpy,
    max_stack_depth,
    node_count,
    parse,
    stack_programs,
    to_sympy,
    to_text,
)
from derl_jax.expr.program import NOP, Program, min_nodes_for_stack_depth, stack_need
from derl_jax.expr.vm import _decode, evaluate_batch_threaded
from expr_strategies import exprs

NUM_PRIMS = 4
ROWS = 24

_jit_evaluate = jax.jit(evaluate)
_jit_vmapped = jax.jit(jax.vmap(evaluate, in_axes=(0, None, None)))


def _points() -> np.ndarray:
    rng = np.random.default_rng(1)
    fixed = np.array([[0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 1], [-1.5, 2.0, 0.5, -0.25]], np.float32)
    return np.concatenate([fixed, rng.uniform(-2, 2, (ROWS - len(fixed), NUM_PRIMS)).astype(np.float32)])


POINTS = _points()


# ----------------------------------------------------------------------------- reference


class _Ill(Exception):
    """The value is ill-defined (NaN by the VM's rules)."""


class _Borderline(Exception):
    """float32 and float64 may legitimately disagree on ill-definedness here: skip the row."""


U32 = 2.0**-24  # float32 unit roundoff


def reference(expr, g, u):
    """Python-float (float64) value with the VM's NaN rules -> (value, float32 error bound).

    The bound is a first-order estimate of the rounding error a float32 evaluation of the
    same tree may make (it grows through cancellation and division); rows where float32 and
    float64 could disagree on ill-definedness raise `_Borderline`.
    """

    def out(x, err):
        if math.isnan(x) or math.isinf(x):
            raise _Ill
        if abs(x) > 1e30:
            raise _Borderline
        return x, err + abs(x) * U32

    if isinstance(expr, Num):
        return out(float(np.float32(expr.value)), 0.0)
    if isinstance(expr, Var):
        return out(u, 0.0)
    if isinstance(expr, Prim):
        return out(float(g[expr.index]), 0.0)
    if isinstance(expr, Unary):
        x, e = reference(expr.operand, g, u)
        return out(-x, e)
    if isinstance(expr, Call):
        args = [reference(a, g, u) for a in expr.args]
        err = max(e for _, e in args)
        vals = [x for x, _ in args]
        if expr.fn == "abs":
            return out(abs(vals[0]), err)
        if expr.fn == "min":
            return out(min(vals), err)
        if expr.fn == "max":
            return out(max(vals), err)
        x, lo, hi = vals
        return out(min(max(x, lo), hi), err)
    a, ea = reference(expr.left, g, u)
    b, eb = reference(expr.right, g, u)
    if expr.op == "+":
        return out(a + b, ea + eb)
    if expr.op == "-":
        return out(a - b, ea + eb)
    if expr.op == "*":
        return out(a * b, abs(a) * eb + abs(b) * ea + ea * eb)
    if expr.op == "/":
        if abs(abs(b) - DIV_EPS) <= 4 * eb + 4 * abs(b) * U32:
            raise _Borderline
        if abs(b) < DIV_EPS:
            raise _Ill
        if 4 * eb >= abs(b):
            raise _Borderline
        return out(a / b, (ea + abs(a / b) * eb) / (abs(b) - eb))
    # power (the exponent is a constant: its error is the float32 rounding of the constant)
    if abs(a) <= 4 * ea and (b < 0 or b != math.floor(b)):
        raise _Borderline  # the sign or zero-ness of the base is not known in float32
    if a == 0 and b < 0:
        raise _Ill
    if a < 0 and b != math.floor(b):
        raise _Ill
    try:
        value = a**b
    except (OverflowError, ZeroDivisionError):
        raise _Borderline from None
    da = abs(b) * abs(value / a) * ea if a != 0 else ea
    db = abs(value * math.log(abs(a))) * eb if a != 0 else 0.0
    return out(value, da + db)


def reference_values(expr, points, u):
    """(values, status, error bound) per row; status 'ok' | 'ill' | 'skip'."""
    values, status, errors = [], [], []
    for g in points.astype(np.float64):
        try:
            value, err = reference(expr, g, float(np.float32(u)))
            values.append(value)
            errors.append(err)
            status.append("ok")
        except _Ill:
            values.append(math.nan)
            errors.append(math.nan)
            status.append("ill")
        except _Borderline:
            values.append(math.nan)
            errors.append(math.nan)
            status.append("skip")
    return np.array(values), np.array(status), np.array(errors)


def close(actual, expected, error_bound):
    """Relative 1e-4, widened by the float32 rounding-error bound of the reference."""
    return np.abs(actual - expected) <= 1e-4 * np.abs(expected) + 16 * error_bound + 1e-30


# ----------------------------------------------------------------------------- properties


@pytest.mark.slow
@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(exprs(NUM_PRIMS, max_leaves=16), st.sampled_from([0.0, 0.3, 1.0]))
def test_vm_matches_python_reference(expr, u):
    program = compile_expr(expr)
    got = np.asarray(_jit_evaluate(program, POINTS, np.float32(u)))
    expected, status, error = reference_values(expr, POINTS, u)
    ok, ill = status == "ok", status == "ill"
    assert np.all(np.isnan(got[ill])), (to_text(expr), got[ill])
    assert np.all(np.isfinite(got[ok])), (to_text(expr), got[ok], expected[ok])
    assert np.all(close(got[ok], expected[ok], error[ok])), (to_text(expr), got[ok], expected[ok])
    assert np.all(np.isfinite(got) | np.isnan(got))  # never inf
    numpy_path = evaluate_numpy(expr, POINTS, u)
    assert np.all(np.isnan(numpy_path[ill]))
    assert np.all(close(numpy_path[ok], expected[ok], error[ok]))
    assert np.all(close(numpy_path[ok], got[ok], error[ok]))  # evaluate_numpy == evaluate


_SYMBOLS = sympy.symbols("g1:5 u", real=True)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning")
@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(exprs(NUM_PRIMS, max_leaves=10, nice_only=True))
def test_vm_matches_sympy_lambdify(expr):
    u = 0.6
    expected, status, error = reference_values(expr, POINTS, u)
    got = np.asarray(_jit_evaluate(compile_expr(expr), POINTS, np.float32(u)))
    ok = status == "ok"
    assert np.all(np.isnan(got[status == "ill"]))
    try:
        sym = to_sympy(expr, rational=False)
    except (ArithmeticError, ValueError, TypeError):
        return  # sympy refuses an ill-defined constant (0**-1, Min(zoo, u)): nothing to compare
    if sym.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo, sympy.I):
        return  # sympy folded an ill-defined constant (1/0, (-1)**0.5): nothing to lambdify
    fn = sympy.lambdify(_SYMBOLS, sym, "numpy")
    with np.errstate(all="ignore"):
        lam = np.broadcast_to(np.asarray(fn(*POINTS.T.astype(np.float64), u)), (ROWS,))
    assert np.all(np.isreal(lam[ok]))
    lam = np.real(lam).astype(np.float64)
    assert np.all(close(got[ok], lam[ok], error[ok])), (to_text(expr), got[ok], lam[ok])


@pytest.mark.slow
@settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(exprs(NUM_PRIMS, max_leaves=12), min_size=5, max_size=5))
def test_vmap_batch_equals_one_by_one(batch):
    # K = 5 and the batch sizes / row tiles of the uneven-batch test below: one compilation each
    programs = stack_programs([compile_expr(e) for e in batch])
    singles = np.stack([np.asarray(_jit_evaluate(compile_expr(e), POINTS, 0.5)) for e in batch])
    vmapped = np.asarray(_jit_vmapped(programs, POINTS, np.float32(0.5)))
    np.testing.assert_array_equal(np.isnan(vmapped), np.isnan(singles))
    np.testing.assert_allclose(vmapped, singles, rtol=1e-6, atol=1e-6, equal_nan=True)
    for batch_size, row_tile in ((None, None), (2, None), (None, 8)):
        chunked = np.asarray(evaluate_batch(programs, POINTS, np.float32(0.5), batch_size=batch_size, row_tile=row_tile))
        np.testing.assert_allclose(chunked, singles, rtol=1e-6, atol=1e-6, equal_nan=True)


@pytest.mark.slow
def test_jit_equals_eager():
    program = compile_expr(parse("clip(g1/(g2+1), u, 1) - abs(g4)**1.5 + g1/g3"))
    jitted = np.asarray(_jit_evaluate(program, POINTS, 0.5))
    assert np.isnan(jitted).any() and np.isfinite(jitted).any()
    np.testing.assert_allclose(np.asarray(evaluate(program, POINTS, 0.5)), jitted, rtol=1e-6, equal_nan=True)
    with jax.disable_jit():  # fully op-by-op
        eager = np.asarray(evaluate(program, POINTS, 0.5))
    np.testing.assert_allclose(eager, jitted, rtol=1e-6, equal_nan=True)


# ----------------------------------------------------------------------------- specifics


def test_one_compiled_function_serves_every_expression():
    traces = []

    def counted(program, prims, progress):
        traces.append(1)
        return evaluate(program, prims, progress)

    fn = jax.jit(counted)
    for text in ["g1", "g1+g2*u", "clip(g3, 0, 1)**2 - abs(g4)", "max(g1, g2)/(g3+1)"]:
        fn(compile_expr(parse(text)), POINTS, 0.1).block_until_ready()
    assert len(traces) == 1


@pytest.mark.parametrize(
    "text, row, expected",
    [
        ("g1/g2", [1, 0, 0, 0], math.nan),
        ("g1/g2", [1, 5e-7, 0, 0], math.nan),
        ("g1/g2", [1, 2e-6, 0, 0], 5e5),
        ("g1**0.5", [-1, 0, 0, 0], math.nan),
        ("g1**2", [-3, 0, 0, 0], 9.0),
        ("g1**3", [-2, 0, 0, 0], -8.0),
        ("g1**-1", [0, 0, 0, 0], math.nan),
        ("g1**0", [0, 0, 0, 0], 1.0),
        ("g1*1e30*1e30", [1, 0, 0, 0], math.nan),
        ("1/(g1*1e30*1e30)", [1, 0, 0, 0], math.nan),
        ("min(g1, 1/g2)", [0, 0, 0, 0], math.nan),
        ("(g2/g2)**0", [0, 0, 0, 0], math.nan),
        ("clip(g1, 0, 1)", [3, 0, 0, 0], 1.0),
        ("clip(g1, g2, g3)", [-1, 0.2, 0.8, 0], 0.2),
        ("-g1**2", [3, 0, 0, 0], -9.0),
        ("u*g4", [0, 0, 0, 2], 1.0),
    ],
)
def test_numeric_rules(text, row, expected):
    prims = np.array([row], np.float32)
    for got in (np.asarray(_jit_evaluate(compile_expr(parse(text)), prims, 0.5)), evaluate_numpy(parse(text), prims, 0.5)):
        if math.isnan(expected):
            assert np.isnan(got[0])
        else:
            np.testing.assert_allclose(got[0], expected, rtol=1e-6)


def test_operand_order_is_kept_when_the_compiler_reorders():
    # the right operands need more stack than the left ones: the compiler pushes them first
    for text in ["g1-(g2-(g3-g4))", "g1/(g2*(g3+1)+1)", "2**(3-(1-2))", "clip(g1, g2-g3*g4, (g1+1)*(g2+2))"]:
        expected = evaluate_numpy(parse(text), POINTS, 0.0)
        got = np.asarray(_jit_evaluate(compile_expr(parse(text)), POINTS, 0.0))
        np.testing.assert_allclose(got, expected, rtol=1e-6, equal_nan=True)
    g = POINTS.T
    np.testing.assert_allclose(evaluate_numpy(parse("g1-(g2-(g3-g4))"), POINTS, 0), g[0] - (g[1] - (g[2] - g[3])), rtol=1e-6)


def test_stack_bound_and_program_limits():
    assert [min_nodes_for_stack_depth(h) for h in range(1, 11)] == [1, 3, 4, 9, 13, 27, 40, 81, 121, 243]
    assert STACK_SIZE == 9 and MAX_PROGRAM_LENGTH == 128
    # a tree built to need 9 slots (121 nodes): nested ternary clips over 4-node cores
    def need(h):
        if h == 1:
            return Prim(0, "g1")
        if h == 2:
            return Binary("+", Prim(0, "g1"), Prim(1, "g2"))
        if h == 3:
            return Call("clip", (Prim(0, "g1"), Prim(1, "g2"), Prim(2, "g3")))
        if min_nodes_for_stack_depth(h) == 2 * min_nodes_for_stack_depth(h - 1) + 1:
            return Binary("*", need(h - 1), need(h - 1))
        return Call("clip", (need(h - 2), need(h - 2), need(h - 2)))

    deepest = need(9)
    program = compile_expr(deepest)
    assert stack_need(deepest) == 9 == max_stack_depth(program)
    np.testing.assert_allclose(np.asarray(_jit_evaluate(program, POINTS, 0.0)), evaluate_numpy(deepest, POINTS, 0.0), rtol=1e-5)
    chain = parse("g1" + "+g2" * 63)
    assert max_stack_depth(compile_expr(chain)) == 2
    with pytest.raises(ProgramError, match="max_length"):
        compile_expr(chain, max_length=16)
    with pytest.raises(ProgramError, match="unknown primitive g5"):
        compile_expr(parse("g1+g5"), num_primitives=4)
    with pytest.raises(ProgramError, match="stack slots"):
        compile_expr(Binary("+", deepest, deepest), max_length=256)  # needs 10 (built by hand)


@settings(max_examples=200, deadline=None)
@given(exprs(NUM_PRIMS, max_leaves=40))
def test_stack_need_never_exceeds_the_bound(expr):
    program = compile_expr(expr)
    assert max_stack_depth(program) == stack_need(expr) <= STACK_SIZE
    assert int(program.size) == node_count(expr)


def test_evaluate_numpy_accepts_programs_and_checks_columns():
    program = compile_expr(parse("g1+g3"))
    np.testing.assert_allclose(evaluate_numpy(program, POINTS, 0.0), POINTS[:, 0] + POINTS[:, 2], rtol=1e-6)
    with pytest.raises(ProgramError, match="g3 but prims has 2 columns"):
        evaluate_numpy(program, POINTS[:, :2], 0.0)


def test_threaded_batch_refuses_an_unstacked_program():
    # its values: test_batch_paths_agree_on_uneven_batches_with_empty_programs
    with pytest.raises(ValueError, match="stacked"):
        evaluate_batch_threaded(compile_expr(parse("g1")), POINTS, 0.3)


def test_power_constant_exponent_paths_keep_the_rules():
    # constant exponents 2, 3, 0.5 take the multiply / sqrt path; a per-row exponent the general one
    g1 = np.array([-2.0, -0.0, 0.0, 0.25, 3.0, 1e20, -1.5, 7.0], np.float32)
    g2 = np.array([2.0, 0.5, -1.0, 0.5, 3.0, 2.0, 0.5, 0.5], np.float32)
    prims = np.stack([g1, g2, g1, g1], axis=1)
    with np.errstate(all="ignore"):
        pw = np.power(g1.astype(np.float64), g2.astype(np.float64))
        cases = {
            "g1**2": g1.astype(np.float64) ** 2,
            "g1**3": g1.astype(np.float64) ** 3,
            "g1**0.5": np.where(g1 < 0, np.nan, np.sqrt(np.abs(g1.astype(np.float64)))),
            "g1**g2": np.where(((g1 < 0) & (np.floor(g2) != g2)) | ((g1 == 0) & (g2 < 0)), np.nan, pw),
        }
    for text, expected in cases.items():
        expected = np.where(np.abs(expected) > np.finfo(np.float32).max, np.nan, expected)
        # the parser wants constant exponents; a tree built by hand may have any
        expr = Binary("**", Prim(0, "g1"), Prim(1, "g2")) if text == "g1**g2" else parse(text)
        got = np.asarray(_jit_evaluate(compile_expr(expr), prims, 0.0))
        np.testing.assert_array_equal(np.isnan(got), np.isnan(expected), err_msg=text)
        np.testing.assert_allclose(got, expected, rtol=3e-7, equal_nan=True, err_msg=text)
    root = np.asarray(_jit_evaluate(compile_expr(parse("g1**0.5")), prims, 0.0))
    assert not np.signbit(root[1])  # (-0.0) ** 0.5 is +0.0, as pow gives


# ----------------------------------------------------------------------------- micro-ops


@pytest.mark.parametrize(
    "text, steps",
    [
        ("g1", 1),
        ("u", 1),
        ("g1+g2", 1),  # both leaves are read in place
        ("-(-abs(-g1))", 1),  # NEG / ABS fold into the step that computes their operand
        ("abs(g1-g2)*-g3", 3),  # -g3 is a lone leaf (a COPY), then SUB (with its abs), then MUL
        ("clip(g1, 0, 1)", 1),
        ("g1*(g2+g3)", 2),
        ("g1-(g2-(g3-g4))", 3),
        ("max(g1, g2)/(g3+1)", 3),
    ],
)
@pytest.mark.slow
def test_micro_ops_read_leaves_in_place_and_absorb_unary_operators(text, steps):
    program = compile_expr(parse(text))
    assert int(_decode(program.ops, program.args, program.size, NUM_PRIMS, 0.5)[-1]) == steps
    got = np.asarray(_jit_evaluate(program, POINTS, 0.5))
    np.testing.assert_allclose(got, evaluate_numpy(parse(text), POINTS, 0.5), rtol=1e-6, atol=1e-7, equal_nan=True)


def _with_nops(program, positions):
    """The program with a NOP inserted before each instruction index in `positions` (host arrays)."""
    size = int(program.size)
    ops, args = [], []
    for i in range(size + 1):
        ops.extend([NOP] * positions.count(i))
        args.extend([0.0] * positions.count(i))
        if i < size:
            ops.append(int(program.ops[i]))
            args.append(float(program.args[i]))
    length = max(len(ops), program.length)
    pad = length - len(ops)
    return Program(ops=np.asarray(ops + [NOP] * pad, np.int32), args=np.asarray(args + [0.0] * pad, np.float32),
                   size=np.asarray(len(ops), np.int32))


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(exprs(NUM_PRIMS, max_leaves=12), st.lists(st.integers(0, 40), max_size=6), st.sampled_from([0.0, 0.7]))
def test_nops_anywhere_change_nothing(expr, positions, u):
    # NOPs between a leaf and its operator, or inside a chain of NEG / ABS, must not change values
    # (only rounding: a NOP before a power keeps its constant exponent from taking the
    # square / cube / square-root path in place, so it takes the general one)
    program = compile_expr(expr)
    padded = _with_nops(program, [p % (int(program.size) + 1) for p in positions])
    want = np.asarray(_jit_evaluate(program, POINTS, np.float32(u)))
    got = np.asarray(_jit_evaluate(padded, POINTS, np.float32(u)))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, equal_nan=True)
    np.testing.assert_array_equal(evaluate_numpy(padded, POINTS, u), evaluate_numpy(program, POINTS, u))


@pytest.mark.slow
def test_batch_paths_agree_on_uneven_batches_with_empty_programs():
    texts = ["g1*g2 - u", "clip(g1/(g2+1), u, 1) - abs(g4)**1.5", None, "-(g3**0.5)", "g1" + "+g2*u" * 12]
    empty = Program(ops=np.zeros(MAX_PROGRAM_LENGTH, np.int32), args=np.zeros(MAX_PROGRAM_LENGTH, np.float32),
                    size=np.asarray(0, np.int32))
    programs = [compile_expr(parse(t)) if t else empty for t in texts]
    batch = stack_programs(programs)  # K = 5, sizes up to 49; the stack is reused from one program to the next
    want = np.stack([np.asarray(_jit_evaluate(p, POINTS, 0.4)) for p in programs])
    assert not want[2].any()  # an empty program gives zeros
    for text, values in zip(texts, want):
        if text:
            np.testing.assert_allclose(values, evaluate_numpy(parse(text), POINTS, 0.4), rtol=1e-6, atol=1e-7,
                                       equal_nan=True)
    for batch_size, row_tile in ((None, None), (None, 8), (2, None), (2, 8)):
        got = np.asarray(evaluate_batch(batch, POINTS, np.float32(0.4), batch_size=batch_size, row_tile=row_tile))
        np.testing.assert_array_equal(got, want, err_msg=f"batch_size={batch_size} row_tile={row_tile}")
    # 3 threads do not divide K = 5: their chunks of 2 (the default) and of 2 end in a padded one
    for threads, chunk in ((1, None), (2, 2), (3, 1), (3, None)):
        got = evaluate_batch_threaded(batch, POINTS, 0.4, threads=threads, chunk=chunk, row_tile=8)
        assert got.shape == (len(texts), ROWS)
        np.testing.assert_array_equal(got, want, err_msg=f"threads={threads} chunk={chunk}")


@pytest.mark.slow
@pytest.mark.parametrize("u", [2.0, 3.0, 0.5, 1.5, -1.0])
def test_power_with_a_scalar_exponent_from_u_keeps_the_rules(u):
    # u as the exponent is a scalar known only at run time: 2, 3, 0.5 take the special paths
    g1 = np.array([-2.0, -0.0, 0.0, 0.25, 3.0, 1e20, -1.5, 7.0], np.float32)
    prims = np.stack([g1, g1, g1, g1], axis=1)
    expr = Binary("**", Prim(0, "g1"), Var("u"))
    got = np.asarray(_jit_evaluate(compile_expr(expr), prims, np.float32(u)))
    want = evaluate_numpy(expr, prims, u)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=3e-7, equal_nan=True)
    root = np.asarray(_jit_evaluate(compile_expr(Binary("**", Unary("neg", Prim(0, "g1")), Var("u"))), prims, 0.5))
    np.testing.assert_array_equal(np.isnan(root), g1 > 0)


def test_numpy_vm_takes_one_progress_per_row():
    expr = parse("g1*(1-u) + u*min(g2, 2*u)")
    prims = np.random.default_rng(3).uniform(0, 1, size=(16, 2)).astype(np.float32)
    progress = np.linspace(0, 1, 16, dtype=np.float32)
    rows = [evaluate_numpy(expr, prims[i:i + 1], progress[i])[0] for i in range(16)]
    np.testing.assert_array_equal(evaluate_numpy(expr, prims, progress), np.asarray(rows, np.float32))
    with pytest.raises(ValueError, match="one value per row"):
        evaluate_numpy(expr, prims, progress[:3])
