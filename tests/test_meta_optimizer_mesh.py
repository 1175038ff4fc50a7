"""The Meta-Optimizer on a mesh: its backbone split over the 'model' axis (two of the test's
fake CPU devices) samples the same expressions and takes the same GRPO step as on one device."""

import pytest
import jax
import numpy as np

from derl_jax.expr.grammar import make_grammar
from derl_jax.methods.derl.optimizer import MetaOptimizer
from derl_jax.outer import make_strategy
from derl_jax.parallel import MODEL_AXIS, make_mesh

GRAMMAR = make_grammar(3, 16, max_depth=3)
META = {
    "backbone": "scratch", "hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2,
    "num_kv_heads": 2, "head_dim": 16, "temperature": 1.0, "max_symbols": 16, "max_depth": 3,
    "cold_start_corpus": 32, "cold_start_steps": 5, "cold_start_lr": 3e-3, "lr": 3e-3, "kl": 0.01, "epochs": 1,
}
N = 8


def _split_over_model(params) -> int:
    """How many parameter leaves are divided over the 'model' axis."""
    return sum(MODEL_AXIS in tuple(getattr(leaf.sharding, "spec", ())) for leaf in jax.tree_util.tree_leaves(params))


@pytest.mark.slow
def test_sharded_sample_and_update_match_one_device():
    mesh = make_mesh(1, 1, 2, devices=jax.devices()[:2])
    plain, sharded = MetaOptimizer({"meta": META}, GRAMMAR), MetaOptimizer({"meta": META}, GRAMMAR, mesh=mesh)
    key, sample_key = jax.random.split(jax.random.key(0))
    one, split = plain.init(key), sharded.init(key)
    assert _split_over_model(one.params) == 0
    assert _split_over_model(split.params) >= 3  # attention heads, MLP and vocabulary weights
    for a, b in zip(jax.tree_util.tree_leaves(one.params), jax.tree_util.tree_leaves(split.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5)  # AdamW steps over reordered sums

    sample_one, sample_split = plain.sample(one, sample_key, N), sharded.sample(split, sample_key, N)
    assert sample_one.texts == sample_split.texts
    np.testing.assert_allclose(np.asarray(sample_one.logp), np.asarray(sample_split.logp), rtol=1e-4, atol=1e-5)

    scores = np.linspace(0.0, 1.0, N, dtype=np.float32)
    (next_one, metrics_one), (next_split, metrics_split) = plain.update(one, sample_one, scores), sharded.update(
        split, sample_split, scores)
    assert _split_over_model(next_split.params) == _split_over_model(split.params)
    for a, b in zip(jax.tree_util.tree_leaves(next_one.params), jax.tree_util.tree_leaves(next_split.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=2e-5)
    moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                for a, b in zip(jax.tree_util.tree_leaves(one.params), jax.tree_util.tree_leaves(next_one.params)))
    assert moved > 0  # the step changed the weights, so the comparison above means something
    assert (metrics_one.pop("devices"), metrics_split.pop("devices")) == (1, 2)
    for name in metrics_one:
        np.testing.assert_allclose(float(metrics_one[name]), float(metrics_split[name]), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_strategy_builds_its_meta_optimizer_on_the_run_mesh():
    mesh = make_mesh(1, 1, 2, devices=jax.devices()[:2])
    strategy = make_strategy("derl", {"meta": META}, GRAMMAR, ("g1", "g2", "g3"), mesh=mesh)
    assert strategy.optimizer.mesh is mesh
    assert _split_over_model(strategy.init(jax.random.key(0)).meta.params) >= 3


def test_a_checkpointed_strategy_state_comes_back_on_the_mesh():
    """The DERL strategy saves its Meta-Optimizer state as host arrays (written once, whichever
    processes the mesh spans) and restores it with the placement of a freshly initialised state."""
    mesh = make_mesh(1, 1, 2, devices=jax.devices()[:2])
    strategy = make_strategy("derl", {"meta": META}, GRAMMAR, ("g1", "g2", "g3"), mesh=mesh)
    state = strategy.init(jax.random.key(0))
    arrays, data = strategy.checkpoint(state)
    assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree_util.tree_leaves(arrays))
    restored = strategy.restore(strategy.init(jax.random.key(1)), arrays, data)
    for want, got in zip(jax.tree_util.tree_leaves(state.meta), jax.tree_util.tree_leaves(restored.meta)):
        assert got.sharding.is_equivalent_to(want.sharding, want.ndim)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert _split_over_model(restored.meta.params) >= 3
