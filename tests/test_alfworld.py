"""ALFWorld adapter: generated problems, the tag rules' ALFWorld side, data directories, install
messages, and episodes on the real engine (TextWorld's PDDL games) in this process and in a worker."""

from __future__ import annotations

import importlib.util
import re
import sys

import numpy as np
import pytest

from configs import alfworld as alf_config
from derl_jax.config import InputError, validate
from derl_jax.domains.alfworld import problems as P
from derl_jax.domains.alfworld import rules
from derl_jax.domains.alfworld.domain import make_vocabulary, task_text
from derl_jax.domains.alfworld.engine import Game
from derl_jax.domains.alfworld.env import AlfWorldEnv, EngineMissing
from derl_jax.domains.alfworld.splits import level_games, read_games
from derl_jax.domains.scienceworld import tags as T

SPLIT = P.type_split(0)
SEEN = tuple(SPLIT[s][0] for s in ("objects", "receptacles", "lamps"))


@pytest.mark.slow
def test_generated_problems_carry_alfworld_goals_and_rooms():
    from alfworld.gen import constants, goal_library

    games = P.generate_games(P.KINDS, 2, seed=3, objects=SEEN[0], receptacles=SEEN[1], lamps=SEEN[2])
    again = P.generate_games(P.KINDS, 2, seed=3, objects=SEEN[0], receptacles=SEEN[1], lamps=SEEN[2])
    assert [g.source for g in games] == [g.source for g in again]   # the seed fixes the games
    other = P.generate_games(P.KINDS, 2, seed=4, objects=SEEN[0], receptacles=SEEN[1], lamps=SEEN[2])
    assert [g.source for g in games] != [g.source for g in other]
    assert [g.kind for g in games] == [k for k in P.KINDS for _ in range(2)]
    by_lower = {t.lower(): t for t in constants.OBJECTS}
    for game in games:
        target = game.toggle or game.recep
        texts = [t.format(obj=game.obj, recep=game.recep, toggle=game.toggle, mrecep="")
                 for t in goal_library.gdict[game.kind]["templates"]]
        assert game.goal in texts and "UNKNOWN GOAL" not in game.source["grammar"]
        assert f'"Your task is to: {game.goal}."' in game.source["grammar"]
        problem = game.source["pddl_problem"]
        assert f"(objectType ?o {by_lower[game.obj]}Type)" in problem or f"(objectType ?o1 {by_lower[game.obj]}Type)" in problem
        assert f"{by_lower[target]}Type)" in problem and by_lower[game.obj] in SEEN[0]
        # every object starts in a receptacle that ALFRED's table lets hold it, never the goal receptacle
        init = problem.split("(:goal")[0]
        types = dict(re.findall(r"\((?:objectType|receptacleType) (\S+) (\w+)Type\)", init))
        for obj, recep in re.findall(r"\(inReceptacle (\S+) (\S+)\)", init):
            lamp = types[obj] in P.LAMPS
            assert lamp or types[obj] in constants.VAL_RECEPTACLE_OBJECTS[types[recep]], (obj, recep)
            assert lamp or types[obj] != by_lower[game.obj] or types[recep].lower() != game.recep
    # the engine shows the goal and the room; the planner's plan wins every kind; the process's argv
    # stays as it was (the engine's PDDL translator overwrites it)
    argv = list(sys.argv)
    for game in games[::2]:
        played = Game(game.source, expert=True)
        first = played.reset()
        assert rules.goal_of(first) == game.goal and "you are in the middle of a room" in first.lower()
        assert "sinkbasin 1" in first and "fridge 1" in first and "microwave 1" in first
        won = [played.step(command)[1] for command in played.plan()]
        assert won[-1] and not any(won[:-1]), game.kind
        assert sys.argv == argv


