"""The registered `household` domain: datasets, config checks, the warm-start corpus as text."""

import jax
import ml_collections
import numpy as np
import pytest

from derl_jax.config import ConfigError
from derl_jax.domains.household import corpus as C
from derl_jax.domains.household import env as household_env
from derl_jax.domains.household import tasks as T
from derl_jax.domains.household import vocab
from derl_jax.domains.household.domain import tasks_of
from derl_jax.domains.registry import get_domain


def config(**domain) -> ml_collections.ConfigDict:
    block = {"kind": "household", "level": "L2", "seed": 4, "num_train": 24, "num_test": 12,
             "held_out_kinds": (T.COOL, T.PICK_TWO), "max_turns": 30, "history": 2}
    block.update(domain)
    return ml_collections.ConfigDict({"domain": block, "policy": {"sft_perturb_rate": 0.25}})


@pytest.fixture(scope="module")
def domain():
    spec = get_domain("household")
    spec.validate(config())
    return spec.build(config())


@pytest.mark.slow
def test_domain_splits_are_the_level_splits(domain):
    train, test = T.level_splits("L2", 4, 24, 12)
    for name in ("kind", "obj_type", "obj_loc", "recep_type", "description"):
        np.testing.assert_array_equal(getattr(tasks_of(domain.train), name), getattr(train, name))
        np.testing.assert_array_equal(getattr(tasks_of(domain.test), name), getattr(test, name))
    words, reset = vocab.WordVocab(), jax.jit(domain.env.reset)
    for row in range(3):
        prompt = np.asarray(domain.train.prompts[row])[np.asarray(domain.train.prompt_mask[row])]
        room = words.decode(np.asarray(reset(jax.random.PRNGKey(0), {n: getattr(train, n)[row] for n in household_env.TASK_FIELDS})[0]))
        assert prompt.tolist() == words.encode(words.decode(train.description[row]) + " " + room, add_bos=True)
        assert room.startswith("you are in the middle of a room")
    assert domain.primitive_names == ("outcome", "phase_first", "phase_middle", "phase_last")
    assert domain.rollout == "env" and domain.max_new_tokens == domain.env.action_length == 8
    assert domain.prompt_length == 13 + 64 + 2 * (8 + 64)
    assert domain.info["test_kinds"] == ["cool", "pick_two"] and domain.info["test_unseen"]


def test_reset_reads_a_context_row(domain):
    """The multi-turn rollout hands reset rows of dict(batch.context)."""
    row = {name: value[5] for name, value in dict(domain.train.context).items()}
    obs, state = jax.jit(domain.env.reset)(jax.random.PRNGKey(0), row)
    types, numbers = np.asarray(row["recep_type"]), np.asarray(row["recep_num"])
    listing = " , ".join(f"a {vocab.RECEPTACLE_NAMES[t]} {n}" for t, n in zip(types, numbers) if t >= 0)
    expected = f"you are in the middle of a room . looking quickly around you , you see {listing} ."
    assert vocab.WordVocab().decode(obs) == expected
    np.testing.assert_array_equal(state.obj_loc, tasks_of(domain.train).obj_loc[5])
    assert obs.shape == (household_env.OBS_LENGTH,)


@pytest.mark.parametrize("field, value, message", [
    ("level", "L4", "config.domain.level"),
    ("num_train", 2, "config.domain.num_train"),
    ("max_turns", 0, "config.domain.max_turns"),
    ("history", 0, "config.domain.history"),
    ("held_out_kinds", (T.COOL,), "config.domain.held_out_kinds"),
    ("held_out_kinds", (T.COOL, 9), "config.domain.held_out_kinds"),
    ("prompt_budget", 76, "config.domain.prompt_budget"),
    ("prompt_budget", -1, "config.domain.prompt_budget"),
])
def test_bad_config_fields_are_named(field, value, message):
    with pytest.raises(ConfigError, match=message):
        get_domain("household").validate(config(**{field: value}))
    bad_rate = config()
    bad_rate.policy.sft_perturb_rate = 2.0
    with pytest.raises(ConfigError, match="config.policy.sft_perturb_rate"):
        get_domain("household").validate(bad_rate)


@pytest.mark.slow
def test_corpus_texts_encode_back_to_the_played_turns(domain):
    holdout = [0, 3]
    texts = domain.corpus(7, holdout, {"sft_perturb_rate": 0.25})
    kept = tasks_of(domain.train).take(np.array([r for r in range(24) if r not in holdout]))
    pairs = C.sft_corpus(kept, 7, 0.25, env=domain.env, window=domain.history)
    assert len(texts) == len(pairs) > 0
    prompts, prompt_mask = domain.tokenizer.encode_batch([p for p, _ in texts], domain.prompt_length,
                                                         left_pad=True, add_bos=True)
    actions, action_mask = domain.tokenizer.encode_batch([a for _, a in texts], domain.max_new_tokens,
                                                         left_pad=False, add_eos=True)
    for row, (prompt, action) in enumerate(pairs):
        assert prompts[row][prompt_mask[row]].tolist() == prompt.tolist()
        assert actions[row][action_mask[row]].tolist() == action.tolist() + [vocab.EOS_ID]
    # Fresh tasks add turns; no room for them is an error.
    more = domain.corpus(7, holdout, {"sft_perturb_rate": 0.25, "sft_extra_tasks": 6})
    assert len(more) > len(texts) and more[: len(texts)] == texts
    with pytest.raises(ValueError, match="holdout_rows"):
        domain.corpus(7, [99], {})


