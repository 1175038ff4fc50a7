"""`Expr` -> `Program`: a fixed-size postfix instruction array that the VM (`vm.py`) runs.

A `Program` holds `ops: int32[L]` (opcodes below), `args: float32[L]` (operand of each
instruction) and `size: int32[]` (how many leading instructions are real; the rest are
`NOP`). Programs of the same length stack along a leading axis K (`stack_programs`), which is
what `jax.vmap` / the `cand` mesh axis runs over: different expressions are data, so one
compiled function evaluates any of them.

Opcodes and the meaning of `args`:

    NOP         padding; does nothing                                  (arity 0, pushes 0)
    PUSH_CONST  push the constant `arg`                                 (arity 0, pushes 1)
    PUSH_PRIM   push primitive column `int(arg)` (0-based)              (arity 0, pushes 1)
    PUSH_U      push the training-progress value u                     (arity 0, pushes 1)
    NEG, ABS    replace the top x by -x, |x|                            (arity 1)
    ADD, SUB, MUL, DIV, POW, MIN, MAX                                  (arity 2)
    CLIP        clip(x, lo, hi) = min(max(x, lo), hi)                   (arity 3)

For the operators of arity >= 2, `arg` says in which order the operands were pushed, so the
compiler may evaluate the operand that needs the deeper stack first (Sethi-Ullman order),
which keeps every program within `STACK_SIZE` slots: for a binary operator, arg 0 means the
left operand was pushed first (the right one is on top), arg 1 the reverse; for CLIP, arg is
the index in `CLIP_ORDERS` of the push order of (x, lo, hi). With that ordering the deepest
stack any tree of at most 128 nodes needs is 9 (`min_nodes_for_stack_depth` proves it), so
`STACK_SIZE = 9`; `compile_expr` rejects anything deeper. Among operands that need the same
depth, leaves are pushed last: the VM reads leaves pushed right before their operator in
place, without a step of their own.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import jax.numpy as jnp
import numpy as np
from flax import struct

from derl_jax.expr.ast import Binary, Call, Expr, Num, Prim, Unary, Var

MAX_PROGRAM_LENGTH = 128  # == parse.MAX_NODES: one instruction per tree node

# Opcode table.
NOP = 0
PUSH_CONST = 1
PUSH_PRIM = 2
PUSH_U = 3
NEG = 4
ABS = 5
ADD = 6
SUB = 7
MUL = 8
DIV = 9
POW = 10
MIN = 11
MAX = 12
CLIP = 13
NUM_OPCODES = 14

OPCODE_NAMES = (
    "NOP", "PUSH_CONST", "PUSH_PRIM", "PUSH_U", "NEG", "ABS",
    "ADD", "SUB", "MUL", "DIV", "POW", "MIN", "MAX", "CLIP",
)
# Number of operands popped by each opcode, and the net change of the stack depth.
ARITY = (0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2, 3)
STACK_DELTA = (0, 1, 1, 1, 0, 0, -1, -1, -1, -1, -1, -1, -1, -2)

BINARY_OPCODES = {"+": ADD, "-": SUB, "*": MUL, "/": DIV, "**": POW}
FUNCTION_OPCODES = {"min": MIN, "max": MAX, "abs": ABS, "clip": CLIP}

# Push orders of clip's (x, lo, hi): CLIP_ORDERS[arg][j] is the argument pushed j-th.
CLIP_ORDERS = tuple(itertools.permutations(range(3)))


def min_nodes_for_stack_depth(depth: int) -> int:
    """Fewest tree nodes whose best evaluation order needs `depth` stack slots.

    A leaf needs 1; a binary node whose children need a >= b needs max(a, b + 1); a ternary
    one with a >= b >= c needs max(a, b + 1, c + 2). So M(1) = 1, M(2) = 3, M(3) = 4 and
    M(h) = min(2 M(h-1) + 1, 3 M(h-2) + 1): M = 1, 3, 4, 9, 13, 27, 40, 81, 121, 243, ...
    """
    m = {0: 0, 1: 1, 2: 3}
    for h in range(3, depth + 1):
        m[h] = min(2 * m[h - 1] + 1, 3 * m[h - 2] + 1)
    return m[depth]


def _max_depth_for_nodes(nodes: int) -> int:
    depth = 1
    while min_nodes_for_stack_depth(depth + 1) <= nodes:
        depth += 1
    return depth


STACK_SIZE = _max_depth_for_nodes(MAX_PROGRAM_LENGTH)  # 9


@struct.dataclass
class Program:
    """Postfix program. Unstacked: ops i32[L], args f32[L], size i32[]; stacked: a leading K."""

    ops: jnp.ndarray
    args: jnp.ndarray
    size: jnp.ndarray

    @property
    def length(self) -> int:
        return int(self.ops.shape[-1])


class ProgramError(ValueError):
    """The expression cannot become a program (too long, too deep, unknown primitive)."""


# ----------------------------------------------------------------------------- compiling


def stack_need(expr: Expr) -> int:
    """Stack slots `expr` needs when evaluated in the compiler's (Sethi-Ullman) order."""
    return _compile(expr)[1]


