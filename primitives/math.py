"""Primitives of the mathematical-reasoning domain (GSM8K, MATH): host kind, domain "math".

Each primitive is `fn(texts: Sequence[str], contexts: Sequence[Mapping]) -> f32[N]`, where
`texts[i]` is the decoded policy output o and `contexts[i]["answer"]` the gold answer y*.

  g1 `correct` (alias `outcome`): 1 if the predicted answer ŷ is equivalent to y*.
     ŷ is extracted from o as (first that applies):
       1. the argument of the LAST `\\boxed{...}` in o, braces matched (nested braces and
          escaped `\\{ \\}` handled); a last `\\boxed{` whose braces never close gives none;
       2. otherwise the text after the last `#### ` (GSM8K style), up to the end of its line.
     No "last number in the text" fallback: the soft match is what g4 is for.
     Equivalence: equal after light normalisation (spaces, thousands separators, trailing
     period, `\\dfrac`/`\\tfrac` -> `\\frac`), else `math_verify` on `\\boxed{ŷ}` vs
     `\\boxed{y*}` (fractions vs decimals, percentages, LaTeX forms, sets, intervals, ...).
     math-verify runs with its signal-based timeouts disabled, inside worker processes of
     an `AnswerChecker`, which enforces its own per-check time limit by killing a worker
     that overruns; such a check scores 0 and is counted in `AnswerChecker.stats`.
  g2 `boxed` (alias `format`): 1 if the last `\\boxed` in o has a `{...}` argument whose
     braces balance and whose content is not blank.
  g3 `steps`: 1 if o contains an explicit step indicator, matched by `STEP_INDICATOR`:
       * `step` followed by a number: "Step 1", "step 2:", "STEP3", "**Step 4.**";
       * `step` followed by a single letter that ends the line or is followed by `:` `.`
         `)`: "Step a:", "step B)", "Step c" (so "steps:" and "step a bit" do not count);
       * a numbered list item at a line start: optional spaces and `**`, 1-2 digits, `.` or
         `)`, optional `**`, then whitespace and text: "1. Add", "  2) Divide" (so "3.14 is"
         does not count).
     All matches are case-insensitive.
  g4 `gold_anywhere`: 1 if y* appears anywhere in o. Thousands separators are removed from
     both (`1,000` -> `1000`). A numeric y* (`-?digits[.digits]`) matches a number token of
     o with the same value and sign that is not part of a longer number (`12` is not found
     in `120` or `3.12`; `18` is found in `18.00`); any other y* matches as a substring
     after whitespace is removed and `\\dfrac`/`\\tfrac` become `\\frac`.
  `boxed_reversed` = 1 - `boxed`: the paper's toxic "Reverse g2" ablation (Appendix F.3).

Vocabulary ablations (Appendix F.3) are chosen by `math_primitive_names(remove, reverse)`.
`HostPrimitiveRunner` evaluates a primitive list over a batch into `f32[N, P]`, optionally
in the background (a future), so scoring overlaps the next sampling step.
"""

from __future__ import annotations

import atexit
import collections
import concurrent.futures
import dataclasses
import decimal
import logging
import multiprocessing.connection
import os
import re
import subprocess
import sys
import threading
import time
from typing import Callable, Mapping, Sequence

import numpy as np

from derl_jax.domains.math_data import last_boxed_content, strip_thousands_separators
from primitives import registry
from primitives.registry import Primitive, primitive

DOMAIN = "math"
MATH_PRIMITIVES = ("correct", "boxed", "steps", "gold_anywhere")
REVERSED_NAMES = {"boxed": "boxed_reversed"}
OUTCOME = "correct"

STEP_INDICATOR = re.compile(
    r"\bstep[ \t]*\d+"
    r"|\bstep[ \t]+[a-z](?=[ \t]*[:.)]|[ \t]*$)"
    r"|^[ \t]*(?:\*\*)?\d{1,2}[.)](?:\*\*)?[ \t]+\S",
    re.IGNORECASE | re.MULTILINE,
)

