"""ScienceWorld adapter: tag rules, vocabulary, install messages, and two episodes on the real engine."""

from __future__ import annotations

import importlib.util
import shutil

import numpy as np
import pytest

from derl_jax.domains import env as env_api
from derl_jax.domains.scienceworld import engine, tags
from derl_jax.domains.scienceworld.tags import TagTracker, score_step, split_tag
from derl_jax.domains.scienceworld.vocab import Vocabulary, words


def test_tag_rules_follow_what_each_step_did():
    tracker = TagTracker(visited={"hallway"})
    steps = [  # (policy text, engine answer, score rose, expected step score, why)
        ("plan open door to kitchen", "The door is now open.", False, 1.0, "plan at the start"),
        ("act go to kitchen", "You move to the kitchen.", False, 0.0, "reaching an unvisited room is explore"),
        ("explore open cupboard", "The cupboard is now open.", False, 1.0, "a never-opened receptacle"),
        ("act xyzzy", "No known action matches that input.", False, 0.0, "not parsed: not well-formed"),
        ("reflect look around", "This room is called the kitchen.", False, 1.0, "reflect after a failure"),
        ("act focus on cupboard", "You focus on the cupboard.", True, 1.0, "a plain action"),
        ("act move cupboard to red box", "You move the cupboard to the red box.", False, 0.0,
         "after a completed subgoal the tag is plan"),
        ("explore open cupboard", "The cupboard is now open.", False, 0.0, "opened before: not explore"),
        ("go to hallway", "You move to the hallway.", False, 0.0, "no tag: not well-formed"),
        ("reflect go to hallway", "You move to the hallway.", False, 1.0, "after the untagged (failed) step"),
    ]
    scores = []
    for text, observation, rose, want, why in steps:
        tag, action = split_tag(text)
        scores.append(score_step(tracker, tag, action, observation, rose))
        assert scores[-1] == want, why
    assert tracker.turn == len(steps) and tracker.visited == {"hallway", "kitchen"} and tracker.opened == {"cupboard"}


def test_split_tag_and_failures():
    assert split_tag("Explore  go to kitchen ") == ("explore", "go to kitchen")
    assert split_tag("go to kitchen") == (None, "go to kitchen")
    assert split_tag("plan") == ("plan", "")
    assert tags.failed("No known action matches that input.") and tags.failed("The door is already open.")
    assert not tags.failed("You move to the kitchen.")
    assert tags.start_location("Task\nThis room is called the art studio. In it") == "art studio"


def test_vocabulary_round_trip_and_padding():
    vocab = Vocabulary(["cupboard", "red", "box", "cupboard"], ["find-non-living-thing"])
    ids = vocab.encode("Explore: move Cupboard to red box zebra", 12)
    assert ids.dtype == np.int32 and ids.shape == (12,)
    assert vocab.decode(ids) == "explore : move cupboard to red box <unk>"
    assert vocab.tokens(vocab.decode(ids)) == [i for i in ids.tolist() if i != vocab.pad_id]  # decode re-encodes
    batch, mask = vocab.encode_batch(["red box", "<unk> box"], 4, left_pad=True, add_bos=True)
    assert batch.tolist() == [[vocab.pad_id, vocab.bos_id, vocab.ids["red"], vocab.ids["box"]],
                              [vocab.pad_id, vocab.bos_id, vocab.unk_id, vocab.ids["box"]]]
    assert mask.tolist() == [[False, True, True, True]] * 2 and vocab.decode_batch(batch) == ["red box", "<unk> box"]
    assert vocab.decode([vocab.ids["red"], vocab.eos_id, vocab.ids["box"]]) == "red"
    with pytest.raises(ValueError, match="has 3 tokens, more than 2"):
        vocab.encode_batch(["red box"], 2, left_pad=False, add_eos=True)
    assert vocab.encode("a b c", 2).tolist() == [vocab.ids["a"], vocab.unk_id]
    assert len(vocab) == len(set(vocab.words))
    assert words("It's 3 o'clock.") == ["it's", "3", "o'clock", "."]


def test_missing_java_or_package_says_what_to_install(monkeypatch):
    from derl_jax.domains.scienceworld.env import ScienceWorldEnv

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(engine.EngineMissing, match="needs Java.*openjdk"):
        engine.Worker()
    with pytest.raises(engine.EngineMissing, match="needs Java"):
        ScienceWorldEnv(["boil"], num_workers=2)  # before any JVM or thread starts
    monkeypatch.undo()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "scienceworld" else real(name, *a))
    if shutil.which("java") is not None:
        with pytest.raises(engine.EngineMissing, match=r"pip install 'derl_jax\[agents\]'"):
            engine.Worker()


# ----------------------------------------------------------------------------- the real engine

TASK = "find-non-living-thing"
GOLD = ["open door to kitchen", "go to kitchen", "look around", "focus on cupboard", "move cupboard to red box"]


