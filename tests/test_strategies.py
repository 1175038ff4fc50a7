"""Strategies: registry, fixed presets, derl vs random (frozen), evolution, checkpoint hooks, equal budgets."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from derl_jax.expr.grammar import make_grammar
from derl_jax.expr.parse import parse
from derl_jax.expr.vm import evaluate_numpy
from derl_jax.config import ConfigError
from derl_jax.experiment.checks import validate_config
from derl_jax.outer import ALL_METHODS, Strategy, make_strategy, strategy_names
from derl_jax.methods.derl.strategy import MetaOptimizerStrategy
from derl_jax.methods.evolution.strategy import EvolutionStrategy
from derl_jax.methods.baselines import FixedStrategy, average_text, fixed, outcome_format_text, outcome_text
from test_search import (
    CORPUS,
    PRIMITIVES,
    FakeMetaOptimizer,
    fake_config,
    fixed_rows,
    records_of,
    reference_quality,
    run_fake_search,
)


def build(name, cfg=None, **kwargs):
    cfg = cfg or fake_config()
    grammar = make_grammar(len(PRIMITIVES), cfg.meta.max_symbols, cfg.meta.max_depth)
    return make_strategy(name, cfg, grammar, PRIMITIVES, optimizer_factory=FakeMetaOptimizer, **kwargs)


def test_registry_builds_every_strategy_with_its_flags():
    kinds = {
        "derl": (MetaOptimizerStrategy, True, False),
        "derl_pop": (MetaOptimizerStrategy, True, True),
        "random": (MetaOptimizerStrategy, False, False),
    }
    assert set(ALL_METHODS) | {"fixed:<arg>"} <= set(strategy_names())
    assert strategy_names()[: len(ALL_METHODS)] == ALL_METHODS
    for name in ALL_METHODS + ("fixed:g1*g2",):
        strategy = build(name)
        assert isinstance(strategy, Strategy) and strategy.name == name
        if name in kinds:
            cls, learn, population = kinds[name]
            assert isinstance(strategy, cls) and strategy.learn == learn and strategy.population == population
            assert strategy.searches
        elif name == "evolution":
            assert isinstance(strategy, EvolutionStrategy) and strategy.searches and not strategy.population
        else:
            assert isinstance(strategy, FixedStrategy) and not strategy.searches
    assert build("fixed:g1+0.5*g3").text == "g1+0.5*g3"
    assert (fixed("g1*g2").name, fixed("g1*g2").text) == ("fixed:g1*g2", "g1*g2")
    with pytest.raises(ValueError, match="unknown strategy 'grid'"):
        build("grid")
    with pytest.raises(ValueError, match="needs a grammar"):
        make_strategy("derl", fake_config(), None, PRIMITIVES, optimizer_factory=FakeMetaOptimizer)


def test_fixed_presets_compute_what_they_claim():
    rows = np.random.default_rng(0).random((64, 4)).astype(np.float32)
    columns = {f"g{i + 1}": rows[:, i] for i in range(4)}
    expected = {
        "outcome": columns["g1"],
        "outcome_format": columns["g1"] + columns["g2"],
        "average": rows.mean(axis=1),
    }
    for name, reference in expected.items():
        strategy = build(name)
        texts, aux = strategy.propose(strategy.init(jax.random.key(0)), jax.random.key(1), 3)
        assert texts == [strategy.text] * 3 and aux is None
        np.testing.assert_allclose(evaluate_numpy(parse(texts[0], PRIMITIVES), rows, 0.0), reference, rtol=1e-6)
    assert outcome_text(4, outcome_index=2) == "g3"
    assert outcome_format_text(4, outcome_index=2) == "g3+g1"
    assert average_text(1) == "g1"
    assert build("outcome", outcome_index=2).text == "g3"


def test_random_is_derl_without_updates():
    derl, random = build("derl"), build("random")
    key = jax.random.key(3)
    derl_state, random_state = derl.init(key), random.init(key)
    rows = fixed_rows()
    quality = {text: reference_quality(text, rows) if text not in ("g1/(g2-g2)", "3") else 0.0 for text in CORPUS}
    start = derl.optimizer.probabilities(derl_state.meta)
    for step in range(6):
        propose_key = jax.random.fold_in(key, step)
        derl_texts, derl_aux = derl.propose(derl_state, propose_key, 8)
        random_texts, random_aux = random.propose(random_state, propose_key, 8)
        if step == 0:
            assert derl_texts == random_texts  # the same cold start proposes the same group
        derl_scores = np.array([quality[t] for t in derl_texts], np.float32)
        random_scores = np.array([quality[t] for t in random_texts], np.float32)
        derl_state = derl.update(derl_state, records_of(derl_texts, derl_scores), derl_scores, derl_aux)
        random_state = random.update(random_state, records_of(random_texts, random_scores), random_scores, random_aux)
    for leaf_after, leaf_before in zip(jax.tree_util.tree_leaves(random_state.meta), jax.tree_util.tree_leaves(random.init(key).meta)):
        np.testing.assert_array_equal(np.asarray(leaf_after), np.asarray(leaf_before))
    assert int(derl_state.meta.step) == 6 and random.metrics(random_state) == {}
    assert set(derl.metrics(derl_state)) == {"loss", "score_mean"}
    values = np.array([quality[t] for t in CORPUS])
    expected_before, expected_after = start @ values, derl.optimizer.probabilities(derl_state.meta) @ values
    assert expected_after > expected_before + 0.1  # learning moved mass to better expressions


def test_scores_reach_the_optimizer_unchanged():
    class Recording(FakeMetaOptimizer):
        def update(self, state, sample, scores):
            self.seen = (sample.texts, np.asarray(scores))
            return super().update(state, sample, scores)

    cfg = fake_config()
    grammar = make_grammar(4, cfg.meta.max_symbols, cfg.meta.max_depth)
    strategy = make_strategy("derl", cfg, grammar, PRIMITIVES, optimizer_factory=Recording)
    state = strategy.init(jax.random.key(0))
    texts, aux = strategy.propose(state, jax.random.key(1), 4)
    scores = np.array([0.25, 0.0, 0.5, 1.0], np.float32)
    strategy.update(state, records_of(texts, scores), scores, aux)
    assert strategy.optimizer.seen[0] == tuple(texts)
    np.testing.assert_array_equal(strategy.optimizer.seen[1], scores)
    with pytest.raises(ValueError, match=r"derl.update: expected scores of shape \(4,\)"):
        strategy.update(state, records_of(texts, scores), scores[:3], aux)
    with pytest.raises(ValueError, match="must be finite"):
        strategy.update(state, records_of(texts, scores), np.array([0.1, np.nan, 0.2, 0.3]), aux)
    with pytest.raises(ValueError, match=r"record 1 has score 0.0 but scores\[1\] = 0.5"):
        strategy.update(state, records_of(texts, scores), np.array([0.25, 0.5, 0.5, 1.0]), aux)


@pytest.mark.parametrize("name", ["derl", "evolution"])
def test_checkpoint_hooks_round_trip(name):
    strategy = build(name)
    state = strategy.init(jax.random.key(5))
    for step in range(2):
        texts, aux = strategy.propose(state, jax.random.key(10 + step), 4)
        scores = np.linspace(0.1, 0.9, 4).astype(np.float32)
        state = strategy.update(state, records_of(texts, scores), scores, aux)
    arrays, data = strategy.checkpoint(state)
    host_arrays = jax.tree_util.tree_map(np.asarray, arrays)  # what a restore from disk gives back
    restored = strategy.restore(strategy.init(jax.random.key(5)), host_arrays, data)
    key = jax.random.key(99)
    assert strategy.propose(restored, key, 4)[0] == strategy.propose(state, key, 4)[0]
    assert strategy.checkpoint(restored)[1] == data


def test_evolution_generations():
    strategy = build("evolution")
    state = strategy.init(jax.random.key(0))
    first, _ = strategy.propose(state, jax.random.key(1), 4)
    assert set(first) <= set(CORPUS)  # the cold-start sample
    with pytest.raises(ValueError, match="cold-start generation holds 4"):
        strategy.propose(state, jax.random.key(1), 3)
    scores = np.array([reference_quality(t, fixed_rows()) if t not in ("g1/(g2-g2)", "3") else 0.0 for t in first], np.float32)
    state = strategy.update(state, records_of(first, scores), scores, None)
    kept = {text for text, score in zip(first, scores) if score > 0}
    assert len(state.population.members) == len({parse(t, PRIMITIVES) for t in kept})
    children, _ = strategy.propose(state, jax.random.key(2), 6)
    assert len(children) == 6
    trees = [parse(text, PRIMITIVES) for text in children]  # children are well-formed expression text
    assert all(len(text) <= 256 for text in children) and len(set(trees)) > 1

    cfg = fake_config()
    cfg.evolution.init = "random_trees"
    random_trees = build("evolution", cfg)
    state = random_trees.init(jax.random.key(0))
    assert state.first_generation == ()
    texts, _ = random_trees.propose(state, jax.random.key(1), 5)
    assert len(texts) == 5 and all(parse(t, PRIMITIVES) is not None for t in texts)
    assert texts == random_trees.propose(state, jax.random.key(1), 5)[0]


def test_every_search_strategy_is_charged_the_same(tmp_path):
    charged = {}
    for name in ("derl", "derl_pop", "random", "evolution", "outcome"):
        result, evaluator = run_fake_search(tmp_path / name, name, iterations=2, num_candidates=3)
        charged[name] = result.budget["candidates_charged"]
        assert result.budget["candidates_trained"] == sum(c["k"] for c in evaluator.calls)
    assert set(charged.values()) == {6}


def test_each_strategy_checks_its_own_config_fields_when_used():
    cfg = fake_config()
    cfg.outer.strategy, cfg.compare.methods = "derl", ("derl", "outcome")
    cfg.evolution.mutation_rate = 2.0  # evolution is not used: its block is not checked
    validate_config(cfg)
    cfg.compare.methods = ("derl", "evolution")
    with pytest.raises(ConfigError, match=r"^config.evolution.mutation_rate must be in \[0, 1\], got 2.0$"):
        validate_config(cfg)
    cfg = fake_config()
    cfg.outer.strategy, cfg.compare.methods = "outcome", ("outcome", "fixed:g1+g2")
    cfg.meta.lr = -1.0  # no Meta-Optimizer in a fixed-expression run
    validate_config(cfg)
    cfg.compare.methods = ("outcome", "random")
    with pytest.raises(ConfigError, match=r"^config.meta.lr must be a number > 0.0, got -1.0$"):
        validate_config(cfg)
    cfg.compare.methods = ("outcome", "fixed:")
    with pytest.raises(ConfigError, match=r"config.compare.methods: unknown method 'fixed:'"):
        validate_config(cfg)