def test_levels_split_types_and_kinds():
    train, test = level_games("L1", P.KINDS, (), 2, 2, seed=0)
    unseen = {t.lower() for t in SPLIT["objects"][1]}
    assert {g.obj for g in train} <= {t.lower() for t in SEEN[0]} and {g.obj for g in test} <= unseen
    assert {g.recep for g in test if g.recep} <= {t.lower() for t in SPLIT["receptacles"][1]}
    held_out = ("pick_cool_then_place_in_recep", "pick_two_obj_and_place")
    train, test = level_games("L2", P.KINDS, held_out, 2, 3, seed=0)
    assert {g.kind for g in train} == set(P.KINDS) - set(held_out) and len(train) == 8
    assert [g.kind for g in test] == [k for k in held_out for _ in range(3)]
    l0_train, l0_test = level_games("L0", P.KINDS, (), 2, 2, seed=0)
    assert {g.obj for g in l0_test} <= {t.lower() for t in SEEN[0]}
    assert not {g.source["pddl_problem"] for g in l0_test} & {g.source["pddl_problem"] for g in l0_train}


def test_rules_read_alfworld_answers():
    assert rules.well_formed("take apple 1 from countertop 2") and rules.well_formed("go to  sinkbasin 1")
    assert rules.well_formed("heat mug 1 with microwave 1") and rules.well_formed("look")
    assert not rules.well_formed("take apple from countertop 2") and not rules.well_formed("look around")
    assert not rules.well_formed("put apple 1 in fridge 1") and not rules.well_formed("")
    goal = ("pick_heat_then_place_in_recep", "apple", "countertop", "")
    assert rules.subgoal(*goal, "You pick up the apple 2 from the fridge 1.")
    assert not rules.subgoal(*goal, "You pick up the mug 1 from the fridge 1.")
    assert rules.subgoal(*goal, "You heat the apple 2 using the microwave 1.")
    assert not rules.subgoal(*goal, "You cool the apple 2 using the fridge 1.")   # not this kind's change
    assert rules.subgoal(*goal, "You move the apple 2 to the countertop 1.")
    assert not rules.subgoal(*goal, "You move the apple 2 to the shelf 1.")
    assert rules.subgoal("look_at_obj_in_light", "cd", "", "desklamp", "You turn on the desklamp 1.")
    intro = "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room.\n\nYour task is to: put a pen in dresser."
    assert rules.goal_of(intro) == "put a pen in dresser" and rules.room_of(intro) == "You are in the middle of a room."
    tracker = T.TagTracker(phrasing=rules.PHRASING)
    steps = [("plan", "go to shelf 1", "You arrive at shelf 1. On the shelf 1, you see a pen 1.", False, 1.0),
             ("act", "go to drawer 1", "You arrive at drawer 1. The drawer 1 is closed.", False, 0.0),   # new place
             ("explore", "open drawer 1", "You open the drawer 1. The drawer 1 is open. In it, you see nothing.", False, 1.0),
             ("act", "examine drawer 1", "Nothing happens.", False, 1.0),
             ("reflect", "go to shelf 1", "You arrive at shelf 1. On the shelf 1, you see a pen 1.", False, 1.0),
             ("act", "take pen 1 from shelf 1", "You pick up the pen 1 from the shelf 1.", True, 1.0),
             ("act", "go to dresser 1", "You arrive at dresser 1. On the dresser 1, you see nothing.", False, 0.0)]
    for tag, action, observation, achieved, want in steps:
        assert T.score_step(tracker, tag, action, observation, achieved) == want, action
    assert tracker.visited == {"shelf 1", "drawer 1", "dresser 1"} and tracker.opened == {"drawer 1"}


def expert_tags(plan: list[str], game: P.GameSpec) -> list[str]:
    """The tag of every step of a plan that never fails, by the rules spelled out: plan first and after
    a subgoal, explore on reaching a new receptacle or opening one, act otherwise."""
    tags, seen, after_subgoal = [], set(), True
    for command in plan:
        place = command.split(" ", 2)[2] if command.startswith("go to") else command[5:] if command.startswith("open ") else None
        tags.append("plan" if after_subgoal else "explore" if place and place not in seen else "act")
        seen |= {place} if place else set()
        words = command.split()
        after_subgoal = ((words[0] == "take" and words[1] == game.obj) or (words[0] == "move" and words[1] == game.obj
                         and words[4] == game.recep) or (words[0] == rules.CHANGE_OF_KIND.get(game.kind) and words[1] == game.obj))
    return tags


