"""The reward VM at the edges: ±inf / NaN / subnormal inputs, missing primitive columns, N = 0
rows, the checks at its entry points, and the bounded cost of `canonical`."""

from __future__ import annotations

import chex
import jax
import numpy as np
import pytest
import sympy
from absl.testing import parameterized
from hypothesis import given, settings
from hypothesis import strategies as st

from derl_jax.expr import (
    Binary,
    Num,
    Prim,
    Var,
    MAX_PROGRAM_LENGTH,
    ProgramError,
    check,
    compile_expr,
    evaluate,
    evaluate_batch,
    evaluate_numpy,
    node_count,
    parse,
    stack_programs,
    to_text,
)
from derl_jax.expr.canonical import FALLBACK_PREFIX, MAX_EXPANDED_ATOMS, canonical, expanded_size, fallback_key, to_key_sympy
from derl_jax.expr import vm
from derl_jax.expr.vm import SMALLEST_NORMAL, evaluate_batch_threaded, settle
from benchmarks.bench_canonical import SLOW
from expr_strategies import commuted, exprs

NAMES = ("g1", "g2", "g3", "g4")
INF, NAN = np.inf, np.nan
SUBNORMALS = (1e-40, -1e-42, 1.4e-45)
SPECIAL = (INF, -INF, NAN, 0.0, -0.0, 1e38, -1e38, *SUBNORMALS, 1.0, -1.0, 0.5, 2.0, -3.0, 1e-7, 0.3)


def _special_rows(rows: int = 96) -> np.ndarray:
    """f32[rows, 4]: every special value in every column, then random combinations of them."""
    each = np.array([[v] * 4 for v in SPECIAL], np.float32)
    rng = np.random.default_rng(7)
    mixed = rng.choice(np.array(SPECIAL, np.float32), size=(rows - len(SPECIAL), 4))
    return np.concatenate([each, mixed]).astype(np.float32)


SPECIAL_ROWS = _special_rows()
_vm_many = jax.jit(jax.vmap(evaluate, in_axes=(0, None, None)))


def _assert_same(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, what
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=what)
    assert not np.isinf(got).any() and not np.isinf(want).any(), what
    finite = ~np.isnan(want)
    err = np.abs(got[finite].astype(np.float64) - want[finite])
    assert np.all(err <= 1e-6 * np.maximum(1.0, np.abs(want[finite]))), what


# ----------------------------------------------------------------------------- one rule


@settings(max_examples=15, deadline=None, derandomize=True)
@given(st.lists(exprs(4, max_leaves=10), min_size=8, max_size=8), st.sampled_from(SPECIAL))
def test_vm_equals_reference_on_inf_nan_zero_huge_and_subnormal_inputs(trees, u):
    programs = stack_programs([compile_expr(tree, MAX_PROGRAM_LENGTH) for tree in trees])
    got = _vm_many(programs, SPECIAL_ROWS, np.float32(u))  # one compiled function for every example
    for tree, values in zip(trees, np.asarray(got)):
        _assert_same(values, evaluate_numpy(tree, SPECIAL_ROWS, u), f"{to_text(tree)} at u={u}")


_G1, _U = Prim(0, "g1"), Var("u")
LEAF_CASES = (  # (expression over g1, g2 as text or tree; prims row; u; value under the rule)
    ("1/g1", [INF, 1], 0.5, NAN),
    ("1/g1", [-INF, 1], 0.5, NAN),
    ("min(g1, g2)", [-INF, 1], 0.5, NAN),
    ("max(g1, g2)", [INF, 1], 0.5, NAN),
    ("clip(g1, 0, 1)", [INF, 1], 0.5, NAN),
    ("g1**0", [INF, 1], 0.5, NAN),
    ("g1**-0.5", [INF, 1], 0.5, NAN),
    ("g1**-0.5", [1e-40, 1], 0.5, NAN),  # a subnormal is 0, and 0 ** -0.5 is NaN
    ("g1*1e30 + g2", [1e-40, 1], 0.5, 1.0),
    ("(g1*g2)**-0.5", [1e-20, 1e-20], 0.5, NAN),  # a subnormal product is 0 too
    ("g1 + g2", [3e38, 3e38], 0.5, NAN),  # overflow
    ("g1 - g2", [3e38, 3e38], 0.5, 0.0),
    ("g1 * 2", [1.5, NAN], 0.5, 3.0),  # an unused NaN column changes nothing
    ("g1**0.5 + g2**3", [4.0, -2.0], 0.5, -6.0),
    ("g1 + u", [1, 1], INF, NAN),
    ("g1 + 0*u", [1, 1], NAN, NAN),
    # constants beyond float32 cannot be parsed, only built
    (Binary("+", _G1, Num(1e39)), [1, 1], 0.5, NAN),
    (Binary("+", _G1, Binary("*", Num(1e-39), Num(1e39))), [1, 1], 0.5, NAN),  # 0 * inf: both settled first
    (Binary("+", _G1, Binary("*", Num(1e-39), _U)), [1, 1], 0.5, 1.0),
)


