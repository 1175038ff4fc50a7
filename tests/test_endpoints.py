"""The chat endpoint's hiccups are retried with seeded backoff; an endpoint that stays down stops
the search before the round is charged, and the rerun resumes as if nothing had happened.

The endpoint is `arbo_fakes.Replay` on 127.0.0.1; waits go to a fake clock (no real sleeping)."""

import json
import os
import random
import subprocess
import sys

import pytest

from arbo_fakes import ARITH, ARITH_NAMES, RESET, STALL, STALL_S, Replay, completion, fake_search
from derl_jax.logging import read_jsonl
from derl_jax.methods.arbo.endpoint import BackendError, EndpointDown, Retry
from derl_jax.methods.arbo.agent import OpenAIBackend
from derl_jax.outer import make_strategy
from derl_jax.outer.search import SearchStopped, strip_wall_clock

NAMES = ARITH_NAMES
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELLO = [{"role": "user", "content": "hi"}]


def expected_waits(seed, base, cap, count):
    """The backoff the docstring states, from an independent stream of the same seed."""
    rng = random.Random(seed)
    return [min(cap, base * 2 ** k) * (1 - 0.5 * rng.random()) for k in range(count)]


def test_backoff_doubles_up_to_the_cap_with_seeded_jitter():
    retry = Retry(max_tries=8, base_s=0.5, max_s=3.0, seed=11)
    waits = [retry.delay(k) for k in range(1, 8)]
    assert waits == pytest.approx(expected_waits(11, 0.5, 3.0, 7))
    ceilings = [0.5, 1, 2, 3, 3, 3, 3]
    assert all(c / 2 < w <= c for w, c in zip(waits, ceilings))
    assert Retry(seed=11).delay(1) == Retry(seed=11).delay(1) != Retry(seed=12).delay(1)
    assert retry.delay(1, retry_after=2.0) == 2.0 and retry.delay(1, retry_after=99.0) == 3.0


@pytest.mark.parametrize("fault", [(429, b"slow down"), (503, b"overloaded"), (502, b"bad gateway"), STALL, RESET],
                         ids=["429", "503", "502", "timeout", "reset"])
def test_a_passing_fault_is_retried_with_backoff(fault):
    waits = []
    with Replay([fault, fault, completion("done")]) as server:
        backend = OpenAIBackend(server.url, timeout_s=STALL_S / 3,
                                retry=Retry(max_tries=3, base_s=0.25, max_s=10.0, seed=5, sleep=waits.append))
        reply = backend.chat(HELLO, [], seed=0)
    assert reply.content == "done" and len(server.requests) == 3
    assert waits == pytest.approx(expected_waits(5, 0.25, 10.0, 2))


def test_retry_after_is_honoured():
    waits = []
    with Replay([(429, (b"later", {"Retry-After": "7"})), completion("ok")]) as server:
        backend = OpenAIBackend(server.url, retry=Retry(max_tries=2, base_s=0.1, max_s=60.0, sleep=waits.append))
        assert backend.complete(HELLO, 1, seed=0) == ["ok"]
    assert waits == [7.0]


def test_what_retrying_cannot_fix_is_not_retried():
    waits = []
    with Replay([(400, b"context too long"), (401, b"bad key"), (200, b"not json")]) as server:
        backend = OpenAIBackend(server.url, retry=Retry(max_tries=5, sleep=waits.append))
        with pytest.raises(BackendError, match="HTTP 400: context too long"):
            backend.chat(HELLO, [], seed=0)
        with pytest.raises(EndpointDown, match="HTTP 401"):
            backend.chat(HELLO, [], seed=0)
        with pytest.raises(BackendError, match="not JSON"):
            backend.chat(HELLO, [], seed=0)
    assert waits == [] and len(server.requests) == 3


