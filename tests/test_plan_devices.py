"""The plan of a tiny run on a (cand=2, data=2, model=2) mesh of 8 fake CPU devices against what
the real run allocates on device 0 (in a subprocess: this process may have another device count).

Tolerance: the compiler's per-device argument and output bytes equal the bytes of the real
shards on a device to within 1% + 1 KiB (XLA's output size also counts the output tuple's
table of 8-byte buffer pointers); the analytic per-device parameter and optimizer bytes equal
the real shards exactly.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # a long module fixture

SCRIPT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from derl_jax.models import transformer as tr
    from derl_jax.plan import analytic, compiled
    from derl_jax.plan.analytic import RunShape
    from derl_jax.rl.grpo import make_optimizer

    model = tr.tiny_config(64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4, num_kv_heads=2)
    shape = RunShape(model, num_candidates=4, prompts_per_step=2, group_size=2, prompt_tokens=6, new_tokens=6,
                     mesh=(2, 2, 2))
    pieces = compiled.compile_pieces(shape, compiled.make_mesh(shape))
    predicted = {name: compiled.memory_stats(piece) for name, piece in pieces.items()}
    device = jax.devices()[0]

    def on_device(tree):
        return sum(s.data.nbytes for leaf in jax.tree_util.tree_leaves(tree) for s in leaf.addressable_shards
                   if s.device == device)

    def place(tree, shardings):
        return jax.tree_util.tree_map(jax.device_put, tree, shardings)

    shardings = pieces["update"].input_shardings[0]
    params = jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (4, *x.shape)),
                                    tr.init_params(model, jax.random.key(0))[1])
    opt_state = jax.vmap(make_optimizer(compiled.grpo_config(shape)).init)(params)
    rng = np.random.default_rng(0)
    n, tp, t = shape.rollouts, shape.prompt_tokens, shape.new_tokens
    batch = {"prompts": rng.integers(0, 64, (4, n, tp)).astype(np.int32), "prompt_mask": np.ones((4, n, tp), bool),
             "completions": rng.integers(0, 64, (4, n, t)).astype(np.int32), "mask": np.ones((4, n, t), bool),
             "old_logp": np.full((4, n, t), -4.0, np.float32), "advantages": rng.normal(size=(4, n)).astype(np.float32)}
    keys = jax.random.split(jax.random.key(1), 4)
    params, opt_state, batch, keys = place((params, opt_state, batch, keys), shardings)
    sample_args = place((params, batch["prompts"], batch["prompt_mask"], keys), pieces["sample"].input_shardings[0])
    real = {"params": on_device(params), "optimizer": on_device(opt_state),
            "sample_args": on_device(sample_args), "sample_out": on_device(pieces["sample"](*sample_args)),
            "update_args": on_device((params, opt_state, batch, keys))}
    real["update_out"] = on_device(pieces["update"](params, opt_state, batch, keys))
    print(json.dumps({"predicted": predicted, "real": real,
                      "analytic_params": analytic.param_bytes(model, 2) * 2,
                      "analytic_optimizer": analytic.optimizer_bytes(model, "adamw", 2) * 2,
                      "devices": len(jax.devices())}))
""")


@pytest.fixture(scope="module")
def measured():
    # XLA:CPU's cheapest code generation: argument and output sizes do not depend on it
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=8 "
               "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_plan_of_a_tiny_run_equals_what_the_run_allocates(measured):
    """One test on the one subprocess run: split over pytest-xdist's workers, each worker would
    run it again."""
    assert measured["devices"] == 8
    # analytic per-device bytes equal the real shards: device 0 holds K / cand = 2 candidates,
    # each split 2 ways over 'model'
    assert measured["real"]["params"] == measured["analytic_params"]
    assert measured["real"]["optimizer"] == measured["analytic_optimizer"]
    # the compiled arguments and outputs equal the real allocation
    for piece in ("sample", "update"):
        predicted, real = measured["predicted"][piece], measured["real"]
        assert real[f"{piece}_args"] == pytest.approx(predicted["argument_bytes"], rel=0.01, abs=1024), piece
        assert real[f"{piece}_out"] == pytest.approx(predicted["output_bytes"], rel=0.01, abs=1024), piece
        assert predicted["temp_bytes"] > 0, piece
    # the update donates the policy and the optimizer state
    update = measured["predicted"]["update"]
    assert update["alias_bytes"] >= measured["real"]["params"] + measured["real"]["optimizer"] - 64
