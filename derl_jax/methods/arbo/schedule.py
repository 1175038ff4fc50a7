"""The external explore/exploit schedule: a pure function of the acceptance record.

The acceptance record holds one bool per finished round: did the round produce a new
incumbent (see `history.acceptance_record`). The schedule never looks at candidates.

`kind="adaptive"` (ARBO):
  * explore for the first `initial_explore` rounds, and as long as there is no incumbent;
  * then exploit (refine the incumbent);
  * after `patience` (mu) consecutive exploit rounds without an accepted improvement, explore
    again for at most `reexplore` (nu) rounds: the first accepted round ends the phase
    early; afterwards the count of unaccepted exploit rounds starts again from zero.
`kind="explore_only"`: every round explores. `kind="exploit_only"`: exploit as soon as an
incumbent exists (before that there is nothing to refine, so the round explores).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

EXPLORE, EXPLOIT = "explore", "exploit"
KINDS = ("adaptive", "explore_only", "exploit_only")


@dataclasses.dataclass(frozen=True)
class Schedule:
    kind: str = "adaptive"    # one of KINDS
    initial_explore: int = 1  # rounds that explore before the first exploit
    patience: int = 2         # mu: unaccepted exploit rounds before exploring again
    reexplore: int = 1        # nu: most rounds of one re-exploration phase

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"schedule kind must be one of {KINDS}, got {self.kind!r}")
        for field, least in (("initial_explore", 0), ("patience", 1), ("reexplore", 0)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"schedule {field} must be an integer >= {least}, got {value!r}")


def modes(acceptance: Sequence[bool], schedule: Schedule) -> tuple[str, ...]:
    """The mode of every round 0..len(acceptance): one per finished round, then the next one."""
    result = []
    have_incumbent = False
    stall = 0          # consecutive exploit rounds without acceptance
    explore_left = 0   # rounds left in a re-exploration phase
    for round_index in range(len(acceptance) + 1):
        if schedule.kind == "explore_only" or not have_incumbent:
            mode = EXPLORE
        elif schedule.kind == "exploit_only":
            mode = EXPLOIT
        elif round_index < schedule.initial_explore:
            mode = EXPLORE
        elif explore_left > 0:
            mode, explore_left = EXPLORE, explore_left - 1
        elif stall >= schedule.patience and schedule.reexplore > 0:
            mode, explore_left, stall = EXPLORE, schedule.reexplore - 1, 0
        else:
            mode = EXPLOIT
        result.append(mode)
        if round_index == len(acceptance):
            break
        accepted = bool(acceptance[round_index])
        have_incumbent = have_incumbent or accepted
        if accepted:
            stall, explore_left = 0, 0
        elif mode == EXPLOIT:
            stall += 1
    return tuple(result)


def next_mode(acceptance: Sequence[bool], schedule: Schedule) -> str:
    """The mode of the round after the `len(acceptance)` finished ones."""
    return modes(acceptance, schedule)[-1]
