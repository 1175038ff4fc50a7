"""The outer loop as the paper runs it: DERL-pop's inner steps and headline, refused configs,
the start policy after an iteration without a valid candidate, duplicates trained once, and the
candidate test curve of Fig. 3 (policies kept on disk, tested only after the search)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from derl_jax.config import ConfigError
from derl_jax.domains.arith import make_arith_domain
from derl_jax.outer import candidate_policies
from derl_jax.outer.budget import population_inner_steps
from derl_jax.experiment.protocol import run_method
from derl_jax.outer.search import search
from derl_jax.experiment.checks import validate_config
from derl_jax.outer import Strategy, check_update
from test_search import BASE_PARAMS, FakeEvaluator, FakeMetaOptimizer, fake_config, get_config, reference_quality, tiny_dataset

PRIMITIVES = ("correct", "boxed", "steps", "gold_anywhere")


@pytest.fixture(scope="module")
def domain():
    return make_arith_domain(get_config("smoke").domain)


def accuracy_of(skill: float) -> float:
    """FakeEvaluator.accuracy on a split whose prompts are all present."""
    return float(jax.nn.sigmoid(2.0 * skill - 1.0))


class Scripted(Strategy):
    """Proposes `script[i]` in iteration i and remembers what `update` received."""

    def __init__(self, script, population=False):
        self.script, self.population, self.seen = script, population, []

    def init(self, key):
        return 0

    def propose(self, state, key, n):
        return list(self.script[state]), None

    def update(self, state, records, scores, aux):
        check_update(records, scores, "scripted.update")
        self.seen.append(list(records))
        return state + 1


def run_scripted(workdir, script, *, population=False, crn=True, keep=False, evaluator=None):
    cfg = fake_config(iterations=len(script), num_candidates=len(script[0]))
    cfg.inner.common_random_numbers = crn
    strategy = Scripted(script, population)
    strategy.name = "scripted"
    evaluator = evaluator or FakeEvaluator()
    result = search(strategy, evaluator, tiny_dataset(16, 0), tiny_dataset(8, 1), PRIMITIVES, cfg, workdir,
                    jax.random.key(0), init_params=BASE_PARAMS, progress=False, echo=lambda line: None,
                    keep_candidate_policies=keep)
    return result, evaluator, strategy


# --------------------------------------------------------------------------- DERL-pop


def test_population_inner_steps_default_equals_the_final_policy_total():
    cfg = fake_config(iterations=3)
    cfg.final.steps, cfg.outer.population_inner_steps = 100, 0
    assert population_inner_steps(cfg) == 33  # the paper's ScienceWorld setting: 3 rounds x 33
    cfg.outer.iterations = 10
    assert population_inner_steps(cfg) == 10  # ALFWorld: 10 x 10 = the final policy's 100 steps
    cfg.outer.population_inner_steps = 7
    assert population_inner_steps(cfg) == 7
    cfg.outer.population_inner_steps, cfg.final.steps = 0, 4
    assert population_inner_steps(cfg) == 1  # never 0


def test_derl_pop_trains_shorter_inner_runs_and_reports_its_evolved_policy(tmp_path, domain):
    cfg = fake_config(iterations=2, num_candidates=3)
    cfg.final.steps, cfg.outer.population_inner_steps = 10, 0
    cfg.compare.candidate_test = False
    pop_eval, derl_eval = FakeEvaluator(), FakeEvaluator()
    pop = run_method("derl_pop", cfg, domain, pop_eval, tmp_path / "pop", 0, base_params=BASE_PARAMS,
                     optimizer_factory=FakeMetaOptimizer, progress=False, echo=lambda line: None)
    derl = run_method("derl", cfg, domain, derl_eval, tmp_path / "derl", 0, base_params=BASE_PARAMS,
                      optimizer_factory=FakeMetaOptimizer, progress=False, echo=lambda line: None)
    assert {c["steps"] for c in pop_eval.calls} == {5} and {c["steps"] for c in derl_eval.calls} == {None}
    # both totals: the evolved policy's lineage equals the final policy's steps, as in the paper
    assert pop.budget["inner_steps_per_candidate"] == 5 and pop.budget["start_policy_updates"] == 2
    assert pop.budget["reported_policy_inner_steps"] == 10 == derl.budget["reported_policy_inner_steps"]
    assert pop.budget["search_inner_steps"] == 5 * pop.budget["candidates_trained"]
    assert derl.budget["search_inner_steps"] == cfg.inner.steps * derl.budget["candidates_trained"]
    # headline: the evolved policy (skill = the sum of each iteration's best quality); retrained beside it
    assert len(pop_eval.calls) == 2
    evolved_skill = float(np.asarray(pop_eval.calls[-1]["skill"])) + max(
        reference_quality(t, pop_eval.rows) for t in _texts_of(tmp_path / "pop", iteration=1)
    )
    coverage = float(np.asarray(domain.test.prompt_mask).mean())
    assert pop.headline == "evolved" and pop.test == pop.evolved_policy_test
    assert pop.test == pytest.approx(accuracy_of(evolved_skill) * coverage, abs=1e-4)
    assert pop.retrained_test == pytest.approx(accuracy_of(2.0 * reference_quality(pop.expression, pop_eval.rows)) * coverage, abs=1e-5)
    assert derl.headline == "retrained" and derl.test == derl.retrained_test and derl.evolved_policy_test is None


def _texts_of(workdir, iteration):
    return [r["text"] for r in result_history(workdir) if r["iteration"] == iteration and r["valid"]]


def test_population_strategy_refuses_a_loop_that_returns_no_policies():
    cfg = get_config("smoke")
    cfg.inner.return_params = False
    validate_config(cfg)  # derl and outcome do not need the policies
    cfg.compare.methods = ("derl", "derl_pop")
    with pytest.raises(ConfigError, match=r"config.inner.return_params=False cannot run 'derl_pop'"):
        validate_config(cfg)
    cfg.compare.methods, cfg.outer.strategy = ("derl",), "derl_pop"
    with pytest.raises(ConfigError, match="return_params"):
        validate_config(cfg)


def test_start_policy_is_kept_after_an_iteration_without_a_valid_candidate(tmp_path):
    script = [("g1", "g1+g2"), ("3", "g1/(g2-g2)"), ("g1", "g2")]
    result, evaluator, _ = run_scripted(tmp_path, script, population=True)
    assert len(evaluator.calls) == 2  # iteration 1 trained nothing
    after_first = max(reference_quality(t, evaluator.rows) for t in script[0])
    assert evaluator.calls[0]["skill"] == 0.0
    assert evaluator.calls[1]["skill"] == pytest.approx(after_first, abs=1e-5)  # not the base policy
    assert result.budget["start_policy_updates"] == 2


# --------------------------------------------------------------------------- duplicates


def test_duplicates_are_trained_once_and_share_score_curves_and_policy(tmp_path):
    script = [("g1+g2", "g2+g1", "g1", "3", "(g1+g2)*1")]
    result, evaluator, strategy = run_scripted(tmp_path / "crn", script, keep=True)
    assert [c["k"] for c in evaluator.calls] == [2]  # g1+g2 and g1
    records = strategy.seen[0]
    assert [r.duplicate_of for r in records] == [None, 0, None, None, 0]
    assert [h["trained"] for h in result.history] == [True, False, True, False, False]
    for j in (1, 4):
        assert records[j].score == records[0].score and records[j].reason is None
        assert all(np.array_equal(records[j].curves[k], records[0].curves[k]) for k in records[0].curves)
    assert records[3].curves == {} and not records[3].valid
    assert result.budget["candidates_trained"] == 2 and result.budget["candidates_shared"] == 2
    assert result.history[1]["duplicate_of"] == 0
    _, rows = candidate_policies.load_iteration(str(tmp_path / "crn"), 0, BASE_PARAMS)
    assert rows.tolist() == [0, 0, 1, -1, 0]  # duplicates point at their original's policy

    plain, evaluator, _ = run_scripted(tmp_path / "independent", script, crn=False)
    assert [c["k"] for c in evaluator.calls] == [4]  # without common random numbers every valid one trains
    assert all(r["duplicate_of"] is None for r in plain.history) and plain.budget["candidates_shared"] == 0


# --------------------------------------------------------------------------- Fig. 3 candidate test curve


def test_candidate_policies_round_trip_exactly(tmp_path):
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(3, 4, 2)), jnp.bfloat16), "b": {"x": jnp.asarray(rng.normal(size=(3,)), jnp.float32)}}
    template = jax.tree_util.tree_map(lambda leaf: leaf[0], params)
    candidate_policies.save_iteration(str(tmp_path), 4, params, [2, -1, 0, 1])
    loaded, rows = candidate_policies.load_iteration(str(tmp_path), 4, template)
    assert rows.tolist() == [2, -1, 0, 1] and candidate_policies.saved_iterations(str(tmp_path)) == [4]
    assert loaded["w"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(np.asarray(loaded["w"]).view(np.uint16), np.asarray(params["w"]).view(np.uint16))
    np.testing.assert_array_equal(loaded["b"]["x"], np.asarray(params["b"]["x"]))
    with pytest.raises(ValueError, match="dtype"):
        candidate_policies.load_iteration(str(tmp_path), 4, {"w": template["w"].astype(jnp.float32), "b": template["b"]})
    assert not [n for n in (tmp_path / candidate_policies.POLICY_DIR).iterdir() if n.name.endswith(".tmp")]


def test_candidate_test_curve_is_the_mean_test_accuracy_of_the_candidates(tmp_path, domain):
    cfg = fake_config(iterations=2, num_candidates=4)
    cfg.compare.candidate_test = True
    evaluator = FakeEvaluator()
    result = run_method("derl", cfg, domain, evaluator, tmp_path, 0, base_params=BASE_PARAMS,
                        optimizer_factory=FakeMetaOptimizer, progress=False, echo=lambda line: None)
    coverage = float(np.asarray(domain.test.prompt_mask).mean())
    expected = []
    for i in range(2):  # each candidate policy has skill = its reward's quality (DERL starts from the base)
        texts = [(r["text"], r["valid"]) for r in result_history(tmp_path) if r["iteration"] == i]
        expected.append(np.mean([accuracy_of(reference_quality(t, evaluator.rows)) * coverage if ok else 0.0 for t, ok in texts]))
    assert result.per_iteration["candidate_test_mean"] == pytest.approx(expected, abs=1e-4)
    assert candidate_policies.saved_iterations(str(tmp_path)) == [0, 1]

    cfg.compare.candidate_test = False
    off = run_method("derl", cfg, domain, FakeEvaluator(), tmp_path / "off", 0, base_params=BASE_PARAMS,
                     optimizer_factory=FakeMetaOptimizer, progress=False, echo=lambda line: None)
    assert off.per_iteration["candidate_test_mean"] is None and candidate_policies.saved_iterations(str(tmp_path / "off")) == []


def result_history(workdir):
    with open(workdir / "history.jsonl") as handle:
        return [json.loads(line) for line in handle]


def test_shorter_inner_runs_need_an_evaluator_that_takes_steps(tmp_path):
    class NoSteps(FakeEvaluator):
        def evaluate_candidates(self, programs, init_params, key, train_set, val_set):
            return super().evaluate_candidates(programs, init_params, key, train_set, val_set)

    cfg = fake_config(iterations=1, num_candidates=2)
    with pytest.raises(TypeError, match=r"NoSteps.evaluate_candidates takes no `steps` keyword.*'scripted'"):
        strategy = Scripted([("g1", "g2")], population=True)
        strategy.name = "scripted"
        search(strategy, NoSteps(), tiny_dataset(16, 0), tiny_dataset(8, 1), PRIMITIVES, cfg, tmp_path,
               jax.random.key(0), init_params=BASE_PARAMS, inner_steps=3, progress=False)
