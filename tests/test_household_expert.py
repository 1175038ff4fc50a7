"""Household expert and corpus through the jitted, vmapped environment (1024 episodes at once)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from derl_jax.domains.household import corpus as C
from derl_jax.domains.household import env as household_env
from derl_jax.domains.household import tasks as T
from derl_jax.domains.household import vocab

ENV = household_env.HouseholdEnv(max_turns=30)
EPISODES = 1024


@pytest.fixture(scope="module")
def tasks() -> T.Task:
    """1024 tasks: the train and test splits of every level, all six kinds at every level."""
    parts = [part for level in T.LEVELS for part in T.level_splits(level, 5, 200, 150)]
    everything = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *parts)
    return everything.take(np.arange(EPISODES))


def play(tasks: T.Task, seed: int, rate: float):
    """`C.play` called as `C.sft_corpus` calls it (no prompt budget): the corpus of the same tasks
    reuses the compiled program."""
    return jax.device_get(C.play(T.to_device(tasks), jax.random.PRNGKey(seed), jnp.float32(rate), ENV,
                                 C.DEFAULT_WINDOW, None))


@pytest.fixture(scope="module")
def expert_run(tasks):
    return play(tasks, 0, 0.0)


@pytest.fixture(scope="module")
def mixed_run(tasks):
    return play(tasks, 1, 0.25)


@pytest.fixture(scope="module")
def mixed_corpus(tasks):
    return C.sft_corpus(tasks, seed=1, perturb_rate=0.25, env=ENV)


@pytest.mark.slow
def test_expert_solves_every_task_with_correct_tags(tasks, expert_run):
    _, _, actions, episodes = expert_run
    kinds = np.asarray(tasks.kind)
    assert set(kinds[:350].tolist()) == set(kinds[350:700].tolist()) == set(range(6))
    assert episodes["success"].shape == (EPISODES,)
    assert np.all(episodes["success"] == 1.0), np.flatnonzero(episodes["success"] < 1)
    mask = episodes["step_mask"]
    assert np.all(episodes["step_scores"][mask] == 1.0)
    assert np.all(episodes["valid"][mask] == 1.0)
    np.testing.assert_array_equal(episodes["reward"].sum(axis=1), 1.0)
    lengths = mask.sum(axis=1)
    assert lengths.max() < ENV.max_turns and lengths.min() >= 3
    assert np.all(mask == (np.arange(ENV.max_turns)[None] < lengths[:, None]))    # a prefix
    # The first action is a plan, the last one completes the goal.
    assert np.all(actions[:, 0, 0] == vocab.TAG_IDS[vocab.PLAN])


@pytest.mark.slow
def test_same_key_same_episodes(tasks, expert_run, mixed_run):
    again = play(tasks, 1, 0.25)
    for name, value in mixed_run[3].items():
        np.testing.assert_array_equal(value, again[3][name], err_msg=name)
    np.testing.assert_array_equal(mixed_run[0], again[0])


def test_perturbed_expert_mixes_in_failures_and_the_turn_limit_ends_episodes(tasks, mixed_run):
    episodes = mixed_run[3]
    mask = episodes["step_mask"]
    invalid = 1.0 - episodes["valid"][mask].mean()
    assert 0.05 < invalid < 0.4
    assert episodes["success"].mean() > 0.9                            # the expert recovers from detours
    random_run = play(tasks, 2, 1.0)[3]
    lengths = random_run["step_mask"].sum(axis=1)
    failed = random_run["success"] == 0
    assert failed.mean() > 0.9
    assert np.all(lengths[failed] == ENV.max_turns)
    assert 0.0 < random_run["step_scores"][random_run["step_mask"]].mean() < 0.5


def test_vmapped_episodes_equal_step_by_step_episodes(tasks, mixed_run):
    """Replay the mixed run's actions one step at a time with the unbatched jitted env."""
    _, _, _, episodes = mixed_run
    step, reset = jax.jit(ENV.step), jax.jit(ENV.reset)
    kinds = np.asarray(tasks.kind)
    chosen = [int(np.flatnonzero(kinds == k)[3]) for k in range(6)]
    for index in chosen:
        obs, state = reset(jax.random.PRNGKey(0), tasks.take(index))
        np.testing.assert_array_equal(obs, episodes["obs"][index, 0])
        for turn in range(ENV.max_turns):
            obs, state, reward, done, info = step(state, episodes["actions"][index, turn])
            np.testing.assert_array_equal(obs, episodes["obs"][index, turn + 1])
            assert float(info["step_score"]) == episodes["step_scores"][index, turn]
            assert float(info["valid"]) == episodes["valid"][index, turn]
            assert float(reward) == episodes["reward"][index, turn]
            if bool(done):
                break
        assert float(state.success) == episodes["success"][index]
        assert int(state.turn) == episodes["step_mask"][index].sum()


