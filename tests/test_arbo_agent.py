"""ARBO's agent: its workspace of files, its tools, the tool loop, the backends, and whole searches.

The endpoint is `arbo_fakes.Replay` (127.0.0.1, started by each test), which answers with
scripted replies and keeps the request bodies, so the tests see exactly what the agent was
sent back: file contents, errors for malformed calls, nudges. The in-process backend runs a
tiny random Qwen2 checkpoint the test writes with `transformers`.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from arbo_fakes import ARITH, ARITH_NAMES, Replay, completion, fake_records, fake_search
from derl_jax.expr.check import check_text
from derl_jax.logging import read_jsonl
from derl_jax.methods.arbo import history as hist
from derl_jax.methods.arbo.agent import (BackendError, EndpointDown, OpenAIBackend, Retry, parse_tool_calls,
                                         plain_messages, reply_from_completion, round_prompt, run_agent, system_prompt)
from derl_jax.methods.arbo.proposer import View
from derl_jax.methods.arbo.sources import source_files
from derl_jax.methods.arbo.strategy import transcript_path
from derl_jax.methods.arbo.tools import Workspace, belief_from_text
from derl_jax.outer import CandidateRecord, make_strategy

NAMES = ARITH_NAMES
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def history_with_two():
    curves = {"reward_mean": np.linspace(0, 1, 5, dtype=np.float32), "primitive/correct": np.linspace(0, 0.5, 5)}
    record = CandidateRecord(0, 0, "g1+g2", "g1 + g2", True, None, 0.4, curves)
    bad = CandidateRecord(0, 1, "g1/g3", "g1/g3", True, "non-finite validation score", 0.0, {})
    proposals = [hist.Proposal("g1+g2", None, "agent", "both"), hist.Proposal("g1/g3", None, "agent")]
    belief = hist.Belief(0, ("old",), ("next",), {"belief": "old\nNext steps: next", "analysis": "my notes"})
    return hist.append_round(hist.History(), [record, bad], proposals, "explore", belief)


def workspace(view=View(), wanted=3, history=None):
    return Workspace(history or history_with_two(), view, NAMES, wanted=wanted, sources=source_files(ARITH, NAMES))


def read(ws, path):
    return ws.call("read_file", {"path": path})


# --------------------------------------------------------------------------- the workspace


def test_workspace_files_hold_the_code_the_log_and_the_agents_notes():
    ws = workspace()
    listing = ws.call("list_files", "{}")
    for path in ("task.md", "env/derl_jax/domains/arith.py", "primitives/correct.py", "evaluation_log.md",
                 "candidates/0.md", "candidates/1.md", "analysis.md", "belief.md"):
        assert path in listing, path
    assert "belief.md  (2 lines, writable)" in listing and "candidates/0.md  (10 lines, read-only)" in listing
    assert listing.count("writable") == 2
    assert "def correct(rollout, context)" in read(ws, "primitives/correct.py")
    assert "@register_domain(\"arith\"" in ws.call("read_file", {"path": "env/derl_jax/domains/arith.py", "start": 400,
                                                                 "lines": 100})
    first = read(ws, "env/derl_jax/domains/arith.py")
    assert first.startswith("env/derl_jax/domains/arith.py: lines 1-200 of ")
    assert "g2 = boxed" in read(ws, "task.md")
    log = read(ws, "evaluation_log.md")
    assert "0.4000" in log and "[non-finite validation score]" in log
    cand = read(ws, "candidates/0.md")
    assert "expression: g1+g2" in cand and "score: 0.4000" in cand and "proposed by: agent (both)" in cand
    assert "reward_mean: 0 -> 1" in cand and "primitive/correct: 0 -> 0.5" in cand
    assert "failure: non-finite validation score" in read(ws, "candidates/1.md")
    assert read(ws, "analysis.md").endswith("my notes") and "Next steps: next" in read(ws, "belief.md")


def test_workspace_views_follow_the_ablations():
    scores = workspace(View(level="scores"))
    cand = read(scores, "candidates/0.md")
    assert "score: 0.4000" in cand and "reward_mean" not in cand
    assert "non-finite" not in read(scores, "evaluation_log.md") + read(scores, "candidates/1.md")
    blind = workspace(View(level="none"))
    assert "evaluation_log.md" not in blind.call("list_files", "")
    assert read(blind, "evaluation_log.md").startswith("error: no file 'evaluation_log.md'")
    cand = read(blind, "candidates/0.md")
    assert "expression: g1+g2" in cand and "score" not in cand and "reward_mean" not in cand
    assert "evaluation_log.md" not in system_prompt(blind) and "evaluation_log.md" in system_prompt(workspace())
    assert "Every submission is charged" in system_prompt(workspace())
    assert "0.4" not in round_prompt(blind, "exploit") and "candidate 0 (g1+g2)" in round_prompt(blind, "exploit")
    no_belief = workspace(View(belief=False))
    assert "write_file" not in {t["function"]["name"] for t in no_belief.tool_specs()}
    assert "belief.md" not in no_belief.call("list_files", "") and no_belief.belief is None
    assert no_belief.call("write_file", {"path": "belief.md", "content": "x"}).startswith("error: unknown tool")
    assert "my notes" not in system_prompt(no_belief) + round_prompt(no_belief, "explore")
    greedy = workspace(View(scope="incumbent"))
    assert read(greedy, "candidates/1.md").startswith("error: no file")
    assert greedy.call("submit_candidate", {"expression": "g1", "parent": 1}).startswith("error: parent: no candidate 1")
    framework_free = round_prompt(workspace(View(belief=False)), None)
    assert "Mode" not in framework_free and "belief" not in framework_free
    assert "Mode: exploit" in round_prompt(workspace(), "exploit") and "score 0.4000" in round_prompt(workspace(), "exploit")


def test_belief_text_is_read_into_diagnoses_and_next_steps():
    belief = belief_from_text("## Diagnoses\n- g2 saturates\n\nNext steps:\n- drop g2\n- try u", 3, "notes")
    assert belief == hist.Belief(3, ("g2 saturates",), ("drop g2", "try u"),
                                 {"belief": "## Diagnoses\n- g2 saturates\n\nNext steps:\n- drop g2\n- try u",
                                  "analysis": "notes"})
    assert belief_from_text("Next steps: add g3", 0, None).next_steps == ("add g3",)


# --------------------------------------------------------------------------- the tool loop

SCRIPT = [
    completion(calls=[("list_files", "{}")]),
    completion(calls=[("read_file", '{"path": "task.md"'), ("delete_history", "{}"), ("read_file", '{"path": "nope.md"}'),
                      ("read_file", '{"path": "candidates/0.md", "start": "one"}'),
                      ("read_file", '{"path": "candidates/0.md", "start": 99}')]),
    completion(calls=[("write_file", json.dumps({"path": "env/derl_jax/domains/arith.py", "content": "x"})),
                      ("write_file", '{"path": "belief.md"}'),
                      ("submit_candidate", '{"expression": "g1+"}'), ("submit_candidate", '{"expression": "g9"}'),
                      ("submit_candidate", '{"expression": "g1", "parent": 7}'),
                      ("submit_candidate", '{"expression": "g2+g1"}')]),
    completion("I think g3 should be added."),
    completion('<tool_call>\n{"name": "submit_candidate", "arguments": '
               '{"expression": "g1+0.5*g3", "parent": null}}\n</tool_call>'),
    completion(calls=[("read_file", '{"path": "candidates/0.md"}'),
                      ("write_file", json.dumps({"path": "belief.md",
                                                 "content": "g2 dominates\nreward rises\nNext steps:\n- add g3"})),
                      ("write_file", json.dumps({"path": "analysis.md", "content": "g1 carries the signal"})),
                      ("submit_candidate", json.dumps({"expression": "g1+0.25*g2", "parent": 0, "note": "damp g2"}))]),
    completion(calls=[("submit_candidate", '{"expression": "0.25*g2+g1"}'),
                      ("submit_candidate", '{"expression": "g1*(1+g3)", "parent": 0}')]),
]


def test_tool_loop_with_malformed_calls_against_replay_server():
    """Malformed calls cost nothing; every submitted expression takes a slot, invalid and repeated
    ones too (charged like any method's proposals), and the answer says what is wrong."""
    ws = workspace(wanted=7)
    with Replay(SCRIPT) as server:
        outcome = run_agent(OpenAIBackend(server.url, model="m"), ws, "exploit", seed=3, max_turns=10)
    assert [p.text for p in outcome.proposals] == ["g1+", "g9", "g2+g1", "g1+0.5*g3", "g1+0.25*g2", "0.25*g2+g1",
                                                   "g1*(1+g3)"]
    assert [p.parent for p in outcome.proposals] == [None, None, None, None, 0, None, 0]
    assert outcome.proposals[4].note == "damp g2"
    assert outcome.stopped == "submitted" and outcome.turns == 7 and outcome.backend_errors == 0
    assert outcome.tool_errors == 12 and outcome.belief_written
    assert outcome.belief.diagnoses == ("g2 dominates", "reward rises") and outcome.belief.next_steps == ("add g3",)
    assert outcome.belief.notes["analysis"] == "g1 carries the signal" and outcome.belief.round == 1
    requests = [r["body"] for r in server.requests]
    assert all(r["path"] == "/v1/chat/completions" for r in server.requests) and len(requests) == 7
    assert requests[0]["model"] == "m" and {t["function"]["name"] for t in requests[0]["tools"]} == {
        "list_files", "read_file", "write_file", "submit_candidate"}
    assert "Mode: exploit" in requests[0]["messages"][1]["content"] and "task.md" in requests[0]["messages"][1]["content"]
    tool_replies = [m["content"] for m in requests[-1]["messages"] if m["role"] == "tool"]
    assert "primitives/correct.py" in tool_replies[0]
    errors = tool_replies[1:12]
    expected = ["not valid JSON", "unknown tool 'delete_history'", "no file 'nope.md'", "'start' must be an integer",
                "start must be between 1 and", "is a file you may read, not one you may write", "missing argument 'content'",
                "parse error", "unknown primitive 'g9'", "no candidate 7", "repeats candidate 0 (g1+g2)"]
    for got, want in zip(errors, expected, strict=True):
        assert got.startswith("error:") and want in got, (got, want)
    charged = [got for got in errors if "charged all the same" in got]
    assert [got.rsplit("(", 1)[1] for got in charged] == ["submitted 1 of 7)", "submitted 2 of 7)", "submitted 3 of 7)"]
    assert "no candidate 7" in errors[9] and "charged" not in errors[9]   # a bad parent is no submission
    nudges = [m["content"] for m in requests[-1]["messages"] if m["role"] == "user"][1:]
    assert nudges == ["No tool was called. Submitted 3 of 7; call submit_candidate (or another tool)."]
    assert "score: 0.4000" in tool_replies[13]
    assert outcome.messages[-1]["content"] == "submitted 7 of 7"
    assert "repeats a candidate submitted this round; it is charged all the same (submitted 6 of 7)" in \
        outcome.messages[-2]["content"]


def test_backend_failures_leave_the_slots_empty():
    with Replay([completion(calls=[("submit_candidate", '{"expression": "g1*g2"}')]), (400, b"bad request"),
                 (200, b"not json"), (200, {"error": "no choices"}), (200, {"error": "no choices"})]) as server:
        strategy = make_strategy("arbo", {"arbo": {"agent": {"url": server.url}}}, None, NAMES)
        texts, plan = strategy.propose(strategy.init(jax.random.key(0)), jax.random.key(1), 4)
    assert texts == ["g1*g2", "", "", ""]
    assert [p.operator for p in plan.proposals] == ["agent", "unsubmitted", "unsubmitted", "unsubmitted"]
    assert "reply is not JSON" in plan.proposals[1].note
    assert plan.stats["agent_submitted"] == 1 and plan.stats["agent_backend_errors"] == 2
    records = fake_records(0, texts, NAMES)
    assert [r.valid for r in records] == [True, False, False, False]


def test_unreachable_endpoint_is_down():
    with Replay([]) as server:
        url = server.url
    with pytest.raises(EndpointDown, match="127.0.0.1.*no answer after 2 tries"):
        OpenAIBackend(url, timeout_s=2, retry=Retry(max_tries=2, sleep=lambda s: None)).chat(
            [{"role": "user", "content": "hi"}], [], seed=0)
    with pytest.raises(BackendError, match="not a chat completion"):
        reply_from_completion({"choices": []})


def test_text_tool_calls_and_plain_messages():
    content, calls = parse_tool_calls('think <tool_call>{"name": "list_files", "arguments": {}}</tool_call>'
                                      '<tool_call>not json</tool_call> done')
    assert content == "think  done"
    assert [(c.name, c.arguments) for c in calls] == [("list_files", {}), ("", "not json")]
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "list_files", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "a", "content": "files"}]
    plain = plain_messages(messages, [{"type": "function", "function": {"name": "list_files"}}])
    assert plain[0]["content"].startswith("S\n\n# Tools") and '"name": "list_files"' in plain[0]["content"]
    assert plain[2] == {"role": "assistant", "content": '<tool_call>\n{"name": "list_files", "arguments": {}}\n</tool_call>'}
    assert plain[3] == {"role": "user", "content": "<tool_response>\nfiles\n</tool_response>"}
    assert plain_messages(messages[:2], [])[0] == {"role": "system", "content": "S"}   # no tools: no tools section