@pytest.mark.slow
@pytest.mark.parametrize("num_workers", [0, 1])
def test_two_scripted_episodes_on_the_engine(num_workers):
    games = P.generate_games(("pick_clean_then_place_in_recep",), 1, seed=5, objects=SEEN[0], receptacles=SEEN[1],
                             lamps=SEEN[2])
    game = games[0]
    expert = Game(game.source, expert=True)
    expert.reset()
    plan = expert.plan()
    tags = expert_tags(plan, game)
    tags[1] = "plan" if tags[1] != "plan" else "act"   # one wrong tag: its step scores 0
    vocab = make_vocabulary(games)
    turns = len(plan) + 1
    wrong = ["act go to fridge 1", "act xyzzy apple", "reflect look", "act take fridge 1 from sinkbasin 1",
             "reflect inventory"] + ["act look"] * turns
    with AlfWorldEnv(games, num_workers, vocab=vocab, obs_length=48, action_length=12, max_turns=turns) as env:
        obs, states = env.reset(np.zeros((2, 2), np.uint32), {"game": np.zeros(2, np.int32)})
        assert vocab.decode(obs[0]).startswith("you are in the middle of a room") and (obs[0] == obs[1]).all()
        history = []
        for turn in range(turns):
            texts = [f"{tags[turn]} {plan[turn]}" if turn < len(plan) else "act look", wrong[turn]]
            actions = np.stack([vocab.encode(t, env.action_length) for t in texts])
            obs, states, reward, done, info = env.step(states, actions)
            history.append((vocab.decode(obs[1]), reward.copy(), done.copy(), {k: v.copy() for k, v in info.items()}))
        rewards = np.array([h[1] for h in history])
        dones = np.array([h[2] for h in history])
        scores = np.array([h[3]["step_score"] for h in history])
    last = len(plan) - 1
    # the expert wins on its last step: reward 1 there only, done from then on, success 1
    assert rewards[:, 0].tolist() == [0.0] * last + [1.0] + [0.0] * (turns - last - 1)
    assert dones[:, 0].tolist() == [False] * last + [True] * (turns - last) and history[last][3]["success"][0] == 1.0
    assert scores[:last + 1, 0].tolist() == [1.0, 0.0] + [1.0] * (last - 1)
    # the wrong-action episode never wins and ends at max_turns
    assert rewards[:, 1].sum() == 0 and dones[:, 1].tolist() == [False] * (turns - 1) + [True]
    assert history[-1][3]["success"][1] == 0.0
    assert history[1][0] == "nothing happens ." and history[1][3]["valid"][1] == 0.0   # malformed: not sent
    assert scores[:5, 1].tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]   # new place tagged act; malformed; reflect; act; reflect


def test_data_directory_games_play_from_their_files(tmp_path):
    games = P.generate_games(("pick_and_place_simple", "look_at_obj_in_light"), 1, seed=1, objects=SEEN[0],
                             receptacles=SEEN[1], lamps=SEEN[2])
    root = tmp_path / "json_2.1.1"
    for split in ("train", "valid_seen", "valid_unseen"):
        for game in games:
            target = game.toggle or game.recep
            trial = root / split / f"{game.kind}-{game.obj}-None-{target}-10" / "trial_T2019_0"
            trial.mkdir(parents=True)
            P.write_game_file(game, str(trial / "game.tw-pddl"))
        skipped = root / split / "pick_and_place_with_movable_recep-Apple-Bowl-Fridge-1" / "trial_1"
        skipped.mkdir(parents=True)
        P.write_game_file(games[0], str(skipped / "game.tw-pddl"))
    found = read_games(str(root / "valid_seen"), P.KINDS)
    assert [(g.kind, g.obj, g.recep, g.toggle, g.goal) for g in found] == \
        [(g.kind, g.obj, g.recep, g.toggle, g.goal) for g in sorted(games, key=lambda g: g.kind)]
    train, test = level_games("L1", ("look_at_obj_in_light",), (), 1, 1, data_dir=str(tmp_path))
    assert test[0].source == str(root / "valid_unseen" / f"look_at_obj_in_light-{games[1].obj}-None-{games[1].toggle}-10"
                                 / "trial_T2019_0" / "game.tw-pddl")
    played = Game(test[0].source, expert=True)
    assert rules.goal_of(played.reset()) == games[1].goal
    assert [played.step(c)[1] for c in played.plan()][-1]
    cfg = alf_config.get_config("tiny")
    cfg.domain.data_dir = str(tmp_path)
    validate(cfg)
    (root / "valid_unseen").rename(tmp_path / "elsewhere")
    cfg.domain.level = "L1"
    with pytest.raises(InputError, match=r"^config.domain.data_dir=.* has no valid_unseen/ .*json_2.1.1"):
        validate(cfg)
    cfg.domain.data_dir = str(tmp_path / "missing")
    with pytest.raises(InputError, match=r"^config.domain.data_dir=.*missing' is not a directory; put ALFWorld's json_2.1.1"):
        validate(cfg)


