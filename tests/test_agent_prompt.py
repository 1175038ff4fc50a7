"""The agent prompt of a pretrained policy: its parts, its answers, and the rollout's window of it.

Uses the real Qwen2.5 tokenizer (`bundled_qwen_tokenizer_dir`) and its chat template.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from derl_jax.domains import agent_prompt as AP
from derl_jax.domains.env import left_pack, window_history
from derl_jax.models.hf_tokenizer import QWEN25_CHAT_TEMPLATE, HFTokenizer, bundled_qwen_tokenizer_dir


@pytest.fixture(scope="module")
def table():
    return AP.load_table(bundled_qwen_tokenizer_dir())


@pytest.fixture(scope="module")
def prompt(table):
    return AP.AgentPrompt(table, "alfworld", obs_length=48, admissible_length=40)


STEPS = [("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a mug 1."),
         ("take mug 1 from countertop 1", "You pick up the mug 1 from the countertop 1.")]
ADMISSIBLE = ["go to sinkbasin 1", "examine mug 1", "look", "inventory"]


def test_rendered_turn_prompt_has_every_part_in_order(prompt):
    text = prompt.render("put a clean mug in coffeemachine", STEPS, ADMISSIBLE)
    parts = ["<|im_start|>user\n", "Your task is to: put a clean mug in coffeemachine.",
             "Action: go to countertop 1\nObservation: You arrive at countertop 1.",
             "Action: take mug 1 from countertop 1\nObservation: You pick up the mug 1",
             "Admissible actions now: [go to sinkbasin 1, examine mug 1, look, inventory]",
             "<planning>", "<reflection>", "<explore>", "<monitor>", "<action> </action>",
             "<|im_end|>\n<|im_start|>assistant\n"]
    where = [text.find(part) for part in parts]
    assert all(w >= 0 for w in where), [p for p, w in zip(parts, where) if w < 0]
    assert where == sorted(where)
    assert text.endswith("<|im_start|>assistant\n")
    assert text.count("Admissible actions now") == 1   # the current observation's only


def test_admissible_line_keeps_whole_actions_that_fit(table):
    short = AP.AgentPrompt(table, "household", obs_length=16, admissible_length=14)
    row = short.row(None, "you are in the middle of a room .", ["go to desk 1", "go to shelf 2", "go to fridge 1"])
    listed = table.tokenizer.decode(row[16:], skip_special_tokens=True)
    assert listed.startswith("\nAdmissible actions now: [go to desk 1") and listed.endswith("]")
    assert "fridge" not in listed and len(table.tokens(listed)) <= 14


def test_tokenizer_without_a_template_gets_the_qwen25_one(table):
    fallback = HFTokenizer(table.tokenizer.tokenizer, chat_template="qwen2.5")
    assert fallback.chat_template == QWEN25_CHAT_TEMPLATE
    wrapped = type(table)(fallback)
    p = AP.AgentPrompt(wrapped, "household", 16, 16)
    assert p.head.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    assert p.tail == "<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("text, kind, action, well_formed", [
    ("<planning>First find the mug.</planning>\n<action>go to countertop 1</action>", "plan", "go to countertop 1", True),
    ("<explore>new place</explore><action> open  drawer 2 </action>", "explore", "open drawer 2", True),
    ("<reflection>failed</reflection>\n<action>look</action>", "reflect", "look", True),
    ("<monitor>ok</monitor><action>inventory</action>", "act", "inventory", True),
    ("<action>go to countertop 1</action>", None, "<action>go to countertop 1</action>", False),
    ("<planning>a</planning>", None, "<planning>a</planning>", False),
    ("<action>look</action><planning>late</planning>", None, "<action>look</action><planning>late</planning>", False),
    ("<planning>a</planning><explore>b</explore><action>look</action>", None,
     "<planning>a</planning><explore>b</explore><action>look</action>", False),
    ("<planning>a</planning><action> </action>", None, "<planning>a</planning><action> </action>", False),
    ("<think>x</think><action>look</action>", None, "<think>x</think><action>look</action>", False),
    ("go to countertop 1", None, "go to countertop 1", False),
])
def test_answers_are_read(text, kind, action, well_formed):
    answer = AP.parse_answer(text)
    assert (answer.kind, answer.action, answer.well_formed) == (kind, action, well_formed)


@pytest.mark.parametrize("kind", ["plan", "explore", "reflect", "act"])
def test_written_answers_read_back(kind):
    for assessment in (None, 0, 1, 2):
        answer = AP.parse_answer(AP.write_answer(kind, "take mug 1 from countertop 1", assessment))
        assert answer == AP.Answer(kind, "take mug 1 from countertop 1", True, -1 if assessment is None else assessment)


def test_answer_counts_share_of_admissible_well_formed_answers():
    counts = AP.AnswerCounts()
    counts.add(AP.parse_answer("<monitor>x</monitor><action>look</action>"), ["look", "inventory"])
    counts.add(AP.parse_answer("<monitor>x</monitor><action>fly</action>"), ["look"])
    counts.add(AP.parse_answer("look"), ["look"])
    counts.add(AP.parse_answer("<monitor>x</monitor><action>look</action>"), ["look"])
    assert counts.shares() == {"well_formed": 0.75, "admissible": 0.5}


def _rollout_window(prompt, rows, task_ids, length=None):
    """The turn prompt the rollout writes (task, then `window_history` with the agent layout) as ids."""
    pad = prompt.table.pad_id
    slots, obs_len = len(rows), prompt.row_length
    observations = jnp.asarray(np.stack(rows))[None]
    actions = jnp.full((1, slots, 5), 7, jnp.int32)   # raw answers: left out of the window
    task = jnp.asarray(task_ids, jnp.int32)[None]
    history, kept = window_history(task != pad, actions, jnp.ones_like(actions, bool), observations,
                                   observations != pad, length, pad, None, prompt.layout)
    block, mask = left_pack(history, kept)
    assert history.shape == (1, slots * (5 + obs_len) + len(prompt.suffix))
    return list(task_ids) + [int(i) for i in np.asarray(block[0])[np.asarray(mask[0])]]


def test_window_of_the_rollout_is_the_host_prompt(prompt):
    task_ids = prompt.task_ids("put a clean mug in coffeemachine")
    rows = [prompt.row(a, o, ADMISSIBLE) for a, o in STEPS]
    assert _rollout_window(prompt, rows, task_ids) == task_ids + prompt.window_ids(rows)
    older = rows[0][: prompt.step_length]
    # a bound drops the oldest window tokens first, never the tail
    keep = len(task_ids) + len(prompt.window_ids(rows)) - 5
    bounded = _rollout_window(prompt, rows, task_ids, keep)
    dropped = [int(i) for i in older if i != prompt.table.pad_id][5:]
    assert bounded == task_ids + dropped + prompt.window_ids(rows[1:])
    assert bounded[-len(prompt.suffix):] == list(prompt.suffix)
    assert AP.window_room(prompt.layout, 2, prompt.row_length, 5) == 2 * 48 + 40 + len(prompt.suffix)


def test_prompt_style_follows_the_policy():
    from ml_collections import ConfigDict

    from derl_jax.config import ConfigError

    def cfg(**policy):
        return ConfigDict({"policy": {"checkpoint": "", "tokenizer": "", **policy}})

    assert not AP.agent_style(cfg()) and AP.agent_style(cfg(checkpoint="/m"))
    assert not AP.agent_style(cfg(checkpoint="/m", prompt_style="compact"))
    with pytest.raises(ConfigError, match="prompt_style='agent' needs"):
        AP.validate_prompt_fields(cfg(prompt_style="agent"))
    with pytest.raises(ConfigError, match="prompt_style"):
        AP.validate_prompt_fields(cfg(prompt_style="chat"))


# ----------------------------------------------------------------------------- the household's admissible actions


@pytest.fixture(scope="module")
def household_states():
    """(batched env step, states along the expert's episodes of a few household tasks, the
    expert's action ids in each of them); one compiled step serves the fixture and the test."""
    from derl_jax.domains.household import tasks as T
    from derl_jax.domains.household.env import HouseholdEnv
    from derl_jax.domains.household.expert import expert_action

    env = HouseholdEnv(max_turns=10)
    tasks, _ = T.level_splits("L0", 0, 6, 1, (4, 5))
    step, reset = jax.jit(jax.vmap(env.step)), jax.jit(jax.vmap(env.reset))
    expert = jax.jit(jax.vmap(expert_action))
    _, state = reset(jnp.zeros((tasks.size, 2), jnp.uint32), T.to_device(tasks))
    states, experts = [], []
    for _ in range(6):
        action = expert(state)
        states.append(jax.device_get(state))
        experts.append(np.asarray(action))
        _, state, _, _, _ = step(state, action)
    return step, states, experts


def test_household_admissible_actions_all_succeed_and_hold_the_experts(household_states):
    from derl_jax.domains.household import vocab
    from derl_jax.domains.household.text_env import admissible_actions

    step, states, experts = household_states
    words = vocab.WordVocab()
    tried_states, tried_ids, tried = [], [], []
    for batch, expert_ids in zip(states, experts):
        for b in range(np.asarray(batch.turn).shape[0]):
            state = jax.tree_util.tree_map(lambda x: x[b], batch)
            actions = admissible_actions(state)
            assert len(set(actions)) == len(actions) and actions[-2:] == ["look", "inventory"]
            for action in actions[:: max(1, len(actions) // 6)]:
                ids = words.encode(f"act {action}")
                tried_states.append(state)
                tried_ids.append(ids + [vocab.PAD_ID] * (8 - len(ids)))
                tried.append(action)
            if not bool(state.done):
                said = words.decode([int(w) for w in expert_ids[b][1:] if w not in (vocab.PAD_ID, vocab.EOS_ID)])
                assert said in actions
    # every tried action, each from its own state, in one batched step
    stacked = jax.tree_util.tree_map(lambda *x: np.stack(x), *tried_states)
    _, _, _, _, info = step(stacked, jnp.asarray(tried_ids, jnp.int32))
    valid = np.asarray(info["valid"])
    assert valid.shape == (len(tried),) and len(tried) > 30
    assert (valid == 1.0).all(), [a for a, v in zip(tried, valid) if v != 1.0]


@pytest.mark.parametrize("task", ["Your task is to: put some statue on countertop.",
                                  "Task Description:\nYour task is to put some statue on countertop.",
                                  "put some statue on countertop"])
def test_the_engines_task_lines_are_not_repeated(prompt, task):
    text = prompt.task_text(task)
    assert text.count("Your task is to") == 1 and "Task Description" not in text
    assert text.endswith("Your task is to: put some statue on countertop." + AP.HISTORY_HEADER)


class DoorsOpenWorld:
    """A hand-written engine whose gold path opens a door that is already open: the engine
    accepts `open door to kitchen` but does not list it among the actions it admits."""

    GOLD = ["open door to kitchen", "go to kitchen", "focus on cup"]

    def load(self, task, variation, simplifications, gold_path=True):
        self.stepped, self.room = [], "hallway"

    def gold_actions(self):
        return list(self.GOLD)

    def task_description(self):
        return "Your task is to find a cup."

    def reset(self, describe_task=False):
        return "This room is called the hallway. A door to the kitchen (that is open)."

    def admissible(self):
        here = ["go to kitchen", "look around"] if self.room == "hallway" else ["focus on cup", "look around"]
        return here + ["inventory"]

    def step(self, action):
        self.stepped.append(action)
        if action == "go to kitchen":
            self.room = "kitchen"
        done = action == "focus on cup"
        return f"You did {action}.", 1.0 if done else 0.0, done


def test_agent_corpus_plays_gold_actions_the_engine_does_not_admit_silently():
    from derl_jax.domains.scienceworld.corpus import play_agent

    prompt = AP.AgentPrompt(AP.load_table(bundled_qwen_tokenizer_dir()), "scienceworld", obs_length=48,
                            admissible_length=40)
    world = DoorsOpenWorld()
    pairs = play_agent(world, "find", 0, 0, 0.0, prompt, window=2, max_turns=2)
    taught = [AP.parse_answer(prompt.table.tokenizer.decode(answer)).action for _, answer in pairs]
    assert world.stepped == DoorsOpenWorld.GOLD        # the world followed the whole gold path
    assert taught == ["go to kitchen", "focus on cup"]  # the silent step took no turn of max_turns
    shown = [prompt.table.tokenizer.decode(ids) for ids, _ in pairs]
    assert not any("open door" in text for text in shown)
    assert "Admissible actions now: [focus on cup, look around, inventory]" in shown[1]