# --------------------------------------------------------------------------- whole searches


def test_arbo_searches_end_to_end_against_the_replay_server(tmp_path):
    """Three rounds through the search loop: the agent writes its belief and submits (round 0), reads
    the evaluation log and refines the incumbent after a malformed call (round 1), then the endpoint
    answers with errors and the round's slots are charged empty."""
    script = [
        completion(calls=[("write_file", json.dumps({"path": "belief.md",
                                                     "content": "nothing yet\nNext steps: g1 with g3"})),
                          ("submit_candidate", '{"expression": "g1+0.5*g3", "note": "shaping"}'),
                          ("submit_candidate", '{"expression": "g1*(1+g2)"}'),
                          ("submit_candidate", '{"expression": "g1"}')]),
        completion(calls=[("read_file", '{"path": "evaluation_log.md"}')]),
        completion(calls=[("submit_candidate", '{"expression": "g1+0.5*g3", "parent": 0}'),
                          ("submit_candidate", '{"expression": "g1+0.25*g3", "parent": 0}'),
                          ("submit_candidate", '{"expression": "2*g1+0.5*g3", "parent": 0}')]),
        completion("thinking"), (400, b"bad request"), (400, b"bad request"),
    ]
    with Replay(script) as server:
        cfg = {**ARITH, "arbo": {"agent": {"url": server.url, "model": "replay"}}}
        strategy = make_strategy("arbo", cfg, None, NAMES, workdir=tmp_path)
        result = fake_search(strategy, str(tmp_path), iterations=3, n=2, names=NAMES)
    records = read_jsonl(tmp_path / "history.jsonl")
    # round 1 repeats candidate 0 first: charged like any method's repeat (trained again), the round ends sooner
    assert [r["text"] for r in records] == ["g1+0.5*g3", "g1*(1+g2)", "g1+0.5*g3", "g1+0.25*g3", "", ""]
    assert [r["valid"] for r in records] == [True, True, True, True, False, False]
    assert {r["method"] for r in records} == {"arbo"} and result.best_text in {r["text"] for r in records}
    saved = json.loads((tmp_path / "arbo" / "history.json").read_text())
    assert saved["method"] == "arbo" and saved["proposer"] == "agent" and server.url in saved["backend"]
    history = hist.load(tmp_path)
    assert [e.parent for e in history.lineage] == [None, None, 0, 0, None, None]
    assert history.belief.next_steps == ("g1 with g3",) and history.belief.round == 0
    bodies = [r["body"] for r in server.requests]
    assert len(bodies) == 6
    assert "Mode: explore" in bodies[0]["messages"][1]["content"]
    assert "Mode: exploit. Refine the current best candidate" in bodies[1]["messages"][1]["content"]
    log = [m for m in bodies[2]["messages"] if m["role"] == "tool"][0]["content"]
    assert "g1+0.5*g3" in log and "g1*(1+g2)" in log and "2 candidates (2 shown)" in log
    assert [m for m in bodies[3]["messages"] if m["role"] == "tool"] == []  # round 2 starts a fresh conversation
    transcript = json.loads(open(transcript_path(tmp_path, 1)).read())
    assert transcript["stopped"] == "submitted" and "repeats candidate 0" in transcript["messages"][-3]["content"]
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m["strategy/agent_submitted"] for m in metrics] == [2, 2, 0]
    assert [m["strategy/agent_tool_errors"] for m in metrics] == [1, 2, 0]
    assert [m["candidates_charged"] for m in metrics] == [2, 4, 6]


