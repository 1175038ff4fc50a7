"""The evolving population of the evolution baseline: selection, generations, the state.

    state = EvolutionState(capacity=16)
    children = state.propose(rng, n, num_primitives=4)      # new trees (elites are not re-proposed)
    state = state.update(children, scores)                   # scores: validation accuracy or None

Selection is by tournament over validation scores (None/NaN never preferred); children are
mutations and crossovers (`derl_jax.methods.evolution.operators`) of the selected parents. The state
serialises to JSON (`to_json` / `from_json`) for checkpoints.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from derl_jax.expr.ast import BINARY_OPS, FUNCTIONS, Binary, Call, Expr, Num, Prim, Unary, Var
from derl_jax.methods.evolution.operators import (
    MAX_DEPTH,
    MAX_NODES,
    Accept,
    as_generator,
    check_expr,
    crossover,
    mutate,
    random_expr,
)


# --------------------------------------------------------------------------- selection


def _selection_scores(scores: Sequence[float | None]) -> np.ndarray:
    """f64[P] with None/NaN as -inf (never preferred over a real score)."""
    values = np.array([np.nan if s is None else float(s) for s in scores], np.float64)
    return np.where(np.isnan(values), -np.inf, values)


def rank_by_score(scores: Sequence[float | None]) -> list[int]:
    """Indices from best to worst score; ties keep the given order; None/NaN last."""
    values = _selection_scores(scores)
    return [int(i) for i in np.argsort(-values, kind="stable")]


def tournament_select(scores: Sequence[float | None], rng: np.random.Generator, size: int) -> int:
    """Index of the best of `size` members drawn without replacement (with, if `size` > population)."""
    values = _selection_scores(scores)
    if len(values) == 0:
        raise ValueError("tournament_select: empty population")
    if size < 1:
        raise ValueError(f"tournament_select: tournament size must be >= 1, got {size}")
    entrants = rng.choice(len(values), size=size, replace=size > len(values))
    return int(entrants[int(np.argmax(values[entrants]))])


def next_generation(
    population: Sequence[Expr],
    scores: Sequence[float | None],
    rng: np.random.Generator,
    n: int,
    *,
    num_primitives: int,           # primitives g1..gk the trees may use
    elite: int = 1,                # best members carried over unchanged
    tournament: int = 3,           # members drawn per tournament
    mutation_rate: float = 0.5,    # probability that a child is a mutation, not a crossover
    max_nodes: int = MAX_NODES,    # size limit of every tree, members and children
    max_depth: int = MAX_DEPTH,    # depth limit of every tree, members and children
    accept: Accept | None = None,  # extra test a child must pass (None: any child within the limits)
    unique_attempts: int = 8,      # redraws of a child already in the generation
    operators: str = "extended",   # the operator set mutations draw from (operators.py docstring)
) -> list[Expr]:
    """`n` trees: the `elite` best of `population` unchanged, then children of tournament winners.

    Each child is `mutate(winner)` with probability `mutation_rate`, else
    `crossover(winner, other winner)`. Children already in the new generation are redrawn
    (up to `unique_attempts` times) so a generation rarely evaluates a tree twice.
    scores: one per member; None/NaN (invalid) lose every comparison.
    """
    rng = as_generator(rng)
    if len(population) == 0:
        raise ValueError("next_generation: population is empty")
    if len(scores) != len(population):
        raise ValueError(f"next_generation: {len(scores)} scores for {len(population)} members")
    if n < 0 or elite < 0:
        raise ValueError(f"next_generation: n and elite must be >= 0, got n={n}, elite={elite}")
    if not 0.0 <= mutation_rate <= 1.0:
        raise ValueError(f"next_generation: mutation_rate must be in [0, 1], got {mutation_rate}")
    for i, member in enumerate(population):
        check_expr(member, num_primitives, max_nodes=max_nodes, max_depth=max_depth, where=f"next_generation: member {i}")
    limits = dict(max_nodes=max_nodes, max_depth=max_depth, accept=accept)
    generation: list[Expr] = []
    seen: set[Expr] = set()
    for index in rank_by_score(scores):
        if len(generation) >= min(elite, n):
            break
        if population[index] not in seen:
            generation.append(population[index])
            seen.add(population[index])
    while len(generation) < n:
        for attempt in range(unique_attempts):
            parent = population[tournament_select(scores, rng, tournament)]
            if rng.random() < mutation_rate or len(population) == 1:
                child = mutate(parent, rng, num_primitives, operators=operators, **limits)
            else:
                other = population[tournament_select(scores, rng, tournament)]
                child = crossover(parent, other, rng, **limits)
            if child not in seen:
                break
        generation.append(child)
        seen.add(child)
    return generation


# --------------------------------------------------------------------------- state


@dataclasses.dataclass(frozen=True)
class EvolutionState:
    """The evolving population: up to `capacity` distinct trees with their scores, best first.

    Survivors stay in the state across generations, so `propose` returns only new
    children (elites are kept, not re-evaluated). Scores are validation accuracies;
    None/NaN (an invalid or failed candidate) are not kept. A tree scored twice keeps its
    higher score.
    """

    members: tuple[tuple[Expr, float], ...] = ()
    capacity: int = 16

    def __post_init__(self):
        if self.capacity < 1:
            raise ValueError(f"EvolutionState: capacity must be >= 1, got {self.capacity}")

    @property
    def population(self) -> list[Expr]:
        return [expr for expr, _ in self.members]

    @property
    def scores(self) -> list[float]:
        return [score for _, score in self.members]

    @property
    def best(self) -> tuple[Expr, float] | None:
        return self.members[0] if self.members else None

    def update(self, exprs: Sequence[Expr], scores: Sequence[float | None]) -> "EvolutionState":
        """Merge evaluated trees in and keep the `capacity` best (ties: earlier members first)."""
        if len(exprs) != len(scores):
            raise ValueError(f"EvolutionState.update: {len(exprs)} trees but {len(scores)} scores")
        best_score: dict[Expr, float] = {}
        order: list[Expr] = []
        candidates = list(self.members) + list(zip(exprs, scores))
        for expr, score in candidates:
            if score is None or not math.isfinite(float(score)):
                continue
            if expr not in best_score:
                order.append(expr)
                best_score[expr] = float(score)
            else:
                best_score[expr] = max(best_score[expr], float(score))
        ranked = sorted(order, key=lambda e: -best_score[e])  # sorted() is stable
        return dataclasses.replace(self, members=tuple((e, best_score[e]) for e in ranked[: self.capacity]))

    def propose(
        self,
        rng: np.random.Generator,
        n: int,
        *,
        num_primitives: int,
        initial_depth: int = 4,
        tournament: int = 3,
        mutation_rate: float = 0.5,
        max_nodes: int = MAX_NODES,
        max_depth: int = MAX_DEPTH,
        accept: Accept | None = None,
        operators: str = "extended",
    ) -> list[Expr]:
        """`n` new trees in the operator set `operators`: random ones (depth <= `initial_depth`)
        while the population is empty, otherwise `next_generation(..., elite=0)` of the members."""
        rng = as_generator(rng)
        if not self.members:
            trees = []
            for _ in range(n):
                tree = random_expr(rng, num_primitives, initial_depth, max_nodes=max_nodes, operators=operators)
                for _ in range(32):
                    if accept is None or accept(tree):
                        break
                    tree = random_expr(rng, num_primitives, initial_depth, max_nodes=max_nodes, operators=operators)
                trees.append(tree)
            return trees
        return next_generation(
            self.population,
            self.scores,
            rng,
            n,
            num_primitives=num_primitives,
            elite=0,
            tournament=tournament,
            mutation_rate=mutation_rate,
            max_nodes=max_nodes,
            max_depth=max_depth,
            accept=accept,
            operators=operators,
        )

    def to_json(self) -> dict:
        """JSON-able form (for checkpoint metadata); `from_json` inverts it exactly."""
        return {"capacity": self.capacity, "members": [[expr_to_data(e), s] for e, s in self.members]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "EvolutionState":
        try:
            members = tuple((expr_from_data(e), float(s)) for e, s in data["members"])
            return cls(members=members, capacity=int(data["capacity"]))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"EvolutionState.from_json: malformed data ({err})") from err


# --------------------------------------------------------------------------- serialization


def expr_to_data(expr: Expr) -> Any:
    """A JSON-able nested list: ["num", v] ["var", name] ["prim", i, name] ["neg", x] [op, l, r] ["call", fn, *args]."""
    if isinstance(expr, Num):
        return ["num", float(expr.value)]
    if isinstance(expr, Var):
        return ["var", expr.name]
    if isinstance(expr, Prim):
        return ["prim", expr.index, expr.name]
    if isinstance(expr, Unary):
        return [expr.op, expr_to_data(expr.operand)]
    if isinstance(expr, Binary):
        return [expr.op, expr_to_data(expr.left), expr_to_data(expr.right)]
    if isinstance(expr, Call):
        return ["call", expr.fn, *[expr_to_data(a) for a in expr.args]]
    raise TypeError(f"expr_to_data: not an Expr node: {type(expr).__name__}")


def expr_from_data(data: Any) -> Expr:
    """Inverse of `expr_to_data`; raises ValueError on anything else."""
    if not isinstance(data, (list, tuple)) or not data:
        raise ValueError(f"expr_from_data: expected a non-empty list, got {data!r}")
    tag, rest = data[0], list(data[1:])
    if tag == "num" and len(rest) == 1:
        return Num(float(rest[0]))
    if tag == "var" and len(rest) == 1:
        return Var(str(rest[0]))
    if tag == "prim" and len(rest) == 2:
        return Prim(int(rest[0]), str(rest[1]))
    if tag == "neg" and len(rest) == 1:
        return Unary("neg", expr_from_data(rest[0]))
    if tag in BINARY_OPS and len(rest) == 2:
        return Binary(tag, expr_from_data(rest[0]), expr_from_data(rest[1]))
    if tag == "call" and rest and FUNCTIONS.get(rest[0]) == len(rest) - 1:
        return Call(str(rest[0]), tuple(expr_from_data(a) for a in rest[1:]))
    raise ValueError(f"expr_from_data: malformed node {data!r}")
