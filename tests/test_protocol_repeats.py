"""A protocol that does not select on luck: `final.repeats` (the final test averaged over
independent keys) and `final.reevaluate_top_k` (the top candidates re-trained before the
choice, charged like candidates), on the fake inner loop of test_search."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from derl_jax.config import ConfigError
from derl_jax.domains.arith import make_arith_domain
from derl_jax.experiment import reevaluate
from derl_jax.experiment.checks import validate_config
from derl_jax.experiment.protocol import run_keys, run_method
from test_search import BASE_PARAMS, FakeEvaluator, FakeMetaOptimizer, fake_config, get_config


@pytest.fixture(scope="module")
def domain():
    return make_arith_domain(get_config("smoke").domain)


class KeyedEvaluator(FakeEvaluator):
    """FakeEvaluator whose final training depends on its key (so repeats differ) and records keys."""

    def __init__(self):
        super().__init__()
        self.final_keys, self.candidate_keys = [], []

    def train_final(self, program, init_params, key, train_set):
        self.final_keys.append(np.asarray(jax.random.key_data(key)).tolist())
        params, curves = super().train_final(program, init_params, key, train_set)
        return {"skill": params["skill"] + self.noise(key)}, curves

    def evaluate_candidates(self, programs, init_params, key, train_set, val_set, *, steps=None):
        self.candidate_keys.append(np.asarray(jax.random.key_data(key)).tolist())
        return super().evaluate_candidates(programs, init_params, key, train_set, val_set, steps=steps)


def _run(method, cfg, domain, path, evaluator, seed=0):
    return run_method(method, cfg, domain, evaluator, path, seed, base_params=BASE_PARAMS,
                      optimizer_factory=FakeMetaOptimizer, progress=False, echo=lambda line: None)


def test_repeats_default_by_domain_and_are_checked():
    cfg = fake_config()
    assert reevaluate.final_repeats(cfg) == 1            # the smoke preset: one key
    cfg.final.repeats = 0
    assert reevaluate.final_repeats(cfg) == 3            # arith is a testbed
    cfg.final.repeats = 5
    assert reevaluate.final_repeats(cfg) == 5
    cfg.final.reevaluate_top_k = -2
    with pytest.raises(ConfigError, match="final.reevaluate_top_k must be >= 0"):
        validate_config(cfg)
    other = fake_config()
    other.final.repeats = 0
    other.domain.kind = "household"
    assert reevaluate.final_repeats(other) == 1
    from configs import symbols_compose
    for level in ("easy", "medium", "hard"):   # the composed testbeds average three keys too
        assert reevaluate.final_repeats(symbols_compose.get_config(level)) == 3


def test_the_final_test_is_averaged_over_independent_keys(tmp_path, domain):
    cfg = fake_config(iterations=2, num_candidates=3)
    cfg.final.repeats = 3
    evaluator = KeyedEvaluator()
    result = _run("derl", cfg, domain, tmp_path, evaluator)
    keys = reevaluate.repeat_keys(run_keys(0)["final"], 3)
    assert evaluator.final_keys == [np.asarray(jax.random.key_data(k)).tolist() for k in keys]
    assert len({json.dumps(k) for k in evaluator.final_keys}) == 3        # independent keys
    assert len(result.final_repeat_tests) == 3 and result.final_repeat_tests[0] == result.retrained_test
    assert len(set(result.final_repeat_tests)) == 3                      # the key changes the outcome here
    skill = 2.0 * evaluator.quality(_program(result.expression, domain))
    expected = [float(jax.nn.sigmoid(2.0 * (skill + evaluator.noise(k)) - 1.0)) for k in keys]
    assert result.final_repeat_tests == pytest.approx(expected, abs=1e-5)
    assert result.test == result.retrained_test                          # the paper's protocol stays the headline
    assert result.reevaluated is None and "candidates_reevaluated" not in result.budget


def _program(text, domain):
    from derl_jax.experiment.protocol import compile_checked

    return compile_checked(text, domain.primitive_names, domain.outcome_index)[1]


def test_reevaluation_chooses_the_argmax_of_the_averaged_validation_and_charges_every_method_alike(tmp_path, domain):
    cfg = fake_config(iterations=2, num_candidates=4)
    cfg.final.repeats = 2
    cfg.final.reevaluate_top_k = 3
    budgets = {}
    for method in ("derl", "random", "evolution"):
        evaluator = KeyedEvaluator()
        result = _run(method, cfg, domain, tmp_path / method, evaluator)
        history = [json.loads(line) for line in open(tmp_path / method / "history.jsonl")]
        top = reevaluate.top_candidates(history, 3)
        found = result.reevaluated
        assert found["candidates"] == [t for t, _ in top] and found["validation"] == pytest.approx([s for _, s in top])
        assert len({r["canonical"] for r in history if r["text"] in found["candidates"]}) == len(top)
        # the re-training: one more candidate call, with the fresh key, over the top candidates
        assert evaluator.candidate_keys[-1] == np.asarray(
            jax.random.key_data(reevaluate.reevaluation_key(run_keys(0)["search"]))).tolist()
        averaged = (np.array(found["validation"]) + np.array(found["revalidation"])) / 2
        assert found["averaged"] == pytest.approx(averaged.tolist())
        assert found["expression"] == found["candidates"][int(np.argmax(averaged))]
        assert len(found["tests"]) == 2 and found["test"] == pytest.approx(np.mean(found["tests"]))
        if found["expression"] == result.expression:
            assert found["tests"] == result.final_repeat_tests
        budgets[method] = result.budget
    charged = {m: (b["candidates_charged"], b["candidates_reevaluated"], b["candidates_charged_with_reevaluation"])
               for m, b in budgets.items()}
    assert set(charged.values()) == {(8, 3, 11)}, charged


def test_choose_by_hand():
    text, averaged = reevaluate.choose([("a", 0.9), ("b", 0.7), ("c", 0.6)], [0.3, 0.8, 0.95])
    assert text == "c" and averaged.tolist() == pytest.approx([0.6, 0.75, 0.775])   # not the search's best "a"
    text, _ = reevaluate.choose([("a", 0.9), ("b", 0.7)], [0.5, 0.7])   # a tie goes to the earlier
    assert text == "a"
    with pytest.raises(ValueError, match="2 candidates and 1 re-scores"):
        reevaluate.choose([("a", 0.9), ("b", 0.7)], [0.5])


def test_a_compare_reports_both_protocols_and_the_endpoints_and_a_kept_run_keeps_the_histories(tmp_path, domain):
    from derl_jax.experiment import pages
    from derl_jax.experiment.protocol import compare

    cfg = fake_config(iterations=2, num_candidates=3)
    cfg.compare.methods = ("derl", "random")
    cfg.compare.seeds = (0, 1)
    cfg.final.repeats = 2
    cfg.final.reevaluate_top_k = 2
    classified = dataclasses.replace(domain, classifier=lambda text: "top" if "g1" in text else "other")
    payload = compare(cfg, classified, KeyedEvaluator(), tmp_path / "run", base_params=BASE_PARAMS,
                      optimizer_factory=FakeMetaOptimizer, progress=False, echo=lambda line: None)
    saved = json.load(open(tmp_path / "run" / "results.json"))
    for method in ("derl", "random"):
        rows = saved["per_seed"][method]
        protocols = saved["protocols"][method]
        assert protocols["keys"] == [2]
        assert protocols["paper"]["mean"] == pytest.approx(np.mean([r["retrained_test"] for r in rows]))
        assert protocols["repeated"]["mean"] == pytest.approx(np.mean([np.mean(r["final_repeat_tests"]) for r in rows]))
        assert protocols["reevaluated"]["mean"] == pytest.approx(np.mean([r["reevaluated"]["test"] for r in rows]))
    assert [row["endpoint"][:2] for row in payload["endpoints"]] == ["E1", "E2", "E3"]
    assert payload["endpoints"][0]["verdict"] != "not measurable" and payload["endpoints"][2]["seeds"] == 2
    markdown = open(tmp_path / "run" / "results.md").read()
    assert "## Endpoints fixed before the runs" in markdown and "| derl | " in markdown.split("re-evaluated |")[1]

    kept = pages.collect(str(tmp_path / "run"), str(tmp_path / "kept"), "fake")
    histories = pages.kept_histories(kept)
    assert sorted(histories) == ["derl", "random"] and sorted(histories["derl"]) == [0, 1]
    original = [json.loads(line) for line in open(tmp_path / "run" / "derl" / "seed_1" / "history.jsonl")]
    assert [{k: v for k, v in r.items() if k != "curves"} for r in original] == histories["derl"][1]
    assert all("curves" not in r for r in histories["random"][0])
    page = "\n".join(pages.render_compare(kept, "runs/fake"))
    assert "Endpoints fixed before the runs" in page and "The paper's protocol and the re-evaluated one" in page
