"""How close a testbed seed's cost is to the arithmetic it must do: matrix-product FLOPs against
this host's measured matmul rate.

    python -m benchmarks.seed_floor --config=configs/symbols_compose.py:hard \\
        --out=benchmarks/results/seed_floor.json

For one config (and `--override`s, as in benchmarks/seed_cost.py) it reports:

1. FLOPs (`derl_jax.plan.analytic`, matrix products only): one candidate's inner training
   (`inner.steps` steps of sampling and update), one warm start (`policy.sft_steps` optimizer
   steps of `policy.sft_batch_size` rows at the domain's prompt and completion widths), and a
   DERL seed's (its warm start, `--iterations` (20) x `outer.num_candidates` candidates and
   `--finals` (3) final trainings).
2. The rate: GFLOP per CPU-second of a jitted chain of the policy's MLP projections at two row
   counts, a step's completion tokens (`rollouts * new tokens`) and one decode step's rows
   (`rollouts`), in this process (run it under `taskset -c <core>` for one core's rate).
3. The floor: (1.) at the faster of those rates, i.e. what a seed would cost if every FLOP ran at
   the matmul kernel's speed and nothing else cost anything.
4. What one candidate's jitted training costs here (median of `--repeats` calls after
   compilation) and the FLOP rate that implies.

The per-seed figures leave out the candidate tests and the Meta-Optimizer (each under 3% of a
seed in benchmarks/results/seed_cost.json).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Sequence

from benchmarks.seed_cost import median_cpu


def matmul_rate(rows: int, inner: int, cols: int, repeats: int = 3, calls: int = 1000) -> float:
    """GFLOP per CPU-second of f32 [rows, inner] x [inner, cols] products and back ([rows, cols] x
    [cols, inner]), `calls` pairs chained in one jit (each product reads the last one's output)."""
    import jax
    import jax.numpy as jnp

    up = jax.random.normal(jax.random.key(0), (inner, cols), jnp.float32) / inner ** 0.5
    down = jax.random.normal(jax.random.key(1), (cols, inner), jnp.float32) / cols ** 0.5
    start = jax.random.normal(jax.random.key(2), (rows, inner), jnp.float32)

    @jax.jit
    def chain(x, up, down):
        return jax.lax.fori_loop(0, calls, lambda i, x: jnp.dot(jnp.dot(x, up), down), x)

    seconds = median_cpu(lambda: jax.block_until_ready(chain(start, up, down)), repeats)
    return 4.0 * rows * inner * cols * calls / seconds / 1e9


def flops(cfg, domain, iterations: int, finals: int) -> dict:
    """Matrix-product FLOPs of one candidate, one warm start and a DERL seed (module docstring, 1.)."""
    from derl_jax.plan.analytic import RunShape, step_flops, update_step_flops
    from derl_jax.plan.report import shape_from_config

    shape = shape_from_config(cfg, domain=domain).replace(num_candidates=1, chunk_size=0)
    candidate = int(cfg.inner.steps) * step_flops(shape)["total"]
    sft_step = RunShape(shape.model, prompts_per_step=int(cfg.policy.sft_batch_size), group_size=1,
                        prompt_tokens=shape.prompt_tokens, new_tokens=shape.new_tokens)
    warm_start = int(cfg.policy.sft_steps) * update_step_flops(sft_step)
    trainings = iterations * int(cfg.outer.num_candidates) + finals
    return {"candidate": candidate, "warm_start": warm_start, "trainings_per_seed": trainings,
            "seed": warm_start + trainings * candidate}


def candidate_cpu(cfg, domain, repeats: int) -> float:
    """Median CPU-seconds of one jitted `InnerLoop.train` (`inner.steps` steps) from the initial policy."""
    import jax

    from derl_jax.expr.parse import parse
    from derl_jax.expr.program import compile_expr
    from derl_jax.models.transformer import init_params
    from derl_jax.rl import sft
    from derl_jax.rl.config import inner_config
    from derl_jax.rl.loop import make_inner_loop

    graphdef, params = init_params(sft.policy_model_config(domain, cfg.policy), jax.random.key(0))
    loop = make_inner_loop(domain, graphdef, inner_config(cfg, domain.max_new_tokens))
    train = jax.jit(loop.train)
    program = compile_expr(parse("g2+g3"))   # the cost does not depend on the reward
    return median_cpu(lambda: jax.block_until_ready(train(params, program, jax.random.key(1), domain.train)), repeats)


def measure(config: str, overrides: Sequence[str] = (), repeats: int = 4, iterations: int = 20,
            finals: int = 3) -> dict:
    """The report of the module docstring for `config` with `overrides`."""
    from benchmarks.common import machine
    from benchmarks.symbols_reference import load_config
    from derl_jax.experiment import build
    from derl_jax.experiment.runtime import commit_of
    from derl_jax.parallel import host_description

    cfg = load_config(config, 0, ["--config.mesh.data=1", *overrides])
    domain = build.build_domain(cfg)
    counted = flops(cfg, domain, iterations, finals)
    hidden, intermediate = int(cfg.policy.hidden_size), int(cfg.policy.intermediate_size)
    rollouts = int(cfg.inner.prompts_per_step) * int(cfg.inner.group_size)
    rates = {f"{rows}x{hidden}x{intermediate}": matmul_rate(rows, hidden, intermediate)
             for rows in (rollouts * int(domain.max_new_tokens), rollouts)}
    peak = max(rates.values())
    measured = candidate_cpu(cfg, domain, repeats)
    return {
        "config": config, "overrides": list(overrides), "date": time.strftime("%Y-%m-%d"),
        "commit": commit_of(__file__),
        "host": host_description(), "machine": machine(),
        "gflop": {name: value / 1e9 for name, value in counted.items() if name != "trainings_per_seed"},
        "trainings_per_seed": counted["trainings_per_seed"],
        "matmul_gflop_per_cpu_second": rates,
        "floor_cpu_seconds": {"candidate": counted["candidate"] / peak / 1e9,
                              "warm_start": counted["warm_start"] / peak / 1e9,
                              "seed": counted["seed"] / peak / 1e9,
                              "seed_without_warm_start": (counted["seed"] - counted["warm_start"]) / peak / 1e9},
        "candidate_cpu_seconds": measured,
        "candidate_gflop_per_cpu_second": counted["candidate"] / measured / 1e9,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/symbols_compose.py:hard")
    parser.add_argument("--override", action="append", default=[],
                        help="a config override, e.g. --override=--config.policy.hidden_size=32")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=20, help="outer iterations of a seed (as seed_cost)")
    parser.add_argument("--finals", type=int, default=3, help="final trainings of a seed (the testbeds' 3 keys)")
    parser.add_argument("--out", default="", help="append the report to this JSON list")
    args = parser.parse_args(argv)
    report = measure(args.config, args.override, args.repeats, args.iterations, args.finals)
    print(json.dumps(report, indent=1), flush=True)
    if args.out:
        kept = []
        if os.path.exists(args.out):
            with open(args.out, encoding="utf-8") as handle:
                kept = json.load(handle)
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(kept + [report], handle, indent=2)


if __name__ == "__main__":
    main()
