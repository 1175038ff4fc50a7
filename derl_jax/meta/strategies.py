"""Outer-loop strategies: every method that proposes reward expressions, behind one protocol.

    state = strategy.init(key)
    texts, aux = strategy.propose(state, key, n)       # n expression texts
    state = strategy.update(state, texts, scores, aux) # scores f32[n], invalid ones 0

The search (`derl_jax.meta.search`) charges every strategy the same way: one unit per
proposed candidate, `iterations * num_candidates` in all, so methods are compared at an
equal budget by construction.

Strategies (`make_strategy(name, ...)`):

  derl            the Meta-Optimizer samples n expressions under the grammar; its GRPO update
                  uses the validation scores (the paper's DERL).
  derl_pop        the same proposals and updates; `population=True` tells the search to start
                  each iteration's inner policies from the previous iteration's best policy
                  (the paper's DERL-pop).
  random          the cold-started Meta-Optimizer sampled with its parameters frozen: the
                  paper's compute-controlled random search (Appendix F.2).
  evolution       REvolve-like search on expression trees (`derl_jax.meta.evolution`): the
                  first generation is sampled from the cold-started Meta-Optimizer
                  (`evolution.init="cold_start"`, so it starts where derl and random start) or
                  drawn as random trees (`"random_trees"`); later generations are mutations and
                  crossovers of the best expressions evaluated so far.
  outcome         fixed `g{o}` (o = the outcome primitive, 1-based).
  outcome_format  fixed `g1+g2` (outcome plus the format primitive).
  average         fixed `(g1+...+gk)/k`, the mean of all k primitives.
  fixed:<text>    any fixed expression.

Besides the three protocol methods a strategy has `name`, `population` (bool), `searches`
(False for fixed expressions, which need no search), `metrics(state) -> dict[str, float]`
(what the last update reported, for logging), and the checkpoint hooks
`checkpoint(state) -> (arrays, data)` — a pytree of arrays and a JSON-able dict — and
`restore(initial_state, arrays, data) -> state`, the exact inverse given an `init` state as
the template.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Protocol, Sequence, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from derl_jax.expr.grammar import Grammar
from derl_jax.expr.parse import MAX_TEXT_LENGTH, ExpressionError, parse, to_text
from derl_jax.meta import evolution

LEARNED_STRATEGIES = ("derl", "derl_pop")
SEARCH_STRATEGIES = ("derl", "derl_pop", "random", "evolution")
FIXED_PRESETS = ("outcome", "outcome_format", "average")
FIXED_PREFIX = "fixed:"
EVOLUTION_INITS = ("cold_start", "random_trees")


@runtime_checkable
class Strategy(Protocol):
    """One outer-loop method (module docstring)."""

    name: str
    population: bool
    searches: bool

    def init(self, key: jax.Array) -> Any: ...

    def propose(self, state: Any, key: jax.Array, n: int) -> tuple[list[str], Any]: ...

    def update(self, state: Any, texts: Sequence[str], scores: np.ndarray, aux: Any) -> Any: ...

    def metrics(self, state: Any) -> dict[str, float]: ...

    def checkpoint(self, state: Any) -> tuple[Any, dict]: ...

    def restore(self, initial_state: Any, arrays: Any, data: Mapping[str, Any]) -> Any: ...


class MetaOptimizerLike(Protocol):
    """What strategies need from `derl_jax.meta.optimizer.MetaOptimizer`.

    init(key) -> MetaState (a pytree of arrays; includes the cold-start SFT)
    sample(state, key, n) -> MetaSample with `texts: list[str]` (and symbols/mask/logp)
    update(state, sample, scores f32[n]) -> (MetaState, metrics dict)
    """

    def init(self, key: jax.Array) -> Any: ...

    def sample(self, state: Any, key: jax.Array, n: int) -> Any: ...

    def update(self, state: Any, sample: Any, scores: jax.Array) -> tuple[Any, Mapping[str, Any]]: ...


OptimizerFactory = Callable[[Any, Grammar], MetaOptimizerLike]


# --------------------------------------------------------------------------- helpers


def check_scores(scores: Any, n: int, where: str) -> np.ndarray:
    """`scores` as f32[n] with finite values; raises ValueError naming `where` otherwise."""
    values = np.asarray(scores, np.float32)
    if values.shape != (n,):
        raise ValueError(f"{where}: expected scores of shape ({n},), got {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{where}: scores must be finite (invalid candidates score 0), got {values.tolist()}")
    return values


def check_proposals(texts: Any, n: int, where: str) -> list[str]:
    texts = list(texts)
    if len(texts) != n:
        raise ValueError(f"{where}: asked for {n} proposals, got {len(texts)}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"{where}: proposal {i} is a {type(text).__name__}, not a str")
    return texts


def finite_metrics(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    """Metric values as Python floats (None where not finite), for logs and checkpoint JSON."""
    out: dict[str, float | None] = {}
    for name, value in metrics.items():
        number = float(np.asarray(value).reshape(()))
        out[str(name)] = number if math.isfinite(number) else None
    return out


def average_text(num_primitives: int) -> str:
    """`(g1+g2+...+gk)/k`."""
    if num_primitives < 1:
        raise ValueError(f"average_text: num_primitives must be >= 1, got {num_primitives}")
    total = "+".join(f"g{i + 1}" for i in range(num_primitives))
    return f"({total})/{num_primitives}" if num_primitives > 1 else total


def preset_text(name: str, num_primitives: int, outcome_index: int = 0) -> str:
    """The expression of a fixed baseline preset (`FIXED_PRESETS`)."""
    if not 0 <= outcome_index < num_primitives:
        raise ValueError(f"preset_text: outcome_index {outcome_index} outside 0..{num_primitives - 1}")
    outcome = f"g{outcome_index + 1}"
    if name == "outcome":
        return outcome
    if name == "outcome_format":
        if num_primitives < 2:
            raise ValueError("preset_text: 'outcome_format' needs at least 2 primitives")
        other = "g2" if outcome_index == 0 else "g1"
        return f"{outcome}+{other}"
    if name == "average":
        return average_text(num_primitives)
    raise ValueError(f"preset_text: unknown preset {name!r}; expected one of {FIXED_PRESETS}")


# --------------------------------------------------------------------------- Meta-Optimizer strategies


@dataclasses.dataclass(frozen=True)
class OptimizerStrategyState:
    """meta: the MetaState pytree; last_metrics: what the latest update reported."""

    meta: Any
    last_metrics: Mapping[str, float | None] = dataclasses.field(default_factory=dict)


class MetaOptimizerStrategy:
    """derl / derl_pop (`learn=True`) and random search (`learn=False`) over a Meta-Optimizer.

    propose: `optimizer.sample(meta, key, n)`; aux is the MetaSample.
    update: one `optimizer.update(meta, sample, scores)` GRPO step when learning; the random
    strategy leaves its cold-started parameters untouched.
    """

    searches = True

    def __init__(self, name: str, optimizer: MetaOptimizerLike, *, learn: bool, population: bool = False):
        self.name = name
        self.optimizer = optimizer
        self.learn = learn
        self.population = population

    def init(self, key: jax.Array) -> OptimizerStrategyState:
        return OptimizerStrategyState(meta=self.optimizer.init(key))

    def propose(self, state: OptimizerStrategyState, key: jax.Array, n: int) -> tuple[list[str], Any]:
        sample = self.optimizer.sample(state.meta, key, n)
        return check_proposals(sample.texts, n, f"{self.name}.propose"), sample

    def update(self, state: OptimizerStrategyState, texts: Sequence[str], scores: np.ndarray, aux: Any):
        values = check_scores(scores, len(texts), f"{self.name}.update")
        if not self.learn:
            return state
        meta, metrics = self.optimizer.update(state.meta, aux, jnp.asarray(values))
        return OptimizerStrategyState(meta=meta, last_metrics=finite_metrics(metrics))

    def metrics(self, state: OptimizerStrategyState) -> dict[str, float | None]:
        return dict(state.last_metrics)

    def checkpoint(self, state: OptimizerStrategyState) -> tuple[Any, dict]:
        return state.meta, {"last_metrics": dict(state.last_metrics)}

    def restore(self, initial_state: OptimizerStrategyState, arrays: Any, data: Mapping[str, Any]):
        return OptimizerStrategyState(meta=arrays, last_metrics=dict(data.get("last_metrics", {})))


# --------------------------------------------------------------------------- fixed expressions


class FixedStrategy:
    """Always proposes `text`; nothing to learn. Fixed baselines skip the search in the protocol."""

    searches = False
    population = False

    def __init__(self, name: str, text: str):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"fixed strategy {name!r}: the expression must be a non-empty string, got {text!r}")
        self.name = name
        self.text = text

    def init(self, key: jax.Array) -> tuple:
        return ()

    def propose(self, state: tuple, key: jax.Array, n: int) -> tuple[list[str], None]:
        return [self.text] * n, None

    def update(self, state: tuple, texts: Sequence[str], scores: np.ndarray, aux: Any) -> tuple:
        check_scores(scores, len(texts), f"{self.name}.update")
        return state

    def metrics(self, state: tuple) -> dict[str, float]:
        return {}

    def checkpoint(self, state: tuple) -> tuple[dict, dict]:
        return {}, {}

    def restore(self, initial_state: tuple, arrays: Any, data: Mapping[str, Any]) -> tuple:
        return ()


def fixed(text: str, name: str | None = None) -> FixedStrategy:
    """A strategy that always proposes `text` (named `fixed:<text>` unless `name` is given)."""
    return FixedStrategy(name or f"{FIXED_PREFIX}{text}", text)


# --------------------------------------------------------------------------- evolution


@dataclasses.dataclass(frozen=True)
class EvolutionSearchState:
    """population: the evolving `evolution.EvolutionState`; first_generation: cold-start texts
    still to be proposed (empty once used or with random-tree initialisation)."""

    population: evolution.EvolutionState
    first_generation: tuple[str, ...] = ()
    generation: int = 0


class EvolutionStrategy:
    """Mutation/crossover search over expression trees with tournament selection.

    Generation 0 is the cold-start sample drawn in `init` (or random trees); afterwards each
    proposal is `EvolutionState.propose`, children of the best `capacity` expressions seen so
    far. Candidates that score 0 — every invalid one, and a valid one whose policy solved no
    validation problem — never enter the population.
    """

    searches = True
    population = False

    def __init__(
        self,
        name: str,
        primitive_names: Sequence[str],
        *,
        num_candidates: int,
        initialisation: str = "cold_start",
        optimizer: MetaOptimizerLike | None = None,
        capacity: int = 16,
        tournament: int = 3,
        mutation_rate: float = 0.5,
        initial_depth: int = 4,
    ):
        if initialisation not in EVOLUTION_INITS:
            raise ValueError(f"evolution strategy: init must be one of {EVOLUTION_INITS}, got {initialisation!r}")
        if initialisation == "cold_start" and optimizer is None:
            raise ValueError("evolution strategy: init='cold_start' needs a Meta-Optimizer to sample from")
        self.name = name
        self.primitive_names = tuple(primitive_names)
        self.num_candidates = int(num_candidates)
        self.initialisation = initialisation
        self.optimizer = optimizer
        self.capacity = int(capacity)
        self.tournament = int(tournament)
        self.mutation_rate = float(mutation_rate)
        self.initial_depth = int(initial_depth)

    def init(self, key: jax.Array) -> EvolutionSearchState:
        first: tuple[str, ...] = ()
        if self.initialisation == "cold_start":
            init_key, sample_key = jax.random.split(key)
            meta = self.optimizer.init(init_key)
            sample = self.optimizer.sample(meta, sample_key, self.num_candidates)
            first = tuple(check_proposals(sample.texts, self.num_candidates, f"{self.name}.init"))
        return EvolutionSearchState(population=evolution.EvolutionState(capacity=self.capacity), first_generation=first)

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
            initial_depth=self.initial_depth,
            tournament=self.tournament,
            mutation_rate=self.mutation_rate,
            accept=_fits_text_limit,
        )
        return [to_text(tree) for tree in trees], None

    def update(self, state: EvolutionSearchState, texts: Sequence[str], scores: np.ndarray, aux: Any):
        values = check_scores(scores, len(texts), f"{self.name}.update")
        trees, tree_scores = [], []
        for text, score in zip(texts, values):
            tree = self._tree(text)
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
            population=evolution.EvolutionState.from_json(data["population"]),
            first_generation=tuple(data["first_generation"]),
            generation=int(data["generation"]),
        )

    def _tree(self, text: str):
        try:
            tree = parse(text, self.primitive_names)
        except ExpressionError:
            return None
        try:
            evolution.check_expr(tree, len(self.primitive_names), where=f"{self.name} candidate {text!r}")
        except ValueError:
            return None
        return tree


def _fits_text_limit(tree) -> bool:
    return len(to_text(tree)) <= MAX_TEXT_LENGTH


# --------------------------------------------------------------------------- registry


def strategy_names() -> tuple[str, ...]:
    """Names `make_strategy` accepts (plus `fixed:<expression>`)."""
    return SEARCH_STRATEGIES + FIXED_PRESETS


def is_known_strategy(name: str) -> bool:
    return name in strategy_names() or (isinstance(name, str) and name.startswith(FIXED_PREFIX))


def default_optimizer_factory(cfg: Any, grammar: Grammar) -> MetaOptimizerLike:
    from derl_jax.meta.optimizer import MetaOptimizer

    return MetaOptimizer(cfg, grammar)


def make_strategy(
    name: str,
    cfg: Any,
    grammar: Grammar | None,
    primitive_names: Sequence[str],
    *,
    outcome_index: int = 0,
    optimizer_factory: OptimizerFactory | None = None,
):
    """The strategy called `name` (module docstring) for a run configured by `cfg`.

    cfg: the run's ConfigDict (reads `outer.num_candidates` and the `evolution` fields; the
        Meta-Optimizer gets the whole cfg).
    grammar: the Meta-Optimizer's grammar (needed by derl, derl_pop, random and cold-started
        evolution; may be None for fixed expressions and random-tree evolution).
    optimizer_factory: `(cfg, grammar) -> MetaOptimizer`; defaults to
        `derl_jax.meta.optimizer.MetaOptimizer`.
    """
    primitive_names = tuple(primitive_names)
    num_primitives = len(primitive_names)
    factory = optimizer_factory or default_optimizer_factory
    if not is_known_strategy(name):
        raise ValueError(f"make_strategy: unknown strategy {name!r}; expected one of {strategy_names()} or 'fixed:<expr>'")
    if name.startswith(FIXED_PREFIX):
        return fixed(name[len(FIXED_PREFIX) :])
    if name in FIXED_PRESETS:
        return fixed(preset_text(name, num_primitives, outcome_index), name)
    if name == "evolution":
        evo = cfg.evolution
        optimizer = factory(cfg, _need_grammar(grammar, name)) if evo.init == "cold_start" else None
        return EvolutionStrategy(
            name,
            primitive_names,
            num_candidates=cfg.outer.num_candidates,
            initialisation=evo.init,
            optimizer=optimizer,
            capacity=evo.capacity,
            tournament=evo.tournament,
            mutation_rate=evo.mutation_rate,
            initial_depth=evo.initial_depth,
        )
    optimizer = factory(cfg, _need_grammar(grammar, name))
    return MetaOptimizerStrategy(name, optimizer, learn=name in LEARNED_STRATEGIES, population=name == "derl_pop")


def _need_grammar(grammar: Grammar | None, name: str) -> Grammar:
    if grammar is None:
        raise ValueError(f"make_strategy: strategy {name!r} samples from the Meta-Optimizer and needs a grammar")
    return grammar
