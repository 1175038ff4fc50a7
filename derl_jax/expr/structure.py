"""Structure classes of a reward expression, after the DERL paper, §4.2.

The paper sorts generated Meta-Rewards into three types:

1. *Stable*: linear combinations or normalisation mechanisms, e.g. `0.5*g1+0.8*g2` or
   `g1/(g2+1)` (the division acts like a sigmoid and bounds the output range).
2. *Unstable*: predominantly unbounded products without normalisation, e.g. the chain
   `g1*(g2+0.2)*g3`: if any factor approaches zero the whole reward vanishes (a "veto").
3. *Invalid*: mathematically adversarial forms, e.g. `-(g1+0.5*g2)`, which assign negative
   coefficients to positive signals and penalise desirable behaviour.

The exact rule used here (`structure(expr, num_primitives, outcome_index, aligned=...)`),
applied in order:

* **invalid** if `check(expr, num_primitives)` fails (ill-defined, constant, unknown
  primitive); or if the reward never rises with the outcome primitive nor with any of the
  domain's outcome-aligned primitives (`aligned`, `Domain.aligned_indices`): with
  D_j(x) = r(x with g_j = 1) - r(x with g_j = 0) over every probe context x (the check probe
  points, each at u in {0, 0.5, 1}), max D_j <= `MONOTONE_TOL` for j = outcome and for every
  aligned j (this includes ignoring them altogether). On symbols, `g2` (position, the dense
  aligned share) rises with none of `g1` but with `g2` itself: valid, stable. A reward that
  never rises and somewhere falls with the outcome (`g2 - g1`) stays invalid. With
  `outcome_index=None` the second test becomes "non-increasing in every primitive the
  expression uses" (max D_j <= tol for all j used).
* **unstable** if the tree contains a *product* with at least two factors that depend on
  primitives and that product is not under a bounding normalisation. A product is a maximal
  chain of `*` (looking through unary minus and through division by a constant); a power
  `a ** p` with a primitive-dependent base and constant p > 1 counts as a product of p
  factors. Bounding normalisations are: being (part of) the numerator of a division whose
  denominator depends on primitives, or an argument of `clip`, `min` or `max`.
  `u` is not a primitive: `u*g1` is a schedule, not a product of signals.
* **stable** otherwise: linear combinations (with constant or `u`-dependent weights) and
  bounded normalisations such as `g1/(g2+1)`.

Examples (outcome g1): `0.5*g1+0.8*g2` stable; `g1/(g2+1)` stable; `g1 + u*g2` stable;
`g1*g2/(g3+1)` stable; `g1*(g2+0.2)*g3` unstable; `g1**2 + g2` unstable; `-(g1+0.5*g2)`
invalid; `g2 + g3` invalid (ignores the outcome); `g1/(g2-g2)` invalid (ill-defined). With g2
aligned (`aligned=(1,)`): `g2` stable, `g2*g3` unstable, `g2 - g1` and `g3 + g4` invalid.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from derl_jax.expr.ast import Binary, Call, Expr, Num, Prim, Unary, Var, primitive_indices
from derl_jax.expr.check import PROGRESS_PROBES, Validity, check_compiled, probe_points
from derl_jax.expr.program import Program, compile_expr
from derl_jax.expr.vm import evaluate_numpy

STABLE, UNSTABLE, INVALID = "stable", "unstable", "invalid"
STRUCTURES = (STABLE, UNSTABLE, INVALID)
MONOTONE_TOL = 1e-6


def _depends(expr: Expr) -> bool:
    return bool(primitive_indices(expr))


def _constant_exponent(expr: Expr) -> Optional[float]:
    try:
        value = float(evaluate_numpy(expr, np.zeros((1, 1), np.float32), 0.0)[0])
    except Exception:  # noqa: BLE001
        return None
    return value if np.isfinite(value) else None


def _factors(expr: Expr) -> list[Expr]:
    """Multiplicative factors of `expr` (through `*`, unary minus, division by a constant)."""
    if isinstance(expr, Binary) and expr.op == "*":
        return _factors(expr.left) + _factors(expr.right)
    if isinstance(expr, Unary):
        return _factors(expr.operand)
    if isinstance(expr, Binary) and expr.op == "/" and not _depends(expr.right):
        return _factors(expr.left)
    return [expr]


def _signal_factor_count(factor: Expr) -> float:
    """How many primitive-dependent factors `factor` contributes to its product."""
    if not _depends(factor):
        return 0
    if isinstance(factor, Binary) and factor.op == "**":
        exponent = _constant_exponent(factor.right)
        if exponent is not None and exponent > 1:
            return exponent
    return 1


def has_unbounded_product(expr: Expr, normalised: bool = False) -> bool:
    """True if `expr` contains a product of >= 2 primitive-dependent factors outside a normaliser."""
    if isinstance(expr, (Num, Var, Prim)):
        return False
    if isinstance(expr, Call):
        inside = normalised or expr.fn in ("clip", "min", "max")
        return any(has_unbounded_product(a, inside) for a in expr.args)
    if isinstance(expr, Unary):
        return has_unbounded_product(expr.operand, normalised)
    assert isinstance(expr, Binary)
    if expr.op in ("*", "**") or (expr.op == "/" and not _depends(expr.right)):
        factors = _factors(expr) if expr.op != "**" else [expr]
        if not normalised and sum(_signal_factor_count(f) for f in factors) > 1:
            return True
        inner = [f.left if isinstance(f, Binary) and f.op == "**" else f for f in factors]
        return any(has_unbounded_product(f, normalised) for f in inner if f is not expr)
    if expr.op == "/":  # denominator depends on primitives: the numerator is normalised
        return has_unbounded_product(expr.left, True) or has_unbounded_product(expr.right, normalised)
    return has_unbounded_product(expr.left, normalised) or has_unbounded_product(expr.right, normalised)


def rise(expr: Expr, num_primitives: int, index: int, program: Program | None = None) -> np.ndarray:
    """D = r(g_index = 1) - r(g_index = 0) at every probe context and u (NaN entries dropped);
    `program`: `expr` already compiled."""
    program = compile_expr(expr, num_primitives=num_primitives) if program is None else program
    points = np.array(probe_points(num_primitives))
    high, low = points.copy(), points.copy()
    high[:, index], low[:, index] = 1.0, 0.0
    diffs = []
    for progress in PROGRESS_PROBES:
        d = evaluate_numpy(program, high, progress).astype(np.float64) - evaluate_numpy(program, low, progress)
        diffs.append(d[np.isfinite(d)])
    return np.concatenate(diffs)


def structure(expr: Expr, num_primitives: int, outcome_index: Optional[int] = 0, *,
              checked: tuple[Validity, Program | None] | None = None, aligned: Sequence[int] = ()) -> str:
    """"stable" | "unstable" | "invalid" by the rule in the module docstring.

    aligned: primitives besides the outcome that are outcome-aligned (`Domain.aligned_indices`);
    rising with any of them counts like rising with the outcome.

    checked: `check_compiled(expr, num_primitives, ...)` already computed for this `expr`
    (its Validity and Program), so the expression is neither compiled nor checked again.
    """
    if checked is None:
        checked = check_compiled(expr, num_primitives, outcome_index=0 if outcome_index is None else outcome_index)
    validity, program = checked
    if not validity.ok:
        return INVALID
    if outcome_index is not None:
        targets = [outcome_index, *(int(j) for j in aligned if int(j) != outcome_index)]
        bad = [j for j in targets if not 0 <= j < num_primitives]
        if bad:
            raise ValueError(f"structure: aligned primitives {bad} are not below {num_primitives}")
        rises = {j: rise(expr, num_primitives, j, program) for j in targets}
        if all(float(np.max(d, initial=-np.inf)) <= MONOTONE_TOL for d in rises.values()):
            return INVALID
        outcome = rises[outcome_index]
        if float(np.max(outcome, initial=-np.inf)) <= MONOTONE_TOL and float(np.min(outcome, initial=0.0)) < -MONOTONE_TOL:
            return INVALID   # penalises the outcome (e.g. g2 - g1), whatever the aligned signals do
    else:
        used = sorted(primitive_indices(expr))
        if all(float(np.max(rise(expr, num_primitives, j, program), initial=-np.inf)) <= MONOTONE_TOL for j in used):
            return INVALID
    if has_unbounded_product(expr):
        return UNSTABLE
    return STABLE
