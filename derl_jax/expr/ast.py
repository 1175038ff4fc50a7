"""Expression trees for reward formulas.

An `Expr` is an immutable tree. Leaves are numbers (`Num`), the training-progress variable
`u` (`Var`) and primitives (`Prim`, referenced by their 0-based index in the domain's
primitive list). Inner nodes are unary minus (`Unary`), binary arithmetic (`Binary`) and the
functions `min`, `max`, `abs`, `clip` (`Call`).

Trees are hashable and compare structurally, so they can key dictionaries and sets.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Union

BINARY_OPS = ("+", "-", "*", "/", "**")
UNARY_OPS = ("neg",)
FUNCTIONS = {"min": 2, "max": 2, "abs": 1, "clip": 3}
PROGRESS_VAR = "u"


@dataclasses.dataclass(frozen=True)
class Num:
    """A numeric constant."""

    value: float


@dataclasses.dataclass(frozen=True)
class Var:
    """A free variable; only `u` (fraction of inner-loop training done, in [0, 1])."""

    name: str = PROGRESS_VAR


@dataclasses.dataclass(frozen=True)
class Prim:
    """Primitive number `index` (0-based) of the domain; `name` is its canonical name (`g1`...)."""

    index: int
    name: str


@dataclasses.dataclass(frozen=True)
class Unary:
    """`op` is "neg"."""

    op: str
    operand: "Expr"


@dataclasses.dataclass(frozen=True)
class Binary:
    """`op` is one of `BINARY_OPS`; for "**" the right operand is a constant expression."""

    op: str
    left: "Expr"
    right: "Expr"


@dataclasses.dataclass(frozen=True)
class Call:
    """`fn` is one of `FUNCTIONS` with exactly `FUNCTIONS[fn]` arguments."""

    fn: str
    args: tuple["Expr", ...]


Expr = Union[Num, Var, Prim, Unary, Binary, Call]


def children(expr: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of `expr`, left to right."""
    if isinstance(expr, Unary):
        return (expr.operand,)
    if isinstance(expr, Binary):
        return (expr.left, expr.right)
    if isinstance(expr, Call):
        return expr.args
    return ()


def walk(expr: Expr) -> Iterator[Expr]:
    """All nodes of `expr` in pre-order."""
    yield expr
    for child in children(expr):
        yield from walk(child)


def node_count(expr: Expr) -> int:
    return sum(1 for _ in walk(expr))


def depth(expr: Expr) -> int:
    """Number of nodes on the longest root-to-leaf path (a leaf has depth 1)."""
    return 1 + max((depth(c) for c in children(expr)), default=0)


def primitive_indices(expr: Expr) -> frozenset[int]:
    return frozenset(node.index for node in walk(expr) if isinstance(node, Prim))
