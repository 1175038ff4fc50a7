"""The planner compiles the run's own inner loop (`make_inner_loop(...).train_many`) of the arith
smoke config on abstract inputs; its per-device argument and output bytes are exactly the
starting policy, programs, keys and training split (in) and the K trained policies plus
the per-step curves (out)."""

import jax
import numpy as np
import pytest

from configs import arith
from derl_jax.domains.registry import get_domain
from derl_jax.expr.program import MAX_PROGRAM_LENGTH
from derl_jax.plan import analytic, inner_loop
from derl_jax.rl import sft
from derl_jax.rl.config import metric_names


@pytest.mark.slow
def test_train_many_memory_is_the_policy_programs_and_data():
    cfg = arith.get_config("smoke")
    domain = get_domain("arith").build(cfg)
    model = sft.policy_model_config(domain, cfg.policy)
    k = 2
    stats = inner_loop.compile_train_many(domain, model, cfg, num_candidates=k,
                                          compiler_options={"xla_backend_optimization_level": 0})
    memory = stats["memory"]
    dataset = sum(np.asarray(leaf).nbytes for leaf in jax.tree_util.tree_leaves(domain.train))
    programs = k * MAX_PROGRAM_LENGTH * (4 + 4) + k * 4
    keys = k * 8  # threefry keys: 2 x uint32
    assert memory["argument_bytes"] == analytic.param_bytes(model) + programs + keys + dataset
    curves = len(metric_names(domain.primitive_names, float(cfg.inner.kl) > 0)) * k * int(cfg.inner.steps) * 4
    tuple_table = 8 * (len(jax.tree_util.tree_leaves(analytic.param_shapes(model))) // 2 + 1 + 1)
    assert memory["output_bytes"] == pytest.approx(k * analytic.param_bytes(model) + curves, abs=tuple_table + 512)
    assert memory["temp_bytes"] > 0 and stats["flops"] > 0
