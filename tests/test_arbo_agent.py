"""The ARBO agent's tool loop against a local OpenAI-compatible server replaying scripted replies.

The server (127.0.0.1, started in the test) answers each POST to /v1/chat/completions with the
next scripted reply and keeps the request bodies, so the tests see exactly what the agent sent
back: tool results, errors for malformed calls, nudges.
"""

import http.server
import json
import threading

import jax
import numpy as np
import pytest

from derl_jax.expr.check import check_text
from derl_jax.methods.arbo import history as hist
from derl_jax.methods.arbo.agent import BackendError, OpenAIBackend, parse_tool_calls, plain_messages, reply_from_completion, run_agent
from derl_jax.methods.arbo.proposer import View
from derl_jax.methods.arbo.tools import Workspace
from derl_jax.outer import CandidateRecord, make_strategy

NAMES = ("correct", "format", "steps")


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
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def completion(content="", calls=()):
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": f"c{k}", "type": "function", "function": {"name": name, "arguments": args}}
            for k, (name, args) in enumerate(calls)]
    return 200, {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}


def history_with_one():
    curves = {"reward_mean": np.linspace(0, 1, 5, dtype=np.float32), "primitive/correct": np.linspace(0, 0.5, 5)}
    record = CandidateRecord(0, 0, "g1+g2", "g1 + g2", True, None, 0.4, curves)
    bad = CandidateRecord(0, 1, "g1/0", None, False, "not finite (NaN) on a probe point", 0.0, {})
    proposals = [hist.Proposal("g1+g2", None, "explore_sum"), hist.Proposal("g1/0", None, "explore_sum")]
    return hist.append_round(hist.History(), [record, bad], proposals, "explore", hist.Belief(0, ("old",), ("next",)))


SCRIPT = [
    completion(calls=[("list_candidates", "{}")]),
    completion(calls=[("commit_candidate", "{expression: g1"), ("delete_history", "{}"), ("show_curves", '{"candidate": "zero"}')]),
    completion(calls=[("commit_candidate", '{"expression": "g1+"}'), ("commit_candidate", '{"expression": "g9"}'),
                      ("commit_candidate", '{"expression": "g1", "parent": 7}')]),
    completion("I think g3 should be added."),
    completion('<tool_call>\n{"name": "commit_candidate", "arguments": {"expression": "g1+0.5*g3", "parent": null}}\n</tool_call>'),
    completion(calls=[("show_curves", '{"candidate": 0}'),
                      ("write_belief", json.dumps({"diagnoses": "g2 dominates\nreward rises", "next_steps": "add g3"})),
                      ("commit_candidate", json.dumps({"expression": "g1+0.25*g2", "parent": 0, "note": "damp g2"}))]),
    completion(calls=[("commit_candidate", '{"expression": "0.25*g2+g1"}'), ("commit_candidate", '{"expression": "g1*(1+g3)", "parent": 0}')]),
]


