"""Reference tables of the composed symbols levels: a top, a fewer-aspects and a decoy reward over
warm starts and training keys, with each warm start's base-policy property.

    python -m benchmarks.symbols_compose_reference --levels=easy,medium,hard --seeds=0,1,2,3,4 --keys=3 \\
        --workdir=runs/compose_reference --out=benchmarks/results/symbols_compose_reference.json

For each level (a preset of configs/symbols_compose.py) and seed s, in one process:

1. The base policy of `--config.seed=s` (warm-started once, cached in `<workdir>/base_policy/`
   by the corpus it was trained on, so `easy` and `medium`, which share m, share it). Its
   property is measured as the band check measures it (`derl_jax.rl.base_band.measure`: every
   primitive's mean over one sampled completion per inner-training prompt) together with its
   greedy test exact match. The band is not checked here: this is how it is chosen.
2. Every expression trains a fresh policy on the full training split for `final.steps` inner
   steps from that base policy, as final mode does (`protocol.train_final`), once per training
   key k < `--keys` (key 0 is final mode's own, `run_keys(s)["final"]`; key k > 0 is `fold_in` of it with k), and is
   tested by greedy exact match on the test split.

Expressions per level with m aspects (g2..g(m+1) aligned, g(m+2) = `marker`): the top reward
(the sum of the aligned primitives), the fewer-aspects reward (the same without the last aspect)
and the decoy reward (the top reward plus `marker`). Reported per level: test exact match per
expression, mean ± std [95% Student-t] over the seeds of each seed's mean over the keys, and the
same for the per-seed paired differences top − fewer and top − decoy
(`derl_jax.experiment.stats.summarize`); every (seed, key) value is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Sequence

import numpy as np

from benchmarks.symbols_reference import load_config

ROLES = ("top", "fewer", "decoy")


def level_expressions(aspects: int) -> dict[str, str]:
    """{"top", "fewer", "decoy"} -> expression of a level with `aspects` aspects (module docstring)."""
    aligned = [f"g{i + 2}" for i in range(aspects)]
    top = "+".join(aligned)
    return {"top": top, "fewer": "+".join(aligned[:-1]), "decoy": f"{top}+g{aspects + 2}"}


def measure_seed(config: str, seed: int, keys: int, workdir: str, overrides: Sequence[str]) -> dict:
    """One warm start's property and every (expression, key) test exact match (module docstring)."""
    import dataclasses

    import jax

    from derl_jax.experiment import build
    from derl_jax.experiment.protocol import run_keys, train_final
    from derl_jax.rl import base_band
    from derl_jax.rl.config import inner_config
    from derl_jax.rl.setup import base_policy, validation_rows

    start = time.time()
    cfg = load_config(config, seed, overrides)
    domain = dataclasses.replace(build.build_domain(cfg), base_policy_band={})
    base_params, evaluator = build.build_inner(domain, cfg, workdir)
    warm = time.time() - start
    graphdef, params = base_policy(domain, cfg, workdir)   # the cached warm start build_inner just made
    inner_rows = np.setdiff1d(np.arange(domain.train.size), validation_rows(domain.train.size, int(cfg.outer.split_seed)))
    measured = base_band.measure(domain, graphdef, params, inner_config(cfg, domain.max_new_tokens),
                                 domain.train.take(inner_rows))
    greedy = float(evaluator.accuracy(base_params, domain.test))
    expressions = level_expressions(int(cfg.domain.aspects))
    tests = {role: [] for role in ROLES}
    for key_index in range(keys):
        key = run_keys(seed)["final"]
        key = key if key_index == 0 else jax.random.fold_in(key, key_index)
        for role in ROLES:
            tests[role].append(float(train_final(expressions[role], domain, evaluator, key, base_params).test))
    return {"seed": seed, "base_property": measured, "base_greedy_test": greedy, "test": tests,
            "warm_start_seconds": warm, "seconds": time.time() - start}


def summarize_level(rows: Sequence[dict]) -> dict:
    """Per role and per paired difference: summarize() over the seeds of each seed's key mean."""
    from derl_jax.experiment.stats import summarize

    per_seed = {role: [float(np.mean(row["test"][role])) for row in rows] for role in ROLES}
    out = {role: summarize(values, clip=(0.0, 1.0)) for role, values in per_seed.items()}
    for other in ("fewer", "decoy"):
        out[f"top-{other}"] = summarize([a - b for a, b in zip(per_seed["top"], per_seed[other])])
    out["per_seed_mean"] = per_seed
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/symbols_compose.py")
    parser.add_argument("--levels", default="easy,medium,hard")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--workdir", default="runs/compose_reference")
    parser.add_argument("--out", default="")
    parser.add_argument("--override", action="append", default=[], help="e.g. --override=--config.inner.steps=32")
    args = parser.parse_args(argv)
    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    payload = {"config": args.config, "overrides": args.override, "seeds": seeds, "keys": args.keys, "levels": {}}
    for level in [s.strip() for s in args.levels.split(",") if s.strip()]:
        config = f"{args.config}:{level}"
        aspects = int(load_config(config, 0, args.override).domain.aspects)
        rows = []
        for seed in seeds:
            rows.append(measure_seed(config, seed, args.keys, workdir, args.override))
            row = rows[-1]
            print(f"{level} seed {seed}: " + " ".join(f"{k} {v:.3f}" for k, v in row["base_property"].items())
                  + f" | greedy {row['base_greedy_test']:.3f} | "
                  + " ".join(f"{r} {np.round(row['test'][r], 3).tolist()}" for r in ROLES)
                  + f" | {row['seconds']:.0f} s", flush=True)
            payload["levels"][level] = {"expressions": level_expressions(aspects), "rows": rows}
            for path in [os.path.join(workdir, "symbols_compose_reference.json")] + ([args.out] if args.out else []):
                with open(path, "w", encoding="utf-8") as handle:
                    json.dump(payload, handle, indent=2)
        payload["levels"][level]["summary"] = summarize_level(rows)
        print(json.dumps({k: v for k, v in payload["levels"][level]["summary"].items() if k != "per_seed_mean"},
                         indent=1), flush=True)
    for path in [os.path.join(workdir, "symbols_compose_reference.json")] + ([args.out] if args.out else []):
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2)


if __name__ == "__main__":
    main()
