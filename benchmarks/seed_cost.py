"""What one compare seed costs on a known-answer testbed, whole and by part, in CPU-seconds.

    python -m benchmarks.seed_cost --config=configs/symbols_compose.py:hard --seeds=3 \\
        --workdir=runs/seed_cost --out=benchmarks/results/seed_cost.json

1. Whole. The launcher runs the compare of one method (`--method`, default derl; 20 x 8
   search, final retraining with the level's `final.repeats` keys, every candidate policy
   tested) on one worker process, first for seed 0 alone, then for seeds 0..S-1 in a fresh
   workdir. The child's CPU time (user + system, `RUSAGE_CHILDREN`) of each gives the cost
   of one more seed, (cpu(S) - cpu(1)) / (S - 1), and the one-off cost (start-up,
   compilation, the shared base policy's test) as cpu(1) minus that. Every seed builds its
   own warm start (`compare.own_base_policy`), so it is part of a seed's cost.
2. By part, in this process on one device, after compilation (each the median of `--repeats`
   calls): one warm start (the base policy's SFT, `rl.setup.base_policy`, fresh cache), one
   outer iteration's candidates trained and validated (`evaluate_candidates`) with each
   dispatch ("loop": one compiled training per candidate, the CPU default; "batched": the
   candidates vmapped in one call), one final training, one candidate policy's test.

`--override=--config.<field>=<value>` (repeatable) changes the config of every part and run
alike, e.g. a narrower policy. Run it under `taskset -c <core>` to measure what a process kept
to one core pays (every run it starts inherits the core).

Writes the JSON to `<workdir>/seed_cost.json` (and `--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from typing import Callable, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def compare_command(config: str, method: str, seeds: Sequence[int], iterations: int, workdir: str,
                    overrides: Sequence[str] = ()) -> list[str]:
    return [sys.executable, os.path.join(REPO, "launch", "run.py"), f"--config={config}", "--mode=compare",
            f"--config.outer.iterations={iterations}", f"--config.compare.methods=('{method}',)",
            f"--config.compare.seeds=({','.join(map(str, seeds))},)", "--config.compare.workers=1",
            f"--workdir={workdir}", "--noprogress", *overrides]


def whole_run(command: list[str], workdir: str) -> dict:
    """CPU-seconds (user + system) and wall seconds of one launcher run in a fresh `workdir`."""
    shutil.rmtree(workdir, ignore_errors=True)
    before, start = children_cpu(), time.time()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, cwd=REPO)
    return {"command": " ".join(command[1:]), "cpu_seconds": children_cpu() - before, "wall_seconds": time.time() - start}


def median_cpu(call: Callable[[], object], repeats: int) -> float:
    """The median CPU-seconds of `repeats` calls of `call` (after one untimed call that compiles)."""
    call()
    times = []
    for _ in range(repeats):
        before = process_cpu()
        call()
        times.append(process_cpu() - before)
    return statistics.median(times)


def parts(config: str, workdir: str, repeats: int, overrides: Sequence[str] = ()) -> dict:
    """CPU-seconds of each part of a seed (module docstring, 2.), in this process."""
    import jax
    import numpy as np

    from benchmarks.symbols_reference import load_config
    from derl_jax.experiment import build
    from derl_jax.experiment.protocol import split_train
    from derl_jax.expr.parse import parse
    from derl_jax.expr.program import compile_expr, stack_programs

    cfg = load_config(config, 0, ["--config.mesh.data=1", *overrides])
    domain = build.build_domain(cfg)
    shutil.rmtree(workdir, ignore_errors=True)
    before = process_cpu()
    params, evaluator = build.build_inner(domain, cfg, workdir, host_cores=1)
    warm_start = process_cpu() - before   # SFT, band measurement and the evaluator's set-up (no compilation yet)
    inner_train, validation = split_train(domain.train, int(cfg.outer.split_seed))
    count = int(cfg.outer.num_candidates)
    texts = [f"{1 + k / 10}*g2+g3" for k in range(count)]   # distinct valid rewards; the cost does not depend on them
    programs = stack_programs([compile_expr(parse(t)) for t in texts], len(domain.primitive_names))
    key = jax.random.key(0)

    def iteration(dispatch: str) -> Callable[[], object]:
        chosen = evaluator.with_dispatch(dispatch)
        return lambda: np.asarray(chosen.evaluate_candidates(programs, params, key, inner_train, validation).scores)

    one = compile_expr(parse(texts[0]))
    trained, _ = evaluator.train_final(one, params, key, domain.train)
    return {
        "warm_start_cpu_seconds": warm_start,
        "candidates_per_iteration": count,
        "iteration_cpu_seconds": {d: median_cpu(iteration(d), repeats) for d in ("loop", "batched")},
        "final_training_cpu_seconds": median_cpu(
            lambda: jax.block_until_ready(evaluator.train_final(one, params, key, domain.train)[0]), repeats),
        "candidate_test_cpu_seconds": median_cpu(lambda: evaluator.accuracy(trained, domain.test), repeats),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/symbols_compose.py:hard")
    parser.add_argument("--method", default="derl")
    parser.add_argument("--seeds", type=int, default=3, help="S: the second whole run's seed count (>= 2)")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default="runs/seed_cost")
    parser.add_argument("--out", default="")
    parser.add_argument("--skip-whole", action="store_true", help="only the parts (2.)")
    parser.add_argument("--override", action="append", default=[],
                        help="a config override for every run, e.g. --override=--config.policy.hidden_size=32")
    args = parser.parse_args(argv)
    if args.seeds < 2:
        parser.error(f"--seeds must be >= 2, got {args.seeds}")
    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    payload = {"config": args.config, "overrides": args.override, "method": args.method, "iterations": args.iterations,
               "parts": parts(args.config, os.path.join(workdir, "parts"), args.repeats, args.override)}
    print(json.dumps(payload["parts"], indent=1), flush=True)
    if not args.skip_whole:
        one = whole_run(compare_command(args.config, args.method, [0], args.iterations, os.path.join(workdir, "one"),
                                          args.override),
                        os.path.join(workdir, "one"))
        many = whole_run(compare_command(args.config, args.method, list(range(args.seeds)), args.iterations,
                                         os.path.join(workdir, "many"), args.override), os.path.join(workdir, "many"))
        per_seed = (many["cpu_seconds"] - one["cpu_seconds"]) / (args.seeds - 1)
        payload["whole"] = {"one_seed": one, f"{args.seeds}_seeds": many, "cpu_seconds_per_seed": per_seed,
                            "one_off_cpu_seconds": one["cpu_seconds"] - per_seed}
        print(f"per seed {per_seed:.0f} CPU-s; one-off {one['cpu_seconds'] - per_seed:.0f} CPU-s", flush=True)
    for path in [os.path.join(workdir, "seed_cost.json")] + ([args.out] if args.out else []):
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(payload, handle, indent=2)


if __name__ == "__main__":
    main()
