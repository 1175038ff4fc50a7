"""The reward expression language: parse, canonical form, programs, the VM, validity, structure.

    expr = parse("g1 + 0.5*g2*(g3/2)", ["outcome", "format", "steps"])
    canonical(expr)                   # "g1 + g2*g3/4": key for "the same reward"
    program = compile_expr(expr)      # fixed-size postfix arrays; stack many with stack_programs
    evaluate(program, prims, u)       # f32[N, P], f32[] -> f32[N]; jit/vmap-able
    check(expr, 3), structure(expr, 3)
    examine("g1 + 0.5*g2", names)     # all of it at once, compiled once: the Candidate the outer loop trains
"""

from derl_jax.expr.ast import (
    BINARY_OPS,
    FUNCTIONS,
    PROGRESS_VAR,
    Binary,
    Call,
    Expr,
    Num,
    Prim,
    Unary,
    Var,
    children,
    depth,
    node_count,
    primitive_indices,
    walk,
)
from derl_jax.expr.candidate import Candidate, examine
from derl_jax.expr.canonical import canonical, to_latex, to_sympy
from derl_jax.expr.check import Validity, check, check_text
from derl_jax.expr.parse import MAX_NESTING, MAX_NODES, MAX_TEXT_LENGTH, ExpressionError, parse, to_text
from derl_jax.expr.program import (
    MAX_PROGRAM_LENGTH,
    STACK_SIZE,
    Program,
    ProgramError,
    compile_expr,
    max_stack_depth,
    stack_programs,
)
from derl_jax.expr.structure import INVALID, STABLE, STRUCTURES, UNSTABLE, structure
from derl_jax.expr.vm import DIV_EPS, evaluate, evaluate_batch, evaluate_numpy

__all__ = [
    "BINARY_OPS", "FUNCTIONS", "PROGRESS_VAR", "Binary", "Call", "Expr", "Num", "Prim", "Unary", "Var",
    "children", "depth", "node_count", "primitive_indices", "walk",
    "Candidate", "examine", "canonical", "to_latex", "to_sympy",
    "Validity", "check", "check_text",
    "MAX_NESTING", "MAX_NODES", "MAX_TEXT_LENGTH", "ExpressionError", "parse", "to_text",
    "MAX_PROGRAM_LENGTH", "STACK_SIZE", "Program", "ProgramError", "compile_expr", "max_stack_depth",
    "stack_programs",
    "INVALID", "STABLE", "STRUCTURES", "UNSTABLE", "structure",
    "DIV_EPS", "evaluate", "evaluate_batch", "evaluate_numpy",
]
