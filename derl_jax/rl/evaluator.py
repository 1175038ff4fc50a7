"""The contract between the outer loop (`derl_jax.outer`) and the inner loop (`derl_jax.rl`).

Both sides import this module and neither imports the other: the outer loop hands stacked
reward programs to a `CandidateEvaluator` and receives `CandidateResults`.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import jax
from flax import struct

from derl_jax.domains.base import TokenDataset
from derl_jax.expr.program import Program


@struct.dataclass
class CandidateResults:
    """What one `evaluate_candidates` call returns for K candidates.

    scores: f32[K] greedy pass@1 of each trained policy on the validation split.
    curves: name -> f32[K, steps] inner-training curves (mean reward, each primitive's mean, ...).
    params: the K trained policies, stacked along a leading axis K.
    """

    scores: Any
    curves: Mapping[str, Any]
    params: Any


class CandidateEvaluator(Protocol):
    """The inner loop as the outer loop sees it (implemented by `derl_jax.rl`)."""

    def evaluate_candidates(
        self, programs: Program, init_params: Any, key: jax.Array, train_set: TokenDataset, val_set: TokenDataset,
        *, steps: int | None = None,
    ) -> CandidateResults:
        """Train one policy per stacked program (Program[K]) from `init_params` on `train_set`
        for `steps` inner steps (None: the configured `inner.steps`; population strategies
        train shorter runs); score each on `val_set`. Returns an object with `scores`, `curves`
        (f32[K, steps]) and `params`."""

    def train_final(self, program: Program, init_params: Any, key: jax.Array, train_set: TokenDataset, *,
                    steps: int | None = None) -> tuple[Any, Mapping[str, Any]]:
        """Train a fresh policy with one program for `steps` inner steps (None: the final-mode
        budget, `final.steps`; a fixed baseline may be given `final.baseline_steps`) -> (params,
        curves name -> f32[steps])."""

    def accuracy(self, params: Any, dataset: TokenDataset) -> float:
        """Greedy pass@1 of one policy on `dataset`."""

    def item_scores(self, params: Any, dataset: TokenDataset) -> Any:
        """f32[N]: each example's greedy success under one policy (their mean is `accuracy`); the
        per-item scores that paired comparisons between methods use. Optional: an evaluator
        without it is tested by `accuracy` alone."""