def test_sft_corpus_pairs_are_the_played_turns(tasks, mixed_run, mixed_corpus):
    corpus = mixed_corpus
    prompts, prompt_mask, actions, episodes = mixed_run
    mask = episodes["step_mask"]
    assert len(corpus) == int(mask.sum())
    first_prompt, first_action = corpus[0]
    description = np.asarray(tasks.description[0])
    obs0, obs1 = episodes["obs"][0, 0], episodes["obs"][0, 1]
    room = obs0[obs0 != vocab.PAD_ID].tolist()       # the task prompt ends with the room, the window starts with it
    expected = [vocab.BOS_ID, *description[description != vocab.PAD_ID], *room, *room]
    assert first_prompt.tolist() == expected
    assert first_action.tolist() == [t for t in actions[0, 0].tolist() if t != vocab.PAD_ID]
    second_prompt, _ = corpus[1]
    assert second_prompt.tolist() == expected + first_action.tolist() + obs1[obs1 != vocab.PAD_ID].tolist()
    for prompt, action in corpus[:200]:
        assert prompt[0] == vocab.BOS_ID
        assert vocab.PAD_ID not in prompt.tolist() and vocab.PAD_ID not in action.tolist()
        assert len(prompt) <= prompts.shape[-1] and 1 <= len(action) <= ENV.action_length
    tagged = np.mean([int(a[0]) in vocab.TAG_IDS for _, a in corpus])
    assert 0.8 < tagged < 1.0                                          # random word strings are mixed in


def test_a_small_corpus_is_the_first_episodes_of_a_large_one(tasks, mixed_corpus):
    """5 tasks are played in a batch of 16, 1,024 in one of 1,024: the same turns for the 5."""
    assert [C.play_rows(n) for n in (1, 5, 16, 17, 1024, 1025)] == [16, 16, 16, 32, 1024, 2048]
    large = mixed_corpus
    small = C.sft_corpus(tasks.take(np.arange(5)), seed=1, perturb_rate=0.25, env=ENV)
    assert len(small) > 5 * 3
    for (prompt, action), (want_prompt, want_action) in zip(small, large[:len(small)], strict=True):
        np.testing.assert_array_equal(prompt, want_prompt)
        np.testing.assert_array_equal(action, want_action)


def test_a_renamed_corpus_renames_each_episode_consistently_within_strata(tasks):
    count = 5
    plain = C.sft_corpus(tasks.take(np.arange(count)), seed=1, perturb_rate=0.25, env=ENV)
    renamed = C.sft_corpus(tasks.take(np.arange(count)), seed=1, perturb_rate=0.25, env=ENV, rename=True)
    tables = C.renaming_tables(1, count)
    stratum = {vocab.ID[n]: ("object", spec[0]) for n, spec in vocab.OBJECT_TYPES.items()}
    stratum.update({vocab.ID[n]: ("receptacle", spec[0]) for n, spec in vocab.RECEPTACLE_TYPES.items()})
    for table in tables:   # a permutation of the vocabulary that keeps strata, appliances and other words
        assert sorted(table.tolist()) == list(range(vocab.SELF_GUIDE_VOCAB_SIZE))
        moved = np.flatnonzero(table != np.arange(table.size))
        assert all(stratum[int(w)] == stratum[int(table[w])] for w in moved)
        assert not set(moved.tolist()) & {int(vocab.RECEPTACLE_WORD[a]) for a in vocab.APPLIANCES}
    assert any((tables[0] != tables[1])[list(stratum)])
    # turn by turn: the same corpus under its episode's table (episodes are told apart by their task prompt)
    episode, first_words = -1, None
    for (prompt, action), (want_prompt, want_action) in zip(renamed, plain, strict=True):
        if first_words is None or not np.array_equal(want_prompt[:12], first_words):
            episode, first_words = episode + 1, want_prompt[:12]
        np.testing.assert_array_equal(prompt, tables[episode][want_prompt])
        np.testing.assert_array_equal(action, tables[episode][want_action])
    assert episode == count - 1


def test_sft_corpus_checks_its_rate(tasks):
    with pytest.raises(ValueError, match="perturb_rate"):
        C.sft_corpus(tasks, seed=0, perturb_rate=1.5)


def test_expert_searches_in_listing_order_until_it_has_seen_the_goal_object(tasks, expert_run):
    """Before its first take the expert goes to every receptacle in the order the room lists them
    (never back) up to the first one holding a goal object, and takes it there: it does not know
    where the object is before it has looked."""
    from derl_jax.domains.household import actions as A

    _, _, actions, episodes = expert_run
    parse = jax.jit(jax.vmap(A.parse_action, in_axes=(0, None)))
    for index in range(0, EPISODES, 37):
        task = tasks.take(index)
        parsed = jax.device_get(parse(jnp.asarray(actions[index]), T.to_device(task)))
        mask = episodes["step_mask"][index]
        takes = np.flatnonzero((parsed.template == A.TAKE) & mask)
        assert takes.size, index
        first_take = int(takes[0])
        visits = [int(r) for t, r in zip(parsed.template[:first_take], parsed.recep[:first_take]) if t == A.GO]
        assert visits == sorted(set(visits)), (index, visits)        # listing order, no revisits
        is_goal = (np.asarray(task.obj_type) == int(task.goal_object)) & (np.asarray(task.obj_type) >= 0)
        holding = {int(loc) for loc in np.asarray(task.obj_loc)[is_goal]}
        first_holding = next(r for r in visits if r in holding)
        assert int(parsed.recep[first_take]) == first_holding == visits[-1], (index, visits)
        assert visits == list(range(first_holding + 1)), (index, visits)   # every receptacle listed before it