def test_no_framework_agent_gets_no_schedule_and_keeps_no_belief():
    script = [completion(calls=[("write_file", '{"path": "belief.md", "content": "x"}'),
                                ("submit_candidate", '{"expression": "g1+g3"}')])]
    with Replay(script) as server:
        strategy = make_strategy("arbo_ablation:no_framework", {"arbo": {"agent": {"url": server.url}}}, None, NAMES)
        state = strategy.init(jax.random.key(0))
        texts, plan = strategy.propose(state, jax.random.key(1), 1)
    first = server.requests[0]["body"]
    assert "Mode" not in first["messages"][1]["content"] and "belief" not in first["messages"][0]["content"]
    assert {t["function"]["name"] for t in first["tools"]} == {"list_files", "read_file", "submit_candidate"}
    assert texts == ["g1+g3"] and plan.mode == "unscheduled" and plan.belief is None
    state = strategy.update(state, fake_records(0, texts, NAMES), np.array([0.5], np.float32), plan)
    assert state.history.lineage[0].mode == "unscheduled" and strategy.metrics(state)["explore"] == 0.0


# --------------------------------------------------------------------------- in process


def tiny_checkpoint(path, max_position=2048):
    """A random 1-layer Qwen2 chat checkpoint with the bundled Qwen tokenizer beside it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import shutil

    from derl_jax.models.hf_tokenizer import bundled_qwen_tokenizer_dir

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=False, max_position_embeddings=max_position, rope_theta=10000.0)
    transformers.Qwen2ForCausalLM(config).save_pretrained(path)
    for name in os.listdir(bundled_qwen_tokenizer_dir()):
        shutil.copy(os.path.join(bundled_qwen_tokenizer_dir(), name), path)
    return str(path)


@pytest.mark.slow
def test_local_backend_runs_the_tool_loop_in_process(tmp_path):
    """The prompt carries the tools, sampling is deterministic per seed, replies that call no tool
    end the round cleanly; `complete` samples n replies in one batch."""
    from derl_jax.methods.arbo.agent import LocalBackend

    backend = LocalBackend(tiny_checkpoint(tmp_path), temperature=1.0, max_new_tokens=6)
    ws = workspace(wanted=1)
    messages = [{"role": "system", "content": system_prompt(ws)},
                {"role": "user", "content": round_prompt(ws, "explore")}]   # what run_agent sends first
    prompt = backend.prompt_text(messages, ws.tool_specs())
    assert prompt.startswith("<|im_start|>system\nYou search for a reward") and prompt.endswith("<|im_start|>assistant\n")
    assert "# Tools" in prompt and "Mode: explore" in prompt and '"name": "submit_candidate"' in prompt
    first = backend.chat(messages, ws.tool_specs(), seed=1)
    assert first == backend.chat(messages, ws.tool_specs(), seed=1) and isinstance(first.content, str)
    outcome = run_agent(backend, ws, "explore", seed=2, max_turns=2)
    assert outcome.turns == 2 and outcome.backend_errors == 0
    assert all(check_text(p.text, NAMES)[1].ok for p in outcome.proposals)
    replies = backend.complete(messages[:2], 3, seed=4)
    assert len(replies) == 3 and replies == backend.complete(messages[:2], 3, seed=4)
    greedy = LocalBackend(str(tmp_path), temperature=0.0, max_new_tokens=4)
    assert len(set(greedy.complete(messages[:2], 2, seed=0))) == 1   # temperature 0: the same greedy reply


def launch(workdir, method, checkpoint, *extra):
    """launch/run.py on the arith smoke preset with `method` on the in-process backend."""
    command = [sys.executable, os.path.join(REPO_ROOT, "launch", "run.py"), "--config=configs/arith.py:smoke",
               "--mode=search", f"--workdir={workdir}", "--noprogress", f"--config.outer.strategy={method}",
               "--config.arbo.agent.backend=local", f"--config.arbo.agent.checkpoint={checkpoint}",
               "--config.arbo.agent.max_tokens=12", "--config.arbo.agent.max_turns=2", *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO_ROOT, os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["arbo", "eureka"])
def test_arith_smoke_search_with_the_in_process_backend(tmp_path, method):
    """The search on the arith smoke preset with the model sampled in process (ARBO through the
    command line, Eureka through the launcher's `run`): the random model writes nothing usable, so
    every candidate is charged and invalid, and the run records what ran."""
    checkpoint = tiny_checkpoint(tmp_path / "model")
    if method == "arbo":   # the command line itself, once
        done = launch(tmp_path / "run", method, checkpoint)
        assert done.returncode == 0, done.stderr[-3000:]
    else:                  # the same run in this process: what the launcher calls after parsing the flags
        from configs.arith import get_config
        from derl_jax.experiment.run import run

        cfg = get_config("smoke")
        cfg.outer.strategy = method
        cfg.arbo.agent.update(backend="local", checkpoint=checkpoint, max_tokens=12, max_turns=2)
        run(cfg, str(tmp_path / "run"), "search", progress=False)
    records = read_jsonl(tmp_path / "run" / "history.jsonl")
    assert len(records) == 4 and {r["method"] for r in records} == {method}
    saved = json.loads((tmp_path / "run" / "arbo" / "history.json").read_text())
    assert saved["proposer"] == {"arbo": "agent", "eureka": "eureka"}[method] and checkpoint in saved["backend"]
    transcript = json.loads(open(transcript_path(tmp_path / "run", 1)).read())
    assert transcript["messages"][0]["role"] == "system" and transcript["method"] == method
