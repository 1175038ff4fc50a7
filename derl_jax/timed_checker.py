"""Answer checks under a time limit, in worker processes.

    checker = TimedChecker(compare, timeout_s=5.0, num_workers=2)
    scores = checker.check(predictions, golds)          # f32[N], each check under a time limit

`TimedChecker` runs `compare(prediction, gold) -> bool` in spawned worker processes (fresh
interpreters, so nothing of the parent's threads or `__main__` is inherited) and kills a
worker whose check overruns its time limit; a hung comparison (a symbolic equivalence check,
a sandboxed program) cannot hang the inner loop.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import multiprocessing.connection
import os
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence

import numpy as np


@dataclasses.dataclass
class CheckerStats:
    """Counters of an `TimedChecker` since it was made."""

    checks: int = 0               # (prediction, gold) pairs scored by `check`
    no_answer: int = 0            # predictions that were None or blank (scored 0)
    normal_form_matches: int = 0  # pairs with equal `normalize` forms (scored 1, no worker)
    cache_hits: int = 0           # pairs answered from the score cache
    dispatched: int = 0           # pairs sent to a worker process
    timeouts: int = 0             # checks killed for overrunning `timeout_s` (scored 0)
    errors: int = 0               # checks whose `compare` raised or whose worker died (scored 0)
    worker_starts: int = 0        # worker processes started, replacements included
    seconds: float = 0.0          # wall-clock seconds spent inside `check`


_WORKER_BOOT = "import sys; from derl_jax.timed_checker import serve_checks; serve_checks(int(sys.argv[1]), int(sys.argv[2]))"


def _exit_when_orphaned(parent_pid: int) -> None:
    """Watchdog thread body: end this worker once the process that started it is gone."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(0)


def serve_checks(inbox_fd: int, outbox_fd: int) -> None:
    """Main loop of a checker worker process (started by `TimedChecker`, not by users).

    Protocol over two pipes: first message in is the pickled `compare` callable; the worker
    answers ("ready", None), then each `(prediction, gold)` with ("done", bool) or
    ("error", message); `None` or a closed pipe ends it.
    """
    inbox = multiprocessing.connection.Connection(inbox_fd, writable=False)
    outbox = multiprocessing.connection.Connection(outbox_fd, readable=False)
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    compare = inbox.recv()
    try:
        compare("1", "1")  # import what `compare` needs before the first timed check
    except Exception:  # a warm-up failure shows up again, reported, on the first real check
        pass
    outbox.send(("ready", None))
    while True:
        try:
            message = inbox.recv()
        except EOFError:
            return
        if message is None:
            return
        prediction, gold = message
        try:
            outbox.send(("done", bool(compare(prediction, gold))))
        except Exception as err:
            outbox.send(("error", f"{type(err).__name__}: {err}"))