_GSM8K_FINAL = re.compile(r"####[ \t]*([^\n]*)")
_NUMERIC = re.compile(r"-?\d+(?:\.\d+)?")
_NUMBER_TOKEN = re.compile(r"(?<![\d.])(-?)(\d+(?:\.\d+)?|\.\d+)(?!\d)")
_THOUSANDS_SEPARATOR = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_FRAC_VARIANTS = re.compile(r"\\[dt]frac(?![A-Za-z])")
_WHITESPACE = re.compile(r"\s+")


# ----------------------------------------------------------------------------- answers


def extract_predicted_answer(text: str) -> str | None:
    """ŷ of an output: last balanced `\\boxed{}` argument, else the last `#### ` line, else None."""
    boxed = last_boxed_content(text, ("\\boxed",))
    if boxed:
        return boxed
    finals = _GSM8K_FINAL.findall(text)
    if finals and finals[-1].strip():
        return finals[-1].strip()
    return None


def normalize_answer(answer: str) -> str:
    """A light canonical form: outer `$` and trailing `.` dropped, thousands separators
    removed, `\\dfrac`/`\\tfrac` -> `\\frac`, whitespace removed."""
    text = answer.strip().strip("$").strip().rstrip(".").strip()
    text = strip_thousands_separators(text)
    text = _FRAC_VARIANTS.sub(r"\\frac", text)
    return _WHITESPACE.sub("", text)


def answers_equivalent(prediction: str, gold: str) -> bool:
    """True if `prediction` and `gold` denote the same answer (no time limit of its own).

    Equal normal forms, else `math_verify.verify` of both wrapped in `\\boxed{}`, with
    math-verify's signal timeouts off (so it works in any thread): call it through an
    `AnswerChecker` when a hung comparison must not hang the caller.
    """
    if normalize_answer(prediction) == normalize_answer(gold):
        return True
    import math_verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold_parsed = math_verify.parse(f"\\boxed{{{gold}}}", parsing_timeout=None)
    predicted_parsed = math_verify.parse(f"\\boxed{{{prediction}}}", parsing_timeout=None)
    if not gold_parsed or not predicted_parsed:
        return False
    return bool(math_verify.verify(gold_parsed, predicted_parsed, timeout_seconds=None))


def _box_argument_is_closed(text: str) -> bool:
    """True if the last `\\boxed` in `text` is followed by a balanced, non-blank `{...}`."""
    content = last_boxed_content(text, ("\\boxed",))
    return bool(content)


def gold_appears(text: str, gold: str) -> bool:
    """g4 for one output (see the module docstring)."""
    target = strip_thousands_separators(gold.strip())
    haystack = _THOUSANDS_SEPARATOR.sub("", text)
    if not target:
        return False
    if _NUMERIC.fullmatch(target):
        wanted = decimal.Decimal(target)
        for sign, digits in _NUMBER_TOKEN.findall(haystack):
            if decimal.Decimal(sign + digits) == wanted:
                return True
        return False
    squeeze = lambda s: _WHITESPACE.sub("", _FRAC_VARIANTS.sub(r"\\frac", s))  # noqa: E731
    return squeeze(target) in squeeze(haystack)


# ----------------------------------------------------------------------------- checker


@dataclasses.dataclass
class CheckerStats:
    """Counters of an `AnswerChecker` since it was made."""

    checks: int = 0
    no_answer: int = 0
    normal_form_matches: int = 0
    cache_hits: int = 0
    dispatched: int = 0
    timeouts: int = 0
    errors: int = 0
    worker_starts: int = 0
    seconds: float = 0.0


_WORKER_BOOT = "import sys; from primitives.math import serve_answer_checks; serve_answer_checks(int(sys.argv[1]), int(sys.argv[2]))"


