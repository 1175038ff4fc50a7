"""ALFRED-domain PDDL problems generated from a seed: small rooms for ALFWorld's six task kinds.

A generated problem is what ALFWorld's own `game.tw-pddl` files hold: ALFWorld's PDDL domain,
its text grammar with the task line filled in, and a PDDL problem. As in ALFWorld's game
generation (`alfworld-generate`), the goal's PDDL and its text come from ALFWorld's goal
library (`alfworld.gen.goal_library`: the goal formula of the kind with the object, receptacle
and lamp types filled in, and one of the kind's two text templates, e.g. "put a cool apple in
countertop"), and object properties and which receptacle types can hold which objects from
ALFRED's tables (`alfworld.gen.constants`).

A room (`make_problem`) has a sinkbasin, a microwave and a fridge, the goal receptacle and one
to three other receptacles (cabinets, drawers, safes, the fridge and the microwave start
closed); the goal object(s), two to four objects of other types, and for examine-in-light a lamp, each
in a receptacle that can hold it (never the goal receptacle). The agent starts in the middle
of the room. Every generated problem is solvable: the planner's plan wins it (tested).

Types are split into seen and unseen halves by a seed (`type_split`), per stratum: goal
objects, goal receptacles, lamps. `GameSpec` describes one game, generated or from a data
directory, by its kind and goal types.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from derl_jax.domains.alfworld.engine import game_logic

KINDS = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
         "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")
# ALFRED object types the generator places, by stratum (each split into seen / unseen halves).
GOAL_OBJECTS = ("Apple", "Bread", "Egg", "Potato", "Tomato", "Lettuce", "Mug", "Cup", "Plate", "Bowl", "Pan", "Pot",
                "Fork", "Knife", "Spoon", "ButterKnife", "Spatula", "Ladle", "DishSponge", "SoapBar", "Cloth",
                "Book", "CD", "CellPhone", "KeyChain", "Pen", "Pencil", "Watch", "CreditCard", "AlarmClock",
                "Vase", "Statue", "RemoteControl", "Candle", "SprayBottle", "Newspaper")
GOAL_RECEPTACLES = ("CounterTop", "DiningTable", "SideTable", "CoffeeTable", "Desk", "Shelf", "Dresser", "GarbageCan",
                    "Cabinet", "Drawer", "Safe")
LAMPS = ("DeskLamp", "FloorLamp")
APPLIANCES = ("SinkBasin", "Microwave", "Fridge")
LAMP_STANDS = ("SideTable", "Desk", "Dresser")
ACTION_PROPERTY = {"pick_clean_then_place_in_recep": "Cleanable", "pick_heat_then_place_in_recep": "Heatable",
                   "pick_cool_then_place_in_recep": "Coolable"}


@dataclasses.dataclass(frozen=True)
class GameSpec:
    """One game: its kind, goal types in lower case ("apple", "countertop", "desklamp"; "" when
    the kind has none), its goal text, and its source (a game file's data or a game file's path)."""

    kind: str
    obj: str
    recep: str
    toggle: str
    goal: str
    source: str | dict = dataclasses.field(repr=False, compare=False)


def _constants():
    import alfworld.gen.constants as constants  # an optional dependency

    return constants


def _entity(type_name: str, number: int) -> str:
    """A PDDL entity name that ALFWorld's demangler reads as "<type> <n>" ("Sink..SinkBasin": sinkbasin)."""
    return f"Sink_bar_{number}_bar_SinkBasin" if type_name == "SinkBasin" else f"{type_name}_bar_{number}"