def test_an_endpoint_that_stays_down_raises_after_max_tries():
    waits = []
    with Replay([(503, b"down")] * 4) as server:
        backend = OpenAIBackend(server.url, retry=Retry(max_tries=4, base_s=1.0, max_s=2.0, seed=0, sleep=waits.append))
        with pytest.raises(EndpointDown, match="no answer after 4 tries .HTTP 503: down"):
            backend.chat(HELLO, [], seed=0)
    assert len(server.requests) == 4 and len(waits) == 3 and isinstance(EndpointDown("x"), SearchStopped)


EUREKA_ROUNDS = [completion(["```reward\ng1+0.5*g3\n```", "reward = g1*(1+g2)"], n=2),
                 completion(["```reward\ng1+0.25*g3\n```", "no idea"], n=2),
                 completion(["```reward\n2*g1+0.5*g3\n```", "```reward\ng1\n```"], n=2)]
AGENT_ROUNDS = [completion(calls=[("submit_candidate", '{"expression": "g1+0.5*g3"}'),
                                  ("submit_candidate", '{"expression": "g1*(1+g2)"}')]),
                completion(calls=[("submit_candidate", '{"expression": "g1+0.25*g3", "parent": 0}'),
                                  ("submit_candidate", '{"expression": "2*g1", "parent": 0}')]),
                completion(calls=[("submit_candidate", '{"expression": "g1+g3"}'),
                                  ("submit_candidate", '{"expression": "g1*g3"}')])]


def _search(method, script, workdir, tries=2):
    with Replay(script) as server:
        cfg = {**ARITH, "arbo": {"task": "arithmetic", "agent": {
            "url": server.url, "max_tries": tries, "retry_base_s": 0.0, "retry_max_s": 0.0}}}
        strategy = make_strategy(method, cfg, None, NAMES, workdir=workdir)
        return fake_search(strategy, str(workdir), iterations=3, n=2, names=NAMES), server


@pytest.mark.parametrize("method, rounds", [("eureka", EUREKA_ROUNDS), ("arbo", AGENT_ROUNDS)])
def test_endpoint_down_stops_uncharged_and_the_rerun_resumes(tmp_path, method, rounds):
    reference, _ = _search(method, rounds, tmp_path / "reference")
    down = tmp_path / "down"
    with pytest.raises(EndpointDown, match="no answer after 2 tries"):
        _search(method, [rounds[0], (503, b"down"), (503, b"down")], down)
    records = read_jsonl(down / "history.jsonl")
    assert [r["iteration"] for r in records] == [0, 0]          # round 1 charged nothing
    assert len(read_jsonl(down / "metrics.jsonl")) == 1 and not (down / "search_result.json").exists()
    resumed, server = _search(method, rounds[1:], down)
    assert len(server.requests) == 2                              # round 0 was not asked again
    assert strip_wall_clock(read_jsonl(down / "history.jsonl")) == strip_wall_clock(
        read_jsonl(tmp_path / "reference" / "history.jsonl"))
    assert resumed.best_text == reference.best_text and resumed.budget == reference.budget
    assert resumed.budget["candidates_charged"] == 6


@pytest.mark.slow
def test_launcher_stops_with_one_line_when_the_endpoint_is_down(tmp_path):
    with Replay([]) as server:
        url = server.url  # closed when the block ends: connections are refused
    command = [sys.executable, os.path.join(REPO_ROOT, "launch", "run.py"), "--config=configs/arith.py:smoke",
               "--mode=search", f"--workdir={tmp_path / 'run'}", "--noprogress", "--config.outer.strategy=eureka",
               f"--config.arbo.agent.url={url}", "--config.arbo.agent.max_tries=2",
               "--config.arbo.agent.retry_base_s=0.01"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 3, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("launch/run.py: stopped: ") and "no answer after 2 tries" in lines[-1]
    assert "rerun the same command" in lines[-1] and "Traceback" not in done.stderr
    assert not os.path.exists(tmp_path / "run" / "history.jsonl") or read_jsonl(tmp_path / "run" / "history.jsonl") == []
    assert json.loads((tmp_path / "run" / "config.json").read_text())["outer"]["strategy"] == "eureka"