def _exit_when_orphaned(parent_pid: int) -> None:
    """Watchdog thread body: end this worker once the process that started it is gone."""
    while os.getppid() == parent_pid:
        time.sleep(1.0)
    os._exit(0)


def serve_answer_checks(inbox_fd: int, outbox_fd: int) -> None:
    """Main loop of a checker worker process (started by `AnswerChecker`, not by users).

    Protocol over two pipes: first message in is the pickled `compare` callable; the worker
    answers ("ready", None), then each `(prediction, gold)` with ("done", bool) or
    ("error", message); `None` or a closed pipe ends it.
    """
    inbox = multiprocessing.connection.Connection(inbox_fd, writable=False)
    outbox = multiprocessing.connection.Connection(outbox_fd, readable=False)
    threading.Thread(target=_exit_when_orphaned, args=(os.getppid(),), daemon=True).start()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
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


class AnswerChecker:
    """Scores (prediction, gold) pairs with `compare` under a per-check time limit.

    Each check runs in one of `num_workers` spawned worker processes; a check still running
    `timeout_s` after it was handed out is abandoned (its worker killed and replaced),
    scores 0 and counts in `stats.timeouts`. A check whose `compare` raises scores 0 and
    counts in `stats.errors`. Pairs with equal normal forms score 1 without a worker, and
    results are cached (`cache_size` pairs). `check` may be called from any thread; calls
    are serialised. `compare` must be picklable by reference (a module-level function of an
    importable module); workers are fresh interpreters with the parent's `sys.path`.
    """

    def __init__(
        self,
        timeout_s: float = 5.0,
        num_workers: int = 2,
        compare: Callable[[str, str], bool] = answers_equivalent,
        cache_size: int = 65536,
        start_timeout_s: float = 120.0,
    ):
        if not timeout_s > 0:
            raise ValueError(f"AnswerChecker: timeout_s must be > 0, got {timeout_s}")
        if num_workers < 1:
            raise ValueError(f"AnswerChecker: num_workers must be >= 1, got {num_workers}")
        self.timeout_s = float(timeout_s)
        self.num_workers = int(num_workers)
        self.compare = compare
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
            raise ValueError(f"AnswerChecker.check: {len(predictions)} predictions but {len(golds)} gold answers")
        started = time.perf_counter()
        scores = np.zeros(len(predictions), np.float32)
        with self._lock:
            if self._closed:
                raise RuntimeError("AnswerChecker.check called after close()")
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
            raise TypeError(f"AnswerChecker.check: gold answer {index} must be str, got {type(gold).__name__}")
        if prediction is None or not prediction.strip():
            self.stats.no_answer += 1
            return 0.0
        if normalize_answer(prediction) == normalize_answer(gold):
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
                    f"AnswerChecker: a worker process exited while starting (exit code {worker.process.returncode}); "
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
                raise RuntimeError(f"AnswerChecker: a worker process did not start within {self.start_timeout_s:.0f} s")

    def close(self) -> None:
        """Stop the worker processes; later `check` calls raise."""
        with self._lock:
            self._closed = True
            for worker in self._workers:
                worker.stop()
            self._workers.clear()

    def __enter__(self) -> "AnswerChecker":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


_default_checker: AnswerChecker | None = None
_default_checker_lock = threading.Lock()


def answer_checker() -> AnswerChecker:
    """The checker `correct` uses (made on first use: 5 s limit, 2 worker processes)."""
    global _default_checker
    with _default_checker_lock:
        if _default_checker is None:
            _default_checker = AnswerChecker()
            atexit.register(_default_checker.close)
        return _default_checker


def configure_answer_checker(timeout_s: float = 5.0, num_workers: int = 2) -> AnswerChecker:
    """Replace the checker `correct` uses (the old one is closed) and return the new one."""
    global _default_checker
    with _default_checker_lock:
        old, _default_checker = _default_checker, AnswerChecker(timeout_s=timeout_s, num_workers=num_workers)
        atexit.register(_default_checker.close)
    if old is not None:
        old.close()
    return _default_checker


