"""ALFWorld games: TextWorld's PDDL engine with ALFWorld's names, in this process or in workers.

`Game` is one ALFWorld game: `textworld.envs.pddl.PddlEnv` wrapped in ALFWorld's
`AlfredDemangler` (entities read "apple 1", "fridge 1"), loaded from a game file's data
(`{"pddl_domain", "grammar", "pddl_problem"}`, the layout of ALFWorld's `game.tw-pddl`) or its
path. With `expert=True` every state also carries the planner's plan (`policy_commands`; the
planner runs after every step, so only the warm-start corpus asks for it).

`GameHost` plays many games in one process: `run(ops)` executes a list of operations

    ("start", slot, game, expert) -> the first observation   (game: index into the host's sources)
    ("step", slot, command, last) -> (observation, won)       (last: the episode ends after it)
    ("stop", slot)                -> None
    ("plan", slot)                -> the planner's plan from the current state (expert games)
    ("admissible", slot)          -> the commands the engine admits now ([] once the game stopped)

and keeps a loaded game per source for reuse (a reset re-reads only the problem). `Workers`
runs one host in this process (`num_workers=0`) or one per worker process (started here with
this file as their program, stopped by `close()`); the processes step their games in parallel.
This module imports neither JAX nor the derl_jax package when run as a worker.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pickle
import subprocess
import sys
import threading
import traceback
from typing import Any, Sequence

INSTALL = "pip install 'derl_jax[alfworld]' (or: pip install alfworld==0.4.2)"
WELCOME = "-= Welcome to TextWorld, ALFRED! =-"


def engine_missing() -> str | None:
    """What to install when ALFWorld cannot run here (None when it can)."""
    if any(importlib.util.find_spec(name) is None for name in ("alfworld", "textworld", "fast_downward")):
        return f"ALFWorld needs the alfworld package (TextWorld's PDDL engine), which is not installed: {INSTALL}"
    return None


def game_logic() -> dict[str, str]:
    """ALFWorld's ALFRED PDDL domain and text grammar: {"pddl_domain", "grammar"} (the grammar's
    task line reads "UNKNOWN GOAL" until a game fills it in)."""
    data = os.path.join(os.path.dirname(importlib.util.find_spec("alfworld").origin), "data")
    with open(os.path.join(data, "alfred.pddl")) as domain, open(os.path.join(data, "alfred.twl2")) as grammar:
        return {"pddl_domain": domain.read(), "grammar": grammar.read()}


@contextlib.contextmanager
def _argv_kept():
    """Restores `sys.argv` afterwards: fast_downward's PDDL translator, which TextWorld's engine
    calls, overwrites it."""
    argv = list(sys.argv)
    try:
        yield
    finally:
        sys.argv = argv


class Game:
    """One ALFWorld game (module docstring). Not thread-safe."""

    def __init__(self, source: str | dict, expert: bool = False):
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
        from textworld.envs.pddl import PddlEnv

        self.expert = expert
        self._env = AlfredDemangler(PddlEnv(textworld.EnvInfos(won=True, policy_commands=expert,
                                                               admissible_commands=True)))
        with _argv_kept():
            self._env.load(source)
        self._state = None

    def reset(self) -> str:
        """Restart the game -> the first observation (welcome line, the room, the task line)."""
        with _argv_kept():
            self._state = self._env.reset()
        return str(self._state["feedback"])

    def step(self, command: str) -> tuple[str, bool]:
        """(observation, won) after `command` ("Nothing happens." when the engine has no such action)."""
        with _argv_kept():
            self._state, _, _ = self._env.step(command)
        return str(self._state["feedback"]), bool(self._state["won"])

    def admissible(self) -> list[str]:
        """The commands the engine admits in the current state."""
        return [str(command) for command in (self._state or {}).get("admissible_commands") or []]

    def plan(self) -> list[str]:
        """The planner's commands from the current state to the goal (an expert game only)."""
        if not self.expert:
            raise ValueError("Game.plan: the game was not loaded with expert=True")
        return [str(command) for command in self._state["policy_commands"]]


