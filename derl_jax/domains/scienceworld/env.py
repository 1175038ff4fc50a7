"""ScienceWorld as a batched host environment (`derl_jax.domains.env.HostEnv`).

    env = ScienceWorldEnv(task_names, num_workers=B)   # B JVMs, started here, stopped by close()
    obs i32[B, O], states = env.reset(keys u32[B, 2], tasks)   # tasks: {"task": i32[B], "variation": i32[B]}
    obs, states, reward f32[B], done bool[B], info = env.step(states, actions i32[B, A])

Episode b plays on JVM b % num_workers, in a game of its own (`Worker.fork`: one JVM holds
many games), so any batch size works; a thread per JVM steps its games one after another (the
engine's calls release the GIL while Java works). A game goes back to its JVM's pool when its
episode is done. `tasks["task"]` indexes `env.task_names`, the tasks the
vocabulary was built for; `tasks["variation"]` is the engine's variation index (see
`splits.py`). The first observation is the task description and the room (the room alone
with `describe_task=False`, for prompts that carry the description). The vocabulary is built from the engine for `task_names` unless given. Actions are the policy's word ids: a tag then the action words (`tags.py`).

  reward      the engine's score change this step, in [-1, 1] (its score is 0..100 %)
  done        the engine says the task is completed (solved or failed), or `max_turns` steps
  info        step_score f32[B] (tag rules, `tags.py`), success f32[B] (the task solved:
              completed with the full score), score f32[B] (the engine's score, 0..1),
              valid f32[B] (the action did something)

Self-Guide (`self_guide=True`): every action starts with a self-assessment word
(derl_jax/domains/selfguide.py), which the engine never sees; info adds assessment i32[B]
(index into ASSESSMENTS, -1 when missing: the action is then malformed and not played) and
self_reward f32[B] (its internal reward of `self_rewards`).

Steps after `done` change nothing (zeros). The keys are accepted for the interface and not
used: the engine's variation fixes the episode.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Sequence

import numpy as np

from derl_jax.domains import selfguide
from derl_jax.domains.agent_prompt import AgentPrompt, AnswerCounts, parse_answer
from derl_jax.domains.scienceworld import tags as T
from derl_jax.domains.scienceworld.engine import Worker, require_engine
from derl_jax.domains.scienceworld.vocab import Vocabulary, build_vocabulary

ECHO_WORDS = 12   # a row names the action taken by its first words only (a malformed answer can be long)


@dataclasses.dataclass
class Episode:
    """Host state of one episode."""

    task: str
    variation: int
    tracker: T.TagTracker
    worker: int
    game: Worker
    score: float = 0.0
    done: bool = False
    turn: int = 0
    admissible: list = dataclasses.field(default_factory=list)   # the engine's valid actions now, in the prompt's order


class ScienceWorldEnv:
    """B ScienceWorld simulators behind the batched host-environment interface."""

    host = True

    def __init__(self, task_names: Sequence[str], num_workers: int, *, vocab: Vocabulary | None = None,
                 obs_length: int = 128, action_length: int = 16, max_turns: int = 30, simplifications: str = "easy",
                 describe_task: bool = True, self_guide: bool = False,
                 self_rewards: Sequence[float] = selfguide.DEFAULT_SELF_REWARDS, prompt: AgentPrompt | None = None):
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.self_guide, self.self_rewards = bool(self_guide), selfguide.checked_rewards(self_rewards)
        require_engine()  # before any thread starts: one clear message when Java or the package is missing
        self.task_names = tuple(task_names)
        self.obs_length, self.action_length, self.max_turns = obs_length, action_length, max_turns
        self.simplifications, self.describe_task = simplifications, describe_task
        self.prompt, self.counts = prompt, AnswerCounts()
        if prompt is not None:   # rows of the agent prompt (derl_jax.domains.agent_prompt)
            self.obs_length, self.prompt_layout = prompt.row_length, prompt.layout
        self._pool = ThreadPoolExecutor(num_workers)
        self.workers: list[Worker] = list(self._pool.map(lambda _: Worker(step_limit=max_turns + 1), range(num_workers)))
        unknown = [name for name in self.task_names if name not in self.workers[0].task_names]
        if unknown:
            self.close()
            raise ValueError(f"unknown ScienceWorld tasks {unknown}; known: {', '.join(self.workers[0].task_names)}")
        self._idle: list[list[Worker]] = [[] for _ in self.workers]   # per JVM, games free for a new episode
        self.vocab = vocab or build_vocabulary(self.workers[0], self.task_names, simplifications, self.self_guide)

    def _map(self, fn, *columns):
        return list(self._pool.map(fn, *columns))

    def reset(self, keys: np.ndarray, tasks: Mapping[str, np.ndarray]) -> tuple[np.ndarray, list[Episode]]:
        """B fresh episodes -> (obs i32[B, O], states)."""
        task_ids, variations = np.asarray(tasks["task"]), np.asarray(tasks["variation"])
        batch = len(task_ids)
        if np.shape(keys)[0] != batch or variations.shape != (batch,):
            raise ValueError(f"reset: {batch} tasks, {np.shape(keys)[0]} keys, {variations.shape} variations")
        games = [self._idle[b % len(self.workers)].pop() if self._idle[b % len(self.workers)]
                 else self.workers[b % len(self.workers)].fork() for b in range(batch)]

        def start(b: int):
            name = self.task_names[int(task_ids[b])]
            games[b].load(name, int(variations[b]), self.simplifications)
            observation = games[b].reset(self.describe_task)
            tracker = T.TagTracker()
            location = T.start_location(observation)
            if location:
                tracker.visited.add(location)
            episode = Episode(name, int(variations[b]), tracker, b % len(self.workers), games[b])
            if self.prompt is not None:
                episode.admissible = games[b].admissible()
                return self.prompt.row(None, observation, episode.admissible), episode
            return self.vocab.encode(observation, self.obs_length), episode

        started = self.per_worker(start, [b % len(self.workers) for b in range(batch)])
        return np.stack([obs for obs, _ in started]), [episode for _, episode in started]

    def per_worker(self, fn, worker_of: Sequence[int]) -> list:
        """[fn(b) for every b], the b of one JVM called in order on that JVM's thread."""
        rows = [[b for b, w in enumerate(worker_of) if w == worker] for worker in range(len(self.workers))]
        done = self._map(lambda own: [(b, fn(b)) for b in own], rows)
        out = [None] * len(worker_of)
        for pairs in done:
            for b, value in pairs:
                out[b] = value
        return out

    def step(self, states: Sequence[Episode], actions: np.ndarray):
        """One step of every live episode -> (obs i32[B, O], states, reward f32[B], done bool[B], info)."""
        actions = np.asarray(actions)
        if actions.shape != (len(states), self.action_length):
            raise ValueError(f"step: actions must be int [{len(states)}, {self.action_length}], got {actions.shape}")

        def advance(b: int):
            episode = states[b]
            if episode.done:
                return np.full(self.obs_length, self.vocab.pad_id, np.int32), 0.0, 0.0, 0.0, -1
            if self.prompt is None:
                assessment, text = selfguide.read_action(self.vocab.decode(actions[b]), self.self_guide)
                tag, action = T.split_tag(text)
            else:   # an answer of the agent prompt; a malformed one goes to the engine as it is
                answer = parse_answer(self.vocab.decode(actions[b]))
                self.counts.add(answer, episode.admissible)
                assessment, tag, action = answer.assessment, answer.kind, answer.action
            observation, score, completed = episode.game.step(action) if action else ("No known action matches that input.",
                                                                                       episode.score, False)
            step_score = T.score_step(episode.tracker, tag, action, observation, score > episode.score)
            reward = score - episode.score
            episode.score, episode.turn = score, episode.turn + 1
            episode.done = completed or episode.turn >= self.max_turns
            if episode.done:
                self._idle[episode.worker].append(episode.game)
            valid = float(not T.failed(observation))
            if self.prompt is not None:
                episode.admissible = [] if episode.done else episode.game.admissible()
                row = self.prompt.row(" ".join(action.split()[:ECHO_WORDS]), observation, episode.admissible)
                return row, reward, step_score, valid, assessment
            return self.vocab.encode(observation, self.obs_length), reward, step_score, valid, assessment

        live = np.array([not episode.done for episode in states])
        results = self.per_worker(advance, [episode.worker for episode in states])
        obs = np.stack([r[0] for r in results])
        info = {
            "step_score": np.array([r[2] for r in results], np.float32),
            "success": np.array([float(e.done and e.score >= 1.0) for e in states], np.float32),
            "score": np.array([e.score for e in states], np.float32),
            "valid": np.array([r[3] for r in results], np.float32),
        }
        if self.self_guide:
            info["assessment"] = np.array([r[4] for r in results], np.int32)
            info["self_reward"] = selfguide.self_reward(info["assessment"], self.self_rewards, live)
        return obs, list(states), np.array([r[1] for r in results], np.float32), np.array([e.done for e in states]), info

    def valid_actions(self, episode: Episode) -> list[str]:
        """The actions the engine accepts now in a live `episode` (slow; only when asked)."""
        return self._pool.submit(episode.game.valid_actions).result()

    def close(self) -> None:
        """Stop every JVM."""
        for worker in self.workers:   # in this thread: close() also runs at exit, after the pool's threads stop
            worker.close()
        self.workers = []
        self._pool.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
