"""DERL with shuffled feedback, a control: the Meta-Optimizer's update sees its group's
validation scores permuted within the group, so every score still arrives, only no longer
with the expression that earned it.

If DERL's advantage over random search comes from learning which expressions score well, this
control loses it; if it comes from the update itself (entropy, drift of the sampler), the
control keeps it. The permutation of iteration i is drawn from `(seed, i)`, the seed taken
from the search key at `init`, so a rerun or a resumed search permutes the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from derl_jax.methods.derl.strategy import MetaOptimizerStrategy, OptimizerStrategyState
from derl_jax.outer.registry import register_strategy
from derl_jax.outer.strategy import CandidateRecord, check_update, finite_metrics

_SHUFFLE_STREAM = 0x5EED


def shuffle_order(seed: int, iteration: int, n: int) -> np.ndarray:
    """i64[n]: the permutation the scores of `iteration`'s group are read through."""
    return np.random.default_rng([int(seed), int(iteration)]).permutation(int(n))


def key_seed(key: jax.Array) -> int:
    """A 32-bit seed from a JAX key (its own stream, so it draws nothing the search draws)."""
    return int(np.asarray(jax.random.key_data(jax.random.fold_in(key, _SHUFFLE_STREAM))).reshape(-1)[-1])


@dataclasses.dataclass(frozen=True)
class ShuffledState(OptimizerStrategyState):
    """OptimizerStrategyState and the seed of the score permutations."""

    seed: int = 0


@register_strategy("derl_shuffled")
class ShuffledDerlStrategy(MetaOptimizerStrategy):
    """Control: DERL whose Meta-Optimizer sees its group's scores permuted within the group."""

    def init(self, key) -> ShuffledState:
        return ShuffledState(meta=self.optimizer.init(key), seed=key_seed(key))

    def update(self, state: ShuffledState, records: Sequence[CandidateRecord], scores: np.ndarray, aux: Any):
        values = check_update(records, scores, f"{self.name}.update")
        shuffled = values[shuffle_order(state.seed, records[0].iteration, len(values))]
        meta, metrics = self.optimizer.update(state.meta, aux, jnp.asarray(shuffled))
        return ShuffledState(meta=meta, last_metrics=finite_metrics(metrics), seed=state.seed)

    def checkpoint(self, state: ShuffledState) -> tuple[Any, dict]:
        arrays, data = super().checkpoint(state)
        return arrays, {**data, "seed": int(state.seed)}

    def restore(self, initial_state: ShuffledState, arrays: Any, data: Mapping[str, Any]):
        restored = super().restore(initial_state, arrays, data)
        return ShuffledState(meta=restored.meta, last_metrics=restored.last_metrics,
                             seed=int(data.get("seed", initial_state.seed)))