@pytest.mark.slow
def test_a_prompt_budget_caps_the_corpus_and_rollout_prompts():
    """At a budget, corpus prompts are the full-window prompts cut to their newest tokens (the
    task whole), and the encoder pads them to the budget: nothing longer reaches the warm start."""
    full, capped = (get_domain("household").build(config(prompt_budget=budget)) for budget in (0, 80))
    assert full.prompt_length == 221 and capped.prompt_length == 80
    long_texts = full.corpus(5, [], {"sft_perturb_rate": 0.5})
    texts = capped.corpus(5, [], {"sft_perturb_rate": 0.5})
    assert len(texts) == len(long_texts)
    words = capped.tokenizer
    cut = 0
    for (prompt, action), (long_prompt, long_action) in zip(texts, long_texts):
        assert action == long_action
        tokens, long_tokens = words.encode(prompt, add_bos=True), words.encode(long_prompt, add_bos=True)
        assert len(tokens) == min(len(long_tokens), 80)
        room = long_prompt.index("you are in the middle")   # the task: <bos> description room (two periods)
        task = words.encode(long_prompt[: long_prompt.index(" .", long_prompt.index(" .", room) + 2) + 2], add_bos=True)
        newest = len(tokens) - len(task)
        assert tokens == long_tokens[: len(task)] + long_tokens[len(long_tokens) - newest:]
        cut += len(long_tokens) > 80
    assert cut > 0
    words.encode_batch([p for p, _ in texts], capped.prompt_length, left_pad=True, add_bos=True)


@pytest.mark.slow
@pytest.mark.parametrize("self_guide", [False, True])
def test_every_corpus_completion_fits_the_generation_budget_with_eos(self_guide):
    """All-random turns (the longest word strings included) end in <eos> within max_new_tokens,
    the completion length the warm start encodes to."""
    cfg = config(self_guide=self_guide, num_train=60)
    built = get_domain("household").build(cfg)
    texts = built.corpus(3, [], {"sft_perturb_rate": 1.0})
    lengths = [len(built.tokenizer.encode(a, add_eos=True)) for _, a in texts]
    assert max(lengths) == built.max_new_tokens == 8 + int(self_guide)


@pytest.mark.parametrize("preset", ["default", "smoke"])
def test_config_presets_pass_every_check(preset):
    from configs import common, household
    from derl_jax.config import validate
    from derl_jax.experiment.checks import validate_config

    cfg = household.get_config(preset)
    validate(cfg)
    validate_config(cfg)
    assert cfg.domain.kind == "household" and get_domain(cfg.domain.kind).primitive_names(cfg) == (
        "outcome", "phase_first", "phase_middle", "phase_last")
    reference = common.base("x", {}, {})
    for block in ("inner", "meta", "outer", "evolution", "final", "compare", "mesh", "primitives"):
        assert set(cfg[block].keys()) == set(reference[block].keys()), block


def test_full_history_corpus_packs_each_episode_into_one_stream_read_once():
    """With history "full" every corpus prompt is the episode so far (each continues the previous
    prompt and action), the warm start packs an episode into one stream, and its loss over the
    streams equals the loss over the pairs (one row per turn), gradients included."""
    from derl_jax.models.transformer import init_params, tiny_config
    from derl_jax.rl import sft

    built = get_domain("household").build(config(history="full", max_turns=8, prompt_budget=260))
    assert built.history == "full" and built.prompt_length == 260
    texts = built.corpus(2, [], {"sft_perturb_rate": 0.3})
    streams = sft.pack_corpus(built.tokenizer, texts, built.prompt_length + built.max_new_tokens,
                              built.max_new_tokens)
    assert streams.turns == len(texts) and 1 < streams.size < len(texts)
    row, turn, words = 0, 0, built.tokenizer
    for prompt, action in texts:   # every pair is one turn of a stream, in order
        if turn == int(np.asarray(streams.completion_mask[row]).any(-1).sum()):
            row, turn = row + 1, 0
        start = int(streams.starts[row, turn])
        assert np.asarray(streams.tokens[row])[:start].tolist() == words.encode(prompt, add_bos=True)
        held = np.asarray(streams.completions[row, turn])[np.asarray(streams.completion_mask[row, turn])]
        assert held.tolist() == words.encode(action, add_eos=True)
        turn += 1
    assert row == streams.size - 1
    pairs = sft.encode_corpus(words, texts, built.prompt_length, built.max_new_tokens)
    graphdef, params = init_params(tiny_config(words.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                                               max_position=built.prompt_length + 8), jax.random.key(0))
    loss = jax.jit(jax.value_and_grad(lambda p, d: sft.completion_nll(graphdef, p, d)))
    (got, got_grads), (want, want_grads) = loss(params, streams), loss(params, pairs)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(got_grads), jax.tree_util.tree_leaves(want_grads), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
