"""DERL: the Meta-Optimizer samples n expressions under the grammar; one GRPO update per
iteration on their validation scores (the paper's method). Random search, its
compute-matched baseline, is the same strategy with the Meta-Optimizer frozen
(`derl_jax.methods.baselines`), and DERL-pop its population variant (`population`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from derl_jax.outer.strategy import (
    CandidateRecord,
    MetaOptimizerLike,
    Strategy,
    StrategyContext,
    check_proposals,
    check_update,
    finite_metrics,
)
from derl_jax.outer.registry import register_strategy
from derl_jax.methods.derl.optimizer import MetaOptimizer
from derl_jax.methods.derl.settings import check_meta_block
from derl_jax.parallel import gather_to_host, put_like


@dataclasses.dataclass(frozen=True)
class OptimizerStrategyState:
    """meta: the MetaState pytree; last_metrics: what the latest update reported."""

    meta: Any
    last_metrics: Mapping[str, float | None] = dataclasses.field(default_factory=dict)


class MetaOptimizerStrategy(Strategy):
    """Proposals are `optimizer.sample(meta, key, n)` (aux is the MetaSample); `update` takes one
    `optimizer.update(meta, sample, scores)` GRPO step when `learn`, else leaves the
    cold-started parameters untouched."""

    learn = True

    def __init__(self, optimizer: MetaOptimizerLike):
        self.optimizer = optimizer

    @classmethod
    def from_config(cls, name: str, context: StrategyContext) -> "MetaOptimizerStrategy":
        return cls(context.optimizer(name, MetaOptimizer))

    @classmethod
    def check_config(cls, cfg: Any, name: str) -> None:
        check_meta_block(cfg)

    def init(self, key) -> OptimizerStrategyState:
        return OptimizerStrategyState(meta=self.optimizer.init(key))

    def propose(self, state: OptimizerStrategyState, key, n: int) -> tuple[list[str], Any]:
        sample = self.optimizer.sample(state.meta, key, n)
        return check_proposals(sample.texts, n, f"{self.name}.propose"), sample

    def update(self, state: OptimizerStrategyState, records: Sequence[CandidateRecord], scores: np.ndarray, aux: Any):
        values = check_update(records, scores, f"{self.name}.update")
        if not self.learn:
            return state
        meta, metrics = self.optimizer.update(state.meta, aux, jnp.asarray(values))
        return OptimizerStrategyState(meta=meta, last_metrics=finite_metrics(metrics))

    def metrics(self, state: OptimizerStrategyState) -> dict[str, float | None]:
        return dict(state.last_metrics)

    def checkpoint(self, state: OptimizerStrategyState) -> tuple[Any, dict]:
        # on the host: written once by process 0 when the state spans several processes
        return gather_to_host(state.meta), {"last_metrics": dict(state.last_metrics)}

    def restore(self, initial_state: OptimizerStrategyState, arrays: Any, data: Mapping[str, Any]):
        return OptimizerStrategyState(meta=put_like(arrays, initial_state.meta),
                                      last_metrics=dict(data.get("last_metrics", {})))


@register_strategy("derl")
class DerlStrategy(MetaOptimizerStrategy):
    """The paper's DERL: every iteration's inner policies start from the base policy."""
