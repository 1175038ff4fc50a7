"""Host primitives of a batch, computed concurrently.

    runner = HostPrimitiveRunner(domain.primitives, num_workers=4)
    prims = runner.run(texts, contexts)                 # f32[N, P]; `submit` returns a future

Answer checks under a time limit (`TimedChecker`) are `derl_jax.timed_checker`'s.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Mapping, Sequence

import numpy as np

from primitives.registry import Primitive


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
