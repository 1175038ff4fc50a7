"""The baselines: fixed expressions and random search.

Fixed expressions need no search; the protocol trains the expression once in final mode:

  fixed:<text>    any expression
  outcome         `g{o}` (o = the outcome primitive, 1-based)
  outcome_format  the outcome plus the format primitive (`g1+g2` when the outcome is g1)
  average         `(g1+...+gk)/k`, the mean of all k primitives

  random          random search: the cold-started Meta-Optimizer sampled with its parameters
                  frozen, the paper's compute-controlled random baseline (Appendix F.2)
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from derl_jax.methods.derl.strategy import MetaOptimizerStrategy
from derl_jax.outer.strategy import CandidateRecord, Strategy, StrategyContext, check_update
from derl_jax.outer.registry import register_strategy

FIXED_PREFIX = "fixed:"


@register_strategy("fixed", takes_argument=True)
class FixedStrategy(Strategy):
    """Always proposes `text`; nothing to learn."""

    searches = False

    def __init__(self, text: str):
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"fixed strategy: the expression must be a non-empty string, got {text!r}")
        self.text = text

    @classmethod
    def from_config(cls, name: str, context: StrategyContext) -> "FixedStrategy":
        """The expression after `fixed:`, its primitive aliases read as names (`outcome` -> `correct`)."""
        from derl_jax.config import config_value, has_field
        from primitives.registry import with_names

        text = name[len(FIXED_PREFIX) :] if name.startswith(FIXED_PREFIX) else name
        if has_field(context.cfg, "domain.kind") and isinstance(text, str):
            text = with_names(text, str(config_value(context.cfg, "domain.kind")), context.primitive_names)
        return cls(text)

    def init(self, key) -> tuple:
        return ()

    def propose(self, state: tuple, key, n: int) -> tuple[list[str], None]:
        return [self.text] * n, None

    def update(self, state: tuple, records: Sequence[CandidateRecord], scores: np.ndarray, aux: Any) -> tuple:
        check_update(records, scores, f"{self.name}.update")
        return state


def fixed(text: str, name: str | None = None) -> FixedStrategy:
    """A strategy that always proposes `text` (named `fixed:<text>` unless `name` is given)."""
    strategy = FixedStrategy(text)
    strategy.name = name or f"{FIXED_PREFIX}{text}"
    return strategy


def average_text(num_primitives: int) -> str:
    """`(g1+g2+...+gk)/k`."""
    if num_primitives < 1:
        raise ValueError(f"average_text: num_primitives must be >= 1, got {num_primitives}")
    total = "+".join(f"g{i + 1}" for i in range(num_primitives))
    return f"({total})/{num_primitives}" if num_primitives > 1 else total


def outcome_text(num_primitives: int, outcome_index: int = 0) -> str:
    _check_outcome(num_primitives, outcome_index)
    return f"g{outcome_index + 1}"


def outcome_format_text(num_primitives: int, outcome_index: int = 0) -> str:
    _check_outcome(num_primitives, outcome_index)
    if num_primitives < 2:
        raise ValueError("outcome_format: needs at least 2 primitives")
    other = "g2" if outcome_index == 0 else "g1"
    return f"g{outcome_index + 1}+{other}"


def _check_outcome(num_primitives: int, outcome_index: int) -> None:
    if not 0 <= outcome_index < num_primitives:
        raise ValueError(f"outcome_index {outcome_index} outside 0..{num_primitives - 1}")


@register_strategy("outcome")
class OutcomeStrategy(FixedStrategy):
    """The outcome primitive alone."""

    @classmethod
    def from_config(cls, name: str, context: StrategyContext) -> FixedStrategy:
        return cls(outcome_text(len(context.primitive_names), context.outcome_index))


@register_strategy("outcome_format")
class OutcomeFormatStrategy(FixedStrategy):
    """The outcome plus the format primitive."""

    @classmethod
    def from_config(cls, name: str, context: StrategyContext) -> FixedStrategy:
        return cls(outcome_format_text(len(context.primitive_names), context.outcome_index))


@register_strategy("average")
class AverageStrategy(FixedStrategy):
    """The mean of all primitives."""

    @classmethod
    def from_config(cls, name: str, context: StrategyContext) -> FixedStrategy:
        return cls(average_text(len(context.primitive_names)))


@register_strategy("random")
class RandomSearchStrategy(MetaOptimizerStrategy):
    """DERL's proposals from the cold-started Meta-Optimizer, which never learns."""

    learn = False
