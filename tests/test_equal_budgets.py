"""The protocol spends the budgets the config states: a fixed baseline's final policy trains
`final.baseline_steps`, a search method's `final.steps`, and DERL-pop runs its own iterations
(`outer.population_iterations`) of `final.steps // iterations` inner steps per candidate."""

from __future__ import annotations

import json

import pytest

from derl_jax.domains.arith import make_arith_domain
from derl_jax.experiment.protocol import run_method
from test_search import BASE_PARAMS, FakeEvaluator, FakeMetaOptimizer, fake_config, get_config


class StepsEvaluator(FakeEvaluator):
    """FakeEvaluator that also takes and records `train_final(..., steps=)` (None: final.steps)."""

    def train_final(self, program, init_params, key, train_set, *, steps=None):
        params, curves = super().train_final(program, init_params, key, train_set)
        self.final_calls[-1]["steps"] = steps
        return params, curves


@pytest.fixture(scope="module")
def domain():
    return make_arith_domain(get_config("smoke").domain)


def test_baselines_train_their_own_final_steps(tmp_path, domain):
    cfg = fake_config(iterations=1, num_candidates=2)
    cfg.final.update(steps=4, baseline_steps=6)
    evaluator = StepsEvaluator()
    run_method("outcome", cfg, domain, evaluator, tmp_path / "outcome", 0, base_params=BASE_PARAMS, progress=False)
    run_method("derl", cfg, domain, evaluator, tmp_path / "derl", 0, base_params=BASE_PARAMS,
               optimizer_factory=FakeMetaOptimizer, progress=False, echo=lambda line: None)
    assert [call["steps"] for call in evaluator.final_calls] == [6, None]   # None: the evaluator's final.steps (4)
    cfg.final.baseline_steps = 0
    evaluator = StepsEvaluator()
    run_method("average", cfg, domain, evaluator, tmp_path / "average", 0, base_params=BASE_PARAMS, progress=False)
    assert [call["steps"] for call in evaluator.final_calls] == [None]


def test_derl_pop_runs_its_own_schedule(tmp_path, domain):
    cfg = fake_config(iterations=4, num_candidates=2)
    cfg.final.steps = 10
    cfg.outer.population_iterations = 3
    evaluator = StepsEvaluator()
    result = run_method("derl_pop", cfg, domain, evaluator, tmp_path, 0, base_params=BASE_PARAMS,
                        optimizer_factory=FakeMetaOptimizer, progress=False, echo=lambda line: None)
    iterations = {json.loads(line)["iteration"] for line in open(tmp_path / "history.jsonl")}
    assert iterations == {0, 1, 2}                                   # 3, not outer.iterations = 4
    assert [call["steps"] for call in evaluator.calls] == [3, 3, 3]  # 10 // 3 inner steps per candidate
    assert result.budget["inner_steps_per_candidate"] == 3 and result.budget["retrained_policy_inner_steps"] == 10
    assert result.budget["reported_policy_inner_steps"] <= 9


def test_the_agent_pays_for_what_it_submits_as_eureka_does(tmp_path):
    """The same three proposals (one unparseable, one repeating the other) cost ARBO's agent what
    they cost Eureka: three charged candidates, two trainings, the invalid one scored 0; the agent
    is told what is wrong, but the slot is spent."""
    from arbo_fakes import ARITH, ARITH_NAMES, Replay, completion, fake_search
    from derl_jax.logging import read_jsonl
    from derl_jax.outer import make_strategy

    texts = ["g1+(g2", "g1+0.5*g3", "0.5*g3+g1"]
    agent = [completion(calls=[("submit_candidate", json.dumps({"expression": t})) for t in texts])]
    eureka = [completion([f"```reward\n{t}\n```" for t in texts], n=3)]
    runs = {}
    for method, script in (("arbo", agent), ("eureka", eureka)):
        with Replay(script) as server:
            cfg = {**ARITH, "arbo": {"agent": {"url": server.url}}}
            strategy = make_strategy(method, cfg, None, ARITH_NAMES, workdir=tmp_path / method)
            result = fake_search(strategy, str(tmp_path / method), iterations=1, n=3, names=ARITH_NAMES)
        records = read_jsonl(tmp_path / method / "history.jsonl")
        runs[method] = ([(r["text"], r["valid"], r["score"], r["duplicate_of"]) for r in records], dict(result.budget))
    assert runs["arbo"] == runs["eureka"]
    rows, budget = runs["arbo"]
    assert [row[:2] for row in rows] == [(texts[0], False), (texts[1], True), (texts[2], True)]
    assert rows[0][2] == 0.0 and rows[2][3] == 1          # the repeat shares candidate 1's training
    assert budget["candidates_charged"] == 3 and budget["candidates_trained"] == 1 and budget["candidates_shared"] == 1
    transcript = json.loads((tmp_path / "arbo" / "arbo" / "transcripts" / "round_0.json").read_text())
    answers = [m["content"] for m in transcript["messages"] if m["role"] == "tool"]
    assert answers[0].startswith("error: expression 'g1+(g2' is not a valid reward") and "charged" in answers[0]
    assert "repeats a candidate submitted this round; it is charged" in answers[2]
