"""Eureka's loop: one call per round from the fixed prompt, n sampled replies, the reward reflection.

The endpoint is `arbo_fakes.Replay` on 127.0.0.1; the search loop runs with the fake evaluator.
(The greedy refinement `eureka` used to name is `history_search_ablation:greedy`, checked
against its old histories in test_history_search.py.)
"""

import dataclasses
import json

import jax
import numpy as np
import pytest

from arbo_fakes import ARITH, ARITH_NAMES, Replay, completion, fake_records, fake_search
from derl_jax.logging import read_jsonl
from derl_jax.methods.arbo import history as hist
from derl_jax.methods.arbo.eureka import EurekaStrategy, extract_expression, messages_for, reflected
from derl_jax.outer import make_strategy

NAMES = ARITH_NAMES


@pytest.mark.parametrize("reply, expected", [
    ("```reward\ng1+0.5*g2\n```", "g1+0.5*g2"),
    ("Here:\n```python\n# shaping\nreward = g1 + 0.1*g3;\n```\nthat is all", "g1 + 0.1*g3"),
    ("```\ng1\ng1*(1+g2)\n```", "g1*(1+g2)"),
    ("I would use reward: g1*g3 here.\nreward = min(g1, g2)", "min(g1, g2)"),
    ("```reward\ng1+(g2\n", "g1+(g2"),     # an unclosed block is still read; the checker rejects it
    ("no idea, sorry", ""),
])
def test_extract_expression(reply, expected):
    assert extract_expression(reply)[0] == expected
    assert extract_expression("no idea")[1] == "no expression in the reply"


def test_reflection_is_on_the_best_of_the_latest_round_that_scored():
    curves = {"reward_mean": np.linspace(0, 1, 5, dtype=np.float32), "primitive/correct": np.linspace(0.1, 0.6, 5)}
    h = hist.History()
    rounds = [[("g1+g2", 0.3, None), ("g1*g3", 0.2, None)], [("g1+g3", 0.25, None), ("g1/g2", 0.0, "non-finite")],
              [("g2+", 0.0, "parse error")]]
    for r, group in enumerate(rounds):
        records = fake_records(r, [t for t, _, _ in group], NAMES)
        records = [dataclasses.replace(rec, score=s, reason=why, valid=why != "parse error", curves=curves)
                   for rec, (_, s, why) in zip(records, group)]
        h = hist.append_round(h, records, [hist.Proposal(t, None, "eureka") for t, _, _ in group], "explore", None)
        if r == 0:
            assert reflected(h).text == "g1+g2"
    assert reflected(h).text == "g1+g3"   # not the overall best (g1+g2): Eureka goes on from the latest round
    messages, best = messages_for(h, "TASK")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"] and best.id == 2
    assert messages[2]["content"] == "```reward\ng1+g3\n```"
    assert "validation accuracy is 0.2500" in messages[3]["content"]
    assert "primitive/correct: 0.1 -> 0.6" in messages[3]["content"] and "reward_mean: 0 -> 1" in messages[3]["content"]
    assert messages_for(hist.History(), "TASK")[0][1:] == [{"role": "user", "content": "TASK"}]


def test_eureka_searches_end_to_end_against_the_replay_server(tmp_path):
    """Three rounds: n replies from one call (one without an expression); a server that returns
    fewer choices than asked (asked again) with an unparseable reply; then an endpoint answering
    with something that is not a chat completion (asked twice), which is charged."""
    script = [
        completion(["```reward\ng1+0.5*g3\n```", "I would use reward = g1*(1+g2)", "no idea"], n=3),
        completion(["```reward\ng1+(g2\n```", "```\nreward = 2*g1+0.5*g3\n```"], n=2),
        completion("```reward\ng1+0.25*g3\n```"),
        (200, {"error": "no choices"}), (200, {"error": "no choices"}),
    ]
    with Replay(script) as server:
        cfg = {**ARITH, "arbo": {"task": "arithmetic", "agent": {"url": server.url}}}
        strategy = make_strategy("eureka", cfg, None, NAMES, workdir=tmp_path)
        assert isinstance(strategy, EurekaStrategy)
        fake_search(strategy, str(tmp_path), iterations=3, n=3, names=NAMES)
    records = read_jsonl(tmp_path / "history.jsonl")
    assert [r["text"] for r in records] == ["g1+0.5*g3", "g1*(1+g2)", "", "g1+(g2", "2*g1+0.5*g3", "g1+0.25*g3",
                                            "", "", ""]
    assert [r["valid"] for r in records] == [True, True, False, False, True, True, False, False, False]
    assert records[2]["reason"].startswith("parse error") and records[3]["reason"].startswith("parse error")
    history = hist.load(tmp_path)
    assert [e.note for e in history.lineage][:3] == ["read from the code block", "read from the reward line",
                                                     "no expression in the reply"]
    assert history.lineage[8].note.startswith("no reply: ") and "not a chat completion" in history.lineage[8].note
    assert [e.parent for e in history.lineage] == [None] * 3 + [1] * 3 + [4] * 3
    bodies = [r["body"] for r in server.requests]
    assert len(bodies) == 5 and all("tools" not in b for b in bodies)
    assert [b["n"] for b in bodies] == [3, 3, 1, 3, 3] and bodies[2]["seed"] == bodies[1]["seed"] + 1
    task = bodies[0]["messages"][1]["content"]
    assert "on arithmetic" in task and "def correct(rollout, context)" in task and len(bodies[0]["messages"]) == 2
    assert bodies[1]["messages"][2]["content"] == "```reward\ng1*(1+g2)\n```"
    assert "validation accuracy is 0.8" in bodies[1]["messages"][3]["content"]
    assert bodies[3]["messages"][2]["content"] == "```reward\n2*g1+0.5*g3\n```"
    assert bodies[1]["messages"][:2] == bodies[0]["messages"]   # the prompt is fixed
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m["strategy/eureka_extracted"] for m in metrics] == [2, 3, 0]
    assert [m["strategy/eureka_backend_errors"] for m in metrics] == [0, 0, 2]
    saved = json.loads((tmp_path / "arbo" / "history.json").read_text())
    assert saved["method"] == "eureka" and saved["proposer"] == "eureka"
    transcript = json.loads((tmp_path / "arbo" / "transcripts" / "round_0.json").read_text())
    assert transcript["replies"][2] == "no idea"


def test_eureka_keeps_no_belief_and_checks_its_records():
    with Replay([completion(["```reward\ng1+g3\n```", "```reward\ng1*g2\n```"], n=2)]) as server:
        strategy = make_strategy("eureka", {"arbo": {"agent": {"url": server.url}}}, None, NAMES)
        state = strategy.init(jax.random.key(0))
        texts, plan = strategy.propose(state, jax.random.key(1), 2)
    assert texts == ["g1+g3", "g1*g2"] and plan.belief is None and plan.mode == "explore"
    records = fake_records(0, texts[::-1], NAMES)
    with pytest.raises(ValueError, match="not the texts this round proposed"):
        strategy.update(state, [dataclasses.replace(r, index=j) for j, r in enumerate(records)],
                        np.array([r.score for r in records], np.float32), plan)
