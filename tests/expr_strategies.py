"""Hypothesis strategies for reward-expression trees, shared by the expression tests."""

from __future__ import annotations

from hypothesis import strategies as st

from derl_jax.expr.ast import Binary, Call, Num, Prim, Unary, Var, node_count

NICE_CONSTANTS = (0.0, 1.0, 2.0, 3.0, 0.5, 0.25, 0.1, 0.2, 1.5, 10.0, 0.001, 1e-7, 100.0)


def constants(nice_only: bool = False):
    nice = st.sampled_from(NICE_CONSTANTS)
    if nice_only:
        return nice
    return st.one_of(nice, st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False))


def exponents():
    """Constant exponent sub-trees: integers, halves, and the odd negative or nested one."""
    base = st.sampled_from((0.0, 1.0, 2.0, 3.0, 0.5, 1.5)).map(Num)
    return st.one_of(base, base.map(lambda n: Unary("neg", n)), st.builds(lambda a, b: Binary("+", a, b), base, base))


def exprs(num_primitives: int = 4, *, max_leaves: int = 12, nice_only: bool = False):
    """Random `Expr` trees over g1..g{num_primitives}, u and constants (parser-producible)."""
    leaves = st.one_of(
        constants(nice_only).map(Num),
        st.just(Var("u")),
        st.integers(0, num_primitives - 1).map(lambda i: Prim(i, f"g{i + 1}")),
    )

    def extend(children):
        return st.one_of(
            st.builds(Unary, st.just("neg"), children),
            st.builds(Binary, st.sampled_from(["+", "-", "*", "/"]), children, children),
            st.builds(lambda base, exp: Binary("**", base, exp), children, exponents()),
            st.builds(lambda f, a, b: Call(f, (a, b)), st.sampled_from(["min", "max"]), children, children),
            st.builds(lambda a: Call("abs", (a,)), children),
            st.builds(lambda a, b, c: Call("clip", (a, b, c)), children, children, children),
        )

    return st.recursive(leaves, extend, max_leaves=max_leaves).filter(lambda e: node_count(e) <= 128)


def commuted(expr):
    """Swap the operands of every commutative operator."""
    if isinstance(expr, Binary):
        left, right = commuted(expr.left), commuted(expr.right)
        return Binary(expr.op, right, left) if expr.op in "+*" else Binary(expr.op, left, right)
    if isinstance(expr, Unary):
        return Unary(expr.op, commuted(expr.operand))
    if isinstance(expr, Call):
        args = tuple(commuted(a) for a in expr.args)
        return Call(expr.fn, args[::-1] if expr.fn in ("min", "max") else args)
    return expr