_LEAVES = (Num, Var, Prim)


def _compile(expr: Expr) -> tuple[list[tuple[int, float]], int]:
    """(postfix (opcode, arg) list, stack need) of `expr`, in one pass over the tree.

    Children are pushed the one needing the most stack first (Sethi-Ullman); on ties leaves
    go last, since a leaf pushed right before its operator is read in place by the VM (see
    `vm.py`); otherwise the order is stable. A leaf needs 1 slot, a node whose children in
    push order need n_0, n_1, ... needs max(n_j + j).
    """
    kind = type(expr)
    if kind is Prim:
        return [(PUSH_PRIM, float(expr.index))], 1
    if kind is Num:
        return [(PUSH_CONST, float(expr.value))], 1
    if kind is Var:
        return [(PUSH_U, 0.0)], 1
    if kind is Binary:
        (left, left_need), (right, right_need) = _compile(expr.left), _compile(expr.right)
        right_first = right_need > left_need or (
            right_need == left_need and type(expr.left) in _LEAVES and type(expr.right) not in _LEAVES)
        if right_first:
            right.extend(left)
            right.append((BINARY_OPCODES[expr.op], 1.0))
            return right, max(right_need, left_need + 1)
        left.extend(right)
        left.append((BINARY_OPCODES[expr.op], 0.0))
        return left, max(left_need, right_need + 1)
    if kind is Unary or (kind is Call and expr.fn == "abs"):
        code, need = _compile(expr.operand if kind is Unary else expr.args[0])
        code.append((NEG if kind is Unary else ABS, 0.0))
        return code, need
    if kind is not Call:
        raise TypeError(f"not an expression node: {expr!r}")
    kids, opcode = expr.args, FUNCTION_OPCODES[expr.fn]
    compiled = [_compile(kid) for kid in kids]
    order = tuple(sorted(range(len(kids)), key=lambda j: (-compiled[j][1], type(kids[j]) in _LEAVES)))
    code: list = []
    for j in order:
        code.extend(compiled[j][0])
    code.append((opcode, float(CLIP_ORDERS.index(order)) if opcode == CLIP else 0.0 if order == (0, 1) else 1.0))
    return code, max(compiled[j][1] + position for position, j in enumerate(order))


def instructions(expr: Expr, num_primitives: int | None = None) -> list[tuple[int, float]]:
    """The (opcode, arg) postfix list of `expr`, validated; no padding."""
    if num_primitives is not None:
        for node in _nodes(expr):
            if isinstance(node, Prim) and not 0 <= node.index < num_primitives:
                raise ProgramError(f"unknown primitive g{node.index + 1}: only g1..g{num_primitives} exist")
    out, need = _compile(expr)
    if need > STACK_SIZE:
        raise ProgramError(f"expression needs {need} stack slots, the VM has {STACK_SIZE}")
    for opcode, arg in out:
        if opcode == PUSH_PRIM and arg < 0:
            raise ProgramError(f"negative primitive index {int(arg)}")
    return out


