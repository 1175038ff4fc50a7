"""The household for a pretrained policy: the JAX environment behind the agent prompt, on the host.

A checkpoint policy reads and writes its own tokenizer's sub-words, so its answers are text to
parse (`derl_jax.domains.agent_prompt`), not word ids. `HouseholdTextEnv` is a batched host
environment (`derl_jax.domains.env.HostEnv`) that runs the household's jitted, vmapped
`HouseholdEnv` on its word ids and speaks text to the policy:

    env = HouseholdTextEnv(HouseholdEnv(max_turns=8), prompt, answer_length=48)
    rows i32[B, O], states = env.reset(keys u32[B, 2], tasks)      # tasks: the Task fields, leading axis B
    rows, states, reward f32[B], done bool[B], info = env.step(states, answers i32[B, A])

Each row is the agent prompt's observation row (`AgentPrompt.row`): the action taken and the
observation, then the actions admissible now (`admissible_actions`, the household's rules).
An answer's tag and action become the word action `<tag> <action words>`; a malformed answer,
or an action outside the household's words, is played as an empty action (the household
answers "nothing happens ." and the step scores 0) and counted (`counts`).
info: step_score, success, valid (the action did something), well_formed; with Self-Guide in
words (`self_guide=True`) also assessment i32[B] (index of the verdict, -1 when there is none)
and self_reward f32[B] (`self_rewards` of the verdict; 0 without one, the action still runs).
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from derl_jax.domains import selfguide
from derl_jax.domains.agent_prompt import AgentPrompt, AnswerCounts, parse_answer, write_answer
from derl_jax.domains.household import actions as A
from derl_jax.domains.household import vocab
from derl_jax.domains.household.env import TAG_PRIORITY, HouseholdEnv, accessible, held_object
from derl_jax.domains.household.expert import expert_action
from derl_jax.domains.household.tasks import Task

KIND_WORDS = {"plan": vocab.TAGS[0], "explore": vocab.TAGS[1], "reflect": vocab.TAGS[2], "act": vocab.TAGS[3]}
ECHO_WORDS = 12   # a malformed answer is echoed in the next row by its first words only


def _name(types: np.ndarray, numbers: np.ndarray, slot: int, names: Sequence[str]) -> str:
    return f"{names[int(types[slot])]} {int(numbers[slot])}"


def admissible_actions(state: Any) -> list[str]:
    """The actions that succeed in one (unbatched, NumPy) `HouseholdState`, by the household's rules."""
    task = state.task
    recep_type, obj_type = np.asarray(task.recep_type), np.asarray(task.obj_type)
    recep = [_name(recep_type, task.recep_num, r, vocab.RECEPTACLE_NAMES) for r in range(len(recep_type))]
    obj = [_name(obj_type, task.obj_num, o, vocab.OBJECT_NAMES) if obj_type[o] >= 0 else "" for o in range(len(obj_type))]
    here, held = int(state.agent_loc), int(held_object(state))
    is_open = np.asarray(accessible(state))
    obj_loc = np.asarray(state.obj_loc)
    present = [r for r in range(len(recep_type)) if recep_type[r] >= 0]
    actions = [f"go to {recep[r]}" for r in present if r != here]
    if here >= 0:
        openable = bool(vocab.OPENABLE[recep_type[here]])
        if openable:
            actions.append(f"{'close' if bool(state.recep_open[here]) else 'open'} {recep[here]}")
        visible = [o for o in range(len(obj_type)) if obj_type[o] >= 0 and obj_loc[o] == here and is_open[here]]
        if held < 0:
            actions += [f"take {obj[o]} from {recep[here]}" for o in visible if vocab.PICKABLE[obj_type[o]]]
        else:
            if is_open[here]:
                actions.append(f"put {obj[held]} in/on {recep[here]}")
            for verb, device, able in (("clean", vocab.SINK, vocab.CLEANABLE), ("heat", vocab.MICROWAVE, vocab.HEATABLE),
                                       ("cool", vocab.FRIDGE, vocab.COOLABLE)):
                if recep_type[here] == device and able[obj_type[held]]:
                    actions.append(f"{verb} {obj[held]} with {recep[here]}")
        actions += [f"use {obj[o]}" for o in visible
                    if vocab.LIGHT_SOURCE[obj_type[o]] and not bool(state.lamp_on[o])]
        actions.append(f"examine {recep[here]}")
        actions += [f"examine {obj[o]}" for o in visible]
    if held >= 0:
        actions.append(f"examine {obj[held]}")
    return actions + ["look", "inventory"]


