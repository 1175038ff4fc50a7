"""ALFWorld games played by the planner, and the host's episodes spread over its workers.

`ExpertGame` plays one game of an `AlfWorldEnv` on one of its workers with the planner at hand
(`gold_actions()`: the planner's plan from the current state), behind the engine interface the
warm-start corpora use (`scienceworld.corpus.play`, `play_agent`) and the relabelling
(relabel.py). `played_over_workers` runs a per-worker function over the workers in parallel and
puts the episodes back in row order. `task_text` and `entity_names` read a game's task line and
the names of its entities.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from derl_jax.domains.alfworld import problems as P
from derl_jax.domains.alfworld import rules
from derl_jax.domains.alfworld.env import NOTHING, AlfWorldEnv

_ENTITY = re.compile(r"^\s*(\w+?)_bar_\S*\s+-\s+(?:object|receptacle)\s*$", re.MULTILINE)


def task_text(game: P.GameSpec) -> str:
    """The task line of a game's prompt: "Your task is to: <goal>."."""
    return f"Your task is to: {game.goal}."


def entity_names(game: P.GameSpec) -> set[str]:
    """The type names of a game's objects and receptacles as ALFWorld names them ("apple", "sinkbasin")."""
    if isinstance(game.source, dict):
        problem = game.source["pddl_problem"]
    else:
        with open(game.source) as f:
            problem = json.load(f)["pddl_problem"]
    return {name.lower() + ("basin" if "basin" in line.lower() else "")
            for name, line in ((m.group(1), m.group(0)) for m in _ENTITY.finditer(problem))}


def played_over_workers(env: Any, num_rows: int, play_rows: Any) -> list:
    """The turns of `num_rows` episodes, row r played by worker r % workers (`play_rows(worker)`
    returns that worker's episodes in row order), flattened in row order."""
    with ThreadPoolExecutor(env.workers.size) as pool:
        per_worker = list(pool.map(play_rows, range(env.workers.size)))
    episodes = [None] * num_rows
    for worker, played in enumerate(per_worker):
        episodes[worker::env.workers.size] = played
    return [pair for episode in episodes for pair in episode]


class ExpertGame:
    """One game played with the planner, behind the engine interface `scienceworld.corpus.play`
    uses: `load(kind, game)` starts game `game` of the env, `gold_actions()` is the planner's plan
    from the current state (from the start right after `load`), `step` answers (observation,
    subgoals completed so far, won)."""

    def __init__(self, env: AlfWorldEnv, worker: int):
        self.env, self.worker, self.slot = env, worker, -1
        self.game: P.GameSpec | None = None
        self.first, self.subgoals = "", 0

    def load(self, task: str, variation: int, simplifications: str = "", gold_path: bool = True) -> None:
        del task, simplifications, gold_path
        if self.slot >= 0:
            self.env.workers.run(self.worker, [("stop", self.slot)])
        self.slot, self.game, self.subgoals = next(self.env._slots), self.env.games[int(variation)], 0
        self.first = self.env.workers.run(self.worker, [("start", self.slot, int(variation), True)])[0]

    def gold_actions(self) -> list[str]:
        return self.env.workers.run(self.worker, [("plan", self.slot)])[0]

    def admissible(self) -> list[str]:
        return self.env.workers.run(self.worker, [("admissible", self.slot)])[0]

    def vocabulary(self) -> set[str]:
        return entity_names(self.game)

    def task_description(self) -> str:
        return task_text(self.game)

    def reset(self, describe_task: bool = False) -> str:
        return self.env.first_observation(self.first) if not describe_task else self.first

    def step(self, action: str) -> tuple[str, float, bool]:
        command = " ".join(action.lower().split())
        if not rules.well_formed(command):
            return NOTHING, float(self.subgoals), False
        observation, won = self.env.workers.run(self.worker, [("step", self.slot, command, False)])[0]
        g = self.game
        self.subgoals += rules.subgoal(g.kind, g.obj, g.recep, g.toggle, observation)
        return observation, float(self.subgoals), won
