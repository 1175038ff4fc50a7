"""Household tasks: generator invariants, seen/unseen types, levels L0/L1/L2, vocabulary, prompts."""

import dataclasses

import jax
import numpy as np
import pytest

from derl_jax.domains.household import prompt as P
from derl_jax.domains.household import tasks as T
from derl_jax.domains.household import vocab

VOCAB = vocab.WordVocab()
FIELDS = [f.name for f in dataclasses.fields(T.Task)]


def rows(tasks: T.Task) -> list[dict]:
    return [{name: np.asarray(getattr(tasks, name))[i] for name in FIELDS} for i in range(tasks.size)]


def same(a: T.Task, b: T.Task) -> bool:
    return all(np.array_equal(getattr(a, n), getattr(b, n)) for n in FIELDS)


@pytest.mark.parametrize("level", T.LEVELS)
def test_same_seed_same_arrays_other_seed_other_arrays(level):
    first = T.level_splits(level, 7, 30, 20)
    second = T.level_splits(level, 7, 30, 20)
    other = T.level_splits(level, 8, 30, 20)
    assert same(first[0], second[0]) and same(first[1], second[1])
    assert not same(first[0], other[0]) and not same(first[1], other[1])


def test_type_split_halves_every_stratum_and_depends_on_the_seed():
    split = T.type_split(3)
    assert not set(split.seen_objects) & set(split.unseen_objects)
    assert not set(split.seen_receptacles) & set(split.unseen_receptacles)
    for members in vocab.OBJECT_STRATA.values():
        assert len(set(members) & set(split.seen_objects)) == len(members) // 2
        assert set(members) <= set(split.seen_objects) | set(split.unseen_objects)
    for members in vocab.RECEPTACLE_STRATA.values():
        assert len(set(members) & set(split.seen_receptacles)) == len(members) // 2
    assert not set(split.seen_receptacles) & set(vocab.APPLIANCES)
    assert T.type_split(3) == split and T.type_split(4) != split


def check_task(row: dict, split: T.TypeSplit, unseen: bool):
    """Invariants of one generated task; returns its (goal object, goal receptacle) type pair."""
    kind = int(row["kind"])
    recep = row["recep_type"][row["recep_type"] >= 0]
    objs = row["obj_type"][row["obj_type"] >= 0]
    locs = row["obj_loc"][: len(objs)]
    assert np.all(row["recep_type"][len(recep):] == -1) and np.all(row["obj_loc"][len(objs):] == T.NOWHERE)
    assert sorted(set(vocab.APPLIANCES)) == sorted(set(recep.tolist()) & set(vocab.APPLIANCES))
    assert np.all((locs >= 0) & (locs < len(recep)))
    # Instance numbers are 1..count per type, in slot order.
    for types, nums in ((recep, row["recep_num"]), (objs, row["obj_num"])):
        for t in set(types.tolist()):
            assert nums[: len(types)][types == t].tolist() == list(range(1, int(np.sum(types == t)) + 1))
    goal_obj, goal_rec = int(row["goal_object"]), int(row["goal_receptacle"])
    goal_pool = split.unseen_objects if unseen else split.seen_objects
    assert goal_obj in goal_pool
    needed = {T.CLEAN: vocab.CLEANABLE, T.HEAT: vocab.HEATABLE, T.COOL: vocab.COOLABLE}.get(kind, vocab.PICKABLE)
    assert needed[goal_obj]
    assert np.sum(objs == goal_obj) >= (2 if kind == T.PICK_TWO else 1)
    lamps = np.flatnonzero(vocab.LIGHT_SOURCE[objs])
    assert len(lamps) == 1 and not vocab.OPENABLE[recep[locs[lamps[0]]]]
    if kind == T.EXAMINE:
        assert goal_rec == -1 and objs[lamps[0]] in goal_pool
    else:
        assert goal_rec in (split.unseen_receptacles if unseen else split.seen_receptacles)
        assert goal_rec in recep
        assert not np.any(recep[locs[objs == goal_obj]] == goal_rec)     # not solved at the start
    if not unseen:
        assert set(objs.tolist()) <= set(split.seen_objects)
        assert set(recep.tolist()) <= set(split.seen_receptacles) | set(vocab.APPLIANCES)
    text = VOCAB.decode(row["description"])
    assert vocab.OBJECT_NAMES[goal_obj] in text.split()
    return goal_obj, goal_rec


