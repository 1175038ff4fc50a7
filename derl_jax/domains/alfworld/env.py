"""ALFWorld as a batched host environment (`derl_jax.domains.env.HostEnv`).

    env = AlfWorldEnv(games, num_workers=W, vocab=vocab)   # games: problems.GameSpec; W worker processes
    obs i32[B, O], states = env.reset(keys u32[B, 2], {"game": i32[B]})   # index into `games`
    obs, states, reward f32[B], done bool[B], info = env.step(states, actions i32[B, A])

Episode b plays on worker b % W (`engine.Workers`; W = 0 plays every game in this process),
in a game of its own; a worker keeps finished games loaded for the next episode of the same
game. A step sends every live episode's command to its worker at once, so the worker processes
step in parallel. The first observation is the room (`describe_task=False`, for prompts that
carry the goal) or the engine's whole first text. Actions are token ids: a tag, then a command
(`rules.py`); a command outside ALFWorld's templates is answered "Nothing happens." without
reaching the engine.

  reward   1 on the step that wins the game (the goal holds), else 0
  done     won, or `max_turns` steps
  info     step_score f32[B] (the tag rules: `scienceworld.tags` with ALFWorld's wording and
           subgoals, `rules.py`), success f32[B] (won), score f32[B] (= success),
           valid f32[B] (the action did something)

Self-Guide (`self_guide=True`): every action starts with a self-assessment word
(derl_jax/domains/selfguide.py), which the engine never sees; info adds assessment i32[B]
(index into ASSESSMENTS, -1 when missing: the action is then malformed and not played) and
self_reward f32[B] (its internal reward of `self_rewards`).

Steps after `done` change nothing (zeros). The keys are accepted for the interface and not used.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Mapping, Sequence

import numpy as np

from derl_jax.config import InputError
from derl_jax.domains import selfguide
from derl_jax.domains.agent_prompt import AgentPrompt, AnswerCounts, parse_answer
from derl_jax.domains.alfworld import rules
from derl_jax.domains.alfworld.engine import Workers, engine_missing
from derl_jax.domains.alfworld.problems import GameSpec
from derl_jax.domains.scienceworld import tags as T

NOTHING = "Nothing happens."
ECHO_WORDS = 12   # a row names the action taken by its first words only (a malformed answer can be long)


class EngineMissing(InputError):
    """The alfworld package (with TextWorld's PDDL engine) is not installed."""


def require_engine() -> None:
    """Raise `EngineMissing` saying what to install when ALFWorld cannot run here."""
    missing = engine_missing()
    if missing:
        raise EngineMissing(missing)


@dataclasses.dataclass
class Episode:
    """Host state of one episode."""

    game: int
    slot: int
    worker: int
    tracker: T.TagTracker
    admissible: list = dataclasses.field(default_factory=list)   # the engine's commands now (agent prompt)
    won: bool = False
    done: bool = False
    turn: int = 0


class AlfWorldEnv:
    """ALFWorld games behind the batched host-environment interface (module docstring)."""

    host = True

    def __init__(self, games: Sequence[GameSpec], num_workers: int, *, vocab, obs_length: int = 128,
                 action_length: int = 16, max_turns: int = 30, describe_task: bool = False, self_guide: bool = False,
                 self_rewards: Sequence[float] = selfguide.DEFAULT_SELF_REWARDS, prompt: AgentPrompt | None = None):
        require_engine()   # before any process starts: one clear message when the package is missing
        self.self_guide, self.self_rewards = bool(self_guide), selfguide.checked_rewards(self_rewards)
        self.games = list(games)
        self.vocab, self.describe_task = vocab, describe_task
        self.obs_length, self.action_length, self.max_turns = obs_length, action_length, max_turns
        self.prompt, self.counts = prompt, AnswerCounts()
        if prompt is not None:   # rows of the agent prompt (derl_jax.domains.agent_prompt)
            self.obs_length, self.prompt_layout = prompt.row_length, prompt.layout
        self.workers = Workers([g.source for g in self.games], num_workers)
        self._slots = itertools.count()

    def first_observation(self, text: str) -> str:
        return text if self.describe_task else rules.room_of(text)

    def reset(self, keys: np.ndarray, tasks: Mapping[str, np.ndarray]) -> tuple[np.ndarray, list[Episode]]:
        """B fresh episodes -> (obs i32[B, O], states)."""
        games = np.asarray(tasks["game"]).reshape(-1)
        if np.shape(keys)[0] != len(games):
            raise ValueError(f"reset: {len(games)} games, {np.shape(keys)[0]} keys")
        episodes = [Episode(int(g), next(self._slots), b % self.workers.size, T.TagTracker(phrasing=rules.PHRASING))
                    for b, g in enumerate(games)]
        texts = self._run([(e.worker, ("start", e.slot, e.game, False)) for e in episodes])
        if self.prompt is not None:
            admissible = self._run([(e.worker, ("admissible", e.slot)) for e in episodes])
            for episode, commands in zip(episodes, admissible):
                episode.admissible = commands
            return np.stack([self.prompt.row(None, self.first_observation(t), a) for t, a in zip(texts, admissible)]), episodes
        return np.stack([self.vocab.encode(self.first_observation(t), self.obs_length) for t in texts]), episodes

    def _run(self, calls: Sequence[tuple[int, tuple]]) -> list:
        """The results of (worker, operation) calls, in order; every worker's calls in one batch."""
        by_worker: dict[int, list[int]] = {}
        for i, (worker, _) in enumerate(calls):
            by_worker.setdefault(worker, []).append(i)
        answers = self.workers.run_all({w: [calls[i][1] for i in rows] for w, rows in by_worker.items()})
        out = [None] * len(calls)
        for w, rows in by_worker.items():
            for i, value in zip(rows, answers[w]):
                out[i] = value
        return out

    def step(self, states: Sequence[Episode], actions: np.ndarray):
        """One step of every live episode -> (obs i32[B, O], states, reward f32[B], done bool[B], info)."""
        actions = np.asarray(actions)
        if actions.shape != (len(states), self.action_length):
            raise ValueError(f"step: actions must be int [{len(states)}, {self.action_length}], got {actions.shape}")
        live = np.array([not episode.done for episode in states])
        if self.prompt is None:
            read = [selfguide.read_action(self.vocab.decode(row), self.self_guide) for row in actions]
            parsed = [T.split_tag(text) for _, text in read]
        else:   # an answer of the agent prompt: its tag and action; a malformed one goes to the engine as it is
            answers = [parse_answer(self.vocab.decode(row)) for row in actions]
            for answer, episode, alive in zip(answers, states, live):
                if alive:
                    self.counts.add(answer, episode.admissible)
            read = [(answer.assessment, answer.action) for answer in answers]
            parsed = [(answer.kind, answer.action) for answer in answers]
        calls = []   # (row, worker, operation)
        for b, (episode, (tag, command)) in enumerate(zip(states, parsed)):
            if episode.done:
                continue
            last = episode.turn + 1 >= self.max_turns
            if rules.well_formed(command):
                calls.append((b, episode.worker, ("step", episode.slot, " ".join(command.lower().split()), last)))
            elif last:
                calls.append((b, episode.worker, ("stop", episode.slot)))
        results = self._run([(worker, op) for _, worker, op in calls])
        answers_of = {b: result for (b, _, op), result in zip(calls, results) if op[0] == "step"}
        obs = np.full((len(states), self.obs_length), self.vocab.pad_id, np.int32)
        reward, step_score, valid = (np.zeros(len(states), np.float32) for _ in range(3))
        for b, (episode, (tag, command)) in enumerate(zip(states, parsed)):
            if episode.done:
                continue
            observation, won = answers_of.get(b, (NOTHING, False))
            spec = self.games[episode.game]
            achieved = rules.subgoal(spec.kind, spec.obj, spec.recep, spec.toggle, observation)
            step_score[b] = T.score_step(episode.tracker, tag if b in answers_of else None, command, observation,
                                         achieved)
            episode.turn, episode.won = episode.turn + 1, won
            episode.done = won or episode.turn >= self.max_turns
            reward[b], valid[b] = float(won), float(not T.failed(observation))
            if self.prompt is None:
                obs[b] = self.vocab.encode(observation, self.obs_length)
        if self.prompt is not None:
            live_rows = [b for b, episode in enumerate(states) if live[b]]
            admissible = self._run([(states[b].worker, ("admissible", states[b].slot)) for b in live_rows])
            for b, commands in zip(live_rows, admissible):
                states[b].admissible = commands
                observation = answers_of.get(b, (NOTHING, False))[0]
                obs[b] = self.prompt.row(" ".join(parsed[b][1].split()[:ECHO_WORDS]), observation, commands)
        success = np.array([float(e.won) for e in states], np.float32)
        info = {"step_score": step_score, "success": success, "score": success.copy(), "valid": valid}
        if self.self_guide:
            info["assessment"] = np.array([index if alive else -1 for (index, _), alive in zip(read, live)], np.int32)
            info["self_reward"] = selfguide.self_reward(info["assessment"], self.self_rewards, live)
        return obs, list(states), reward, np.array([e.done for e in states]), info

    def close(self) -> None:
        """Stop the worker processes."""
        self.workers.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