# ----------------------------------------------------------------------------- primitives


def _gold_answers(contexts: Sequence[Mapping], texts: Sequence[str], name: str) -> list[str]:
    if len(texts) != len(contexts):
        raise ValueError(f"math primitive {name!r}: {len(texts)} texts but {len(contexts)} contexts")
    golds = []
    for index, context in enumerate(contexts):
        if "answer" not in context:
            raise KeyError(f"math primitive {name!r}: context {index} has no 'answer' (keys: {sorted(context)})")
        golds.append(str(context["answer"]))
    return golds


def _per_text(texts: Sequence[str], test: Callable[[str], bool]) -> np.ndarray:
    return np.fromiter((float(test(t)) for t in texts), dtype=np.float32, count=len(texts))


@primitive("correct", kind="host", domain=DOMAIN, aliases=("outcome",))
def correct(texts: Sequence[str], contexts: Sequence[Mapping]) -> np.ndarray:
    """g1, f32[N]: 1 if the extracted answer is equivalent to the gold answer."""
    golds = _gold_answers(contexts, texts, "correct")
    return answer_checker().check([extract_predicted_answer(t) for t in texts], golds)


@primitive("boxed", kind="host", domain=DOMAIN, aliases=("format",))
def boxed(texts: Sequence[str], contexts: Sequence[Mapping]) -> np.ndarray:
    """g2, f32[N]: 1 if the answer is in a balanced, non-empty `\\boxed{}`."""
    del contexts
    return _per_text(texts, _box_argument_is_closed)


@primitive("steps", kind="host", domain=DOMAIN)
def steps(texts: Sequence[str], contexts: Sequence[Mapping]) -> np.ndarray:
    """g3, f32[N]: 1 if an explicit step indicator (`STEP_INDICATOR`) is present."""
    del contexts
    return _per_text(texts, lambda t: STEP_INDICATOR.search(t) is not None)


@primitive("gold_anywhere", kind="host", domain=DOMAIN)
def gold_anywhere(texts: Sequence[str], contexts: Sequence[Mapping]) -> np.ndarray:
    """g4, f32[N]: 1 if the gold answer appears anywhere in the output (soft match)."""
    golds = _gold_answers(contexts, texts, "gold_anywhere")
    return np.array([gold_appears(t, g) for t, g in zip(texts, golds)], np.float32).reshape(len(texts))


@primitive("boxed_reversed", kind="host", domain=DOMAIN)
def boxed_reversed(texts: Sequence[str], contexts: Sequence[Mapping]) -> np.ndarray:
    """1 - g2, f32[N]: the flipped format primitive of the "Reverse g2" ablation."""
    return 1.0 - boxed(texts, contexts)


def _base_name(symbol: str) -> str:
    """A name, alias or `gK` of the base vocabulary -> its primitive name."""
    match = re.fullmatch(r"g(\d+)", symbol)
    if match and 1 <= int(match.group(1)) <= len(MATH_PRIMITIVES):
        return MATH_PRIMITIVES[int(match.group(1)) - 1]
    for name in MATH_PRIMITIVES:
        if symbol == name or symbol in registry.get(DOMAIN, name).aliases:
            return name
    raise ValueError(f"math primitives: unknown primitive {symbol!r}; expected one of {MATH_PRIMITIVES}, their aliases or g1..g4")