@pytest.mark.parametrize("level", T.LEVELS)
def test_levels_train_and_test_as_appendix_b(level):
    seed = 11
    train, test = T.level_splits(level, seed, 120, 60)
    split = T.type_split(seed)
    unseen_test = level in ("L1", "L2")
    train_goals = {check_task(r, split, unseen=False) for r in rows(train)}
    test_goals = {check_task(r, split, unseen=unseen_test) for r in rows(test)}
    train_kinds, test_kinds = set(np.asarray(train.kind).tolist()), set(np.asarray(test.kind).tolist())
    if level in ("L2", "L2-seen"):   # L2-seen: held-out kinds over seen types (check_task above)
        assert train_kinds == {T.PICK, T.EXAMINE, T.CLEAN, T.HEAT}
        assert test_kinds == {T.COOL, T.PICK_TWO}
    else:
        assert train_kinds == test_kinds == set(range(6))
    if unseen_test:   # no goal object or goal receptacle of a test task occurs in training
        assert not {o for o, _ in train_goals} & {o for o, _ in test_goals}
        assert not ({r for _, r in train_goals} & {r for _, r in test_goals}) - {-1}
    train_prints = {b"".join(r[n].tobytes() for n in FIELDS) for r in rows(train)}
    assert not any(b"".join(r[n].tobytes() for n in FIELDS) in train_prints for r in rows(test))


def test_l2_held_out_kinds_are_configurable_and_checked():
    train, test = T.level_splits("L2", 1, 12, 6, held_out_kinds=(T.PICK, T.EXAMINE))
    assert set(np.asarray(train.kind).tolist()) == {T.CLEAN, T.HEAT, T.COOL, T.PICK_TWO}
    assert set(np.asarray(test.kind).tolist()) == {T.PICK, T.EXAMINE}
    with pytest.raises(ValueError, match="held_out_kinds"):
        T.level_splits("L2", 1, 12, 6, held_out_kinds=(T.PICK, T.PICK))
    with pytest.raises(ValueError, match="level"):
        T.level_splits("L3", 1, 12, 6)


def test_vocabulary_round_trip_and_errors():
    text = "plan take apple 1 from countertop 2"
    ids = VOCAB.encode(text)
    assert VOCAB.decode(ids) == text and len(ids) == 7
    assert VOCAB.encode("you see a mug 1, a cup 2.") == VOCAB.encode("you see a mug 1 , a cup 2 .")
    assert VOCAB.decode(VOCAB.encode("look", add_bos=True, add_eos=True) + [vocab.ID["look"]]) == "look"
    with pytest.raises(ValueError, match="spaceship"):
        VOCAB.encode("go to spaceship 1")
    with pytest.raises(ValueError, match="not a household word"):
        VOCAB.encode("go to cabinet #1")
    assert len(set(vocab.WORDS)) == vocab.VOCAB_SIZE and vocab.WORDS[vocab.PAD_ID] == "<pad>"


def reference_prompt(description, room, turns) -> list[int]:
    """The prompt of build_prompt written with Python lists: turns = [(action or None, obs)]."""
    def real(ids):
        ids = [int(i) for i in np.asarray(ids)]
        ids = ids[: ids.index(vocab.EOS_ID)] if vocab.EOS_ID in ids else ids
        return [i for i in ids if i != vocab.PAD_ID]

    out = [vocab.BOS_ID] + real(description) + real(room)
    for action, obs in turns:
        out += (real(action) if action is not None else []) + real(obs)
    return out


@pytest.mark.parametrize("window", [1, 3])
def test_prompt_builder_matches_a_list_reference(window):
    rng = np.random.default_rng(window)
    length = P.prompt_length(window)
    description = VOCAB.encode_padded("put a hot apple in shelf .", T.DESCRIPTION_LENGTH)
    room = VOCAB.encode_padded("you see a shelf 1 , a sinkbasin 1 .", 64)
    task_tokens = jax.jit(P.task_prompt)(description, room)
    assert np.asarray(task_tokens).tolist()[-18:] == [vocab.BOS_ID] + VOCAB.encode(
        "put a hot apple in shelf . you see a shelf 1 , a sinkbasin 1 .")
    assert task_tokens.shape == (P.TASK_PROMPT_LENGTH,) == (1 + T.DESCRIPTION_LENGTH + 64,)
    build, push = jax.jit(P.build_prompt), jax.jit(P.push_history)

    def random_obs():
        obs = np.full(64, vocab.PAD_ID, np.int32)
        used = int(rng.integers(1, 64))
        obs[:used] = rng.integers(len(vocab.SPECIALS), vocab.VOCAB_SIZE, size=used)
        return obs

    first = random_obs()
    history = P.start_history(window, first)
    turns = [(None, first)]
    for turn in range(5):
        tokens, mask = build(task_tokens, history)
        expected = reference_prompt(description, room, turns[-window:])
        assert tokens.shape == (length,) and int(mask.sum()) == len(expected)
        assert np.asarray(tokens)[np.asarray(mask)].tolist() == expected
        assert not np.any(np.asarray(mask)[: length - len(expected)])          # left padded
        action = rng.integers(len(vocab.SPECIALS), vocab.VOCAB_SIZE, size=8).astype(np.int32)
        action[rng.integers(1, 8)] = vocab.EOS_ID if turn % 2 else vocab.PAD_ID
        obs = random_obs()
        history = push(history, action, obs)
        turns.append((action, obs))