@pytest.fixture(scope="module")
def scienceworld():
    engine.require_engine()  # fails with what to install: the agents extra is part of this test suite
    from derl_jax.domains.scienceworld.env import ScienceWorldEnv

    env = ScienceWorldEnv([TASK], num_workers=1, obs_length=96, action_length=12, max_turns=5)  # two games, one JVM
    yield env
    env.close()


def _actions(env, texts):
    return np.stack([env.vocab.encode(text, env.action_length) for text in texts])


@pytest.mark.slow
def test_two_scripted_episodes_score_and_end(scienceworld):
    env = scienceworld
    assert isinstance(env, env_api.HostEnv) and env_api.is_host_env(env)
    obs, states = env_api.checked_host_step(env, env.reset(np.zeros((2, 2), np.uint32),
                                                           {"task": np.zeros(2, np.int32),
                                                            "variation": np.zeros(2, np.int32)}), 2)
    assert "this room is called the" in env.vocab.decode(obs[0]) and (obs[0] == obs[1]).all()
    # episode 0 follows the gold path with the right tags; episode 1 fumbles, reflects, explores,
    # then dawdles until the turn limit (5)
    script = [
        ("plan open door to kitchen", "plan xyzzy"),
        ("explore go to kitchen", "reflect open door to kitchen"),
        ("plan look around", "explore go to kitchen"),
        ("act focus on cupboard", "act focus on agent"),
        ("plan move cupboard to red box", "act look around"),
        ("act look around", "act look around"),  # both episodes are over
    ]
    rewards, dones, step_scores, successes, scores, observations = [], [], [], [], [], []
    for pair in script:
        obs, states, reward, done, info = env_api.checked_host_step(env, env.step(states, _actions(env, pair)), 2)
        rewards.append(reward), dones.append(done), step_scores.append(info["step_score"])
        successes.append(info["success"]), scores.append(info["score"]), observations.append(obs)
    rewards, dones, step_scores = np.array(rewards), np.array(dones), np.array(step_scores)
    successes, scores = np.array(successes), np.array(scores)
    text = [[env.vocab.decode(obs[b]) for obs in observations] for b in range(2)]

    # episode 0: the engine scores each subgoal; solved on the 5th step, never before
    assert text[0][1] == "you move to the kitchen ." and text[0][4] == "you move the cupboard to the red box ."
    assert dones[:5, 0].tolist() == [False, False, False, False, True]
    assert successes[:5, 0].tolist() == [0, 0, 0, 0, 1] and scores[4, 0] == pytest.approx(1.0)
    assert np.all(np.diff(scores[:5, 0]) >= 0) and np.all(scores[:4, 0] < 1)
    np.testing.assert_allclose(np.cumsum(rewards[:5, 0]), scores[:5, 0], atol=1e-6)
    assert step_scores[:5, 0].tolist() == [1, 1, 1, 1, 1]
    # episode 1: the unknown word is not well-formed; reflect right after it and exploring the
    # kitchen are right; 'act' right after the kitchen subgoal is not (plan is); the turn limit ends it
    assert text[1][0] == "no known action matches that input ."
    assert step_scores[:5, 1].tolist() == [0, 1, 1, 0, 1]
    assert dones[:5, 1].tolist() == [False, False, False, False, True] and successes[:, 1].sum() == 0
    assert 0 < scores[4, 1] < 1
    # after done nothing changes
    assert dones[5].all() and (rewards[5] == 0).all() and (step_scores[5] == 0).all()
    assert (observations[5] == env.vocab.pad_id).all() and successes[5].tolist() == [1, 0]

    # a reset replays identically
    _, states = env.reset(np.zeros((2, 2), np.uint32), {"task": np.zeros(2, np.int32), "variation": np.zeros(2, np.int32)})
    again = env.step(states, _actions(env, script[0]))
    assert again[4]["step_score"].tolist() == step_scores[0].tolist() and again[3].tolist() == [False, False]
    assert "focus on cupboard" not in env.valid_actions(again[1][0]) and "go to kitchen" in env.valid_actions(again[1][1])

    # the agent prompt's order of the same actions: fewest words first, the engine's order among equals
    valid, listed = again[1][1].game.valid_actions(), again[1][1].game.admissible()
    lengths = [len(action.split()) for action in listed]
    assert sorted(listed) == sorted(valid) and lengths == sorted(lengths) and len(set(lengths)) > 1
    for k in set(lengths):
        assert [a for a in listed if len(a.split()) == k] == [a for a in valid if len(a.split()) == k]


class _FakeWorker:
    """The engine's variation lists for two tasks (what `Worker.variations` returns)."""

    VARIATIONS = {"boil": {"train": [0, 1, 2, 9, 10, 11], "dev": [12, 13], "test": [5, 6]},
                  "melt": {"train": [3, 4, 8], "dev": [14], "test": [7]}}

    def variations(self, task, split):
        return self.VARIATIONS[task][split]