def type_split(seed: int) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """{stratum: (seen types, unseen types)} for "objects", "receptacles" and "lamps", halves drawn by `seed`."""
    rng = np.random.default_rng([int(seed), 4242])
    split = {}
    for stratum, types in (("objects", GOAL_OBJECTS), ("receptacles", GOAL_RECEPTACLES), ("lamps", LAMPS)):
        order = [types[i] for i in rng.permutation(len(types))]
        split[stratum] = (tuple(sorted(order[: (len(order) + 1) // 2])), tuple(sorted(order[(len(order) + 1) // 2:])))
    return split


def holders(obj_type: str) -> list[str]:
    """Non-movable ALFRED receptacle types that can hold `obj_type`, sorted."""
    constants = _constants()
    return sorted(r for r, held in constants.VAL_RECEPTACLE_OBJECTS.items()
                  if obj_type in held and r not in constants.MOVABLE_RECEPTACLES_SET)


def goal_pairs(kind: str, objects: tuple[str, ...], receptacles: tuple[str, ...], lamps: tuple[str, ...]
               ) -> list[tuple[str, str]]:
    """The (object type, receptacle or lamp type) goals of `kind` over the given types, sorted."""
    constants = _constants()
    if kind == "look_at_obj_in_light":
        return [(o, lamp) for o in objects for lamp in lamps if set(holders(o)) & set(GOAL_RECEPTACLES + APPLIANCES)]
    needed = ACTION_PROPERTY.get(kind)
    usable = [o for o in objects if needed is None or o in constants.VAL_ACTION_OBJECTS[needed]]
    return [(o, r) for o in usable for r in receptacles
            if r in holders(o) and set(holders(o)) & set(GOAL_RECEPTACLES + APPLIANCES) - {r}]


def goal_text(kind: str, obj: str, target: str, rng: np.random.Generator) -> str:
    """One of ALFWorld's text templates of `kind` filled in ("put a cool apple in countertop")."""
    from alfworld.gen import goal_library

    templates = goal_library.gdict[kind]["templates"]
    lamp = target if kind == "look_at_obj_in_light" else ""
    return templates[rng.integers(len(templates))].format(obj=obj.lower(), recep=target.lower(), toggle=lamp.lower(),
                                                          mrecep="")


def goal_pddl(kind: str, obj: str, target: str) -> str:
    """The goal section of `kind` from ALFWorld's goal library, with the problem's closing parenthesis."""
    from alfworld.gen import goal_library

    lamp = target if kind == "look_at_obj_in_light" else ""
    return goal_library.gdict[kind]["pddl"].format(obj=obj, recep=target, toggle=lamp, mrecep="").replace("#", "-")


def make_problem(kind: str, obj: str, target: str, rng: np.random.Generator) -> GameSpec:
    """A small room for the goal (kind, object type, receptacle type or lamp type) (module docstring)."""
    constants = _constants()
    light = kind == "look_at_obj_in_light"
    pool = [r for r in GOAL_RECEPTACLES if r != target]
    others = [pool[i] for i in rng.choice(len(pool), size=int(rng.integers(1, 4)), replace=False)]
    room_types = list(APPLIANCES) + ([] if light else [target]) + others
    starts = [h for h in holders(obj) if h != target and h in GOAL_RECEPTACLES + APPLIANCES]
    if not set(starts) & set(room_types):   # somewhere for the goal object to start
        room_types.append(starts[rng.integers(len(starts))])
    if light and not set(LAMP_STANDS) & set(room_types):
        room_types.append(LAMP_STANDS[rng.integers(len(LAMP_STANDS))])
    receptacles = [(t, 1 + room_types[:i].count(t)) for i, t in enumerate(room_types)]
    places = {f"{t}{n}": f"loc_bar_{i + 1}" for i, (t, n) in enumerate(receptacles)}

    def spot(obj_type: str, avoid: str = "") -> tuple[str, int]:
        fits = [(t, n) for t, n in receptacles if t in holders(obj_type) and t != avoid]
        return fits[rng.integers(len(fits))]

    goal_count = 2 if kind == "pick_two_obj_and_place" else 1
    other_types = [o for o in GOAL_OBJECTS if o != obj]   # one more of the goal type could meet the goal at once
    distractors = [other_types[i] for i in rng.choice(len(other_types), size=int(rng.integers(2, 5)), replace=False)]
    objects = [(obj, spot(obj, "" if light else target)) for _ in range(goal_count)]
    objects += [(o, spot(o)) for o in distractors if any(t in holders(o) for t, _ in receptacles)]
    if light:
        objects.append((target, ([(t, n) for t, n in receptacles if t in LAMP_STANDS] or receptacles)[0]))
    named = [(_entity(o, 1 + [p for p, _ in objects[:i]].count(o)), o, where) for i, (o, where) in enumerate(objects)]

    otypes = sorted({o for o, _ in objects})
    rtypes = sorted({t for t, _ in receptacles})
    init = ["(atLocation agent1 loc_bar_0)"]
    for t, n in receptacles:
        name = _entity(t, n)
        init += [f"(receptacleAtLocation {name} {places[f'{t}{n}']})", f"(receptacleType {name} {t}Type)"]
        init += [f"(openable {name})"] if t in constants.OPENABLE_CLASS_SET else []
    for name, o, (t, n) in named:
        init += [f"(objectType {name} {o}Type)", f"(inReceptacle {name} {_entity(t, n)})",
                 f"(objectAtLocation {name} {places[f'{t}{n}']})"]
        init += [f"(pickupable {name})"] if o not in LAMPS else [f"(toggleable {name})"]
        init += [f"({prop.lower()} {name})" for prop in ("Cleanable", "Heatable", "Coolable")
                 if o in constants.VAL_ACTION_OBJECTS[prop]]
    init += [f"(canContain {r}Type {o}Type)" for r in rtypes for o in otypes
             if o in constants.VAL_RECEPTACLE_OBJECTS.get(r, ())]
    declared = (["agent1 - agent", "loc_bar_0 - location"] + [f"{loc} - location" for loc in places.values()]
                + [f"{_entity(t, n)} - receptacle" for t, n in receptacles] + [f"{name} - object" for name, _, _ in named]
                + [f"{o}Type - otype" for o in otypes] + [f"{r}Type - rtype" for r in rtypes])
    problem = ("(define (problem plan_generated)\n    (:domain alfred)\n    (:objects\n        "
               + "\n        ".join(declared) + "\n    )\n    (:init\n        " + "\n        ".join(init)
               + "\n    )\n" + goal_pddl(kind, obj, target))
    goal = goal_text(kind, obj, target, rng)
    logic = game_logic()
    source = {"pddl_domain": logic["pddl_domain"], "grammar": logic["grammar"].replace("UNKNOWN GOAL", goal),
              "pddl_problem": problem}
    return GameSpec(kind=kind, obj=obj.lower(), recep="" if light else target.lower(),
                    toggle=target.lower() if light else "", goal=goal, source=source)


def generate_games(kinds: tuple[str, ...], count: int, seed: int, objects: tuple[str, ...],
                   receptacles: tuple[str, ...], lamps: tuple[str, ...], salt: int = 0) -> list[GameSpec]:
    """`count` games of every kind in `kinds` (kind by kind) over the given types, drawn from
    (`seed`, `salt`): the same arguments give the same games."""
    games = []
    for k, kind in enumerate(kinds):
        pairs = goal_pairs(kind, objects, receptacles, lamps)
        if not pairs:
            raise ValueError(f"no {kind} goal fits the object types {objects} and receptacle types {receptacles}")
        rng = np.random.default_rng([int(seed), int(salt), k])
        for _ in range(count):
            obj, target = pairs[rng.integers(len(pairs))]
            games.append(make_problem(kind, obj, target, rng))
    return games


def write_game_file(spec: GameSpec, path: str) -> None:
    """Write a generated game as an ALFWorld `game.tw-pddl` file (JSON of the game's data)."""
    with open(path, "w") as f:
        json.dump({**spec.source, "solvable": True, "walkthrough": None}, f)
