"""The reward VM: runs a `Program` (postfix, see `program.py`) on a batch of primitive values.

    evaluate(program, prims: f32[N, P], progress: f32[]) -> f32[N]

is a pure jnp machine: the program's instructions are first decoded (vectorised, no loop)
into micro-ops — one per operator, reading the leaves pushed right before it in place and
absorbing the NEG / ABS that follow it — then a `lax.fori_loop` over the micro-ops, a
`lax.switch` on each one's kind that computes the one new value, and a fixed-size table
`f32[P + STACK_SIZE, N]` (primitive columns, then the stack slots). It is jit-compatible
and vmappable over stacked programs (`jax.vmap(evaluate, in_axes=(0, None, None))`): the
expression is data, so one compiled function serves every expression.
`evaluate_batch(programs[K], ...)` is the fast way to run K programs (it picks sequential
scalar dispatch or vmapped chunks, see its docstring), and `evaluate_batch_threaded` spreads
it over host threads.

`evaluate_numpy(expr_or_program, prims, progress)` runs the same instructions with NumPy on
the host (what `check` uses). Both paths apply exactly the rules below.

Numeric semantics (the one definition; float32 everywhere, every backend)
--------------------------------------------------------------------------
* Every value is float32. Constants are rounded to float32 when compiled.
* Every value the machine reads or computes is first *settled* (`settle`): ±inf becomes NaN
  and a subnormal (|x| < 2**-126) becomes 0. This applies to the leaves (primitive values,
  u, constants) as much as to each operator's result, so an operator that reads a leaf
  directly sees the same value as one that reads it from the stack: an infinite primitive is
  an ill-defined (NaN) input, so 1/g1, min(g1, g2), clip(g1, 0, 1), g1**0 and g1**-0.5 are all
  NaN where g1 = ±inf; an overflow cannot turn finite again later (1 / inf would be 0); and
  the results do not depend on whether the backend flushes subnormals (XLA on CPU does,
  NumPy does not). `evaluate` therefore returns finite values or NaN, never ±inf.
* Division: where |denominator| < DIV_EPS (1e-6) the result is NaN — an ill-defined reward,
  never a huge number.
* Power a ** b: NaN where a < 0 and b is not an integer, and where a == 0 and b < 0.
  (NaN ** 0 and 1 ** NaN are NaN too: NaN in, NaN out.)
* min, max, clip (= min(max(x, lo), hi)) and abs propagate NaN.
* A program that reads primitive g_j from fewer than j columns raises `ProgramError` where
  the program is concrete (`evaluate_numpy`, and `evaluate` / `evaluate_batch` called outside
  a trace); inside a trace, where nothing can raise, such a leaf is NaN — never another column.
* N = 0 rows gives an empty result.
Downstream, GRPO zeroes and counts NaN rewards, and `check` rejects expressions that give
NaN on its probe points.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Union

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from derl_jax.expr.ast import Expr
from derl_jax.expr.program import (
    ABS,
    ADD,
    ARITY,
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
    ProgramError,
    compile_expr,
)

# ----------------------------------------------------------------------------- semantics

DIV_EPS = 1e-6  # |denominator| below this -> NaN


def div(a, b, xp=jnp):
    """a / b, NaN where |b| < DIV_EPS (and where either is NaN)."""
    small = xp.abs(b) < DIV_EPS
    return xp.where(small, xp.nan, a / xp.where(small, 1, b).astype(a.dtype))


def power(a, b, xp=jnp):
    """a ** b, NaN where (a < 0 and b not an integer) or (a == 0 and b < 0) or a, b NaN."""
    bad = ((a < 0) & (xp.floor(b) != b)) | ((a == 0) & (b < 0)) | xp.isnan(a) | xp.isnan(b)
    safe_a = xp.where(bad, 1, a).astype(a.dtype)
    return xp.where(bad, xp.nan, xp.power(safe_a, b))


def square(a):
    """a ** 2 for the exponent 2: correctly rounded; NaN in, NaN out (no rule applies)."""
    return a * a


def cube(a):
    """a ** 3 for the exponent 3."""
    return a * a * a


def square_root(a, xp=jnp):
    """a ** 0.5 for the exponent 0.5: NaN where a < 0; (-0.0) ** 0.5 = +0.0 as `pow` gives."""
    return xp.where(a < 0, xp.nan, xp.sqrt(xp.abs(a))).astype(a.dtype)


def minimum(a, b, xp=jnp):
    return xp.where(xp.isnan(a) | xp.isnan(b), xp.nan, xp.minimum(a, b))


def maximum(a, b, xp=jnp):
    return xp.where(xp.isnan(a) | xp.isnan(b), xp.nan, xp.maximum(a, b))


def clip(x, lo, hi, xp=jnp):
    return minimum(maximum(x, lo, xp), hi, xp)


SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)  # 2**-126: below it, a value is 0
LARGEST = float(np.finfo(np.float32).max)


def settle(x, xp=jnp):
    """±inf -> NaN, subnormal -> 0, anything else unchanged (applied to every leaf and result)."""
    magnitude = xp.abs(x)
    return xp.where(magnitude < SMALLEST_NORMAL, xp.zeros_like(x), xp.where(magnitude <= LARGEST, x, xp.nan))


# ----------------------------------------------------------------------------- jnp VM
#
# The loop does not run the postfix instructions one by one. `_decode` first turns a Program
# into micro-ops, one per instruction that computes something new:
#
# * every operator of arity >= 2 reads each argument from a stack slot, a primitive column or
#   a scalar (a constant or u): the leaves pushed immediately before it are its arguments
#   directly, so they cost no step, no stack write and no stack read;
# * a leaf that is not such an argument (the whole program is a leaf, or a unary operator
#   follows it) is a COPY micro-op that writes it to its stack slot;
# * NEG and ABS cost no step either: they become a post-operation (|v| and/or -v, composed)
#   of the micro-op that computed their operand, applied after its inf -> NaN rule (both keep
#   finite values finite and NaN NaN, so the order does not matter); NOP does nothing;
# * a power whose exponent is a scalar 2, 3 or 0.5 becomes SQUARE, CUBE or SQRT (correctly
#   rounded, so within float32 rounding of `pow`; the rules give no NaN for 2 and 3, and
#   SQRT applies the a < 0 one).
#
# The loop state is one table f32[P + STACK_SIZE, N]: the P primitive columns, then the stack
# slots. A micro-op reads its arguments from table rows (or scalars) and writes its value to
# the row of the stack slot the postfix program would write. With row tiles, the micro-ops
# run tile after tile on the table's columns of that tile, which stay in cache. A typical
# program runs less than half as many steps as it has instructions.

_DELTA = np.asarray(STACK_DELTA, np.int32)
_ARITY = np.asarray(ARITY, np.int32)

# Micro-op kinds: the branches of the loop's `lax.switch`.
COPY, K_ADD, K_SUB, K_MUL, K_DIV, K_MIN, K_MAX, K_POW, K_SQUARE, K_CUBE, K_SQRT, K_CLIP = range(12)
_KIND_FNS = (
    lambda x: x,  # COPY
    jnp.add,
    jnp.subtract,
    jnp.multiply,
    div,
    minimum,
    maximum,
    power,
    square,
    cube,
    square_root,
    clip,
)
_KIND_ARITY = (1, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 3)  # arguments each kind reads
_KIND_OF_OPCODE = np.full(NUM_OPCODES, COPY, np.int32)
for _opcode, _kind in ((ADD, K_ADD), (SUB, K_SUB), (MUL, K_MUL), (DIV, K_DIV), (MIN, K_MIN), (MAX, K_MAX),
                       (POW, K_POW), (CLIP, K_CLIP)):
    _KIND_OF_OPCODE[_opcode] = _kind

# _PUSHED[order, a]: which push position (0 = pushed first) holds argument a. Rows 0 and 1: a
# binary operator with arg 0 and 1; row 2 + c: CLIP with arg c (an index into CLIP_ORDERS).
_PUSHED = np.asarray([[0, 1, 0], [1, 0, 0]] + [[order.index(a) for a in range(3)] for order in CLIP_ORDERS], np.int32)

# Fields of the decoded micro-ops: ints i32[..., 5, L] = (kind, write row, row of argument 0, 1, 2),
# a row < 0 meaning "the scalar"; floats f32[..., 5, L] = (scalar of argument 0, 1, 2, abs flag, sign).
_KIND, _WRITE, _ROW0 = 0, 1, 2
_SCALAR0, _ABS, _SIGN = 0, 3, 4


def _running(op, x, reverse: bool = False):
    """Inclusive running `op` (jnp.maximum, jnp.minimum, jnp.add) of x along its last axis."""
    return lax.associative_scan(op, x, reverse=reverse, axis=x.ndim - 1)


def _shift(x, places: int, fill):
    """x moved `places` positions later (earlier when negative) along its last axis, gaps filled."""
    pad = jnp.full(x.shape[:-1] + (abs(places),), fill, x.dtype)
    if places > 0:
        return jnp.concatenate([pad, x[..., :-places]], axis=-1)
    return jnp.concatenate([x[..., -places:], pad], axis=-1)


def _kept_positions(keep):
    """keep bool[..., L] -> (count i32[...], positions i32[..., L]): the first `count` positions
    are those where `keep`, in order; the rest are unspecified (nothing reads them)."""
    batch, length = keep.shape[:-1], keep.shape[-1]
    keep = keep.reshape(-1, length)
    kept = jnp.cumsum(keep.astype(jnp.int32), axis=-1)
    target = jnp.where(keep, kept - 1, length)  # out of range: dropped
    idx = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), keep.shape)
    positions = idx.at[jnp.arange(keep.shape[0])[:, None], target].set(idx, mode="drop")
    return kept[:, -1].reshape(batch), positions.reshape(batch + (length,))


def _decode(ops, args, size, num_primitives: int, progress):
    """Programs -> micro-ops: ops i32[..., L], args f32[..., L], size i32[...] ->
    (ints i32[..., 5, L], floats f32[..., 5, L], steps i32[..., L], count i32[...]).

    Column j of ints / floats describes the micro-op of instruction j (if it makes one);
    step s of the program runs column steps[s], for s < count. Vectorised over the L
    instructions (running sums, maxima and minima, shifts; no loop) and over any leading
    batch axes; computed once per program and shared by its row tiles.
    """
    length = ops.shape[-1]
    idx = jnp.arange(length, dtype=np.int32)
    ops = jnp.clip(jnp.asarray(ops).astype(np.int32), 0, NUM_OPCODES - 1)
    ops = jnp.where(idx < jnp.asarray(size).astype(np.int32)[..., None], ops, NOP)
    args = jnp.asarray(args).astype(np.float32)
    progress = jnp.asarray(progress).astype(np.float32)
    zero = np.float32(0)

    arity = jnp.asarray(_ARITY)[ops]
    delta = jnp.asarray(_DELTA)[ops]
    after = jnp.cumsum(delta, axis=-1)
    before = after - delta
    is_leaf = (ops == PUSH_CONST) | (ops == PUSH_PRIM) | (ops == PUSH_U)
    is_operator = arity >= 2

    # The leaves pushed immediately before an operator are its top arguments (as many as it
    # has); `taken` counts them. A leaf d places before an operator that takes >= d is absorbed.
    leaf_run = idx - _running(jnp.maximum, jnp.where(is_leaf, -1, idx))  # consecutive leaves ending at i
    taken = jnp.where(is_operator, jnp.minimum(_shift(leaf_run, 1, 0), arity), 0)
    absorbed = is_leaf & ((_shift(taken, -1, 0) >= 1) | (_shift(taken, -2, 0) >= 2)
                          | (_shift(taken, -3, 0) >= 3))
    executed = is_operator | (is_leaf & ~absorbed)

    prim_index = jnp.clip(args, -1, num_primitives).astype(np.int32)
    known_prim = (ops == PUSH_PRIM) & (prim_index >= 0) & (prim_index < num_primitives)
    leaf_row = jnp.where(known_prim, prim_index, -1)
    leaf_scalar = jnp.where(ops == PUSH_U, progress[..., None], jnp.where(ops == PUSH_CONST, args, zero))
    leaf_scalar = jnp.where((ops == PUSH_PRIM) & ~known_prim, np.float32(np.nan), settle(leaf_scalar))
    leaf_rows = [_shift(leaf_row, d, -1) for d in (1, 2, 3)]  # of the leaf d places before
    leaf_scalars = [_shift(leaf_scalar, d, zero) for d in (1, 2, 3)]

    def leaf_before(back, shifted):
        return jnp.where(back == 1, shifted[0], jnp.where(back == 2, shifted[1], shifted[2]))

    # Argument a of an operator with r operands was pushed `pushed`-th: it is the leaf
    # back = r - pushed places before the operator if that leaf was taken, else in stack slot
    # before - back. A lone leaf is argument 0 of a COPY.
    order = jnp.where(ops == CLIP, 2 + jnp.clip(args.astype(np.int32), 0, len(CLIP_ORDERS) - 1),
                      (args != 0).astype(np.int32))
    rows, scalars = [], []
    for a in range(3):
        back = arity - jnp.asarray(_PUSHED[:, a])[order]
        from_leaf = (back <= taken) & (a < arity)
        slot_row = num_primitives + jnp.clip(before - back, 0, STACK_SIZE - 1)
        row = jnp.where(from_leaf, leaf_before(back, leaf_rows), jnp.where(a < arity, slot_row, -1))
        scalar = jnp.where(from_leaf, leaf_before(back, leaf_scalars), zero)
        rows.append(jnp.where(is_leaf, leaf_row if a == 0 else -1, row))
        scalars.append(jnp.where(is_leaf, leaf_scalar if a == 0 else zero, scalar))
    write = num_primitives + jnp.clip(after - 1, 0, STACK_SIZE - 1)

    kind = jnp.asarray(_KIND_OF_OPCODE)[ops]
    uniform_power = jnp.where(scalars[1] == 2, K_SQUARE, jnp.where(scalars[1] == 3, K_CUBE,
                                                                  jnp.where(scalars[1] == 0.5, K_SQRT, K_POW)))
    kind = jnp.where((kind == K_POW) & (rows[1] < 0), uniform_power, kind)

    # NEG / ABS chains after a micro-op (NOPs inside them do nothing): |v| if an ABS is in the
    # chain, negated once per NEG after the last ABS.
    passes = (ops == NEG) | (ops == ABS) | (ops == NOP)
    chain_end = _shift(_running(jnp.minimum, jnp.where(passes, length, idx), reverse=True), -1, length) - 1
    last_abs = jnp.take_along_axis(_running(jnp.maximum, jnp.where(ops == ABS, idx, -1)), chain_end, axis=-1)
    negs = jnp.cumsum((ops == NEG).astype(jnp.int32), axis=-1)
    flips = (jnp.take_along_axis(negs, chain_end, axis=-1)
             - jnp.take_along_axis(negs, jnp.maximum(last_abs, idx), axis=-1))
    take_abs = (last_abs > idx).astype(np.float32)
    sign = jnp.where(flips % 2 == 1, np.float32(-1), np.float32(1))

    ints = jnp.stack([kind, write] + rows, axis=-2).astype(np.int32)
    floats = jnp.stack(scalars + [take_abs, sign], axis=-2).astype(np.float32)
    count, steps = _kept_positions(executed)
    return ints, floats, steps, count


def _argument(table, offset, width, ints, floats, column, a):
    """Argument a of the micro-op in `column` on table columns [offset, offset + width):
    a table row f32[width], or its scalar (broadcast) when the row is < 0."""
    row = ints[_ROW0 + a, column]
    value = lax.dynamic_slice(table, (jnp.maximum(row, 0), offset), (1, width))[0]
    return jnp.where(row < 0, floats[_SCALAR0 + a, column], value)


def _branch(kind, width):
    """(table, offset, ints, floats, column) -> the micro-op's value f32[width]: its
    arithmetic, inf -> NaN, then |.| and the sign of its NEG / ABS chain.

    The branch reads the micro-op's fields itself, so they are loaded inside the one fused
    loop that computes the value.
    """
    fn, count = _KIND_FNS[kind], _KIND_ARITY[kind]

    def run(table, offset, ints, floats, column):
        value = settle(fn(*[_argument(table, offset, width, ints, floats, column, a) for a in range(count)]))
        return jnp.where(floats[_ABS, column] != 0, jnp.abs(value), value) * floats[_SIGN, column]

    return run


def _initial_table(prims_t: jax.Array) -> jax.Array:
    """Transposed prims f32[P, N] -> the loop state f32[P + STACK_SIZE, N]: the settled prims, then the stack."""
    return jnp.concatenate([settle(prims_t), jnp.zeros((STACK_SIZE, prims_t.shape[1]), jnp.float32)])


def _run_program(decoded, table, n: int, row_tile: int, num_primitives: int):
    """One decoded program over the row tiles of N rows -> (table, its values f32[N]).

    A program's last micro-op writes stack slot 0, which nothing reads again, so once every
    tile has run, slot 0's row holds the program's value on all N rows. `table` is updated in
    place and handed on to the next program: a valid program reads only stack slots it wrote
    before on the same rows, so the stack needs no clearing. An empty program gives zeros.
    """
    ints, floats, steps, count = decoded
    branches = [_branch(kind, row_tile) for kind in range(len(_KIND_FNS))]

    def tile(t, table):
        offset = t * row_tile

        def step(i, table):
            column = steps[i]
            value = lax.switch(ints[_KIND, column], branches, table, offset, ints, floats, column)
            return lax.dynamic_update_slice(table, value[None], (ints[_WRITE, column], offset))

        return lax.fori_loop(0, count, step, table)

    table = lax.fori_loop(0, n // row_tile, tile, table)
    return table, jnp.where(count > 0, table[num_primitives], 0.0)


def _traced(*arrays) -> bool:
    return any(isinstance(a, jax.core.Tracer) for a in arrays)


def _check_inputs(program: Program, prims, progress, program_rank: int, where: str):
    """Shape and dtype checks at the VM's entry points; the primitive count check where the
    program is concrete. -> prims as a float32 array f32[N, P]."""
    chex.assert_rank([program.ops, program.args, program.size], [program_rank, program_rank, program_rank - 1])
    chex.assert_equal_shape([program.ops, program.args])
    chex.assert_shape(program.size, program.ops.shape[:-1])
    chex.assert_type([program.ops, program.args], [int, float])
    chex.assert_rank([prims, progress], [2, 0])
    chex.assert_type(prims, float)
    if not _traced(program.ops, program.args, program.size):
        check_primitive_count(program, prims.shape[1], where)
    return jnp.asarray(prims, jnp.float32)


def check_primitive_count(program: Program, num_primitives: int, where: str = "program") -> None:
    """Raise `ProgramError` if a concrete (unstacked or stacked) program reads a primitive
    column >= num_primitives (or < 0) among its real instructions."""
    ops, args = np.asarray(program.ops), np.asarray(program.args)
    real = np.arange(ops.shape[-1]) < np.asarray(program.size)[..., None]
    index = np.where(real & (ops == PUSH_PRIM), args, 0)
    if index.size and (index.max() >= num_primitives or index.min() < 0):
        bad = int(index.max()) if index.max() >= num_primitives else int(index.min())
        raise ProgramError(f"{where}: program reads primitive g{bad + 1} but prims has {num_primitives} columns")


def evaluate(program: Program, prims: jax.Array, progress) -> jax.Array:
    """Run one program: prims f32[N, P], progress f32[] -> rewards f32[N] (finite or NaN).

    Decodes the program into micro-ops, then a `lax.fori_loop` over them; each step
    `lax.switch`es on the micro-op's kind to a branch that reads its arguments (table rows or
    scalars), computes one value and writes it to its stack slot. Pure and jit-compatible;
    `jax.vmap(evaluate, in_axes=(0, None, None))` evaluates a stacked Program[K] in one call
    (under vmap the switch turns into a select over every branch). Raises `ProgramError`
    when a concrete program reads a column prims does not have (see the module docstring).
    """
    prims = _check_inputs(program, prims, progress, 1, "evaluate")
    n, p = prims.shape
    if n == 0:
        return jnp.zeros((0,), jnp.float32)
    decoded = _decode(program.ops, program.args, program.size, p, progress)
    out = _run_program(decoded, _initial_table(prims.T), n, n, p)[1]
    chex.assert_shape(out, (n,))
    return out


def evaluate_batch(
    programs: Program, prims: jax.Array, progress, *, batch_size: int | None = None, row_tile: int | None = None
) -> jax.Array:
    """Run stacked programs Program[K] on the same prims f32[N, P] -> f32[K, N].

    `batch_size=None` runs the K programs one after another, so every micro-op computes only
    its own kind: the fastest choice on CPU. `batch_size=b` vmaps chunks of b programs (every
    branch is computed and selected): the choice for accelerators, where the K axis is
    parallel. `row_tile=t` (t divides N) runs each program over row tiles of t rows, which
    keeps the rows a program touches in cache on CPU (t = 1024 is a good start). Jitted;
    checks its inputs first (`ProgramError` for a concrete program reading a missing column).
    """
    prims = _check_inputs(programs, prims, progress, 2, "evaluate_batch")
    k, n = programs.ops.shape[0], prims.shape[0]
    if n == 0:
        return jnp.zeros((k, 0), jnp.float32)
    if row_tile is not None and row_tile < n and n % row_tile:
        raise ValueError(f"row_tile={row_tile} does not divide N={n}")
    out = _evaluate_batch(programs, prims, progress, batch_size=batch_size, row_tile=row_tile)
    chex.assert_shape(out, (k, n))
    return out


@functools.partial(jax.jit, static_argnames=("batch_size", "row_tile"))
def _evaluate_batch(programs: Program, prims: jax.Array, progress, *, batch_size, row_tile) -> jax.Array:
    """`evaluate_batch` after its checks: Program[K], f32[N > 0, P] -> f32[K, N]."""
    prims_t = jnp.asarray(prims, jnp.float32).T  # [P, N], transposed once for all programs
    p, n = prims_t.shape
    k = programs.ops.shape[0]
    if row_tile is None or row_tile >= n:
        row_tile = n
    elif n % row_tile:
        raise ValueError(f"row_tile={row_tile} does not divide N={n}")
    decoded = _decode(programs.ops, programs.args, programs.size, p, progress)  # all K at once
    table = _initial_table(prims_t)
    if batch_size is None:
        def program(j, carry):
            table, out = carry
            table, values = _run_program(jax.tree.map(lambda a: a[j], decoded), table, n, row_tile, p)
            return table, lax.dynamic_update_index_in_dim(out, values, j, 0)

        return lax.fori_loop(0, k, program, (table, jnp.zeros((k, n), jnp.float32)))[1]

    chunks = -(-k // batch_size)
    padded = jax.tree.map(lambda a: jnp.concatenate([a, jnp.repeat(a[:1], chunks * batch_size - k, axis=0)]), decoded)
    padded = jax.tree.map(lambda a: a.reshape((chunks, batch_size) + a.shape[1:]), padded)
    run_chunk = jax.vmap(lambda table, one: _run_program(one, table, n, row_tile, p))
    tables = jnp.broadcast_to(table, (batch_size,) + table.shape)
    _, outs = lax.scan(run_chunk, tables, padded)
    return outs.reshape(chunks * batch_size, n)[:k]


THREADED_CHUNK_BYTES = 8 << 20  # output of one evaluate_batch call in evaluate_batch_threaded


def evaluate_batch_threaded(
    programs: Program, prims, progress, *, row_tile: int | None = None, threads: int | None = None,
    chunk: int | None = None,
) -> np.ndarray:
    """`evaluate_batch` split over host threads: Program[K], f32[N, P] -> host f32[K, N].

    XLA:CPU runs a while loop on one core, so the K programs are cut into chunks of `chunk`
    programs (default: about `THREADED_CHUNK_BYTES` of output each, and at least one chunk
    per thread; the last one padded by repeating a program, so every chunk has the same shape
    and one compilation serves all). `threads` host threads (None: every CPU) take chunks in
    turn, evaluate each with `evaluate_batch` (JAX releases the GIL while a computation runs)
    and copy its values into one host array. Many small chunks balance the load when other
    work shares the cores, and their outputs reuse memory instead of touching a fresh K x N
    buffer per thread. Not jit-able (it is the host-side driver); the values equal
    `evaluate_batch`'s.
    """
    host = jax.tree.map(np.asarray, programs)
    if host.ops.ndim != 2:
        raise ValueError(f"evaluate_batch_threaded: programs must be stacked Program[K], got ops of shape {host.ops.shape}")
    prims = _check_inputs(host, prims, progress, 2, "evaluate_batch_threaded")
    if prims.shape[0] == 0:
        return np.zeros((host.ops.shape[0], 0), np.float32)
    # Instructions past every program's size are ignored: drop them (in steps of 32, so few
    # lengths get compiled), which makes decoding cheaper.
    length = min(host.ops.shape[1], 32 * max(1, -(-int(host.size.max(initial=0)) // 32)))
    host = host.replace(ops=host.ops[:, :length], args=host.args[:, :length])
    progress = jnp.asarray(progress, jnp.float32)
    k, n = host.ops.shape[0], prims.shape[0]
    threads = max(1, min(threads or os.cpu_count() or 1, k))
    chunk = min(k, chunk or min(-(-k // threads), max(1, THREADED_CHUNK_BYTES // (4 * n))))
    chunks = -(-k // chunk)
    rows = np.minimum(np.arange(chunks * chunk), k - 1).reshape(chunks, chunk)
    out = np.empty((k, n), np.float32)

    def run(c: int) -> None:
        part = jax.tree.map(lambda a: a[rows[c]], host)
        values = np.asarray(_evaluate_batch(part, prims, progress, batch_size=None, row_tile=row_tile))
        start, stop = c * chunk, min((c + 1) * chunk, k)
        out[start:stop] = values[: stop - start]

    if threads == 1 or chunks == 1:
        for c in range(chunks):
            run(c)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, range(chunks)))
    return out


# ----------------------------------------------------------------------------- NumPy path


def evaluate_numpy(expr_or_program: Union[Expr, Program], prims, progress) -> np.ndarray:
    """The same instructions and rules as `evaluate`, in float32 NumPy on the host -> f32[N].
    `progress`: u, a scalar or one value per row (f32[N])."""
    if isinstance(expr_or_program, Program):
        program = expr_or_program
    else:
        program = compile_expr(expr_or_program)
    prims = np.asarray(prims, np.float32)
    if prims.ndim != 2:
        raise ValueError(f"prims must be [N, P], got shape {prims.shape}")
    n, p = prims.shape
    check_primitive_count(program, p, "evaluate_numpy")
    prims = settle(prims, xp=np).astype(np.float32)
    progress = np.asarray(progress, np.float32)
    if progress.ndim > 1 or progress.size not in (1, n):
        raise ValueError(f"progress must be a scalar or one value per row ({n}), got shape {progress.shape}")
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
                value = prims[:, int(arg)].copy()
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
            stack.append(settle(np.asarray(value, np.float32), xp=np).astype(np.float32))
    if len(stack) != 1:
        raise ValueError(f"malformed program: {len(stack)} values left on the stack")
    return stack[0]
