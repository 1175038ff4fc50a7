"""The inner loop on a device mesh (8 fake CPU devices, see conftest.py) equals the unsharded one.

Candidates run over the 'cand' axis (K = 3 is padded to the axis size with copies and the
copies dropped), rollouts over 'data', and with a 'model' axis the weights are split too.
"""

from __future__ import annotations

import functools
import re

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from derl_jax.domains.arith import make_arith_domain
from derl_jax.expr import compile_expr, parse, stack_programs
from derl_jax.models.transformer import init_params, param_partition_specs
from derl_jax.parallel import make_mesh
from derl_jax.rl import device_evaluator, loop, placement, sft
from derl_jax.rl.config import InnerConfig
from derl_jax.rl.grpo import GRPOConfig
from test_sft import TINY_DOMAIN, TINY_POLICY, tiny_policy

FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
INNER = InnerConfig(steps=3, prompts_per_step=4, group_size=2, max_new_tokens=14,
                          grpo=GRPOConfig(learning_rate=1e-3), eval_batch_size=8)
EXPRESSIONS = ("g1 + g2", "g3 - 0.5*g4", "max(g2, u)")
KEY = jax.random.key(11)


@functools.lru_cache(maxsize=None)
def setup():
    """(domain, graphdef, params, programs, train, validation) of the tiny SFT policy (tests/test_sft.py)."""
    tiny = tiny_policy()
    domain, graphdef, params = tiny.domain, tiny.graphdef, tiny.params
    programs = stack_programs([compile_expr(parse(t, list(domain.primitive_names))) for t in EXPRESSIONS])
    train, validation = domain.train.split(0.75, 0)
    return domain, graphdef, params, programs, train, validation


@functools.lru_cache(maxsize=None)
def untrained_setup():
    """(domain, graphdef, params, train) of the tiny policy before its SFT: for what does not
    depend on the weights' values (shapes, checks)."""
    domain = make_arith_domain(TINY_DOMAIN)
    graphdef, params = init_params(sft.policy_model_config(domain, TINY_POLICY), jax.random.key(0))
    return domain, graphdef, params, domain.train.split(0.75, 0)[0]


@functools.lru_cache(maxsize=None)
def unsharded_results():
    domain, graphdef, params, programs, train, validation = setup()
    evaluator = device_evaluator.DeviceEvaluator(domain, graphdef, INNER, compiler_options=FAST_COMPILE)
    return evaluator.evaluate_candidates(programs, params, KEY, train, validation)


def assert_results_close(got, want):
    np.testing.assert_allclose(got.scores, want.scores, atol=1e-6)
    assert set(got.curves) == set(want.curves)
    for name in want.curves:
        np.testing.assert_allclose(got.curves[name], want.curves[name], rtol=2e-4, atol=2e-5, err_msg=name)
    for a, b in zip(jax.tree_util.tree_leaves(got.params), jax.tree_util.tree_leaves(want.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape, chunk_size", [((4, 2, 1), 0), ((2, 2, 2), 2)])
def test_sharded_candidates_equal_the_unsharded_run(mesh_shape, chunk_size):
    domain, graphdef, params, programs, train, validation = setup()
    mesh = make_mesh(*mesh_shape)
    evaluator = device_evaluator.DeviceEvaluator(domain, graphdef, INNER.replace(chunk_size=chunk_size), mesh=mesh,
                                     compiler_options=FAST_COMPILE)
    results = evaluator.evaluate_candidates(programs, params, KEY, train, validation)
    assert results.scores.shape == (3,)
    want = unsharded_results()
    assert np.all(want.curves["grad_norm"].max(axis=1) > 0)  # every policy moves: the comparison means something
    assert_results_close(results, want)

    # the trained stack stays on the mesh: candidates over 'cand', weights over 'model'
    stacked, metrics, count = evaluator.train_candidates(evaluator.search_loop, programs, params, KEY, train)
    assert count == 3
    padded = placement.padded_count(3, chunk_size, mesh_shape[0])
    for leaf in jax.tree_util.tree_leaves(metrics):
        assert leaf.shape[0] == padded
        assert leaf.sharding.is_equivalent_to(NamedSharding(mesh, PartitionSpec("cand")), leaf.ndim)
    specs = param_partition_specs(params, mesh)
    spec_leaves = jax.tree_util.tree_leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    split_weights = 0
    for leaf, spec in zip(jax.tree_util.tree_leaves(stacked), spec_leaves, strict=True):
        assert leaf.shape[0] == padded
        expected = NamedSharding(mesh, PartitionSpec("cand", *spec))
        assert leaf.sharding.is_equivalent_to(expected, leaf.ndim), (leaf.sharding, expected)
        split_weights += leaf.sharding.shard_shape(leaf.shape)[1:] != leaf.shape[1:]
    assert (split_weights > 0) == (mesh_shape[2] > 1)


def test_a_chunk_size_that_the_cand_axis_does_not_divide_is_rejected():
    domain, graphdef, *_ = untrained_setup()
    with pytest.raises(ValueError, match="chunk_size=2 must be a multiple of the 'cand' mesh axis size 4"):
        device_evaluator.DeviceEvaluator(domain, graphdef, INNER.replace(chunk_size=2), mesh=make_mesh(4, 2, 1))
    with pytest.raises(ValueError, match="6 rollouts per step do not split over the 'data' mesh axis of size 4"):
        loop.make_inner_loop(domain, graphdef, INNER.replace(prompts_per_step=3), make_mesh(2, 4, 1))


@pytest.mark.slow
def test_rows_over_data_meet_once_per_step():
    """With rollouts over a 'data' axis of 2, a training step's only collective is the update's
    one all-reduce of a flat buffer holding every gradient entry, metric sum and count: no
    transfer of prompt rows, no count reduced before the gradient."""
    domain, graphdef, params, programs, train, _ = setup()
    mesh = make_mesh(1, 2, 1, devices=jax.devices()[:2])
    inner = loop.make_inner_loop(domain, graphdef, INNER, mesh)
    program = jax.tree_util.tree_map(lambda x: x[0], programs)
    replicated = NamedSharding(mesh, PartitionSpec())
    args = jax.device_put((params, program, KEY, train), replicated)
    text = jax.jit(inner.train).lower(*args).compile(FAST_COMPILE).as_text()
    collectives = [line for line in text.splitlines()
                   if any(f" {op}(" in line for op in ("all-reduce", "collective-permute", "all-gather", "all-to-all",
                                                      "reduce-scatter", "all-reduce-start"))]
    assert len(collectives) == 1 and " all-reduce(" in collectives[0], collectives
    sizes = [int(size) for size in re.findall(r"f32\[(\d+)\]", collectives[0].split("all-reduce(")[0])]
    num_params = sum(leaf.size for leaf in jax.tree_util.tree_leaves(params))
    assert max(sizes) > num_params, collectives