def test_tool_loop_with_malformed_calls_against_replay_server():
    workspace = Workspace(history_with_one(), View(), NAMES, wanted=3)
    with Replay(SCRIPT) as server:
        outcome = run_agent(OpenAIBackend(server.url, model="m"), workspace, "exploit", seed=3, max_turns=10)
    assert [p.text for p in outcome.proposals] == ["g1+0.5*g3", "g1+0.25*g2", "g1*(1+g3)"]
    assert [p.parent for p in outcome.proposals] == [None, 0, 0]
    assert outcome.proposals[1].note == "damp g2"
    assert outcome.stopped == "committed" and outcome.turns == 7 and outcome.backend_errors == 0
    assert outcome.tool_errors == 7
    assert outcome.belief == hist.Belief(1, ("g2 dominates", "reward rises"), ("add g3",))
    requests = [r["body"] for r in server.requests]
    assert all(r["path"] == "/v1/chat/completions" for r in server.requests) and len(requests) == 7
    first = requests[0]
    assert first["model"] == "m" and {t["function"]["name"] for t in first["tools"]} == {
        "list_candidates", "show_curves", "read_belief", "write_belief", "commit_candidate"}
    assert "Mode: exploit" in first["messages"][1]["content"] and "candidate 0" in first["messages"][1]["content"]
    tool_replies = [m for m in requests[-1]["messages"] if m["role"] == "tool"]
    assert tool_replies[0]["content"].startswith("2 candidates") and "g1/0" in tool_replies[0]["content"]
    errors = [m["content"] for m in tool_replies[1:7]]
    assert "not valid JSON" in errors[0] and "unknown tool 'delete_history'" in errors[1]
    assert "must be an integer" in errors[2] and "parse error" in errors[3]
    assert "unknown primitive 'g9'" in errors[4] and "no candidate 7" in errors[5]
    assert tool_replies[0]["tool_call_id"] == "c0"
    nudges = [m["content"] for m in requests[-1]["messages"] if m["role"] == "user"][1:]
    assert nudges == ["No tool was called. Committed 0 of 3; call commit_candidate (or another tool)."]
    curves_reply = tool_replies[8]["content"]
    assert curves_reply.startswith("candidate 0: g1+g2") and "reward_mean: 0 -> 1" in curves_reply
    last_reply = [m for m in requests[-1]["messages"] if m["role"] == "tool"][-1]["content"]
    assert last_reply == "committed 2 of 3"


def test_backend_failures_stop_the_agent_and_the_strategy_fills_in():
    cfg = {"arbo": {"proposer": "agent", "agent": {"url": "http://127.0.0.1:9/v1", "timeout_s": 5}}}
    with Replay([completion(calls=[("commit_candidate", '{"expression": "g1*g2"}')]), (500, b"overloaded"),
                 (200, b"not json"), (200, {"error": "no choices"}), (200, {"error": "no choices"})]) as server:
        cfg["arbo"]["agent"]["url"] = server.url
        strategy = make_strategy("arbo", cfg, None, NAMES)
        state = strategy.init(jax.random.key(0))
        texts, plan = strategy.propose(state, jax.random.key(1), 4)
    assert texts[0] == "g1*g2" and len(set(texts)) == 4
    assert all(check_text(t, NAMES)[1].ok for t in texts)
    assert plan.agent["agent_committed"] == 1 and plan.agent["agent_backend_errors"] == 2
    assert [p.operator for p in plan.proposals][0] == "agent"
    assert all(p.operator.startswith("explore_") for p in plan.proposals[1:])


def test_unreachable_endpoint_is_a_backend_error():
    with Replay([]) as server:
        url = server.url
    with pytest.raises(BackendError, match="127.0.0.1"):
        OpenAIBackend(url, timeout_s=2).chat([{"role": "user", "content": "hi"}], [], seed=0)
    with pytest.raises(BackendError, match="not a chat completion"):
        reply_from_completion({"choices": []})


def test_text_tool_calls_and_plain_messages():
    content, calls = parse_tool_calls('think <tool_call>{"name": "read_belief", "arguments": {}}</tool_call>'
                                      '<tool_call>not json</tool_call> done')
    assert content == "think  done"
    assert [(c.name, c.arguments) for c in calls] == [("read_belief", {}), ("", "not json")]
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "read_belief", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "a", "content": "belief"}]
    plain = plain_messages(messages, [{"type": "function", "function": {"name": "read_belief"}}])
    assert plain[0]["content"].startswith("S\n\n# Tools") and '"name": "read_belief"' in plain[0]["content"]
    assert plain[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "read_belief", "arguments": {}}\n</tool_call>'}
    assert plain[3] == {"role": "user", "content": "<tool_response>\nbelief\n</tool_response>"}


