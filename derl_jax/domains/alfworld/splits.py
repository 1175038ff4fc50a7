"""The games of each generalisation level: from a user's ALFWorld data directory, or generated.

A data directory has ALFWorld's layout (`alfworld-download` puts it under
$ALFWORLD_DATA/json_2.1.1): `train/`, `valid_seen/` and `valid_unseen/`, each holding task
directories named `<kind>-<Object>-<MovableRecep>-<Receptacle or Lamp>-<scene>` with one trial
directory per game, each with its `game.tw-pddl` (ALFWorld's game file: domain, grammar with the
goal text, problem). Games with movable receptacles or sliced objects are left out, as ALFWorld
does, and so are games the file marks unsolvable. `domain.data_dir` may name `json_2.1.1` or a
directory holding it; environment variables in it are expanded (`$ALFWORLD_DATA`).

The paper's levels (Appendix B, after ALFWorld's seen / unseen evaluation splits):

  L0  train on `train/`, evaluate on `valid_seen/` (rooms and objects seen in training);
  L1  train on `train/`, evaluate on `valid_unseen/` (unseen rooms and objects);
  L2  train on the kinds not held out, evaluate on `valid_unseen/` games of the held-out kinds.

`num_train` / `num_test` = 0 takes every playable game of the split (of the level's kinds), as
the paper does; N > 0 takes N games of each kind (all of a kind with fewer), drawn at random
with `seed` (`domain.split_seed`; the draws of the training and the evaluation split and of
each kind are independent), listed in path order.

Without a data directory the games are generated (`problems.py`) from `seed`, `num_train` /
`num_test` (>= 1) per kind: training games use the seen halves of the object, receptacle and
lamp types; L0 evaluates on new games over the seen types, L1 and L2 on games whose goal
object, goal receptacle and lamp types are unseen.
"""

from __future__ import annotations

import json
import os
import re

import numpy as np

from derl_jax.domains.alfworld import problems as P

LEVELS = ("L0", "L1", "L2")
DATA_SPLITS = ("train", "valid_seen", "valid_unseen")
GAME_FILE = "game.tw-pddl"
_GOAL = re.compile(r"Your task is to: (.+?)\.?\"")


def expand_data_dir(data_dir: str) -> str:
    """`data_dir` with `~` and environment variables expanded ("" stays "")."""
    return os.path.expanduser(os.path.expandvars(str(data_dir or "").strip()))


def split_directory(data_dir: str, split: str) -> str:
    """`data_dir`/`split`, or `data_dir`/json_2.1.1/`split`; "" when neither exists."""
    for path in (os.path.join(data_dir, split), os.path.join(data_dir, "json_2.1.1", split)):
        if os.path.isdir(path):
            return path
    return ""


def data_problem(data_dir: str, needed: tuple[str, ...] = DATA_SPLITS) -> str | None:
    """What is wrong with `data_dir` (expanded) as an ALFWorld data directory (None when nothing is)."""
    unset = re.findall(r"\$\{?(\w+)", data_dir)
    if unset:
        return f"{data_dir!r} names the environment variable {unset[0]}, which is not set"
    if not os.path.isdir(data_dir):
        return f"{data_dir!r} is not a directory"
    missing = [split for split in needed if not split_directory(data_dir, split)]
    if missing:
        return f"{data_dir!r} has no {', '.join(s + '/' for s in missing)} (ALFWorld's json_2.1.1 layout)"
    return None


def read_games(split_dir: str, kinds: tuple[str, ...]) -> list[P.GameSpec]:
    """Every playable game of `kinds` under `split_dir` (module docstring), in path order."""
    games = []
    for root, dirs, files in sorted(os.walk(split_dir)):
        dirs.sort()
        if GAME_FILE not in files or "movable" in root or "Sliced" in root:
            continue
        fields = os.path.basename(os.path.dirname(root)).split("-")
        if len(fields) < 4 or fields[0] not in kinds:
            continue
        path = os.path.join(root, GAME_FILE)
        with open(path) as f:
            data = json.load(f)
        if data.get("solvable") is False:
            continue
        goal = _GOAL.search(data["grammar"])
        light = fields[0] == "look_at_obj_in_light"
        games.append(P.GameSpec(kind=fields[0], obj=fields[1].lower(), recep="" if light else fields[3].lower(),
                                toggle=fields[3].lower() if light else "", goal=goal.group(1) if goal else "",
                                source=path))
    return games


def per_kind(games: list[P.GameSpec], kinds: tuple[str, ...], count: int, seed: int, salt: int,
             where: str) -> list[P.GameSpec]:
    """Every game of `kinds` (count 0), or `count` of each kind drawn at random with (`seed`,
    `salt`, the kind's index) (all of a kind with fewer), kind by kind, in path order; a kind
    with no game raises naming `where`."""
    chosen = []
    for index, kind in enumerate(kinds):
        found = [g for g in games if g.kind == kind]
        if not found:
            raise ValueError(f"no playable {kind} games under {where}")
        if 0 < count < len(found):
            rows = np.random.default_rng((int(seed), int(salt), index)).choice(len(found), count, replace=False)
            found = [found[row] for row in sorted(rows.tolist())]
        chosen += found
    return chosen


def level_games(level: str, kinds: tuple[str, ...], held_out: tuple[str, ...], num_train: int, num_test: int,
                data_dir: str = "", seed: int = 0) -> tuple[list[P.GameSpec], list[P.GameSpec]]:
    """(training games, evaluation games) of `level` (module docstring)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    trained = tuple(k for k in kinds if level != "L2" or k not in held_out)
    tested = held_out if level == "L2" else kinds
    if not trained or not tested:
        raise ValueError(f"level {level} with kinds {kinds} and held-out kinds {held_out} leaves nothing to train or test")
    data_dir = expand_data_dir(data_dir)
    if data_dir:
        test_split = "valid_seen" if level == "L0" else "valid_unseen"
        wrong = data_problem(data_dir, ("train", test_split))
        if wrong:
            raise ValueError(wrong)
        train_dir, test_dir = split_directory(data_dir, "train"), split_directory(data_dir, test_split)
        return (per_kind(read_games(train_dir, trained), trained, num_train, seed, 0, train_dir),
                per_kind(read_games(test_dir, tested), tested, num_test, seed, 1, test_dir))
    if num_train < 1 or num_test < 1:
        raise ValueError(f"generated games need num_train and num_test >= 1 per kind, got {num_train} and {num_test}")
    split = P.type_split(seed)
    seen = tuple(split[s][0] for s in ("objects", "receptacles", "lamps"))
    unseen = tuple(split[s][1] for s in ("objects", "receptacles", "lamps"))
    train = P.generate_games(trained, num_train, seed, *seen, salt=0)
    test = P.generate_games(tested, num_test, seed, *(seen if level == "L0" else unseen), salt=1)
    return train, test