class _Worker:
    """One checker process (a fresh interpreter, so nothing of the parent's `__main__` or
    threads is inherited), its two pipes and the check it is working on."""

    def __init__(self, compare: Callable[[str, str], bool]):
        to_child_read, to_child_write = os.pipe()
        from_child_read, from_child_write = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if isinstance(p, str)))
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WORKER_BOOT, str(to_child_read), str(from_child_write)],
            pass_fds=(to_child_read, from_child_write),
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        os.close(to_child_read)
        os.close(from_child_write)
        self.outbox = multiprocessing.connection.Connection(to_child_write, readable=False)
        self.connection = multiprocessing.connection.Connection(from_child_read, writable=False)
        self.started_at = time.monotonic()
        self.ready = False
        self.task: tuple[str, str] | None = None
        self.deadline = 0.0
        try:
            self.outbox.send(compare)
        except Exception:
            self.kill()
            raise

    def send(self, task: tuple[str, str], timeout_s: float) -> None:
        self.outbox.send(task)
        self.task = task
        self.deadline = time.monotonic() + timeout_s

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=5)
        self.outbox.close()
        self.connection.close()

    def stop(self) -> None:
        try:
            self.outbox.send(None)
            self.process.wait(timeout=2)
        except (BrokenPipeError, OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


class TimedChecker:
    """Scores (prediction, gold) pairs with `compare` under a per-check time limit.

    Each check runs in one of `num_workers` spawned worker processes; a check still running
    `timeout_s` after it was handed out is abandoned (its worker killed and replaced),
    scores 0 and counts in `stats.timeouts`. A check whose `compare` raises scores 0 and
    counts in `stats.errors`. With `normalize`, pairs with equal normal forms score 1
    without a worker; a None or blank prediction scores 0 without one. Results are cached (`cache_size` pairs). `check` may be called from any thread; calls
    are serialised. `compare` must be picklable by reference (a module-level function of an
    importable module); workers are fresh interpreters with the parent's `sys.path`.
    """

    def __init__(
        self,
        compare: Callable[[str, str], bool],
        *,
        timeout_s: float = 5.0,
        num_workers: int = 2,
        normalize: Callable[[str], str] | None = None,
        cache_size: int = 65536,
        start_timeout_s: float = 120.0,
    ):
        if not timeout_s > 0:
            raise ValueError(f"TimedChecker: timeout_s must be > 0, got {timeout_s}")
        if num_workers < 1:
            raise ValueError(f"TimedChecker: num_workers must be >= 1, got {num_workers}")
        self.timeout_s = float(timeout_s)
        self.num_workers = int(num_workers)
        self.compare = compare
        self.normalize = normalize
        self.cache_size = int(cache_size)
        self.start_timeout_s = float(start_timeout_s)
        self.stats = CheckerStats()
        self._cache: collections.OrderedDict[tuple[str, str], float] = collections.OrderedDict()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._closed = False

    def check(self, predictions: Sequence[str | None], golds: Sequence[str]) -> np.ndarray:
        """f32[N]: 1.0 where predictions[i] (None: no answer, 0) is equivalent to golds[i]."""
        if len(predictions) != len(golds):
            raise ValueError(f"TimedChecker.check: {len(predictions)} predictions but {len(golds)} gold answers")
        started = time.perf_counter()
        scores = np.zeros(len(predictions), np.float32)
        with self._lock:
            if self._closed:
                raise RuntimeError("TimedChecker.check called after close()")
            pending: dict[tuple[str, str], list[int]] = {}
            for index, (prediction, gold) in enumerate(zip(predictions, golds)):
                scores[index] = self._score_without_worker(prediction, gold, pending, index)
            results = self._run_in_workers(list(pending)) if pending else {}
            for pair, indices in pending.items():
                scores[indices] = results[pair]
                self._remember(pair, results[pair])
            self.stats.checks += len(predictions)
            self.stats.seconds += time.perf_counter() - started
        return scores

    def _score_without_worker(self, prediction, gold, pending, index) -> float:
        if not isinstance(gold, str):
            raise TypeError(f"TimedChecker.check: gold answer {index} must be str, got {type(gold).__name__}")
        if prediction is None or not prediction.strip():
            self.stats.no_answer += 1
            return 0.0
        if self.normalize is not None and self.normalize(prediction) == self.normalize(gold):
            self.stats.normal_form_matches += 1
            return 1.0
        pair = (prediction, gold)
        if pair in self._cache:
            self.stats.cache_hits += 1
            self._cache.move_to_end(pair)
            return self._cache[pair]
        pending.setdefault(pair, []).append(index)
        return 0.0

    def _remember(self, pair: tuple[str, str], score: float) -> None:
        self._cache[pair] = score
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _start_worker(self) -> _Worker:
        self.stats.worker_starts += 1
        return _Worker(self.compare)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers[self._workers.index(worker)] = self._start_worker()

    def _run_in_workers(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], float]:
        """Score every pair in the worker processes, each within `timeout_s` of being sent."""
        while len(self._workers) < self.num_workers:
            self._workers.append(self._start_worker())
        queue = collections.deque(pairs)
        results: dict[tuple[str, str], float] = {}
        while queue or any(w.task is not None for w in self._workers):
            for worker in self._workers:
                if worker.ready and worker.task is None and queue:
                    worker.send(queue.popleft(), self.timeout_s)
                    self.stats.dispatched += 1
            waiting = [w for w in self._workers if w.task is not None or not w.ready]
            deadlines = [w.deadline if w.ready else w.started_at + self.start_timeout_s for w in waiting]
            wait_s = max(0.0, min(deadlines) - time.monotonic())
            ready_connections = multiprocessing.connection.wait([w.connection for w in waiting], wait_s)
            for worker in [w for w in waiting if w.connection in ready_connections]:
                self._receive(worker, results)
            self._expire(results)
        return results

    def _receive(self, worker: _Worker, results: dict) -> None:
        try:
            kind, value = worker.connection.recv()
        except (EOFError, OSError):
            if not worker.ready:
                worker.kill()
                raise RuntimeError(
                    f"TimedChecker: a worker process exited while starting (exit code {worker.process.returncode}); "
                    "its traceback is on stderr (is `compare` importable by module path?)"
                )
            results[worker.task] = 0.0
            self.stats.errors += 1
            self._replace(worker)
            return
        if kind == "ready":
            worker.ready = True
            return
        if kind == "error":
            self.stats.errors += 1
            logging.getLogger(__name__).warning("answer check %r raised %s; scored 0", worker.task, value)
        results[worker.task] = 1.0 if (kind == "done" and value) else 0.0
        worker.task = None

    def _expire(self, results: dict) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.task is not None and now >= worker.deadline:
                results[worker.task] = 0.0
                self.stats.timeouts += 1
                self._replace(worker)
            elif not worker.ready and now >= worker.started_at + self.start_timeout_s:
                raise RuntimeError(f"TimedChecker: a worker process did not start within {self.start_timeout_s:.0f} s")

    def close(self) -> None:
        """Stop the worker processes; later `check` calls raise."""
        with self._lock:
            self._closed = True
            for worker in self._workers:
                worker.stop()
            self._workers.clear()

    def __enter__(self) -> "TimedChecker":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
