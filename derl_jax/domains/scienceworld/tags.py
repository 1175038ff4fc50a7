"""Meta-tags and step scores for ScienceWorld episodes (after RLVMR; the household domain's rules).

Each turn the policy writes a tag (plan / explore / reflect / act) and an action. The correct
tags of a step are

  plan     the first step, or the step right after one that completed a subgoal (the engine's
           score rose: ScienceWorld scores each subgoal of a task as it is reached);
  reflect  the step right after a failed action (the engine did not accept it or it had no
           effect, see `failed`);
  explore  the action reached a location not visited before in the episode, or opened a
           receptacle never opened before;
  act      none of the three above.

A step scores 1 when its action is well-formed (a known tag followed by an action the engine
parsed) and its tag is one of the correct ones. Pure Python over strings: the adapter calls
`score_step` once per step with the engine's answer.
"""

from __future__ import annotations

import dataclasses
import re

TAGS = ("plan", "explore", "reflect", "act")
PLAN, EXPLORE, REFLECT, ACT = TAGS

# Engine answers that mean the action was not understood or changed nothing.
FAILURE_PATTERNS = (
    r"^no known action matches",
    r"^ambiguous request",
    r"^it's not clear how to get there",
    r"^you can't",
    r"^that (?:can't|cannot)",
    r"^i'm not sure",
    r"is already (?:open|closed|activated|deactivated|on|off)",
    r"^the .* (?:is|are) not (?:open|movable)",
    r"^(?:there is )?nothing happens",
    r"^unknown action",
)
NOT_PARSED = re.compile(r"^no known action matches", re.IGNORECASE)
_FAILURE = re.compile("|".join(FAILURE_PATTERNS), re.IGNORECASE)
_MOVED = re.compile(r"^you (?:move|teleport) to the (.+?)\.", re.IGNORECASE)
_OPENED = re.compile(r"^the (.+?) is now open", re.IGNORECASE)
_OPEN_ACTION = re.compile(r"^open (.+)$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Phrasing:
    """How an engine words a move and an opening: `moved` matches an answer that reached a
    place (group 1 names it), `opened` an answer to `open X` that opened X."""

    moved: re.Pattern
    opened: re.Pattern


SCIENCEWORLD = Phrasing(_MOVED, _OPENED)


def _opened_receptacle(action: str, observation: str, phrasing: Phrasing = SCIENCEWORLD) -> str | None:
    """The receptacle this step opened ('open cupboard' answered 'The cupboard is now open.'),
    named as the action names it; doors are passages, not receptacles."""
    target = _OPEN_ACTION.match(action.strip())
    if not (target and phrasing.opened.match(observation.strip())) or target.group(1).lower().startswith("door"):
        return None
    return target.group(1).lower()


@dataclasses.dataclass
class TagTracker:
    """What the tag rules remember about one episode."""

    turn: int = 0
    last_failed: bool = False
    subgoal_done: bool = False
    visited: set = dataclasses.field(default_factory=set)
    opened: set = dataclasses.field(default_factory=set)
    phrasing: Phrasing = SCIENCEWORLD   # the engine's wording of moves and openings


def split_tag(text: str) -> tuple[str | None, str]:
    """'explore go to kitchen' -> ('explore', 'go to kitchen'); no known tag first -> (None, text)."""
    words = text.strip().split(maxsplit=1)
    if words and words[0].lower() in TAGS:
        return words[0].lower(), (words[1] if len(words) > 1 else "").strip()
    return None, text.strip()


def failed(observation: str) -> bool:
    """The engine's answer says the action did nothing (not parsed, ambiguous, impossible)."""
    return bool(_FAILURE.search(observation.strip()))


def start_location(observation: str) -> str | None:
    """'This room is called the hallway. ...' -> 'hallway'."""
    match = re.search(r"this room is called the (.+?)\.", observation, re.IGNORECASE)
    return match.group(1).lower() if match else None


def correct_tags(tracker: TagTracker, action: str, observation: str) -> set[str]:
    """The tags that agree with this step (module docstring), from the state before it."""
    tags = set()
    if tracker.turn == 0 or tracker.subgoal_done:
        tags.add(PLAN)
    if tracker.last_failed:
        tags.add(REFLECT)
    moved = tracker.phrasing.moved.match(observation.strip())
    opened = _opened_receptacle(action, observation, tracker.phrasing)
    if (moved and moved.group(1).lower() not in tracker.visited) or (opened and opened not in tracker.opened):
        tags.add(EXPLORE)
    if not tags:
        tags.add(ACT)
    return tags


def score_step(tracker: TagTracker, tag: str | None, action: str, observation: str, score_rose: bool) -> float:
    """Score one step (1.0 or 0.0) and advance `tracker` in place.

    tag: the policy's tag (None when it wrote none); action: the action text sent to the
    engine; observation: the engine's answer; score_rose: the engine's score went up.
    """
    well_formed = tag is not None and bool(action) and not NOT_PARSED.search(observation.strip())
    good = well_formed and tag in correct_tags(tracker, action, observation)
    moved = tracker.phrasing.moved.match(observation.strip())
    opened = _opened_receptacle(action, observation, tracker.phrasing)
    if moved:
        tracker.visited.add(moved.group(1).lower())
    if opened:
        tracker.opened.add(opened)
    tracker.turn += 1
    tracker.last_failed = not well_formed or failed(observation)
    tracker.subgoal_done = score_rose
    return float(good)
