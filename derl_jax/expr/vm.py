"""The reward VM: runs a `Program` (postfix, see `program.py`) on a batch of primitive values.

    evaluate(program, prims: f32[N, P], progress: f32[]) -> f32[N]

is a pure jnp stack machine: a `lax.while_loop` over the program's real instructions, a
`lax.switch` on the opcode that computes the one new value, and a fixed-size stack
`f32[STACK_SIZE, N]`. It is jit-compatible and vmappable over stacked programs
(`jax.vmap(evaluate, in_axes=(0, None, None))`): the expression is data, so one compiled
function serves every expression. `evaluate_batch(programs[K], ...)` is the fast way to run
K programs (it picks sequential scalar dispatch or vmapped chunks, see its docstring).

`evaluate_numpy(expr_or_program, prims, progress)` runs the same instructions with NumPy on
the host (what `check` uses). Both paths apply exactly the rules below.

Numeric semantics (the one definition; float32 everywhere)
-----------------------------------------------------------
* Every value is float32. Constants are rounded to float32 when compiled.
* Division: where |denominator| < DIV_EPS (1e-6) the result is NaN — an ill-defined reward,
  never a huge number.
* Power a ** b: NaN where a < 0 and b is not an integer, and where a == 0 and b < 0.
  (NaN ** 0 and 1 ** NaN are NaN too: NaN in, NaN out.)
* min, max, clip (= min(max(x, lo), hi)) and abs propagate NaN.
* Any non-finite intermediate (an overflow to ±inf) becomes NaN immediately, so it cannot
  turn finite again later (1 / inf would be 0); NaN then propagates to the result.
  `evaluate` therefore returns finite values or NaN, never ±inf.
Downstream, GRPO zeroes and counts NaN rewards, and `check` rejects expressions that give
NaN on its probe points.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from derl_jax.expr.ast import Expr
from derl_jax.expr.program import (
    ABS,
    ADD,
    CLIP,
    CLIP_ORDERS,
    DIV,
    MAX,
    MIN,
    MUL,
    NEG,
    NOP,
    NUM_OPCODES,
    POW,
    PUSH_CONST,
    PUSH_PRIM,
    PUSH_U,
    STACK_DELTA,
    STACK_SIZE,
    SUB,
    Program,
    compile_expr,
)

# ----------------------------------------------------------------------------- semantics

DIV_EPS = 1e-6  # |denominator| below this -> NaN
DTYPE = np.float32


def div(a, b, xp=jnp):
    """a / b, NaN where |b| < DIV_EPS (and where either is NaN)."""
    small = xp.abs(b) < DIV_EPS
    return xp.where(small, xp.nan, a / xp.where(small, 1, b).astype(a.dtype))


def power(a, b, xp=jnp):
    """a ** b, NaN where (a < 0 and b not an integer) or (a == 0 and b < 0) or a, b NaN."""
    bad = ((a < 0) & (xp.floor(b) != b)) | ((a == 0) & (b < 0)) | xp.isnan(a) | xp.isnan(b)
    safe_a = xp.where(bad, 1, a).astype(a.dtype)
    return xp.where(bad, xp.nan, xp.power(safe_a, b))


def power_uniform_fast(a, b):
    """`power` for the VM's jnp path: f32[N], f32[N] -> f32[N], same rules, cheaper when b is one constant.

    General `pow` is by far the most expensive instruction on CPU (a transcendental per row).
    Exponents are nearly always constants (2, 3, 0.5), i.e. the same on every row, so a
    `lax.cond` on that checks once per instruction and then squares, cubes or takes the square
    root (correctly rounded, so within float32 rounding of `pow`); any other exponent takes the
    general path. Under `vmap` the cond becomes a select and both sides run (still correct).
    """
    first = b[0]
    uniform = jnp.all(b == first)
    kind = jnp.where(first == 2, 0, jnp.where(first == 3, 1, jnp.where(first == 0.5, 2, 3)))
    kind = jnp.where(uniform, kind, 3)
    cases = [
        lambda a, b: a * a,  # NaN in, NaN out: no rule applies to an even integer exponent
        lambda a, b: a * a * a,
        lambda a, b: jnp.where(a < 0, jnp.nan, jnp.sqrt(jnp.abs(a))).astype(a.dtype),  # abs: (-0.0) ** 0.5 = +0.0
        power,
    ]
    return lax.switch(kind, cases, a, b)


def minimum(a, b, xp=jnp):
    return xp.where(xp.isnan(a) | xp.isnan(b), xp.nan, xp.minimum(a, b))


def maximum(a, b, xp=jnp):
    return xp.where(xp.isnan(a) | xp.isnan(b), xp.nan, xp.maximum(a, b))


def clip(x, lo, hi, xp=jnp):
    return minimum(maximum(x, lo, xp), hi, xp)


def finite_or_nan(x, xp=jnp):
    """±inf -> NaN (applied after every instruction)."""
    return xp.where(xp.isfinite(x), x, xp.nan)


# ----------------------------------------------------------------------------- jnp VM

_DELTA = np.asarray(STACK_DELTA, np.int32)


def _operands_clip(arg, top, second, third):
    """(x, lo, hi) from the three stack slots, given the push order CLIP_ORDERS[arg]."""
    slots = (third, second, top)  # pushed first, second, third
    code = jnp.clip(arg.astype(jnp.int32), 0, len(CLIP_ORDERS) - 1)
    out = []
    for which in range(3):  # argument 0 = x, 1 = lo, 2 = hi
        positions = np.asarray([order.index(which) for order in CLIP_ORDERS], np.int32)
        j = jnp.asarray(positions)[code]  # the slot holding this argument
        out.append(jnp.where(j == 0, slots[0], jnp.where(j == 1, slots[1], slots[2])))
    return tuple(out)


def _read(stack, position):
    return lax.dynamic_index_in_dim(stack, jnp.maximum(position, 0), 0, keepdims=False)


_BINARY_FNS = {ADD: jnp.add, SUB: jnp.subtract, MUL: jnp.multiply, DIV: div, POW: power_uniform_fast, MIN: minimum, MAX: maximum}
_BINARY_FIRST, _BINARY_LAST = ADD, MAX  # the binary opcodes are contiguous
NUM_BRANCHES = NUM_OPCODES + len(_BINARY_FNS)  # + the binary opcodes with swapped operands


def _branch_index(op, arg):
    """Branch of `lax.switch`: the opcode, or NUM_OPCODES + k for swapped binary opcode k."""
    swapped = (op >= _BINARY_FIRST) & (op <= _BINARY_LAST) & (arg != 0)
    return jnp.where(swapped, NUM_OPCODES + op - _BINARY_FIRST, op)


def _branches(prims_t, progress):
    """One function per branch: (stack, sp, arg) -> the (finite or NaN) value to write.

    Each branch reads only the stack slots it needs, so one fused loop per instruction does
    the reads, the arithmetic and the inf -> NaN rule.
    """
    n = prims_t.shape[1]

    def nop(stack, sp, arg):
        return _read(stack, sp - 1)

    def push_const(stack, sp, arg):
        return jnp.full((n,), arg, jnp.float32)

    def push_prim(stack, sp, arg):
        index = jnp.clip(arg.astype(jnp.int32), 0, prims_t.shape[0] - 1)
        return lax.dynamic_index_in_dim(prims_t, index, 0, keepdims=False)

    def push_u(stack, sp, arg):
        return jnp.full((n,), progress, jnp.float32)

    def neg(stack, sp, arg):
        return -_read(stack, sp - 1)

    def abs_(stack, sp, arg):
        return jnp.abs(_read(stack, sp - 1))

    def binary(fn, swapped):
        def run(stack, sp, arg):
            top, second = _read(stack, sp - 1), _read(stack, sp - 2)
            return fn(top, second) if swapped else fn(second, top)

        return run

    def clip_(stack, sp, arg):
        return clip(*_operands_clip(arg, _read(stack, sp - 1), _read(stack, sp - 2), _read(stack, sp - 3)))

    table = {NOP: nop, PUSH_CONST: push_const, PUSH_PRIM: push_prim, PUSH_U: push_u, NEG: neg, ABS: abs_, CLIP: clip_}
    table.update({op: binary(fn, False) for op, fn in _BINARY_FNS.items()})
    table.update({NUM_OPCODES + op - _BINARY_FIRST: binary(fn, True) for op, fn in _BINARY_FNS.items()})
    assert sorted(table) == list(range(NUM_BRANCHES))
    return [lambda stack, sp, arg, f=table[i]: finite_or_nan(f(stack, sp, arg)) for i in range(NUM_BRANCHES)]


def _decode(program: Program):
    """Per-instruction scalars, computed once per program (vectorised over its L instructions).

    -> (branch i32[L], sp i32[L] = stack depth before the instruction, write i32[L] = slot the
    result goes to, args f32[L], size i32[]). Knowing every depth up front (a cumulative sum
    of the stack deltas) keeps the loop body free of bookkeeping and lets the row tiles of one
    program share the decoding.
    """
    ops = jnp.clip(jnp.asarray(program.ops, jnp.int32), 0, NUM_OPCODES - 1)
    args = jnp.asarray(program.args, jnp.float32)
    after = jnp.cumsum(jnp.asarray(_DELTA)[ops])
    before = after - jnp.asarray(_DELTA)[ops]
    write = jnp.clip(after - 1, 0, STACK_SIZE - 1)
    return _branch_index(ops, args), before, write, args, jnp.asarray(program.size, jnp.int32)


def _run_decoded(decoded, prims_t: jax.Array, progress) -> jax.Array:
    """A decoded program on transposed prims f32[P, N] -> f32[N]: the VM loop itself."""
    branch, before, write, args, size = decoded
    branches = _branches(prims_t, jnp.asarray(progress, jnp.float32))

    def body(i, stack):
        value = lax.switch(branch[i], branches, stack, before[i], args[i])
        return lax.dynamic_update_index_in_dim(stack, value, write[i], 0)

    stack = jnp.zeros((STACK_SIZE, prims_t.shape[1]), jnp.float32)
    return lax.fori_loop(0, size, body, stack)[0]


def evaluate(program: Program, prims: jax.Array, progress) -> jax.Array:
    """Run one program: prims f32[N, P], progress f32[] -> rewards f32[N] (finite or NaN).

    A `lax.fori_loop` over the program's `size` real instructions; each step `lax.switch`es
    on the opcode to a branch that reads its operands from the stack f32[STACK_SIZE, N],
    computes one value and writes it at the new stack top. Pure and jit-compatible;
    `jax.vmap(evaluate, in_axes=(0, None, None))` evaluates a stacked Program[K] in one call
    (under vmap the switch turns into a select over every branch).
    """
    prims_t = jnp.asarray(prims, jnp.float32).T  # [P, N]
    return _run_decoded(_decode(program), prims_t, progress)


@functools.partial(jax.jit, static_argnames=("batch_size", "row_tile"))
def evaluate_batch(
    programs: Program, prims: jax.Array, progress, *, batch_size: int | None = None, row_tile: int | None = None
) -> jax.Array:
    """Run stacked programs Program[K] on the same prims f32[N, P] -> f32[K, N].

    `batch_size=None` runs the K programs one after another (`lax.map`), so every
    instruction computes only its own opcode: the fastest choice on CPU. `batch_size=b` vmaps
    chunks of b programs (every branch is computed and selected): the choice for
    accelerators, where the K axis is parallel. `row_tile=t` (t divides N) additionally runs
    each program over row tiles of t rows, which keeps the stack in cache on CPU
    (t = 4096..8192 is a good start).
    """
    prims_t = jnp.asarray(prims, jnp.float32).T  # [P, N], transposed once for all programs
    p, n = prims_t.shape
    if row_tile is None or row_tile >= n:
        run = lambda program: _run_decoded(_decode(program), prims_t, progress)  # noqa: E731
    else:
        if n % row_tile:
            raise ValueError(f"row_tile={row_tile} does not divide N={n}")
        tiles = prims_t.reshape(p, n // row_tile, row_tile).transpose(1, 0, 2)  # [tiles, P, t]

        def run(program):
            decoded = _decode(program)
            return lax.map(lambda tile: _run_decoded(decoded, tile, progress), tiles).reshape(n)

    return lax.map(run, programs, batch_size=batch_size)


def evaluate_batch_threaded(
    programs: Program, prims, progress, *, row_tile: int | None = None, threads: int | None = None
) -> np.ndarray:
    """`evaluate_batch` split over host threads: Program[K], f32[N, P] -> host f32[K, N].

    XLA:CPU runs a while loop on one core, so on a multi-core host the K programs are cut
    into `threads` equal chunks (the last one padded by repeating a program, so every chunk
    has the same shape and one compilation serves all), each evaluated by `evaluate_batch`
    from its own thread; JAX releases the GIL while a computation runs. `threads=None` uses
    every CPU. Not jit-able (it is the host-side driver); the values equal `evaluate_batch`'s.
    """
    ops = np.asarray(programs.ops)
    if ops.ndim != 2:
        raise ValueError(f"evaluate_batch_threaded: programs must be stacked Program[K], got ops of shape {ops.shape}")
    k = ops.shape[0]
    threads = max(1, min(threads or os.cpu_count() or 1, k))
    chunk = -(-k // threads)
    rows = np.minimum(np.arange(chunk * threads), k - 1).reshape(threads, chunk)
    prims = jnp.asarray(prims, jnp.float32)
    progress = jnp.asarray(progress, jnp.float32)
    parts = [jax.tree.map(lambda a, r=r: jnp.asarray(np.asarray(a)[r]), programs) for r in rows]
    if threads == 1:
        return np.asarray(evaluate_batch(parts[0], prims, progress, row_tile=row_tile))[:k]
    with ThreadPoolExecutor(threads) as pool:
        outs = list(pool.map(lambda part: np.asarray(evaluate_batch(part, prims, progress, row_tile=row_tile)), parts))
    return np.concatenate(outs)[:k]


# ----------------------------------------------------------------------------- NumPy path


def evaluate_numpy(expr_or_program: Union[Expr, Program], prims, progress) -> np.ndarray:
    """The same instructions and rules as `evaluate`, in float32 NumPy on the host -> f32[N]."""
    if isinstance(expr_or_program, Program):
        program = expr_or_program
    else:
        program = compile_expr(expr_or_program)
    prims = np.asarray(prims, np.float32)
    if prims.ndim != 2:
        raise ValueError(f"prims must be [N, P], got shape {prims.shape}")
    n, p = prims.shape
    progress = np.float32(progress)
    ops = np.asarray(program.ops)
    args = np.asarray(program.args, np.float32)
    stack: list[np.ndarray] = []
    with np.errstate(all="ignore"):
        for op, arg in zip(ops[: int(program.size)], args[: int(program.size)]):
            op = int(op)
            if op == NOP:
                continue
            if op == PUSH_CONST:
                value = np.full(n, arg, np.float32)
            elif op == PUSH_PRIM:
                index = int(arg)
                if not 0 <= index < p:
                    raise IndexError(f"program reads primitive g{index + 1} but prims has {p} columns")
                value = prims[:, index].copy()
            elif op == PUSH_U:
                value = np.full(n, progress, np.float32)
            elif op in (NEG, ABS):
                x = stack.pop()
                value = -x if op == NEG else np.abs(x)
            elif op == CLIP:
                slots = [stack.pop() for _ in range(3)][::-1]  # pushed first .. last
                order = CLIP_ORDERS[int(arg)]
                operands = [None, None, None]
                for j, which in enumerate(order):
                    operands[which] = slots[j]
                value = clip(*operands, xp=np)
            else:
                top, second = stack.pop(), stack.pop()
                lhs, rhs = (second, top) if arg == 0 else (top, second)
                if op == ADD:
                    value = lhs + rhs
                elif op == SUB:
                    value = lhs - rhs
                elif op == MUL:
                    value = lhs * rhs
                elif op == DIV:
                    value = div(lhs, rhs, xp=np)
                elif op == POW:
                    value = power(lhs, rhs, xp=np)
                elif op == MIN:
                    value = minimum(lhs, rhs, xp=np)
                elif op == MAX:
                    value = maximum(lhs, rhs, xp=np)
                else:
                    raise ValueError(f"bad opcode {op}")
            stack.append(finite_or_nan(np.asarray(value, np.float32), xp=np).astype(np.float32))
    if len(stack) != 1:
        raise ValueError(f"malformed program: {len(stack)} values left on the stack")
    return stack[0]
