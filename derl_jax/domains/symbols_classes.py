"""The class of a reward expression on the symbols tasks, read from their construction.

    reward_class(("exact", "order", "case", "marker"), "g2 + 0.5*g3") == "top"

Every primitive has a role: *aligned* (one aspect of the answer, densely: `position` of
symbols; `order`, `case`, `end` of symbols_compose), *harmful* (earned only by a wrong output:
`marker`, and `echo`, which rewards copying, the wrong transform) or *neutral* (`exact`, sparse
and nearly always 0 on the base policy; `bag`, `length`, `ended`, `letters` and `start`, which
the answer and the copy satisfy alike). A reward *uses* a primitive when raising that primitive raises the reward, and
not by a trifle: the central difference over a small step is positive on average and at least
on half of `PROBE_POINTS` random points, and its mean is at least `WEIGHT_SHARE` of the largest
mean difference over the primitives. The probe points draw every primitive uniformly in
[0, 1] except the sparse outcome (`exact`), which sits near 0 as it does on the base policy,
and the training progress uniformly in [0, 1]. Group-normalised advantages make a uniform
rescaling of the reward irrelevant, but not the primitives' relative weights: a primitive at a
hundredth of another's weight, or multiplied by the outcome, moves the advantages too little
to teach its aspect within a candidate's training. The class reads which primitives are used:

  decoy    uses a harmful primitive
  top      uses every aligned primitive (and no harmful one)
  partial  uses some aligned primitives, not all
  other    uses none (constants, `exact`, the neutral features), or does not parse

With greedy validation an aspect that the reward leaves out stays at the base policy's choice
(the copied, lower-case letter without `!`), so only `top` rewards teach the whole answer.
benchmarks/symbols_rarity.py checks the rule against trained candidates.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import numpy as np

ALIGNED = frozenset({"position", "order", "case", "end"})
HARMFUL = frozenset({"marker", "echo"})
PROBE_POINTS = 256   # ours
STEP = 0.05          # ours: the half-step of the central difference, in primitive units
SPARSE = frozenset({"exact"})   # probed at STEP: about 0 on the base policy (the band's `exact`)
# ours, fixed on the 30 trained proposals of (m, D) = (2, 7), then the medium level, before the other levels' checks
# (benchmarks/results/symbols_rarity.json, docs/results/symbols_compose.md)
WEIGHT_SHARE = 0.25
_SEED = 7            # ours: fixed probe points, so a class never changes between calls


def used_primitives(text: str, names: Sequence[str]) -> tuple[str, ...] | None:
    """The primitives of `names` whose increase raises the reward `text` (module docstring); None
    when `text` does not parse or evaluates to non-finite values."""
    from derl_jax.expr.parse import ExpressionError, parse
    from derl_jax.expr.vm import evaluate_numpy

    try:
        expr = parse(text, tuple(names))
    except (ExpressionError, ValueError):
        return None
    rng = np.random.default_rng(_SEED)
    points = rng.uniform(STEP, 1.0 - STEP, size=(PROBE_POINTS, len(names))).astype(np.float32)
    progress = rng.uniform(0.0, 1.0, size=PROBE_POINTS)
    points[:, [k for k, name in enumerate(names) if name in SPARSE]] = STEP
    raises = {}
    for k, name in enumerate(names):
        up, down = points.copy(), points.copy()
        up[:, k] += STEP
        down[:, k] -= STEP
        diff = (evaluate_numpy(expr, up, progress).astype(np.float64)
                - evaluate_numpy(expr, down, progress).astype(np.float64))
        if not np.all(np.isfinite(diff)):
            return None
        if np.mean(diff) > 1e-6 and np.mean(diff > 0) >= 0.5:
            raises[name] = float(np.mean(diff))
    largest = max(raises.values(), default=0.0)
    return tuple(name for name, mean in raises.items() if mean >= WEIGHT_SHARE * largest)


def reward_class(names: Sequence[str], text: str) -> str:
    """"top" | "partial" | "decoy" | "other" of reward `text` over primitives `names` (module docstring).
    Remembered per (names, text): a compare's endpoints classify each history's texts once per
    pair of methods, and a search repeats texts."""
    return _reward_class(tuple(names), str(text))


@functools.lru_cache(maxsize=1 << 16)
def _reward_class(names: tuple[str, ...], text: str) -> str:
    used = used_primitives(text, names)
    if used is None:
        return "other"
    if any(name in HARMFUL for name in used):
        return "decoy"
    aligned = [name for name in names if name in ALIGNED]
    covered = [name for name in aligned if name in used]
    if covered and len(covered) == len(aligned):
        return "top"
    return "partial" if covered else "other"


def with_reward_class(domain, classify: Callable[[str], str]):
    """`domain` with `classify` as its reward classifier (the Domain's `classifier` field, where it has one)."""
    fields = {field.name for field in dataclasses.fields(domain)}
    return dataclasses.replace(domain, classifier=classify) if "classifier" in fields else domain
