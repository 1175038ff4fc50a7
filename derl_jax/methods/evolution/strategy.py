"""REvolve-like evolutionary search on expression trees (`derl_jax.methods.evolution.operators`,
`derl_jax.methods.evolution.population`).

The first generation is sampled from the cold-started Meta-Optimizer (`evolution.init =
"cold_start"`, so it starts where derl and random start) or drawn as random trees
(`"random_trees"`); later generations are mutations and crossovers of the best expressions
evaluated so far, chosen by tournament. Every tree keeps to `config.meta.operators`, the
operator set the search loop checks candidates against.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from derl_jax.config import ConfigError, choice, int_at_least, number
from derl_jax.expr.parse import MAX_NESTING, MAX_TEXT_LENGTH, ExpressionError, check_operators, parse, to_text
from derl_jax.methods.derl.optimizer import MetaOptimizer
from derl_jax.methods.derl.settings import check_meta_block
from derl_jax.methods.evolution import operators as evolution
from derl_jax.methods.evolution.population import EvolutionState
from derl_jax.outer import strategy as base
from derl_jax.outer.strategy import CandidateRecord, Strategy, check_proposals, check_update
from derl_jax.outer.checks import operator_set
from derl_jax.outer.registry import register_strategy

EVOLUTION_INITS = ("cold_start", "random_trees")


@dataclasses.dataclass(frozen=True)
class EvolutionSearchState:
    """population: the evolving `EvolutionState`; first_generation: cold-start texts
    still to be proposed (empty once used or with random-tree initialisation)."""

    population: EvolutionState
    first_generation: tuple[str, ...] = ()
    generation: int = 0


def check_evolution_block(cfg: Any, inits: Sequence[str]) -> None:
    """`config.evolution` (and the Meta-Optimizer's block when it cold-starts the population)."""
    initialisation = choice(cfg, "evolution.init", inits)
    int_at_least(cfg, "evolution.capacity", 1)
    int_at_least(cfg, "evolution.tournament", 1)
    rate = number(cfg, "evolution.mutation_rate", minimum=0.0, strict=False)
    if rate > 1.0:
        raise ConfigError(f"config.evolution.mutation_rate must be in [0, 1], got {rate!r}")
    initial_depth = int_at_least(cfg, "evolution.initial_depth", 1)
    if initial_depth > MAX_NESTING:
        raise ConfigError(f"config.evolution.initial_depth must be <= {MAX_NESTING}, got {initial_depth}")
    if initialisation == "cold_start":
        check_meta_block(cfg)


@register_strategy("evolution")
class EvolutionStrategy(Strategy):
    """Mutation and crossover of expression trees, with tournament selection.

    Candidates that score 0 — every invalid one, and a valid one whose policy solved no
    validation problem — never enter the population."""

    def __init__(
        self,
        primitive_names: Sequence[str],
        *,
        num_candidates: int,
        initialisation: str = "cold_start",
        optimizer: base.MetaOptimizerLike | None = None,
        capacity: int = 16,
        tournament: int = 3,
        mutation_rate: float = 0.5,
        initial_depth: int = 4,
        operators: str = "extended",
    ):
        if initialisation not in EVOLUTION_INITS:
            raise ValueError(f"evolution strategy: init must be one of {EVOLUTION_INITS}, got {initialisation!r}")
        if initialisation == "cold_start" and optimizer is None:
            raise ValueError("evolution strategy: init='cold_start' needs a Meta-Optimizer to sample from")
        self.primitive_names = tuple(primitive_names)
        self.num_candidates = int(num_candidates)
        self.initialisation = initialisation
        self.optimizer = optimizer
        self.capacity = int(capacity)
        self.operators = check_operators(operators, "evolution strategy: operators")
        # how `EvolutionState.propose` breeds each generation
        self.breeding = {"tournament": int(tournament), "mutation_rate": float(mutation_rate),
                         "initial_depth": int(initial_depth)}

    @classmethod
    def from_config(cls, name: str, context: base.StrategyContext) -> "EvolutionStrategy":
        evo = context.cfg.evolution
        optimizer = context.optimizer(name, MetaOptimizer) if evo.init == "cold_start" else None
        return cls(
            context.primitive_names,
            num_candidates=context.cfg.outer.num_candidates,
            initialisation=evo.init,
            optimizer=optimizer,
            capacity=evo.capacity,
            tournament=evo.tournament,
            mutation_rate=evo.mutation_rate,
            initial_depth=evo.initial_depth,
            operators=operator_set(context.cfg),
        )

    @classmethod
    def check_config(cls, cfg: Any, name: str) -> None:
        check_evolution_block(cfg, EVOLUTION_INITS)

    def init(self, key: jax.Array) -> EvolutionSearchState:
        first: tuple[str, ...] = ()
        if self.initialisation == "cold_start":
            init_key, sample_key = jax.random.split(key)
            meta = self.optimizer.init(init_key)
            sample = self.optimizer.sample(meta, sample_key, self.num_candidates)
            first = tuple(check_proposals(sample.texts, self.num_candidates, f"{self.name}.init"))
        return EvolutionSearchState(population=EvolutionState(capacity=self.capacity), first_generation=first)

    def propose(self, state: EvolutionSearchState, key: jax.Array, n: int) -> tuple[list[str], None]:
        if state.first_generation:
            if n != len(state.first_generation):
                raise ValueError(
                    f"{self.name}.propose: the cold-start generation holds {len(state.first_generation)} "
                    f"expressions but {n} were asked for"
                )
            return list(state.first_generation), None
        trees = state.population.propose(
            evolution.as_generator(key),
            n,
            num_primitives=len(self.primitive_names),
            accept=_fits_text_limit,
            operators=self.operators,
            **self.breeding,
        )
        return [to_text(tree) for tree in trees], None

    def update(self, state: EvolutionSearchState, records: Sequence[CandidateRecord], scores: np.ndarray, aux: Any):
        values = check_update(records, scores, f"{self.name}.update")
        trees, tree_scores = [], []
        for record, score in zip(records, values):
            tree = self._tree(record.text)
            if tree is not None:
                trees.append(tree)
                # zero is what every invalid candidate gets; keep such trees out of the gene pool
                tree_scores.append(float(score) if score > 0 else None)
        return EvolutionSearchState(
            population=state.population.update(trees, tree_scores), first_generation=(), generation=state.generation + 1
        )

    def metrics(self, state: EvolutionSearchState) -> dict[str, float]:
        best = state.population.best
        return {"population_size": float(len(state.population.members)), "population_best": best[1] if best else 0.0}

    def checkpoint(self, state: EvolutionSearchState) -> tuple[dict, dict]:
        return {}, {
            "population": state.population.to_json(),
            "first_generation": list(state.first_generation),
            "generation": state.generation,
        }

    def restore(self, initial_state: EvolutionSearchState, arrays: Any, data: Mapping[str, Any]):
        return EvolutionSearchState(
            population=EvolutionState.from_json(data["population"]),
            first_generation=tuple(data["first_generation"]),
            generation=int(data["generation"]),
        )

    def _tree(self, text: str):
        try:
            tree = parse(text, self.primitive_names, self.operators)
        except ExpressionError:
            return None
        try:
            evolution.check_expr(tree, len(self.primitive_names), where=f"{self.name} candidate {text!r}")
        except ValueError:
            return None
        return tree


def _fits_text_limit(tree) -> bool:
    return len(to_text(tree)) <= MAX_TEXT_LENGTH
