"""ALFWorld's side of the meta-tag rules: its wording, its command templates, its subgoals.

The tag rules and step scores are ScienceWorld's (`derl_jax.domains.scienceworld.tags`, the
household domain's rules); this module gives them ALFWorld's wording (`PHRASING`: "You arrive
at cabinet 1." is a move, "You open the fridge 1." an opening) and two things only ALFWorld
needs:

  well_formed  the action is one of ALFWorld's command templates ("go to R", "take O from R",
               "move O to R", "open R", "close R", "use O", "heat|clean|cool O with R",
               "examine X", "look", "inventory"; names are a word and a number). The engine
               answers "Nothing happens." both to a command it cannot parse and to one it
               cannot do, so a malformed action is recognised here and never sent to it.
  subgoal      the step completed a subgoal of the goal (the household domain's list): picking
               up a goal object, cleaning / heating / cooling it, putting it in a receptacle of
               the goal type, switching on the goal lamp. The tag rules' "score rose".
"""

from __future__ import annotations

import re

from derl_jax.domains.scienceworld import tags as T

PHRASING = T.Phrasing(moved=re.compile(r"^you arrive at (.+?)\.", re.IGNORECASE),
                      opened=re.compile(r"^you open the (.+?)\.", re.IGNORECASE))
_NAME = r"[a-z]+ \d+"
COMMANDS = re.compile(
    rf"^(?:look|inventory|(?:go to|open|close|use|examine) {_NAME}|take {_NAME} from {_NAME}|move {_NAME} to {_NAME}"
    rf"|(?:heat|clean|cool) {_NAME} with {_NAME})$")
_PICKED = re.compile(r"^you pick up the ([a-z]+) \d+ from", re.IGNORECASE)
_CHANGED = re.compile(r"^you (clean|heat|cool) the ([a-z]+) \d+ using", re.IGNORECASE)
_PLACED = re.compile(r"^you move the ([a-z]+) \d+ to the ([a-z]+) \d+", re.IGNORECASE)
_SWITCHED = re.compile(r"^you turn on the ([a-z]+) \d+", re.IGNORECASE)
CHANGE_OF_KIND = {"pick_clean_then_place_in_recep": "clean", "pick_heat_then_place_in_recep": "heat",
                  "pick_cool_then_place_in_recep": "cool"}


def well_formed(action: str) -> bool:
    """`action` (without its tag) is one of ALFWorld's command templates."""
    return bool(COMMANDS.match(" ".join(action.lower().split())))


def subgoal(kind: str, obj: str, recep: str, toggle: str, observation: str) -> bool:
    """The engine's answer says a subgoal of the goal (kind, goal types in lower case) was completed."""
    text = observation.strip()
    picked, changed = _PICKED.match(text), _CHANGED.match(text)
    placed, switched = _PLACED.match(text), _SWITCHED.match(text)
    return bool((picked and picked.group(1).lower() == obj)
                or (changed and changed.group(2).lower() == obj and changed.group(1).lower() == CHANGE_OF_KIND.get(kind))
                or (placed and recep and placed.group(1).lower() == obj and placed.group(2).lower() == recep)
                or (switched and toggle and switched.group(1).lower() == toggle))


def goal_of(first_observation: str) -> str:
    """The task line's goal ("Your task is to: put a cool apple in countertop." -> "put a cool apple in countertop")."""
    match = re.search(r"your task is to: (.+?)\.?\s*$", first_observation.strip(), re.IGNORECASE | re.DOTALL)
    return match.group(1).strip() if match else ""


def room_of(first_observation: str) -> str:
    """The first observation without the welcome line and the task line (the room alone)."""
    lines = [line for line in first_observation.splitlines() if line.strip()]
    return " ".join(line.strip() for line in lines
                    if not line.startswith("-= Welcome") and not line.lower().startswith("your task is to"))
