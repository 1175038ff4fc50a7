"""The endpoints fixed before the runs (E1 top-class share with McNemar, E2 repeated final test,
E3 slope of the aligned share), the Domain's reward_class hook, and the shuffled-feedback control."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

from derl_jax.domains.base import Domain, TokenDataset
from derl_jax.experiment import endpoints, stats
from derl_jax.experiment.results import MethodResult
from derl_jax.methods.derl.shuffled import ShuffledDerlStrategy, shuffle_order
from derl_jax.expr.grammar import make_grammar
from derl_jax.outer import make_strategy
from primitives import registry
from primitives.symbols import SYMBOLS_PRIMITIVES
from test_search import PRIMITIVES, FakeMetaOptimizer, fake_config, records_of


def _split(rows: int) -> TokenDataset:
    return TokenDataset(prompts=jnp.zeros((rows, 3), jnp.int32), prompt_mask=jnp.ones((rows, 3), bool), context={})


def classify_by_terms(text: str) -> str:
    """The fake domain's construction: g2 is aligned, g5 a decoy."""
    if "g5" in text:
        return "decoy"
    if "g2" in text:
        return "top" if "g1" not in text else "partial"
    return "other"


def fake_domain(classifier=None) -> Domain:
    return Domain(name="fake", primitives=registry.resolve("symbols", SYMBOLS_PRIMITIVES), outcome_index=0,
                  train=_split(4), test=_split(2), tokenizer=None, max_new_tokens=2, eos_id=1, pad_id=0,
                  aligned_indices=(1,), classifier=classifier)


def test_the_reward_class_hook():
    assert fake_domain().reward_class("g2") is None   # no classifier: not measurable
    domain = fake_domain(classify_by_terms)
    assert [domain.reward_class(t) for t in ("g2", "g1+g2", "g5+g2", "g3")] == ["top", "partial", "decoy", "other"]
    with pytest.raises(ValueError, match="expected one of"):
        fake_domain(lambda text: "best").reward_class("g2")
    with pytest.raises(ValueError, match="aligned_indices \\[0\\]"):
        Domain(name="fake", primitives=registry.resolve("symbols", SYMBOLS_PRIMITIVES), outcome_index=0,
               train=_split(4), test=_split(2), tokenizer=None, max_new_tokens=2, eos_id=1, pad_id=0,
               aligned_indices=(0,))


def _run(method, seed, expression, test, repeats=None):
    return MethodResult(method=method, seed=seed, expression=expression, canonical=expression, latex=None,
                        validation=0.0, test=test, budget={}, per_iteration=None, final_curves={},
                        retrained_test=test, **({} if repeats is None else {"final_repeat_tests": repeats}))


def test_e1_mcnemar_against_binomtest():
    # 8 seeds: DERL top on 0-6, random top on 0-1 and 7 -> discordant 5 (DERL only) vs 1 (random only)
    derl = [_run("derl", s, "g2" if s < 7 else "g3", 0.1) for s in range(8)]
    rand = [_run("random", s, "2*g2" if s in (0, 1, 7) else "g1+g3", 0.1) for s in range(8)]
    row = endpoints.e1_top_share({"derl": derl, "random": rand}, fake_domain(classify_by_terms).reward_class)
    assert (row["first_only"], row["second_only"]) == (5, 1)
    assert row["p_value"] == pytest.approx(scipy_stats.binomtest(5, 6, 0.5).pvalue) == pytest.approx(0.21875)
    assert (row["share"], row["baseline_share"], row["difference"]) == pytest.approx((7 / 8, 3 / 8, 0.5))
    assert row["verdict"] == "not separated"
    assert endpoints.e1_top_share({"derl": derl, "random": rand}, fake_domain().reward_class)["verdict"] == \
        "not measurable" or fake_domain().classifier is None
    assert endpoints.e1_top_share({"derl": derl, "random": rand}, None)["verdict"] == "not measurable"
    assert endpoints.mcnemar_exact([True] * 3, [True] * 3)["p_value"] == 1.0
    # 9 discordant seeds all one way: p = 2 / 2**9 < 0.05
    assert endpoints.mcnemar_exact([True] * 9, [False] * 9)["p_value"] == pytest.approx(2 / 512)


def test_e2_uses_the_repeated_keys_paired_by_seed():
    derl = [_run("derl", s, "g2", 0.9, repeats=[0.30 + 0.01 * s, 0.34 + 0.01 * s, 0.32 + 0.01 * s]) for s in range(4)]
    rand = [_run("random", s, "g3", 0.0, repeats=[0.30, 0.28 + 0.02 * (s % 2), 0.26]) for s in range(4)]
    row = endpoints.e2_repeated_final({"derl": derl, "random": rand})
    diffs = [np.mean(d.final_repeat_tests) - np.mean(r.final_repeat_tests) for d, r in zip(derl, rand)]
    expected = stats.t_test(diffs)
    assert (row["difference"], row["ci95_low"], row["p_value"]) == pytest.approx(
        (expected["difference"], expected["ci95_low"], expected["p_value"]))
    assert row["p_value"] == pytest.approx(scipy_stats.ttest_1samp(diffs, 0.0).pvalue)
    assert "3 keys per seed" in row["measured_as"]
    single = endpoints.e2_repeated_final({"derl": [_run("derl", s, "g2", 0.3 + s / 10) for s in range(3)],
                                          "random": [_run("random", s, "g3", 0.2) for s in range(3)]})
    assert single["difference"] == pytest.approx(0.2)   # one key: the retrained test


