"""Is an expression a well-defined reward? `check` decides on a fixed set of probe points.

An expression is ill-defined (``Validity.ok`` is False, ``reason`` says why) when it

* references a primitive index >= num_primitives ("unknown primitive g7"), or cannot be
  compiled ("program: ...": too long / too deep);
* evaluates to NaN (an ill-defined value under the VM's rules: near-zero denominator,
  negative base with fractional exponent, overflow) anywhere on the probe set
  ("not finite at g=(0, 1, 0), u=0");
* exceeds `MAX_ABS_REWARD` (1e4) in magnitude anywhere on the probe set;
* is constant in every primitive: for each probed u, the values over all primitive probe
  points agree within `CONSTANT_TOL` ("constant: does not depend on any primitive").

Probe set (deterministic): all corners of {0,1}^k (for k <= `MAX_CORNER_DIM`; beyond that
`MAX_CORNERS` corners drawn with a fixed seed) plus `NUM_RANDOM_PROBES` (64) points uniform
in [0,1]^k from seed `PROBE_SEED`; each point at every u in `PROGRESS_PROBES` (0, 0.5, 1).
Evaluation uses `vm.evaluate_numpy`, i.e. exactly the VM's float32 semantics.

`check_text(text, primitive_names, operators=...)` parses first (under the operator set
`operators`, `derl_jax.expr.parse.OPERATOR_SETS`) and reports a parse failure as an invalid
Validity with reason "parse error at N: ..." (a text outside the "paper" set: "parse error at
N: u (training progress) is not in the paper operator set ..."). Reasons are short strings kept as data (they
go to history.jsonl and the reports).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping, Sequence

import numpy as np

from derl_jax.expr.ast import Expr, primitive_indices
from derl_jax.expr.parse import ExpressionError, parse
from derl_jax.expr.program import Program, ProgramError, compile_expr
from derl_jax.expr.vm import evaluate_numpy

MAX_ABS_REWARD = 1e4
CONSTANT_TOL = 1e-6
NUM_RANDOM_PROBES = 64
PROBE_SEED = 0
PROGRESS_PROBES = (0.0, 0.5, 1.0)
MAX_CORNER_DIM = 10
MAX_CORNERS = 1024


@dataclasses.dataclass(frozen=True)
class Validity:
    """`ok`; `reason` ('' when ok) is a short human-readable string; `detail` adds where."""

    ok: bool
    reason: str = ""
    detail: str = ""

    def __bool__(self) -> bool:
        return self.ok


VALID = Validity(True)


@functools.lru_cache(maxsize=64)
def probe_points(num_primitives: int) -> np.ndarray:
    """f32[M, k]: the corners of {0,1}^k then NUM_RANDOM_PROBES uniform points (read-only)."""
    k = int(num_primitives)
    if k <= 0:
        raise ValueError(f"num_primitives must be positive, got {num_primitives}")
    rng = np.random.default_rng(PROBE_SEED)
    if k <= MAX_CORNER_DIM:
        codes = np.arange(2**k)
    else:
        codes = rng.choice(2**min(k, 62), size=MAX_CORNERS, replace=False)
    corners = ((codes[:, None] >> np.arange(k)[None, :]) & 1).astype(np.float32)
    random = rng.random((NUM_RANDOM_PROBES, k), dtype=np.float32)
    points = np.concatenate([corners, random]).astype(np.float32)
    points.setflags(write=False)
    return points


def _where(point: np.ndarray, progress: float) -> str:
    values = ", ".join(f"{v:.3g}" for v in point)
    return f"g=({values}), u={progress:g}"


def check(expr: Expr, num_primitives: int, *, outcome_index: int = 0, probes: np.ndarray | None = None) -> Validity:
    """Validity of `expr` as a reward over `num_primitives` primitives (module docstring).

    `probes`: optional f32[M, num_primitives] points replacing the default probe set.
    `outcome_index` must name one of the primitives (it is what `structure` measures against).
    """
    return check_compiled(expr, num_primitives, outcome_index=outcome_index, probes=probes)[0]


def check_compiled(expr: Expr, num_primitives: int, *, outcome_index: int = 0,
                   probes: np.ndarray | None = None) -> tuple[Validity, Program | None]:
    """(`check`'s Validity, the Program it compiled and ran on the probes; None when it could not
    compile), so that a caller needing the program does not compile the expression again."""
    if not 0 <= outcome_index < num_primitives:
        raise ValueError(f"outcome_index {outcome_index} is not a primitive index below {num_primitives}")
    unknown = sorted(i for i in primitive_indices(expr) if i >= num_primitives)
    if unknown:
        names = ", ".join(f"g{i + 1}" for i in unknown)
        return Validity(False, f"unknown primitive {names}", f"only g1..g{num_primitives} exist"), None
    try:
        program = compile_expr(expr, num_primitives=num_primitives)
    except ProgramError as err:
        return Validity(False, f"program: {err}"), None
    points = probe_points(num_primitives) if probes is None else np.asarray(probes, np.float32)
    if points.ndim != 2 or points.shape[1] != num_primitives:
        raise ValueError(f"probes must be [M, {num_primitives}], got {points.shape}")
    spreads = []
    for progress in PROGRESS_PROBES:
        values = evaluate_numpy(program, points, progress)
        bad = ~np.isfinite(values)
        if bad.any():
            j = int(np.argmax(bad))
            return Validity(False, "not finite (NaN) on a probe point", _where(points[j], progress)), program
        big = np.abs(values) > MAX_ABS_REWARD
        if big.any():
            j = int(np.argmax(big))
            return Validity(
                False, f"|reward| > {MAX_ABS_REWARD:g} on a probe point", f"{values[j]:.4g} at {_where(points[j], progress)}"
            ), program
        scale = max(1.0, float(np.max(np.abs(values))))
        spreads.append(float(np.max(values) - np.min(values)) / scale)
    if max(spreads) <= CONSTANT_TOL:
        return Validity(False, "constant: does not depend on any primitive"), program
    return VALID, program


def num_primitives_of(primitive_names: Sequence[str] | Mapping[str, int]) -> int:
    """How many primitives a name list (or a symbol table name -> index) stands for."""
    if isinstance(primitive_names, Mapping):
        return max(primitive_names.values(), default=-1) + 1
    return len(primitive_names)


def check_text(text: str, primitive_names: Sequence[str] | Mapping[str, int], *, outcome_index: int = 0,
               operators: str = "extended"):
    """Parse (under `operators`) then check -> (Expr or None, Validity); a parse failure is
    "parse error at N: ..."."""
    try:
        expr = parse(text, primitive_names, operators)
    except ExpressionError as err:
        return None, Validity(False, f"parse error at {err.position}: {err.reason}")
    return expr, check(expr, num_primitives_of(primitive_names), outcome_index=outcome_index)