def _nodes(expr: Expr):
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, Unary):
            stack.append(node.operand)
        elif isinstance(node, Binary):
            stack.extend((node.left, node.right))
        elif isinstance(node, Call):
            stack.extend(node.args)


def compile_expr(expr: Expr, max_length: int = MAX_PROGRAM_LENGTH, num_primitives: int | None = None) -> Program:
    """Compile `expr` to a `Program` padded with NOP to `max_length` (host NumPy arrays).

    Raises `ProgramError` if the program is longer than `max_length`, needs more than
    `STACK_SIZE` stack slots, or (with `num_primitives`) references a primitive index
    >= num_primitives.
    """
    code = instructions(expr, num_primitives)
    if len(code) > max_length:
        raise ProgramError(f"program has {len(code)} instructions, more than max_length={max_length}")
    ops = np.zeros(max_length, np.int32)
    args = np.zeros(max_length, np.float32)
    if code:
        ops[: len(code)], args[: len(code)] = zip(*code)
    return Program(ops=ops, args=args, size=np.asarray(len(code), np.int32))


def stack_programs(programs: Sequence[Program], num_primitives: int | None = None) -> Program:
    """K programs of equal length -> one Program with a leading axis K (host NumPy arrays).

    With `num_primitives`, raises `ProgramError` if a program reads a primitive index
    >= num_primitives.
    """
    if not programs:
        raise ValueError("stack_programs needs at least one program")
    if num_primitives is not None:
        for k, program in enumerate(programs):
            ops, args = np.asarray(program.ops)[: int(program.size)], np.asarray(program.args)[: int(program.size)]
            index = args[ops == PUSH_PRIM]
            if index.size and (index.max() >= num_primitives or index.min() < 0):
                raise ProgramError(f"program {k} reads primitive g{int(index.max()) + 1}: only g1..g{num_primitives} exist")
    lengths = {p.length for p in programs}
    if len(lengths) != 1:
        raise ValueError(f"programs have different lengths {sorted(lengths)}; compile with one max_length")
    return Program(
        ops=np.stack([np.asarray(p.ops) for p in programs]),
        args=np.stack([np.asarray(p.args) for p in programs]),
        size=np.asarray([int(p.size) for p in programs], np.int32),
    )


def max_stack_depth(program: Program) -> int:
    """Deepest stack the (unstacked or stacked) program reaches; raises on underflow."""
    ops = np.asarray(program.ops)
    sizes = np.asarray(program.size)
    if ops.ndim == 1:
        ops, sizes = ops[None], sizes[None]
    deepest = 0
    for row, size in zip(ops, sizes):
        depth = 0
        for opcode in row[: int(size)]:
            if depth < ARITY[opcode]:
                raise ProgramError(f"stack underflow at opcode {OPCODE_NAMES[opcode]}")
            depth += STACK_DELTA[opcode]
            deepest = max(deepest, depth)
        if int(size) and depth != 1:
            raise ProgramError(f"program leaves {depth} values on the stack, expected 1")
    return deepest


def disassemble(program: Program) -> list[str]:
    """Readable listing of an unstacked program's real instructions."""
    out = []
    for opcode, arg in zip(np.asarray(program.ops)[: int(program.size)], np.asarray(program.args)):
        name = OPCODE_NAMES[opcode]
        if opcode == PUSH_CONST:
            out.append(f"{name} {float(arg)!r}")
        elif opcode == PUSH_PRIM:
            out.append(f"{name} g{int(arg) + 1}")
        elif ARITY[opcode] >= 2 and arg:
            out.append(f"{name} order={int(arg)}")
        else:
            out.append(name)
    return out