def _rows(tree: Any, count: int) -> list[Any]:
    return [jax.tree_util.tree_map(lambda x, i=i: x[i], tree) for i in range(count)]


def _stack(states: Sequence[Any], size: int) -> Any:
    """The states stacked along a new leading axis, padded to `size` with copies of the first."""
    padded = list(states) + [states[0]] * (size - len(states))
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *padded)


def _bucket(count: int) -> int:
    return 1 << max(0, (count - 1).bit_length())


class HouseholdTextEnv:
    """The household behind the agent prompt (module docstring)."""

    host = True

    def __init__(self, env: HouseholdEnv, prompt: AgentPrompt, answer_length: int, self_guide: bool = False,
                 self_rewards: Sequence[float] = selfguide.DEFAULT_SELF_REWARDS):
        if env.self_guide:
            raise ValueError("HouseholdTextEnv: the inner HouseholdEnv reads word actions; Self-Guide in words is "
                             "this adapter's own option")
        self.env, self.prompt, self.words = env, prompt, vocab.WordVocab()
        self.obs_length, self.action_length, self.max_turns = prompt.row_length, int(answer_length), int(env.max_turns)
        self.self_guide, self.self_rewards = bool(self_guide), selfguide.checked_rewards(self_rewards)
        self.prompt_layout = prompt.layout
        self.counts = AnswerCounts()
        self._reset = jax.jit(jax.vmap(env.reset))
        self._step = jax.jit(jax.vmap(env.step))

    # ------------------------------------------------------------------ text

    def task_text(self, description: np.ndarray) -> str:
        """The goal of a task in words, from its description ids i32[D]."""
        return self.words.decode([int(i) for i in description if i != vocab.PAD_ID]).rstrip(" .")

    def word_action(self, kind: str | None, action: str) -> np.ndarray:
        """i32[A_words]: `<tag> <action>` in household words; all pad when malformed or not household words."""
        out = np.full(A.ACTION_LENGTH, vocab.PAD_ID, np.int32)
        if kind is None:
            return out
        try:
            ids = self.words.encode(f"{KIND_WORDS[kind]} {action}")
        except ValueError:
            return out
        if len(ids) <= A.ACTION_LENGTH:
            out[: len(ids)] = ids
        return out

    # ------------------------------------------------------------------ the host environment

    def reset(self, keys: np.ndarray, tasks: Mapping[str, np.ndarray]) -> tuple[np.ndarray, list[dict]]:
        """B fresh episodes -> (rows i32[B, O], states)."""
        count = np.shape(keys)[0]
        size = _bucket(count)
        task = Task(**{name: np.asarray(tasks[name]) for name in Task.__dataclass_fields__})
        padded = jax.tree_util.tree_map(lambda x: np.concatenate([x, np.repeat(x[:1], size - count, 0)]), task)
        obs, state = jax.device_get(self._reset(jnp.zeros((size, 2), jnp.uint32), padded))
        states = [{"state": s, "done": False} for s in _rows(state, count)]
        rows = [self.prompt.row(None, self.words.decode(obs[b]), admissible_actions(states[b]["state"]))
                for b in range(count)]
        return np.stack(rows), states

    def advance(self, states: Sequence[dict], word_actions: np.ndarray) -> tuple[list[Any], list[str], dict]:
        """Step the JAX household: (new JAX states, observation texts, info of NumPy arrays) per row."""
        count = len(states)
        size = _bucket(count)
        batch = _stack([s["state"] for s in states], size)
        actions = np.concatenate([word_actions, np.repeat(word_actions[:1], size - count, 0)])
        obs, new_state, _, _, info = jax.device_get(self._step(batch, jnp.asarray(actions, jnp.int32)))
        info = {name: np.asarray(value)[:count] for name, value in info.items()}
        return _rows(new_state, count), [self.words.decode(obs[b]) for b in range(count)], info

    def step(self, states: Sequence[dict], actions: np.ndarray):
        """One step of every episode -> (rows i32[B, O], states, reward f32[B], done bool[B], info)."""
        actions = np.asarray(actions)
        if actions.shape != (len(states), self.action_length):
            raise ValueError(f"step: answers must be int [{len(states)}, {self.action_length}], got {actions.shape}")
        answers = [parse_answer(self.prompt.table.decode(row)) for row in actions]
        live = np.array([not s["done"] for s in states])
        for answer, state, alive in zip(answers, states, live):
            if alive:
                self.counts.add(answer, admissible_actions(state["state"]))
        word_actions = np.stack([self.word_action(a.kind, a.action) for a in answers])
        new_states, observations, info = self.advance(states, word_actions)
        rows = np.zeros((len(states), self.obs_length), np.int32)
        for b, (state, answer) in enumerate(zip(states, answers)):
            if state["done"]:
                rows[b] = self.prompt.table.pad_id
                continue
            state["state"], state["done"] = new_states[b], bool(new_states[b].done)
            shown = answer.action if answer.well_formed else " ".join(answer.action.split()[:ECHO_WORDS])
            rows[b] = self.prompt.row(shown, observations[b], admissible_actions(new_states[b]))
        out = {"step_score": np.where(live, info["step_score"], 0.0).astype(np.float32),
               "success": np.array([float(s["state"].success) for s in states], np.float32),
               "valid": np.where(live, info["valid"], 0.0).astype(np.float32),
               "well_formed": np.array([float(a.well_formed) for a in answers], np.float32) * live}
        if self.self_guide:
            out["assessment"] = np.array([a.assessment if alive else -1 for a, alive in zip(answers, live)], np.int32)
            out["self_reward"] = selfguide.self_reward(out["assessment"], self.self_rewards, live)
        reward = np.where(live, out["success"], 0.0).astype(np.float32)
        return rows, list(states), reward, np.array([s["done"] for s in states]), out