def test_workspace_views_follow_the_ablations():
    h = history_with_one()
    no_belief = Workspace(h, View(belief=False), NAMES, wanted=1)
    assert "read_belief" not in {t["function"]["name"] for t in no_belief.tool_specs()}
    assert no_belief.call("read_belief", "{}").startswith("error: unknown tool")
    scores = Workspace(h, View(level="scores"), NAMES, wanted=1)
    assert "no curves" in scores.call("show_curves", {"candidate": 0})
    assert "not finite" not in scores.call("list_candidates", "")
    greedy = Workspace(h, View(scope="incumbent"), NAMES, wanted=1)
    assert greedy.call("show_curves", {"candidate": 1}).startswith("error: no candidate 1")
    assert greedy.call("commit_candidate", {"expression": "g1", "parent": 0}) == "committed 1 of 1"
    assert greedy.call("commit_candidate", {"expression": "g2"}).startswith("error: all 1 candidates")


@pytest.mark.slow
def test_local_backend_runs_the_tool_loop_in_process(tmp_path):
    """A tiny random Qwen2 checkpoint with the real Qwen tokenizer: the prompt carries the tools,
    sampling is deterministic per seed, and replies that call no tool end the round cleanly."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from derl_jax.methods.arbo.agent import LocalBackend, round_prompt, system_prompt
    from derl_jax.models.hf_tokenizer import bundled_qwen_tokenizer_dir

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=False, max_position_embeddings=2048, rope_theta=10000.0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    backend = LocalBackend(str(tmp_path), bundled_qwen_tokenizer_dir(), temperature=1.0, max_new_tokens=6)
    workspace = Workspace(history_with_one(), View(), NAMES, wanted=1)
    messages = [{"role": "system", "content": system_prompt(NAMES, 0)},
                {"role": "user", "content": round_prompt(workspace, "explore")}]   # what run_agent sends first
    prompt = backend.prompt_text(messages, workspace.tool_specs())
    assert prompt.startswith("<|im_start|>system\nYou design reward") and prompt.endswith("<|im_start|>assistant\n")
    assert "# Tools" in prompt and "Mode: explore" in prompt
    assert '"name": "commit_candidate"' in prompt
    first = backend.chat(messages, workspace.tool_specs(), seed=1)
    assert first == backend.chat(messages, workspace.tool_specs(), seed=1)
    assert isinstance(first.content, str)
    outcome = run_agent(backend, workspace, "explore", seed=2, max_turns=2)
    assert outcome.turns == 2 and outcome.backend_errors == 0
    assert len(outcome.proposals) == sum(1 for p in outcome.proposals if check_text(p.text, NAMES)[1].ok)


def test_agent_round_through_the_strategy_keeps_its_belief_and_lineage(tmp_path):
    script = [completion(calls=[
        ("write_belief", json.dumps({"diagnoses": "nothing evaluated yet", "next_steps": "try g1 with g3"})),
        ("commit_candidate", '{"expression": "g1+0.5*g3", "note": "shaping"}'),
        ("commit_candidate", '{"expression": "g1*(1+g2)"}')])]
    with Replay(script) as server:
        cfg = {"arbo": {"proposer": "agent", "agent": {"url": server.url}}}
        strategy = make_strategy("arbo", cfg, None, NAMES, workdir=tmp_path)
        state = strategy.init(jax.random.key(0))
        texts, plan = strategy.propose(state, jax.random.key(1), 2)
    assert texts == ["g1+0.5*g3", "g1*(1+g2)"] and plan.mode == "explore"
    records = [CandidateRecord(0, j, t, t, True, None, 0.1 * (j + 1), {}) for j, t in enumerate(texts)]
    state = strategy.update(state, records, np.array([0.1, 0.2], np.float32), plan)
    saved = hist.load(tmp_path)
    assert saved == state.history
    assert saved.belief == hist.Belief(0, ("nothing evaluated yet",), ("try g1 with g3",))
    assert [(e.operator, e.parent, e.note) for e in saved.lineage] == [("agent", None, "shaping"), ("agent", None, "")]
    assert strategy.metrics(state)["agent_committed"] == 2 and strategy.metrics(state)["accepted"] == 1
