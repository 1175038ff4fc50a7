"""A damaged history or metrics log is brought back, on resume, to exactly what the checkpoint
covers: lines after it are cut, lines lost or garbled are rewritten from the journal, and the
resumed run ends identical to an uninterrupted one."""

from __future__ import annotations

import contextlib
import json
import os
import shutil

import pytest

from derl_jax.logging import read_jsonl
from derl_jax.outer.resume import JOURNAL_DIR
from derl_jax.outer.search import strip_wall_clock
from test_search import run_fake_search

ITERATIONS, CANDIDATES = 3, 4  # lines per iteration: CANDIDATES in history, 1 in metrics


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("reference")
    run_fake_search(workdir, "derl", iterations=ITERATIONS, num_candidates=CANDIDATES)
    return read_jsonl(workdir / "history.jsonl"), read_jsonl(workdir / "metrics.jsonl")


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run directory holding the first ITERATIONS - 1 iterations (copied for each case)."""
    workdir = tmp_path_factory.mktemp("interrupted")
    run_fake_search(workdir, "derl", iterations=ITERATIONS - 1, num_candidates=CANDIDATES)
    os.remove(workdir / "search_result.json")  # a finished search would be returned as is
    return workdir


def _lines(path) -> list[bytes]:
    with open(path, "rb") as handle:
        return handle.read().split(b"\n")[:-1]


def _write(path, lines: list[bytes], tail: bytes = b"\n") -> None:
    with open(path, "wb") as handle:
        handle.write(b"\n".join(lines) + (tail if lines else b""))


def _damage(path, how: str) -> None:
    lines = _lines(path)
    if how == "first":
        lines[0] = b"\x00\xffnot json"
    elif how == "middle":
        lines[len(lines) // 2] = lines[len(lines) // 2][: len(lines[len(lines) // 2]) // 2]  # cut in half
    elif how == "last":
        lines[-1] = b'{"iteration": 1, "index": '
    elif how == "torn_tail":
        _write(path, lines[:-1] + [lines[-1][:10]], tail=b"")  # unterminated last record
        return
    elif how == "lost_iteration":  # an iteration the checkpoint covers is missing from the log
        lines = lines[: -CANDIDATES] if path.name == "history.jsonl" else lines[:-1]
    elif how == "extra_iteration":  # records of an iteration the checkpoint does not cover
        extra = [json.loads(line) for line in lines[-CANDIDATES:]]
        for record in extra:
            record["iteration"] = record.get("iteration", 0) + 1
            record["step"] = record.get("step", 0) + 1
        lines += [json.dumps(r).encode() for r in extra]
    elif how == "not_an_object":
        lines.insert(2, b"[1, 2, 3]")
    else:
        raise ValueError(how)
    _write(path, lines)


CASES = [("history.jsonl", how) for how in ("first", "middle", "last", "torn_tail", "lost_iteration", "extra_iteration", "not_an_object")]
CASES += [("metrics.jsonl", how) for how in ("first", "lost_iteration", "extra_iteration")]


@pytest.mark.parametrize("log, how", CASES)
def test_damaged_log_is_repaired_and_the_resumed_run_matches(tmp_path, reference, interrupted, log, how):
    tmp_path = tmp_path / "run"
    shutil.copytree(interrupted, tmp_path)
    before = {name: _lines(tmp_path / name) for name in ("history.jsonl", "metrics.jsonl")}
    _damage(tmp_path / log, how)
    unreadable = how in ("first", "middle", "last", "torn_tail", "not_an_object")
    with pytest.warns(RuntimeWarning) if unreadable else contextlib.nullcontext():
        result, evaluator = run_fake_search(tmp_path, "derl", iterations=ITERATIONS, num_candidates=CANDIDATES)
    assert len(evaluator.calls) == 1  # only the new iteration was trained
    history, metrics = read_jsonl(tmp_path / "history.jsonl"), read_jsonl(tmp_path / "metrics.jsonl")
    # what the checkpoint covered comes back byte for byte (wall-clock fields included) ...
    assert _lines(tmp_path / "history.jsonl")[: len(before["history.jsonl"])] == before["history.jsonl"]
    assert _lines(tmp_path / "metrics.jsonl")[: len(before["metrics.jsonl"])] == before["metrics.jsonl"]
    # ... and the whole run equals an uninterrupted one
    reference_history, reference_metrics = reference
    assert strip_wall_clock(history) == strip_wall_clock(reference_history) == strip_wall_clock(result.history)
    assert strip_wall_clock(metrics) == strip_wall_clock(reference_metrics)


def test_without_a_journal_the_readable_lines_are_kept_with_a_warning(tmp_path):
    run_fake_search(tmp_path, "derl", iterations=2, num_candidates=CANDIDATES)
    lines = _lines(tmp_path / "history.jsonl")
    _write(tmp_path / "history.jsonl", lines[:1] + [b"garbage"] + lines[2:])
    shutil.rmtree(tmp_path / JOURNAL_DIR)
    os.remove(tmp_path / "search_result.json")
    with pytest.warns(RuntimeWarning, match="no entry for iterations \\[0, 1\\]"):
        run_fake_search(tmp_path, "derl", iterations=3, num_candidates=CANDIDATES)
    history = read_jsonl(tmp_path / "history.jsonl")
    assert [(r["iteration"], r["index"]) for r in history] == [(0, 0)] + [(i, j) for i in range(3) for j in range(4)][2:]
