"""Time household inner steps of whatever `derl_jax` is importable: a script with no imports of
its own tree, so `bench_env.py --baseline DIR` runs it against an earlier checkout too.

    python benchmarks/inner_step.py '{"preset": "default", "steps": 1, "repeats": 5,
                                      "variants": [{"label": "default", "domain": {}}]}'

For every variant (overrides of `config.domain`): build the domain and a scratch policy, jit
`InnerLoop.train` for `steps` steps, run it once (compile), then `repeats` times, each timed.
With `"data": D` > 1 in the spec the loop runs on a mesh whose 'data' axis holds D host
devices, a step's rollouts split over them as a run on a D-core host splits them by default
(the caller sets XLA's host device count). Variants are timed in turns (round r of every
variant, then round r + 1), so a drift in the host's speed reaches them alike. Prints one JSON
line: per variant the compile seconds, every run's seconds and the prompt length. Every call
uses the same inputs (same key), so the runs repeat the same work.
"""

from __future__ import annotations

import json
import sys
import time


def build(preset: str, steps: int, domain: dict, data: int = 1):
    """() -> blocked train call, and the built domain, of one variant."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from configs import household
    from derl_jax.domains.registry import get_domain
    from derl_jax.expr import compile_expr, parse
    from derl_jax.models.transformer import init_params
    from derl_jax.rl import sft
    from derl_jax.rl.config import inner_config
    from derl_jax.rl.loop import make_inner_loop

    cfg = household.get_config(preset)
    cfg.inner.update(steps=steps, kl_metric=False)
    cfg.domain.update(domain)
    built = get_domain("household").build(cfg)
    graphdef, params = init_params(sft.policy_model_config(built, cfg.policy), jax.random.key(0))
    mesh = None
    if data > 1:
        from derl_jax.parallel import make_mesh
        mesh = make_mesh(1, data, 1)
    loop = make_inner_loop(built, graphdef, inner_config(cfg, built.max_new_tokens), mesh)
    program = compile_expr(parse("g1", built.primitive_names))
    train = jax.jit(loop.train)
    inputs = (params, program, jax.random.key(1), built.train)
    if mesh is not None:
        inputs = jax.device_put(inputs, NamedSharding(mesh, PartitionSpec()))
    return (lambda: jax.block_until_ready(train(*inputs))), built, cfg


def main(spec: dict) -> dict:
    runs = []
    for variant in spec["variants"]:
        call, built, cfg = build(spec.get("preset", "default"), int(spec.get("steps", 1)), variant.get("domain", {}),
                                 int(spec.get("data", 1)))
        start = time.perf_counter()
        call()
        runs.append({"label": variant["label"], "domain": variant.get("domain", {}),
                     "compile_s": time.perf_counter() - start, "run_s": [], "prompt_length": int(built.prompt_length),
                     "episodes": int(cfg.inner.prompts_per_step) * int(cfg.inner.group_size) * int(spec.get("steps", 1)),
                     "turns": int(built.env.max_turns), "call": call})
    for _ in range(int(spec.get("repeats", 3))):
        for run in runs:
            start = time.perf_counter()
            run["call"]()
            run["run_s"].append(time.perf_counter() - start)
    return {"variants": [{k: v for k, v in run.items() if k != "call"} for run in runs]}


if __name__ == "__main__":
    print("INNER_STEP " + json.dumps(main(json.loads(sys.argv[1]))), flush=True)
