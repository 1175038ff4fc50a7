"""Canonical keys, SymPy conversion and LaTeX for reward expressions.

* `to_sympy(expr)`: primitives become real SymPy symbols `g1..gk`, `u` a real symbol;
  min/max/abs as `Min`/`Max`/`Abs` and clip(a, lo, hi) = Min(Max(a, lo), hi). By default each
  constant is rounded to `SIGNIFICANT_DIGITS` (6) significant digits and made an exact
  `Rational` (0.5 -> 1/2), so arithmetic on constants is exact; `rational=False` keeps Floats
  (what `sympy.lambdify` wants).
* `canonical(expr) -> str`: a deterministic key for "the same reward": the SymPy string of the
  expanded expression with constants rounded to 6 significant digits and made exact
  rationals, so `g1+0.5*g2`, `0.5*g2 + g1` and `g2/2+g1` share the key `g1 + g2/2` and
  `(g1+g2)*2` / `2*g1+2*g2` share `2*g1 + 2*g2`, while `g1+g2` and `g1-g2` differ. For speed
  the key form treats min/max/abs/clip as opaque functions of their expanded arguments
  (min/max arguments sorted, abs(-x) written abs(x)) instead of SymPy's Min/Max/Abs, whose
  assumption queries are slow. Before calling SymPy, an estimate of the size of the expanded
  form computed from the tree (`expanded_size`, in atoms) decides whether expansion is
  affordable: above `MAX_EXPANDED_ATOMS` (400; SymPy then takes at most about 0.2 s), or when
  SymPy fails, the key falls back to a deterministic ordering of the tree itself
  (`fallback_key`, prefixed with "~"): sums and products are flattened and their operands
  sorted, min/max arguments sorted, so reordered operands still share a key. The decision
  depends on the tree only, never on the clock, so a key never changes between runs or
  machines. Results are cached (`lru_cache` on the tree).
  Typical cost: about 1-3 ms for a 16-node expression on a laptop-class CPU core.
* `to_latex(expr)`: LaTeX of the tree as written (for reports), minimal parentheses.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Callable

import numpy as np
import sympy

from derl_jax.expr.ast import Binary, Call, Expr, Num, Prim, Unary, Var
from derl_jax.expr.parse import format_number, parenthesized, to_text
from derl_jax.expr.vm import evaluate_numpy

SIGNIFICANT_DIGITS = 6
MAX_EXPANDED_ATOMS = 400  # estimated size of the expanded key form (`expanded_size`)
MAX_INTEGER_EXPONENT = 16  # powers of non-constant bases beyond this are not expanded
FALLBACK_PREFIX = "~"


@functools.lru_cache(maxsize=None)
def _symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, real=True)


def _constant(value: float, rational: bool):
    if not rational:
        return sympy.Float(value)
    if not math.isfinite(value):
        return sympy.nan
    if float(value).is_integer() and abs(value) < 1e15:
        return sympy.Integer(int(value))
    return sympy.Rational(f"{value:.{SIGNIFICANT_DIGITS}g}")


_ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def _binary_sympy(op: str, left: sympy.Expr, right: sympy.Expr) -> sympy.Expr:
    """`left op right` in SymPy; a power of two numbers too large to evaluate exactly is a float power."""
    if op in _ARITHMETIC:
        return _ARITHMETIC[op](left, right)
    if right.is_number and left.is_number and _huge_power(left, right):
        return sympy.Pow(sympy.Float(left), sympy.Float(right))
    return sympy.Pow(left, right)


def _translate(expr: Expr, constant: Callable[[float], sympy.Expr], symbol: Callable[[str], sympy.Symbol],
               call: Callable[[Call, list], sympy.Expr]) -> sympy.Expr:
    """`expr` in SymPy: `constant(value)` for constants, `symbol(name)` for variables and
    primitives (g1, g2, ...), SymPy arithmetic for operators, `call(node, translated args)` for calls."""
    def walk(node: Expr) -> sympy.Expr:
        if isinstance(node, Num):
            return constant(float(node.value))
        if isinstance(node, Var):
            return symbol(node.name)
        if isinstance(node, Prim):
            return symbol(f"g{node.index + 1}")
        if isinstance(node, Unary):
            return -walk(node.operand)
        if isinstance(node, Binary):
            return _binary_sympy(node.op, walk(node.left), walk(node.right))
        if isinstance(node, Call):
            return call(node, [walk(a) for a in node.args])
        raise TypeError(f"not an expression node: {node!r}")
    return walk(expr)


def _sympy_call(node: Call, args: list) -> sympy.Expr:
    if node.fn == "min":
        return sympy.Min(*args)
    if node.fn == "max":
        return sympy.Max(*args)
    if node.fn == "abs":
        return sympy.Abs(args[0])
    if node.fn == "clip":
        return sympy.Min(sympy.Max(args[0], args[1]), args[2])
    raise TypeError(f"not an expression node: {node!r}")


def to_sympy(expr: Expr, rational: bool = True) -> sympy.Expr:
    """SymPy expression of `expr` (see the module docstring)."""
    return _translate(expr, lambda value: _constant(value, rational), _symbol, _sympy_call)


def _huge_power(base, exponent) -> bool:
    """Exact power of two constants that SymPy would expand into a giant integer/rational."""
    try:
        return abs(float(exponent)) > 64 or (abs(float(exponent)) > 8 and abs(float(base)) > 1e6)
    except (TypeError, ValueError):
        return True


# ----------------------------------------------------------------------------- canonical


def expanded_size(expr: Expr) -> float:
    """Estimated atoms of `sympy.expand` of the key form of `expr` (`inf`: far too big).

    SymPy's expansion time grows with its output, so this size, computed from the tree alone
    in microseconds, decides whether a key is worth expanding (`MAX_EXPANDED_ATOMS`).
    """
    terms, atoms, denominator = _expansion(expr)
    return terms * (atoms + denominator)


def _expansion(expr: Expr) -> tuple[float, float, float]:
    """(terms of the expanded sum, atoms per term, atoms of each term's expanded denominator).

    Follows what `sympy.expand` does: products and integer powers of sums are multiplied out,
    a non-integer power x**c keeps x**(c - floor(c)) as one factor and expands x**floor(c),
    denominators of a product are multiplied (and expanded) together, and each call's
    arguments are expanded on their own (the call is one atom of the size of its arguments).
    """
    if isinstance(expr, (Num, Var, Prim)):
        return 1.0, 1.0, 0.0
    if isinstance(expr, Unary):
        return _expansion(expr.operand)
    if isinstance(expr, Call):
        return 1.0, 1.0 + sum(expanded_size(arg) for arg in expr.args), 0.0
    assert isinstance(expr, Binary)
    if expr.op == "**":
        if not _has_symbols(expr.left):
            return 1.0, 1.0, 0.0
        exponent = _constant_value(expr.right)
        if exponent is None or not math.isfinite(exponent) or abs(exponent) > MAX_INTEGER_EXPONENT:
            return math.inf, math.inf, math.inf
        power = _power(_expansion(expr.left), int(abs(exponent)), not float(exponent).is_integer())
        return power if exponent >= 0 else _reciprocal(power)
    left, right = _expansion(expr.left), _expansion(expr.right)
    if expr.op in "+-":
        return left[0] + right[0], max(left[1], right[1]), max(left[2], right[2])
    return _product(left, _reciprocal(right) if expr.op == "/" else right)


def _reciprocal(x: tuple[float, float, float]) -> tuple[float, float, float]:
    terms, atoms, denominator = x
    return 1.0, 1.0 + denominator, terms * (atoms + denominator)


def _product(x: tuple[float, float, float], y: tuple[float, float, float]) -> tuple[float, float, float]:
    denominator = x[2] * y[2] if x[2] and y[2] else max(x[2], y[2])
    return x[0] * y[0], x[1] + y[1], denominator


def _power(x: tuple[float, float, float], k: int, root: bool) -> tuple[float, float, float]:
    """x ** k (times the root factor x ** (c - k) when `root`): multinomial terms C(t + k - 1, k)."""
    terms, atoms, denominator = x
    count = (float(math.comb(int(terms) + k - 1, k)) if terms < 1e4 else math.inf) if k else 1.0
    root_atoms = terms * (atoms + denominator) if root else 0.0
    denominator = denominator**k if denominator and k else 0.0
    return count, k * atoms + root_atoms, denominator


def _has_symbols(expr: Expr) -> bool:
    if isinstance(expr, (Prim, Var)):
        return True
    if isinstance(expr, Num):
        return False
    if isinstance(expr, Unary):
        return _has_symbols(expr.operand)
    if isinstance(expr, Binary):
        return _has_symbols(expr.left) or _has_symbols(expr.right)
    return any(_has_symbols(a) for a in expr.args)


def _constant_value(expr: Expr) -> float | None:
    """Float value of a constant sub-tree (an exponent), None if it has symbols."""
    if _has_symbols(expr):
        return None
    try:
        return float(evaluate_numpy(expr, np.zeros((1, 1), np.float32), 0.0)[0])
    except Exception:  # noqa: BLE001 - a malformed constant just means "don't expand"
        return None


def fallback_key(expr: Expr) -> str:
    """Deterministic key from the tree: flattened sums/products with sorted operands."""
    return FALLBACK_PREFIX + _ordered(expr)


def _ordered(expr: Expr) -> str:
    if isinstance(expr, Binary) and expr.op in "+-":
        terms: list[str] = []
        _collect_sum(expr, +1, terms)
        return "(" + " ".join(sorted(terms)) + ")"
    if isinstance(expr, Binary) and expr.op == "*":
        factors: list[str] = []
        _collect_product(expr, factors)
        return "(" + "*".join(sorted(factors)) + ")"
    if isinstance(expr, Binary):
        return f"({_ordered(expr.left)}{expr.op}{_ordered(expr.right)})"
    if isinstance(expr, Unary):
        return f"(-{_ordered(expr.operand)})"
    if isinstance(expr, Call):
        args = [_ordered(a) for a in expr.args]
        if expr.fn in ("min", "max"):
            args.sort()
        return f"{expr.fn}(" + ",".join(args) + ")"
    if isinstance(expr, Num):
        return format(float(expr.value), f".{SIGNIFICANT_DIGITS}g")
    return to_text(expr)


def _collect_sum(expr: Expr, sign: int, out: list[str]) -> None:
    if isinstance(expr, Binary) and expr.op in "+-":
        _collect_sum(expr.left, sign, out)
        _collect_sum(expr.right, sign if expr.op == "+" else -sign, out)
    elif isinstance(expr, Unary):
        _collect_sum(expr.operand, -sign, out)
    else:
        out.append(("+" if sign > 0 else "-") + _ordered(expr))


def _collect_product(expr: Expr, out: list[str]) -> None:
    if isinstance(expr, Binary) and expr.op == "*":
        _collect_product(expr.left, out)
        _collect_product(expr.right, out)
    else:
        out.append(_ordered(expr))


_KEY_FUNCTIONS = {name: sympy.Function(name) for name in ("min", "max", "abs", "clip")}


@functools.lru_cache(maxsize=None)
def _plain_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name)


def to_key_sympy(expr: Expr) -> sympy.Expr:
    """SymPy form for keys: rounded rational constants, plain symbols, and min/max/abs/clip as
    opaque functions of expanded arguments (min/max arguments sorted, abs(-x) -> abs(x)).

    Opaque functions keep SymPy's assumption machinery (slow for Min/Max/Abs) out of the
    key computation; only arithmetic is normalised.
    """
    return _translate(expr, lambda value: _constant(value, True), _plain_symbol, _key_call)


def _key_call(node: Call, args: list) -> sympy.Expr:
    """min/max/abs/clip as opaque functions of expanded arguments (see `to_key_sympy`)."""
    args = [sympy.expand(a) for a in args]
    if node.fn in ("min", "max"):
        args.sort(key=sympy.default_sort_key)
    elif node.fn == "abs" and args[0].could_extract_minus_sign():
        args[0] = -args[0]
    return _KEY_FUNCTIONS[node.fn](*args)


@functools.lru_cache(maxsize=1 << 16)
def canonical(expr: Expr) -> str:
    """Deterministic key: equal for expressions that are the same reward (module docstring)."""
    if expanded_size(expr) > MAX_EXPANDED_ATOMS:
        return fallback_key(expr)
    try:
        return str(sympy.expand(to_key_sympy(expr)))
    except Exception:  # noqa: BLE001 - SymPy failures must not break the search
        return fallback_key(expr)


# ----------------------------------------------------------------------------- LaTeX

_SUM, _PRODUCT, _SIGNED, _POWER, _ATOM = 1, 2, 3, 4, 5


def _latex(expr: Expr) -> tuple[str, int]:
    if isinstance(expr, Num):
        text = format_number(abs(expr.value))
        if "e" in text:
            mantissa, exp = text.split("e")
            text = f"{mantissa} \\cdot 10^{{{int(exp)}}}"
        return (f"\\left(-{text}\\right)", _ATOM) if expr.value < 0 else (text, _ATOM)
    if isinstance(expr, Var):
        return expr.name, _ATOM
    if isinstance(expr, Prim):
        return f"g_{{{expr.index + 1}}}", _ATOM
    if isinstance(expr, Unary):
        return "-" + _latex_wrap(expr.operand, _SIGNED), _SIGNED
    if isinstance(expr, Call):
        args = [_latex(a)[0] for a in expr.args]
        if expr.fn == "abs":
            return f"\\left|{args[0]}\\right|", _ATOM
        name = {"min": "\\min", "max": "\\max", "clip": "\\operatorname{clip}"}[expr.fn]
        return f"{name}\\left({', '.join(args)}\\right)", _ATOM
    if isinstance(expr, Binary):
        if expr.op in "+-":
            return f"{_latex_wrap(expr.left, _SUM)} {expr.op} {_latex_wrap(expr.right, _PRODUCT)}", _SUM
        if expr.op == "*":
            return f"{_latex_wrap(expr.left, _PRODUCT)} \\cdot {_latex_wrap(expr.right, _SIGNED)}", _PRODUCT
        if expr.op == "/":
            return f"\\frac{{{_latex(expr.left)[0]}}}{{{_latex(expr.right)[0]}}}", _ATOM
        if expr.op == "**":
            base = _latex_wrap(expr.left, _ATOM)
            if isinstance(expr.left, Binary) and expr.left.op == "/":
                base = f"\\left({base}\\right)"
            return f"{base}^{{{_latex(expr.right)[0]}}}", _POWER
    raise TypeError(f"not an expression node: {expr!r}")


def _latex_wrap(expr: Expr, minimum: int) -> str:
    return parenthesized(_latex(expr), minimum, "\\left(", "\\right)")


def to_latex(expr: Expr) -> str:
    """LaTeX of `expr` as written: `g1/(g2+1)` -> `\\frac{g_{1}}{g_{2} + 1}`."""
    return _latex(expr)[0]