class GameHost:
    """Games of one process by slot; a loaded game per (source, expert) is kept for reuse."""

    def __init__(self, sources: Sequence[str | dict]):
        self.sources = list(sources)
        self._idle: dict[tuple[int, bool], list[Game]] = {}
        self._live: dict[int, tuple[tuple[int, bool], Game]] = {}

    def run(self, ops: Sequence[tuple]) -> list[Any]:
        """The result of every operation (module docstring), in order."""
        return [getattr(self, f"_{op[0]}")(*op[1:]) for op in ops]

    def _start(self, slot: int, game: int, expert: bool) -> str:
        key = (int(game), bool(expert))
        pool = self._idle.setdefault(key, [])
        played = pool.pop() if pool else Game(self.sources[key[0]], expert=key[1])
        self._live[slot] = (key, played)
        return played.reset()

    def _step(self, slot: int, command: str, last: bool) -> tuple[str, bool]:
        observation, won = self._live[slot][1].step(command)
        if won or last:
            self._stop(slot)
        return observation, won

    def _stop(self, slot: int) -> None:
        if slot in self._live:
            key, played = self._live.pop(slot)
            self._idle[key].append(played)

    def _plan(self, slot: int) -> list[str]:
        return self._live[slot][1].plan()

    def _admissible(self, slot: int) -> list[str]:
        return self._live[slot][1].admissible() if slot in self._live else []


class Workers:
    """`GameHost`s in this process (`num_workers=0`) or in `num_workers` worker processes."""

    def __init__(self, sources: Sequence[str | dict], num_workers: int):
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.size = max(num_workers, 1)
        self._locks = [threading.Lock() for _ in range(self.size)]
        self._local = GameHost(sources) if num_workers == 0 else None
        self._procs: list[subprocess.Popen] = []
        program = (f"import importlib.util as u; s = u.spec_from_file_location('alfworld_engine', {__file__!r}); "
                   "m = u.module_from_spec(s); s.loader.exec_module(m); m.serve()")
        for _ in range(num_workers):   # each imports only TextWorld and ALFWorld, not this package
            self._procs.append(subprocess.Popen([sys.executable, "-c", program], stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE))
        try:
            for proc in self._procs:
                pickle.dump(list(sources), proc.stdin)
                proc.stdin.flush()
            for worker in range(len(self._procs)):
                self._receive(worker)   # the worker's "ready"
        except BaseException:
            self.close()
            raise

    def run(self, worker: int, ops: Sequence[tuple]) -> list[Any]:
        """The results of `ops` on `worker`'s host (thread-safe)."""
        return self.run_all({worker: ops})[worker]

    def run_all(self, ops_of: dict[int, Sequence[tuple]]) -> dict[int, list[Any]]:
        """{worker: results}: every worker's operations, the worker processes in parallel."""
        workers = sorted(w for w, ops in ops_of.items() if ops)
        for w in workers:
            self._locks[w].acquire()
        try:
            if self._local is not None:
                return {w: self._local.run(ops_of[w]) for w in workers}
            for w in workers:
                pickle.dump(list(ops_of[w]), self._procs[w].stdin)
                self._procs[w].stdin.flush()
            return {w: self._receive(w) for w in workers}
        finally:
            for w in workers:
                self._locks[w].release()

    def _receive(self, worker: int) -> Any:
        try:
            ok, value = pickle.load(self._procs[worker].stdout)
        except EOFError:
            raise RuntimeError(f"ALFWorld worker {worker} stopped (exit status {self._procs[worker].poll()})") from None
        if not ok:
            raise RuntimeError(f"ALFWorld worker {worker} failed:\n{value}")
        return value

    def close(self) -> None:
        """Stop the worker processes."""
        for proc in self._procs:
            if proc.poll() is None:
                try:
                    proc.stdin.close()
                    proc.wait(timeout=30)
                except (OSError, subprocess.TimeoutExpired):
                    proc.kill()
        self._procs = []


def serve() -> None:
    """A worker process: read the game sources, then lists of operations from stdin; answer
    (ok, results) on stdout (printing goes to stderr)."""
    out, inp = sys.stdout.buffer, sys.stdin.buffer
    sys.stdout = sys.stderr
    host = GameHost(pickle.load(inp))
    pickle.dump((True, "ready"), out)
    out.flush()
    while True:
        try:
            ops = pickle.load(inp)
        except EOFError:
            return
        try:
            answer = (True, host.run(ops))
        except Exception:   # reported to the parent, which raises
            answer = (False, traceback.format_exc())
        pickle.dump(answer, out)
        out.flush()