def _pairs(rows):
    return list(zip(rows["task"].tolist(), rows["variation"].tolist()))


def test_level_splits_are_the_engine_variation_lists():
    from derl_jax.domains.scienceworld.splits import level_split

    names = ("boil", "melt")
    # 0 = every variation of ScienceWorld's own lists: L0 tests on dev, L1 on test
    train, evaluate = level_split(_FakeWorker(), names, "L0")
    assert _pairs(train) == [(0, 0), (0, 1), (0, 2), (0, 9), (0, 10), (0, 11), (1, 3), (1, 4), (1, 8)]
    assert _pairs(evaluate) == [(0, 12), (0, 13), (1, 14)] and train["variation"].dtype == np.int32
    train_l1, evaluate = level_split(_FakeWorker(), names, "L1")
    assert _pairs(train_l1) == _pairs(train) and _pairs(evaluate) == [(0, 5), (0, 6), (1, 7)]
    train, evaluate = level_split(_FakeWorker(), names, "L2", held_out=("melt",))
    assert _pairs(train) == [(0, 0), (0, 1), (0, 2), (0, 9), (0, 10), (0, 11)] and _pairs(evaluate) == [(1, 7)]
    with pytest.raises(ValueError, match="L2 needs held-out tasks"):
        level_split(_FakeWorker(), names, "L2")
    with pytest.raises(ValueError, match="none is left to train on"):
        level_split(_FakeWorker(), names, "L2", held_out=names)
    with pytest.raises(ValueError, match=r"held-out tasks \['freeze'\]"):
        level_split(_FakeWorker(), names, "L1", held_out=("freeze",))
    with pytest.raises(ValueError, match="level must be one of"):
        level_split(_FakeWorker(), names, "L3")


def test_a_sample_of_the_lists_is_drawn_with_the_split_seed():
    from derl_jax.domains.scienceworld.splits import level_split

    names = ("boil", "melt")
    full = dict(_FakeWorker.VARIATIONS)
    draws = {seed: level_split(_FakeWorker(), names, "L1", num_train=4, num_test=1, seed=seed) for seed in range(8)}
    for train, evaluate in draws.values():
        boil = [v for t, v in _pairs(train) if t == 0]
        assert len(boil) == 4 and set(boil) < set(full["boil"]["train"])
        assert boil == [v for v in full["boil"]["train"] if v in boil]          # in the list's order
        assert [v for t, v in _pairs(train) if t == 1] == full["melt"]["train"]  # 3 < 4: all of it
        assert [t for t, _ in _pairs(evaluate)] == [0, 1] and _pairs(evaluate)[1] == (1, 7)
    assert _pairs(draws[3][0]) == _pairs(level_split(_FakeWorker(), names, "L1", num_train=4, num_test=1, seed=3)[0])
    assert len({tuple(_pairs(train)) for train, _ in draws.values()}) > 1       # the seed picks the sample
    # L0 and L1 draw the same training sample from the same seed
    assert _pairs(level_split(_FakeWorker(), names, "L0", num_train=4, seed=5)[0]) == _pairs(draws[5][0])


def test_more_episodes_than_jvms_each_in_its_own_game(scienceworld):
    """Three episodes on one JVM, stepped in subsets as the inner loop's bridge does (live ones
    only): each plays exactly as it would alone."""
    env = scienceworld
    tasks = {"task": np.zeros(3, np.int32), "variation": np.array([0, 4, 0], np.int32)}

    def play_alone(variation, texts):
        obs, states = env.reset(np.zeros((1, 2), np.uint32), {"task": np.zeros(1, np.int32),
                                                             "variation": np.array([variation], np.int32)})
        seen = [env.vocab.decode(obs[0])]
        for text in texts:
            obs, states, *_ = env.step(states, _actions(env, [text]))
            seen.append(env.vocab.decode(obs[0]))
        return seen

    moves = [["plan open door to kitchen", "explore go to kitchen"], ["act look around", "explore go to kitchen"],
             ["plan xyzzy", "reflect open door to kitchen"]]
    alone = [play_alone(v, m) for v, m in zip(tasks["variation"].tolist(), moves)]
    obs, states = env.reset(np.zeros((3, 2), np.uint32), tasks)
    together = [[env.vocab.decode(o)] for o in obs]
    for turn in range(2):
        for rows in ([2], [0, 1]):   # a subset first, then the others: the order of calls must not matter
            out = env.step([states[r] for r in rows], _actions(env, [moves[r][turn] for r in rows]))
            for i, r in enumerate(rows):
                together[r].append(env.vocab.decode(out[0][i]))
    assert together == alone
    assert len({id(s.game) for s in states}) == 3 and {s.worker for s in states} == {0}