def _history(shares_top):
    """Records of 4 proposals per iteration, the first round(4 * share) of them top-class."""
    records = []
    for i, share in enumerate(shares_top):
        top = int(round(4 * share))
        records += [{"iteration": i, "text": "g2" if j < top else "g3"} for j in range(4)]
    return records


def test_e3_slope_difference_paired_over_seeds():
    histories = {"derl": {0: _history([0.0, 0.25, 0.5, 0.75]), 1: _history([0.0, 0.5, 0.5, 1.0]),
                          2: _history([0.25, 0.25, 0.5, 0.5])},
                 "random": {0: _history([0.25, 0.25, 0.25, 0.25]), 1: _history([0.0, 0.25, 0.0, 0.25]),
                            2: _history([0.5, 0.25, 0.5, 0.25])}}
    classify = fake_domain(classify_by_terms).reward_class
    np.testing.assert_allclose(endpoints.aligned_share_per_iteration(histories["derl"][1], classify), [0, 0.5, 0.5, 1])
    row = endpoints.e3_share_slope(histories, classify)
    slope = lambda y: np.polyfit(np.arange(4.0), y, 1)[0]  # noqa: E731
    diffs = [slope([0, .25, .5, .75]) - slope([.25] * 4), slope([0, .5, .5, 1]) - slope([0, .25, 0, .25]),
             slope([.25, .25, .5, .5]) - slope([.5, .25, .5, .25])]
    assert row["difference"] == pytest.approx(np.mean(diffs))
    assert row["p_value"] == pytest.approx(scipy_stats.ttest_1samp(diffs, 0.0).pvalue)
    assert endpoints.e3_share_slope(histories, None)["verdict"] == "not measurable"
    assert endpoints.e3_share_slope(None, classify)["verdict"] == "not measurable"
    table = endpoints.endpoints_table(endpoints.endpoint_rows(
        {"derl": [_run("derl", s, "g2", 0.3) for s in range(3)], "random": [_run("random", s, "g3", 0.2) for s in range(3)]},
        histories, classify))
    assert table.count("\n") == 5 and "E1" in table and "E3" in table and "3 vs 0 discordant seeds" in table


def test_the_shuffled_feedback_control_is_compared_with_both():
    results = {"derl": [_run("derl", s, "g2", 0.30 + 0.01 * s) for s in range(3)],
               "random": [_run("random", s, "g3", 0.20) for s in range(3)],
               "derl_shuffled": [_run("derl_shuffled", s, "g2" if s else "g5", 0.25) for s in range(3)]}
    classify = fake_domain(classify_by_terms).reward_class
    rows = endpoints.endpoint_rows(results, None, classify)
    assert [r["measured_as"].split(",")[0] for r in rows[::3]] == ["derl − random", "derl_shuffled − random",
                                                                    "derl − derl_shuffled"]
    assert [r["endpoint"][:2] for r in rows] == ["E1", "E2", "E3"] * 3
    assert rows[3]["share"] == pytest.approx(2 / 3) and rows[3]["baseline_share"] == 0.0   # g2 on seeds 1, 2
    assert rows[6]["first_only"] == 1 and rows[6]["second_only"] == 0
    assert rows[4]["difference"] == pytest.approx(0.05) and rows[7]["difference"] == pytest.approx(0.06)
    assert len(endpoints.endpoint_rows({"derl": results["derl"], "random": results["random"]}, None, classify)) == 3
    table = endpoints.endpoints_table(rows).splitlines()
    assert table[0].endswith("| verdict | Holm verdict |") and len(table) == 2 + 9
    assert all(line.count("|") == 8 for line in table)   # E3 (no histories): not measurable, in its place
    assert "not measurable" in table[4] and table[4].startswith("| E3")


class Recording(FakeMetaOptimizer):
    def update(self, state, sample, scores):
        self.seen = np.asarray(scores)
        return super().update(state, sample, scores)


def _shuffled(seed_key: int):
    cfg = fake_config()
    grammar = make_grammar(len(PRIMITIVES), cfg.meta.max_symbols, cfg.meta.max_depth)
    strategy = make_strategy("derl_shuffled", cfg, grammar, PRIMITIVES, optimizer_factory=Recording)
    assert isinstance(strategy, ShuffledDerlStrategy)
    return strategy, strategy.init(jax.random.key(seed_key))


def test_shuffled_feedback_permutes_only_the_order_of_the_scores():
    scores = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], np.float32)
    strategy, state = _shuffled(3)
    texts, aux = strategy.propose(state, jax.random.key(1), 6)
    new_state = strategy.update(state, records_of(texts, scores), scores, aux)
    seen = strategy.optimizer.seen
    assert sorted(seen.tolist()) == pytest.approx(scores.tolist())          # the same multiset
    order = shuffle_order(state.seed, 0, 6)
    np.testing.assert_allclose(seen, scores[order])                           # permuted within the group
    assert not np.array_equal(order, np.arange(6))
    again, state_again = _shuffled(3)                                         # deterministic per key
    again.update(state_again, records_of(texts, scores), scores, aux)
    np.testing.assert_array_equal(again.optimizer.seen, seen)
    other, other_state = _shuffled(4)
    assert other_state.seed != state.seed
    assert not all(np.array_equal(shuffle_order(state.seed, i, 6), shuffle_order(other_state.seed, i, 6)) for i in range(3))
    arrays, data = strategy.checkpoint(new_state)                             # the seed survives a resume
    assert strategy.restore(strategy.init(jax.random.key(9)), arrays, data).seed == state.seed
