"""One proposed reward text, read once: parsed, compiled, checked, classified.

    candidate = examine("g1 + 0.5*g2", ("correct", "boxed"))
    candidate.valid, candidate.reason       # True, ""
    candidate.program                       # the Program the inner loop runs (the checked one)
    candidate.canonical, candidate.structure

The text is parsed once and compiled once; that one `Program` is what the check evaluates on
its probe points (`check.check_compiled`), what the structure class measures
(`structure.structure(..., checked=...)`) and what the inner loop trains with.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from derl_jax.expr.ast import Expr
from derl_jax.expr.canonical import canonical
from derl_jax.expr.check import Validity, check_compiled, num_primitives_of
from derl_jax.expr.parse import ExpressionError, parse
from derl_jax.expr.program import Program
from derl_jax.expr.structure import INVALID, structure


@dataclasses.dataclass(frozen=True)
class Candidate:
    """`expr` is None when the text does not parse; `program` is set exactly when `valid`;
    `canonical` is None when the text does not parse; `structure` is "invalid" when not `valid`."""

    text: str
    expr: Expr | None
    program: Program | None
    validity: Validity
    canonical: str | None
    structure: str

    @property
    def valid(self) -> bool:
        return self.validity.ok

    @property
    def reason(self) -> str:
        """Why the text is not a valid reward ('' when it is)."""
        return self.validity.reason


def examine(text: str, primitive_names: Sequence[str] | Mapping[str, int], outcome_index: int = 0,
            operators: str = "extended") -> Candidate:
    """`text` as a Candidate (module docstring); never raises for a bad text. `operators`: the
    operator set the text may use (`derl_jax.expr.parse.OPERATOR_SETS`; outside it the text is
    invalid with the parser's reason)."""
    try:
        expr = parse(text, primitive_names, operators)
    except ExpressionError as err:
        return Candidate(text, None, None, Validity(False, f"parse error at {err.position}: {err.reason}"), None, INVALID)
    num_primitives = num_primitives_of(primitive_names)
    validity, program = check_compiled(expr, num_primitives, outcome_index=outcome_index)
    if not validity.ok:
        return Candidate(text, expr, None, validity, canonical(expr), INVALID)
    shape = structure(expr, num_primitives, outcome_index, checked=(validity, program))
    return Candidate(text, expr, program, validity, canonical(expr), shape)
