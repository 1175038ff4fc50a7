"""The symbols base policies' banded property over seeds: what pins `base_policy_band`.

    python -m benchmarks.symbols_band --seeds=0,1,2,3,4,5 --workdir=runs/symbols_band
    python -m benchmarks.symbols_band --config=configs/symbols_compose.py:medium --seeds=0,1,2

For every seed it builds the warm-started base policy of the config at `--config.seed=s`
(cached in `<workdir>/base_policy/`, the cache a launcher run in that workdir uses), measures
every primitive's mean over one sampled completion per inner-training prompt
(`derl_jax.rl.base_band.measure`, the band's own measurement) and the greedy test exact match,
and writes them with the final SFT loss and the seconds each seed took to
`<workdir>/symbols_band.json` (and `--out` when given). The band is not checked here: this is
how it is chosen.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import time
from typing import Sequence

from benchmarks.symbols_reference import load_config


def measure_seed(config: str, seed: int, workdir: str, overrides: Sequence[str]) -> dict:
    """{"seed", "measured": {primitive: mean}, "greedy_test", "sft_final_loss", "seconds"} of one seed."""
    from derl_jax.domains.registry import get_domain
    from derl_jax.rl import base_band
    from derl_jax.rl.config import inner_config
    from derl_jax.rl.setup import BASE_POLICY_DIR, base_policy, make_evaluator, validation_rows

    import numpy as np

    start = time.time()
    cfg = load_config(config, seed, overrides)
    cfg.mesh.data = 1
    domain = dataclasses.replace(get_domain(cfg.domain.kind).build(cfg), base_policy_band={})
    graphdef, params = base_policy(domain, cfg, workdir)
    inner_rows = np.setdiff1d(np.arange(domain.train.size), validation_rows(domain.train.size, int(cfg.outer.split_seed)))
    measured = base_band.measure(domain, graphdef, params, inner_config(cfg, domain.max_new_tokens),
                                 domain.train.take(inner_rows))
    greedy = make_evaluator(domain, graphdef, cfg).accuracy(params, domain.test)
    losses = []
    for path in glob.glob(os.path.join(workdir, BASE_POLICY_DIR, "*.json")):
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
        if record.get("sft", {}).get("seed") == seed:
            losses.append(record.get("final_loss"))
    return {"seed": seed, "measured": measured, "greedy_test": float(greedy),
            "sft_final_loss": losses[0] if losses else None, "seconds": time.time() - start}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/symbols.py")
    parser.add_argument("--seeds", default="0,1,2,3,4,5")
    parser.add_argument("--workdir", default="runs/symbols_band")
    parser.add_argument("--out", default="")
    parser.add_argument("--override", action="append", default=[], help="e.g. --override=--config.policy.sft_steps=1000")
    args = parser.parse_args(argv)
    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    rows = []
    for seed in [int(s) for s in args.seeds.split(",") if s.strip()]:
        rows.append(measure_seed(args.config, seed, workdir, args.override))
        row = rows[-1]
        print(f"seed {seed}: " + " ".join(f"{k} {v:.3f}" for k, v in row["measured"].items())
              + f" | greedy test {row['greedy_test']:.3f} | {row['seconds']:.0f} s", flush=True)
    payload = {"config": args.config, "overrides": args.override, "seeds": rows}
    for path in [os.path.join(workdir, "symbols_band.json")] + ([args.out] if args.out else []):
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2)


if __name__ == "__main__":
    main()