def math_primitive_names(remove: Sequence[str] = (), reverse: Sequence[str] = ()) -> tuple[str, ...]:
    """Ordered primitive names of the math domain with Appendix F.3's vocabulary ablations.

    `remove`: primitives to drop ("Remove g2/g3/g4"); `reverse`: primitives replaced in
    place by their flipped version ("Reverse g2": `boxed` -> `boxed_reversed`). Both take
    names, aliases or `g1`..`g4` of the base order (correct, boxed, steps, gold_anywhere).
    `correct` is the validation metric and cannot be removed or reversed.
    """
    removed = {_base_name(s) for s in remove}
    reversed_ = {_base_name(s) for s in reverse}
    if OUTCOME in removed | reversed_:
        raise ValueError(f"math primitives: {OUTCOME!r} is the outcome (validation metric) and must stay as it is")
    both = removed & reversed_
    if both:
        raise ValueError(f"math primitives: {sorted(both)} cannot be both removed and reversed")
    not_reversible = reversed_ - set(REVERSED_NAMES)
    if not_reversible:
        raise ValueError(f"math primitives: {sorted(not_reversible)} have no reversed version; reversible: {sorted(REVERSED_NAMES)}")
    return tuple(REVERSED_NAMES[n] if n in reversed_ else n for n in MATH_PRIMITIVES if n not in removed)


# ----------------------------------------------------------------------------- runner


class HostPrimitiveRunner:
    """Evaluates host primitives over a batch: `run(texts, contexts) -> f32[N, P]`.

    Columns are computed concurrently on a pool of `num_workers` threads (one task per
    primitive; `correct` spreads its checks over its own worker processes). `submit`
    returns a `concurrent.futures.Future` so the caller can sample the next batch
    meanwhile. Time spent: `last_seconds`, `total_seconds`, `seconds_by_primitive`.
    """

    def __init__(self, primitives: Sequence[Primitive], num_workers: int = 4):
        if not primitives:
            raise ValueError("HostPrimitiveRunner needs at least one primitive")
        not_host = [p.name for p in primitives if p.kind != "host"]
        if not_host:
            raise ValueError(f"HostPrimitiveRunner: primitives {not_host} are not of kind 'host'")
        if num_workers < 1:
            raise ValueError(f"HostPrimitiveRunner: num_workers must be >= 1, got {num_workers}")
        self.primitives = tuple(primitives)
        self._columns = concurrent.futures.ThreadPoolExecutor(num_workers, thread_name_prefix="host-primitive")
        self._batches = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="host-primitive-batch")
        self._stats_lock = threading.Lock()
        self.batches = 0
        self.last_seconds = 0.0
        self.total_seconds = 0.0
        self.seconds_by_primitive = {p.name: 0.0 for p in self.primitives}

    def run(self, texts: Sequence[str], contexts: Sequence[Mapping]) -> np.ndarray:
        """f32[N, P]: column j is primitive j on every (text, context)."""
        if len(texts) != len(contexts):
            raise ValueError(f"HostPrimitiveRunner.run: {len(texts)} texts but {len(contexts)} contexts")
        started = time.perf_counter()
        texts, contexts = list(texts), list(contexts)
        futures = [self._columns.submit(self._column, p, texts, contexts) for p in self.primitives]
        values = np.stack([f.result() for f in futures], axis=-1) if texts else np.zeros((0, len(self.primitives)), np.float32)
        elapsed = time.perf_counter() - started
        with self._stats_lock:
            self.batches += 1
            self.last_seconds = elapsed
            self.total_seconds += elapsed
        return values

    __call__ = run

    def submit(self, texts: Sequence[str], contexts: Sequence[Mapping]) -> concurrent.futures.Future:
        """`run` in the background; the future's result is the f32[N, P] array."""
        return self._batches.submit(self.run, list(texts), list(contexts))

    def _column(self, prim: Primitive, texts: list[str], contexts: list[Mapping]) -> np.ndarray:
        started = time.perf_counter()
        column = np.asarray(prim.fn(texts, contexts), np.float32)
        if column.shape != (len(texts),):
            raise ValueError(f"host primitive {prim.name!r} returned shape {column.shape}, expected ({len(texts)},)")
        with self._stats_lock:
            self.seconds_by_primitive[prim.name] += time.perf_counter() - started
        return column

    def close(self) -> None:
        self._batches.shutdown(wait=True)
        self._columns.shutdown(wait=True)

    def __enter__(self) -> "HostPrimitiveRunner":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
