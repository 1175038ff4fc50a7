"""What every outer-loop method is: a `Strategy` that proposes expressions and learns from records.

    state = strategy.init(key)
    texts, aux = strategy.propose(state, key, n)                 # n expression texts
    state = strategy.update(state, records, scores, aux)         # records: n CandidateRecords

The search (`derl_jax.outer.search`) charges every strategy the same way: one unit per proposed
candidate, `iterations * num_candidates` in all, so methods are compared at an equal budget by
construction. `records[j]` describes proposal j after checking and inner training (text,
canonical form, validity and the reason of a rejection, validation score, per-step inner
training curves); `scores` is `f32[n]` with `scores[j] == records[j].score` (invalid ones 0).

A strategy also has `name`, `population` (True: the search starts each iteration's inner
policies from the previous iteration's best policy), `searches` (False for fixed expressions,
which need no search), `metrics(state) -> dict[str, float]` (what the last update reported, for
logging), and the checkpoint hooks `checkpoint(state) -> (arrays, data)` — a pytree of arrays
and a JSON-able dict — and `restore(initial_state, arrays, data) -> state`, the exact inverse
given an `init` state as the template.

Strategies are built from the run's config through `from_config(name, context)` and check
their own config fields in `check_config(cfg, name)` (see `derl_jax.outer.registry`).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class CandidateRecord:
    """One evaluated proposal, as `Strategy.update` and the history see it.

    iteration, index: where it was proposed (0-based outer iteration, position in the group).
    text: the proposal as written; canonical: its canonical form (None when it did not parse).
    valid: it parsed, checked and compiled; reason: why not (None when valid and scored).
    score: validation score of the policy it trained (0 when invalid).
    curves: name -> f32[steps] inner-training curves ('reward', 'primitive/g1', ...); {} when
        the candidate was not trained.
    duplicate_of: index of the earlier candidate of this iteration with the same canonical form
        whose training this one shares (None when trained on its own).
    """

    iteration: int
    index: int
    text: str
    canonical: str | None
    valid: bool
    reason: str | None
    score: float
    curves: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)
    duplicate_of: int | None = None


class MetaOptimizerLike(Protocol):
    """What strategies need from a Meta-Optimizer (`derl_jax.methods.derl.optimizer.MetaOptimizer`).

    init(key) -> MetaState (a pytree of arrays; includes the cold-start SFT)
    sample(state, key, n) -> MetaSample with `texts: list[str]` (and symbols/mask/logp)
    update(state, sample, scores f32[n]) -> (MetaState, metrics dict)
    """

    def init(self, key: Any) -> Any: ...

    def sample(self, state: Any, key: Any, n: int) -> Any: ...

    def update(self, state: Any, sample: Any, scores: Any) -> tuple[Any, Mapping[str, Any]]: ...


OptimizerFactory = Callable[[Any, Any, Any], MetaOptimizerLike]  # (cfg, grammar, mesh) -> MetaOptimizer


@dataclasses.dataclass(frozen=True)
class StrategyContext:
    """What a strategy is built from (`Strategy.from_config`).

    cfg: the run's ConfigDict. primitive_names: the domain's primitives, in order.
    grammar: the Meta-Optimizer's grammar (None where no strategy needs one).
    outcome_index: 0-based index of the outcome primitive.
    optimizer_factory: `(cfg, grammar, mesh) -> MetaOptimizer`, replacing the method's own
        Meta-Optimizer (tests and embedding code pass a stand-in; None: the method's own).
    mesh: the run's ('cand', 'data', 'model') mesh, which the Meta-Optimizer's sample and update
        steps run on as the inner loop's do (None: one device).
    workdir: the run directory of the search, for strategies that keep readable side files
        there (the checkpoint stays the source of truth); None outside a run.
    """

    cfg: Any
    primitive_names: tuple[str, ...]
    grammar: Any = None
    outcome_index: int = 0
    optimizer_factory: OptimizerFactory | None = None
    mesh: Any = None
    workdir: str | None = None

    def optimizer(self, name: str, default: OptimizerFactory) -> MetaOptimizerLike:
        """A Meta-Optimizer for strategy `name`: `optimizer_factory`, else the method's `default`;
        ValueError when there is no grammar."""
        if self.grammar is None:
            raise ValueError(f"make_strategy: strategy {name!r} samples from the Meta-Optimizer and needs a grammar")
        return (self.optimizer_factory or default)(self.cfg, self.grammar, self.mesh)


class Strategy(abc.ABC):
    """One outer-loop method (module docstring). Subclasses override `init`, `propose`, `update`
    and, when they have state worth logging or saving, `metrics`, `checkpoint`, `restore`."""

    name: str = ""
    population: bool = False
    searches: bool = True

    @classmethod
    def from_config(cls, name: str, context: StrategyContext) -> "Strategy":
        """The strategy registered as `name` for the run `context` describes."""
        return cls()

    @classmethod
    def check_config(cls, cfg: Any, name: str) -> None:
        """Raise `derl_jax.config.ConfigError` naming the field when `cfg` cannot run `name`."""

    @abc.abstractmethod
    def init(self, key: Any) -> Any:
        """See the class docstring."""

    @abc.abstractmethod
    def propose(self, state: Any, key: Any, n: int) -> tuple[list[str], Any]:
        """See the class docstring."""

    @abc.abstractmethod
    def update(self, state: Any, records: Sequence[CandidateRecord], scores: np.ndarray, aux: Any) -> Any:
        """See the class docstring."""

    def metrics(self, state: Any) -> dict[str, float | None]:
        return {}

    def checkpoint(self, state: Any) -> tuple[Any, dict]:
        return {}, {}

    def restore(self, initial_state: Any, arrays: Any, data: Mapping[str, Any]) -> Any:
        return initial_state


# --------------------------------------------------------------------------- checks shared by strategies


def check_scores(scores: Any, n: int, where: str) -> np.ndarray:
    """`scores` as f32[n] with finite values; raises ValueError naming `where` otherwise."""
    values = np.asarray(scores, np.float32)
    if values.shape != (n,):
        raise ValueError(f"{where}: expected scores of shape ({n},), got {values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{where}: scores must be finite (invalid candidates score 0), got {values.tolist()}")
    return values


def check_update(records: Sequence[CandidateRecord], scores: Any, where: str) -> np.ndarray:
    """Scores f32[n] checked against the n records they belong to (same length, same values)."""
    values = check_scores(scores, len(records), where)
    for j, record in enumerate(records):
        if not isinstance(record, CandidateRecord):
            raise TypeError(f"{where}: record {j} is a {type(record).__name__}, not a CandidateRecord")
        if record.index != j:
            raise ValueError(f"{where}: record {j} has index {record.index}")
        if not math.isclose(float(record.score), float(values[j]), rel_tol=1e-6, abs_tol=1e-6):
            raise ValueError(f"{where}: record {j} has score {record.score} but scores[{j}] = {values[j]}")
    return values


def check_proposals(texts: Any, n: int, where: str) -> list[str]:
    """`texts` as a list of n strings; ValueError/TypeError naming `where` otherwise."""
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
