"""One ScienceWorld simulator: a JVM started and stopped by this process, stepped fast.

`Worker` wraps the `scienceworld` package's Java engine (its bundled jar, run by the machine's
Java). Its `step` calls the engine's step, score and completion directly: the package's own
`step` also lists every valid action, looks around and reads the inventory after each step,
which costs more than the step itself; `valid_actions()` lists them only when asked. An
ambiguous action (the engine asks which of several objects was meant) is resolved to the
first choice, so every call is one turn.

One JVM can hold many games: `Worker.fork()` opens another game on the same JVM (the engine's
games are independent objects), so a batch of episodes larger than the number of JVMs plays
without reloading anything between turns. A worker and its forks must be called from one
thread at a time.
"""

from __future__ import annotations

import importlib.util
import shutil

from derl_jax.config import InputError

AMBIGUOUS = "ambiguous request"
INSTALL_JAVA = "install Java 11 or newer so that `java` is on PATH (e.g. apt-get install openjdk-17-jre-headless)"
INSTALL_PACKAGE = "pip install 'derl_jax[agents]' (or: pip install scienceworld)"


class EngineMissing(InputError):
    """Java or the scienceworld package is not installed."""


def require_engine() -> None:
    """Raise `EngineMissing` saying what to install when ScienceWorld cannot start here."""
    if shutil.which("java") is None:
        raise EngineMissing(f"ScienceWorld needs Java, which is not on PATH: {INSTALL_JAVA}")
    if importlib.util.find_spec("scienceworld") is None:
        raise EngineMissing(f"ScienceWorld needs the scienceworld package, which is not installed: {INSTALL_PACKAGE}")


class Worker:
    """One simulator (one JVM). Not thread-safe: one episode at a time."""

    def __init__(self, step_limit: int = 100, *, parent: "Worker | None" = None):
        if parent is not None:  # another game on the parent's JVM
            self._env, self._owner = parent._env, False
            self._server = parent._env._gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
            self.task_names = parent.task_names
            return
        require_engine()
        from scienceworld import ScienceWorldEnv  # imported here: an optional dependency

        self._env, self._owner = ScienceWorldEnv("", envStepLimit=step_limit), True
        self._server = self._env.server
        self.task_names: tuple[str, ...] = tuple(self._env.get_task_names())

    def fork(self) -> "Worker":
        """Another, independent game on this worker's JVM (closed with it)."""
        return Worker(parent=self)

    def load(self, task: str, variation: int, simplifications: str = "easy", gold_path: bool = False) -> None:
        if task not in self.task_names:
            raise ValueError(f"unknown ScienceWorld task {task!r}; known: {', '.join(self.task_names)}")
        self._server.load(task, int(variation), simplifications, bool(gold_path))

    def reset(self, describe_task: bool = True) -> str:
        """Restart the loaded task variation -> the first observation (the task description, unless
        `describe_task` is False, and the room)."""
        self._server.reset()
        room = self._server.step("look around")
        return f"{self._server.freeActionTaskDesc()}\n{room}" if describe_task else room

    def step(self, action: str) -> tuple[str, float, bool]:
        """(observation, score in [0, 1] (negative when the task failed), completed) after `action`."""
        observation = self._server.step(action)
        if observation.strip().lower().startswith(AMBIGUOUS):
            observation = self._server.step("0")
        score = float(self._server.getScore())
        return observation, score, bool(self._server.getCompleted()) or score < 0

    def valid_actions(self) -> list[str]:
        """Every action the engine would accept now (slow: enumerates objects x templates)."""
        return list(self._server.getValidActionObjectCombinations())

    def admissible(self) -> list[str]:
        """`valid_actions` in the order an agent prompt lists them (`derl_jax.domains.agent_prompt`):
        fewest words first, the engine's (alphabetical) order among equals. The prompt shows as
        many as fit in its line, and the engine admits hundreds, many of them two-object
        combinations (`dunk cup containing orange juice into bowl`); in the engine's order the
        line can be full before it reaches the first `go to`."""
        return sorted(self.valid_actions(), key=lambda action: len(action.split()))

    def gold_actions(self) -> list[str]:
        """The engine's gold action sequence of the task loaded with `gold_path=True`."""
        return list(self._server.getGoldActionSequence())

    def task_description(self) -> str:
        """The loaded task variation's description ("Your task is to ...")."""
        return str(self._server.freeActionTaskDesc())

    def vocabulary(self) -> set[str]:
        """Words of the loaded task's objects and action templates (the engine's own list)."""
        words = {word for action in self._server.getPossibleActions() for word in action.split(" ")}
        return words | set(self._server.getPossibleObjects())

    def variations(self, task: str, split: str) -> list[int]:
        """The benchmark's variation indices of `task` in `split` ('train', 'dev' or 'test')."""
        getter = {"train": "getVariationsTrain", "dev": "getVariationsDev", "test": "getVariationsTest"}
        if split not in getter:
            raise ValueError(f"split must be 'train', 'dev' or 'test', got {split!r}")
        self.load(task, 0)
        return list(getattr(self._server, getter[split])())

    def close(self) -> None:
        """Stop the JVM."""
        if self._env is not None and self._owner:
            self._env.close()
        self._env = None