class LeafRuleTest(chex.TestCase):
    """Operators that read a primitive leaf in place see the settled value (VM and reference)."""

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(
        ("div", vm.div, [INF, -INF, 1.0, 6.0], [1.0, 2.0, 1e-7, 3.0], [INF, -INF, NAN, 2.0]),
        ("power", vm.power, [-8.0, 0.0, INF, 4.0], [1 / 3, -1.0, 0.0, 0.5], [NAN, NAN, 1.0, 2.0]),
        ("minimum", vm.minimum, [NAN, -INF, 1.0, 2.0], [1.0, 1.0, NAN, 3.0], [NAN, -INF, NAN, 2.0]),
        ("maximum", vm.maximum, [NAN, -INF, 1.0, 2.0], [1.0, 1.0, NAN, 3.0], [NAN, 1.0, NAN, 3.0]),
    )
    def test_rule_functions_before_settling(self, fn, a, b, want):
        # the operators themselves are plain; `settle` (applied to their inputs and results)
        # is what turns the ±inf above into NaN
        got = self.variant(fn)(np.array(a, np.float32), np.array(b, np.float32))
        np.testing.assert_allclose(np.asarray(got), np.array(want, np.float32), rtol=1e-6)
        np.testing.assert_allclose(fn(np.array(a, np.float32), np.array(b, np.float32), xp=np), want, rtol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_settle(self):
        x = np.array([INF, -INF, NAN, *SUBNORMALS, SMALLEST_NORMAL, -2.0, 3e38], np.float32)
        want = np.array([NAN, NAN, NAN, 0.0, 0.0, 0.0, SMALLEST_NORMAL, -2.0, 3e38], np.float32)
        np.testing.assert_array_equal(np.asarray(self.variant(settle)(x)), want)
        np.testing.assert_array_equal(settle(x, xp=np), want)

    # compiled only: run op by op under vmap it compiles hundreds of small programs, and the VM
    # run op by op is test_expr_vm's test_jit_equals_eager
    @chex.variants(with_jit=True)
    @pytest.mark.slow
    def test_leaf_values_follow_the_rule(self):
        trees = [parse(e, NAMES[:2]) if isinstance(e, str) else e for e, _, _, _ in LEAF_CASES]
        with np.errstate(over="ignore"):  # 1e39 becomes inf when compiled to float32
            programs = [compile_expr(tree) for tree in trees]
        prims = np.array([[row] for _, row, _, _ in LEAF_CASES], np.float32)  # [C, 1, 2]
        progress = np.array([u for _, _, u, _ in LEAF_CASES], np.float32)
        got = self.variant(jax.vmap(evaluate))(stack_programs(programs), prims, progress)
        for tree, program, values, case_prims, u, (_, _, _, expected) in zip(
                trees, programs, np.asarray(got), prims, progress, LEAF_CASES):
            want = evaluate_numpy(program, case_prims, u)
            _assert_same(values, want, to_text(tree))
            np.testing.assert_allclose(want[0], expected, rtol=1e-6, err_msg=to_text(tree))

    @chex.variants(without_jit=True)
    def test_missing_primitive_column_raises(self):
        program = compile_expr(parse("g1 + g4", NAMES))
        prims = np.ones((5, 2), np.float32)
        with pytest.raises(ProgramError, match="g4 but prims has 2 columns"):
            self.variant(evaluate)(program, prims, np.float32(0.0))

    @chex.variants(with_jit=True)
    def test_missing_primitive_column_is_nan_inside_a_trace(self):
        program = compile_expr(parse("g1 + g4", NAMES))
        prims = np.arange(10, dtype=np.float32).reshape(5, 2)
        got = np.asarray(self.variant(evaluate)(program, prims, np.float32(0.0)))
        assert got.shape == (5,) and np.isnan(got).all()  # never the last column (which gives finite values)

    @chex.variants(with_jit=True, without_jit=True)
    def test_wrong_shapes_fail_at_the_boundary(self):
        program = compile_expr(parse("g1", NAMES))
        with pytest.raises(AssertionError, match="rank"):
            self.variant(evaluate)(program, np.ones(4, np.float32), np.float32(0.0))
        with pytest.raises(AssertionError, match="rank"):
            self.variant(evaluate)(program, np.ones((4, 1), np.float32), np.ones(2, np.float32))
        with pytest.raises(AssertionError):
            self.variant(evaluate)(program.replace(ops=program.ops.astype(np.float32)), np.ones((4, 1), np.float32),
                                   np.float32(0.0))
        stacked = stack_programs([program, program])
        with pytest.raises(AssertionError, match="rank"):
            evaluate_batch(program, np.ones((4, 1), np.float32), 0.0)
        with pytest.raises(AssertionError, match="rank"):
            evaluate_batch(stacked, np.ones(4, np.float32), 0.0)


def test_missing_primitive_column_raises_in_every_evaluator():
    program = compile_expr(parse("g1 + g4", NAMES))
    stacked = stack_programs([compile_expr(parse("g2", NAMES)), program])
    prims = np.ones((4, 2), np.float32)
    calls = {
        "evaluate_numpy": lambda: evaluate_numpy(program, prims, 0.0),
        "evaluate_batch": lambda: evaluate_batch(stacked, prims, 0.0),
        "evaluate_batch_threaded": lambda: evaluate_batch_threaded(stacked, prims, 0.0),
    }
    for where, call in calls.items():
        with pytest.raises(ProgramError, match=f"{where}: program reads primitive g4 but prims has 2 columns"):
            call()
    with pytest.raises(ProgramError, match="program 1 reads primitive g4: only g1..g2 exist"):
        stack_programs([compile_expr(parse("g2", NAMES)), program], num_primitives=2)
    with pytest.raises(ProgramError, match="unknown primitive g4"):
        compile_expr(parse("g1 + g4", NAMES), num_primitives=2)
    assert stack_programs([program], num_primitives=4).ops.shape == (1, MAX_PROGRAM_LENGTH)


def test_zero_rows_give_empty_results_everywhere():
    program = compile_expr(parse("g1 / g2 + u", NAMES[:2]))
    stacked = stack_programs([program, program, program])
    empty = np.zeros((0, 2), np.float32)
    results = {
        "evaluate": (evaluate(program, empty, 0.5), (0,)),
        "jit(evaluate)": (jax.jit(evaluate)(program, empty, 0.5), (0,)),
        "evaluate_numpy": (evaluate_numpy(program, empty, 0.5), (0,)),
        "evaluate_batch": (evaluate_batch(stacked, empty, 0.5), (3, 0)),
        "evaluate_batch(batch_size=2)": (evaluate_batch(stacked, empty, 0.5, batch_size=2), (3, 0)),
        "evaluate_batch_threaded": (evaluate_batch_threaded(stacked, empty, 0.5), (3, 0)),
    }
    for where, (values, shape) in results.items():
        assert np.asarray(values).shape == shape and np.asarray(values).dtype == np.float32, where


# ----------------------------------------------------------------------------- canonical cost

def test_canonical_of_a_slow_legal_expression_is_bounded():
    """`SLOW` (benchmarks/bench_canonical.py), a legal 78-node reward SymPy would expand for seconds."""
    tree = parse(SLOW, NAMES)
    assert node_count(tree) == 78 and check(tree, 4).ok
    assert expanded_size(tree) > MAX_EXPANDED_ATOMS
    canonical.cache_clear()
    key = canonical(tree)   # the size bound decides before SymPy runs (its CPU time: benchmarks/bench_canonical.py)
    assert key == fallback_key(tree) and key.startswith(FALLBACK_PREFIX)
    # the fallback still gives reordered operands one key, as canonical promises
    assert canonical(commuted(tree)) == key
    swapped = parse(SLOW.replace("min(g1, g2)*max(g3, u)", "max(u, g3)*min(g2, g1)"), NAMES)
    assert canonical(swapped) == key
    assert canonical(parse(SLOW.replace("abs(g3)", "abs(g2)"), NAMES)) != key


@pytest.mark.parametrize(
    "text, expanded",
    [
        ("(g1+g2+g3+g4+u+1)**3 + g1/g2", True),  # 56 terms of 3 factors
        ("(g1+g2)**2*(g3+g4)**2 - min(g1, g2)", True),
        ("((g1+g2+g3)/(g4+u+1))**2", True),
        ("(g1+g2+g3+g4+u+1)**2.5", True),  # sqrt(S) times the 21 terms of S**2
        ("(g1+g2+g3+g4+u+1)**4.5", False),  # sqrt(S) times the 126 terms of S**4
        ("((g1+g2+g3+g4+1)**-1)**8", False),  # the reciprocal's power is expanded too
        ("(g1+g2+g3+g4+u)**16*(g1-g2)**9", False),
    ],
)
def test_expanded_size_decides_before_sympy_runs(text, expanded):
    tree = parse(text, NAMES)
    key = canonical(tree)
    assert (expanded_size(tree) <= MAX_EXPANDED_ATOMS) == expanded
    assert key.startswith(FALLBACK_PREFIX) != expanded


@settings(max_examples=60, deadline=None, derandomize=True)
@given(exprs(4, max_leaves=24, nice_only=True))
def test_the_size_estimate_bounds_what_sympy_expands(tree):
    """SymPy's cost grows with the size of its expansion, so the estimate that decides whether it
    runs must not undercount: on random rewards under the bound, the expanded key has at most 3
    nodes per estimated atom (at most 2.25 measured over 1,000 of them; the CPU time it buys:
    benchmarks/bench_canonical.py); over the bound the key is the tree's own ordering."""
    canonical.cache_clear()
    key, size = canonical(tree), expanded_size(tree)
    assert key.startswith(FALLBACK_PREFIX) == (size > MAX_EXPANDED_ATOMS), to_text(tree)
    if size <= MAX_EXPANDED_ATOMS:
        expanded = sympy.expand(to_key_sympy(tree))
        assert sum(1 for _ in sympy.preorder_traversal(expanded)) <= 3 * max(size, 8), to_text(tree)