def test_missing_package_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "alfworld" else real(name, *a))
    with pytest.raises(InputError, match=r"^config.domain.kind='alfworld': ALFWorld needs the alfworld package.*"
                                         r"pip install 'derl_jax\[alfworld\]'") as err:
        validate(alf_config.get_config("tiny"))
    assert "\n" not in str(err.value)
    with pytest.raises(EngineMissing, match="alfworld==0.4.2"):
        AlfWorldEnv([], 2, vocab=None)   # before any worker process starts
    assert task_text(P.GameSpec("k", "a", "b", "", "put a b in c", {})) == "Your task is to: put a b in c."


def test_worker_process_reports_errors_and_stops_on_close():
    from derl_jax.domains.alfworld.engine import Workers

    games = P.generate_games(("pick_and_place_simple",), 1, seed=2, objects=SEEN[0], receptacles=SEEN[1], lamps=SEEN[2])
    workers = Workers([g.source for g in games], num_workers=1)
    try:
        local = Game(games[0].source)
        assert workers.run(0, [("start", 7, 0, False)]) == [local.reset()]
        with pytest.raises(RuntimeError, match=r"ALFWorld worker 0 failed:(.|\n)*KeyError: 8"):
            workers.run(0, [("step", 8, "look", False)])
        assert workers.run(0, [("step", 7, "look", False)]) == [local.step("look")]   # it still serves
        procs = list(workers._procs)
    finally:
        workers.close()
    assert all(proc.poll() == 0 for proc in procs)


@pytest.mark.slow
def test_search_expert_visits_the_listed_places_in_order_until_it_sees_the_object():
    """`ExpertGame(search=True)`: until the task's object shows in an observation where the agent
    stands, each action opens the closed place it stands at or goes to the first place of the
    admissible list not yet visited; then the planner finishes the game (checked step by step
    against a replay of the admissible lists)."""
    from derl_jax.domains.alfworld.domain import ExpertGame

    games = P.generate_games(("pick_and_place_simple", "pick_clean_then_place_in_recep"), 3, seed=5,
                             objects=SEEN[0], receptacles=SEEN[1], lamps=SEEN[2])
    searched_before_found = 0
    with AlfWorldEnv(games, 0, vocab=make_vocabulary(games), obs_length=48, action_length=12, max_turns=40) as env:
        for index, game in enumerate(games):
            expert = ExpertGame(env, 0, search=True)
            expert.load(game.kind, index)
            visited, seen, closed_here, won = [], False, None, False
            for action in expert.gold_actions():
                admissible = expert.admissible()
                assert action in admissible
                if not seen:
                    unvisited = [a for a in admissible if a.startswith("go to ") and a[6:] not in visited]
                    expected = f"open {closed_here}" if closed_here else unvisited[0]
                    assert action == expected
                    searched_before_found += 1
                observation, _, won = expert.step(action)
                if action.startswith("go to "):
                    visited.append(action[6:])
                    closed_here = action[6:] if f"The {action[6:]} is closed." in observation else None
                elif action.startswith("open "):
                    closed_here = None
                seen = seen or re.search(rf"\b{game.obj} \d+\b", observation) is not None
                if won:
                    break
            assert won and seen
    assert searched_before_found > len(games)   # the object was not always at the first place