@functools.lru_cache(maxsize=1)
def _expert():
    return jax.jit(jax.vmap(expert_action))


def expert_turns(env: HouseholdTextEnv, tasks: Task, seed: int, perturb_rate: float, window: int
                 ) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) of every turn of the perturbed expert on `tasks`, in the agent
    prompt exactly as the rollout writes it (task ids, then `AgentPrompt.window_ids` of the last
    `window` rows). A perturbed turn takes a random admissible action instead of the expert's;
    each answer carries the tag that agrees with what the step did (the household's tag rules,
    preferring plan, reflect, explore, act) and, with Self-Guide, the expert's assessment."""
    rng = np.random.default_rng(seed)
    count = tasks.size
    rows, states = env.reset(np.zeros((count, 2), np.uint32), {n: getattr(tasks, n) for n in Task.__dataclass_fields__})
    task_ids = [env.prompt.task_ids(env.task_text(d)) for d in np.asarray(tasks.description)]
    windows = [[rows[b]] for b in range(count)]
    pairs: list[list[tuple[list[int], list[int]]]] = [[] for _ in range(count)]
    policy = _expert()
    for _ in range(env.max_turns):
        live = [b for b in range(count) if not states[b]["done"]]
        if not live:
            break
        batch = _stack([states[b]["state"] for b in live], _bucket(len(live)))
        expert = np.asarray(policy(batch))[: len(live)]
        commands = []
        for i, b in enumerate(live):
            state = states[b]["state"]
            command = env.words.decode([int(w) for w in expert[i][1:] if w not in (vocab.PAD_ID, vocab.EOS_ID)])
            if rng.random() < perturb_rate:
                options = admissible_actions(state)
                command = options[rng.integers(len(options))]
            commands.append(command)
        word_actions = np.stack([env.word_action("act", c) for c in commands])
        new_states, observations, info = env.advance([states[b] for b in live], word_actions)
        for i, b in enumerate(live):
            state = states[b]["state"]
            tags = np.asarray(info["tags"][i])
            kind = ("plan", "explore", "reflect", "act")[next(t for t in TAG_PRIORITY if tags[t])]
            assessment = (int(selfguide.assess(bool(state.subgoal_done), bool(state.last_failed)))
                          if env.self_guide else None)
            answer = env.prompt.table.tokens(write_answer(kind, commands[i], assessment))
            if len(answer) < env.action_length:   # room for the eos
                pairs[b].append((task_ids[b] + env.prompt.window_ids(windows[b][-window:]), answer))
            states[b]["state"], states[b]["done"] = new_states[i], bool(new_states[i].done)
            windows[b].append(env.prompt.row(commands[i], observations[i], admissible_actions(new_states[i])))
    return [pair for episode in pairs for pair in episode]
