"""Fakes shared by the history-search, ARBO and Eureka tests: an oracle, an evaluator, a chat server.

* `fake_records(iteration, texts)`: CandidateRecords from a NumPy oracle (no model is trained):
  the score is how strongly the reward separates a "correct" probe from a "format+steps" one,
  the curves come from fixed per-primitive trajectories (g1 rises, g2 is saturated, g3 never
  moves). Unparseable or rejected texts become invalid records with the checker's reason.
* `run_rounds(strategy, rounds, n)`: propose -> fake records -> update, round after round.
* `FakeEvaluator`: a `CandidateEvaluator` for `derl_jax.outer.search.search` with the same
  kind of scores and curves, computed from the stacked programs.
* `Replay`: an OpenAI-compatible chat endpoint on 127.0.0.1 (a thread the test starts and
  stops) answering each POST with the next scripted reply and keeping the request bodies; a
  reply may also be `STALL` (answer nothing for `STALL_S` seconds, then hang up: a client
  timeout) or `RESET` (drop the connection at once, without an answer).
"""

from __future__ import annotations

import http.server
import json
import socket
import struct
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np

from derl_jax.expr.canonical import canonical
from derl_jax.expr.check import check_text
from derl_jax.expr.vm import evaluate_numpy
from derl_jax.outer import CandidateRecord
from derl_jax.rl.evaluator import CandidateResults

NAMES = ("correct", "format", "steps")
ARITH_NAMES = ("correct", "boxed", "steps")  # registered primitives of the arith domain: their sources exist
ARITH = {"domain": {"kind": "arith"}}
STEPS = 12
STALL, RESET = ("stall", None), ("reset", None)
STALL_S = 0.6
# per primitive mean value over inner training: g1 rises, g2 is saturated from the start, g3 never moves
TRAJECTORY = np.stack([np.linspace(0.1, 0.7, STEPS), np.full(STEPS, 0.98), np.zeros(STEPS)], 1).astype(np.float32)
PROBE = np.array([[1, 0, 0], [0, 1, 1]], np.float32)


def fake_score(tree) -> float:
    """0.5 + 0.4 tanh(reward(correct probe) - reward(format+steps probe)), clipped to [0, 1]."""
    probe = evaluate_numpy(tree, PROBE, 0.5)
    return round(float(np.clip(0.5 + 0.4 * np.tanh(probe[0] - probe[1]), 0, 1)), 6)


def fake_records(iteration, texts, names=NAMES):
    """CandidateRecords of one round from the fake oracle (module docstring)."""
    records = []
    for j, text in enumerate(texts):
        tree, validity = check_text(text, names)
        if tree is None or not validity.ok:
            records.append(CandidateRecord(iteration, j, text, canonical(tree) if tree else None, False,
                                           validity.reason or "invalid", 0.0, {}))
            continue
        reward = np.array([evaluate_numpy(tree, TRAJECTORY[t:t + 1], t / (STEPS - 1))[0] for t in range(STEPS)])
        curves = {"reward_mean": reward.astype(np.float32),
                  **{f"primitive/{n}": TRAJECTORY[:, i] for i, n in enumerate(names)}}
        records.append(CandidateRecord(iteration, j, text, canonical(tree), True, None, fake_score(tree), curves))
    return records


def run_rounds(strategy, rounds, n=4, seed=0, state=None, start=0):
    """(final state, [texts of each round]) after `rounds` rounds against the fake oracle."""
    key = jax.random.key(seed)
    state = strategy.init(key) if state is None else state
    proposed = []
    for r in range(start, rounds):
        texts, aux = strategy.propose(state, jax.random.fold_in(key, r), n)
        records = fake_records(r, texts, strategy.primitive_names)
        state = strategy.update(state, records, np.array([rec.score for rec in records], np.float32), aux)
        proposed.append(texts)
    return state, proposed


class FakeEvaluator:
    """`evaluate_candidates` without training: each program's score from `fake_score` (on its
    stacked program), curves f32[K, STEPS] from TRAJECTORY under the primitives' `names`."""

    def __init__(self, names=NAMES):
        self.names = tuple(names)

    def evaluate_candidates(self, programs, init_params, key, train_set, val_set, *, steps=None):
        from derl_jax.expr.program import Program

        ops, args, sizes = (np.asarray(a) for a in (programs.ops, programs.args, programs.size))
        k = ops.shape[0]
        scores = np.zeros(k, np.float32)
        rewards = np.zeros((k, STEPS), np.float32)
        for j in range(k):
            program = Program(ops[j], args[j], sizes[j])
            scores[j] = fake_score(program)
            rewards[j] = [evaluate_numpy(program, TRAJECTORY[t:t + 1], t / (STEPS - 1))[0] for t in range(STEPS)]
        curves = {"reward_mean": rewards,
                  **{f"primitive/{n}": np.repeat(TRAJECTORY[None, :, i], k, 0) for i, n in enumerate(self.names)}}
        return CandidateResults(scores=scores, curves=curves, params={"skill": jnp.zeros(k)})


def fake_search(strategy, workdir, iterations, n, names=NAMES, key=3):
    """`derl_jax.outer.search.search` of `strategy` with the fake evaluator in `workdir`."""
    import ml_collections

    from derl_jax.outer.search import search

    cfg = ml_collections.ConfigDict({"outer": {"iterations": iterations, "num_candidates": n},
                                     "inner": {"common_random_numbers": True}})
    data = tiny_data()
    return search(strategy, FakeEvaluator(names), data, data, names, cfg, workdir, jax.random.key(key),
                  init_params={"skill": jnp.float32(0)}, progress=False, echo=lambda line: None)


def tiny_data():
    """A 4-row TokenDataset (the fake evaluator never reads it)."""
    from derl_jax.domains.base import TokenDataset

    return TokenDataset(prompts=jnp.ones((4, 3), jnp.int32), prompt_mask=jnp.ones((4, 3), bool), context={})


# --------------------------------------------------------------------------- a scripted chat endpoint


def completion(content="", calls=(), n=1):
    """(200, body) of a chat completion with `content` and tool `calls` [(name, arguments text)];
    with n > 1 `content` is a list of n contents, one choice each."""
    contents = content if n > 1 else [content]
    choices = []
    for index, text in enumerate(contents):
        message = {"role": "assistant", "content": text}
        if calls:
            message["tool_calls"] = [
                {"id": f"c{k}", "type": "function", "function": {"name": name, "arguments": args}}
                for k, (name, args) in enumerate(calls)]
        choices.append({"index": index, "message": message, "finish_reason": "tool_calls" if calls else "stop"})
    return 200, {"choices": choices}


class Replay:
    """A scripted chat endpoint: each reply is (status, body) with body a dict or raw bytes."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.requests = []
        replay = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                replay.requests.append({"path": self.path, "body": json.loads(self.rfile.read(length))})
                status, body = replay.replies.pop(0) if replay.replies else (500, b"script exhausted")
                if status in ("stall", "reset"):
                    if status == "stall":
                        time.sleep(STALL_S)
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    return
                headers = {}
                if isinstance(body, tuple):  # (body, headers)
                    body, headers = body
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        # shutdown() waits for the serving loop's next poll: 0.5 s by default, on every exit
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
