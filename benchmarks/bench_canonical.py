"""CPU time of `canonical` (the reward key the searches deduplicate on), one cold call per reward.

    python -m benchmarks.bench_canonical                  # 1,000 random valid rewards + the slow one
    python -m benchmarks.bench_canonical --count 200 --out benchmarks/results/bench_canonical.json

Rows: random valid rewards of 3..25 nodes over g1..g4 and u (`bench_expr.random_valid_exprs`,
shaped like Meta-Optimizer outputs), split by whether the size estimate sends them to SymPy
(`expanded_size <= MAX_EXPANDED_ATOMS`) or to the tree's own ordering; and the 78-node legal
reward whose SymPy expansion has tens of thousands of terms (`SLOW`, also read by tests/test_expr_edges.py),
which the estimate sends to the ordering. Each call starts from an empty cache; the time is
`time.process_time` (this process's CPU), after one call that imports and warms SymPy.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks.bench_expr import random_valid_exprs
from benchmarks.common import report
from derl_jax.expr.canonical import MAX_EXPANDED_ATOMS, canonical, expanded_size
from derl_jax.expr.parse import parse

# A legal 78-node reward (it passes `check`): fractional powers of sums of products, which
# SymPy expands into tens of thousands of terms (about 3 s without the size bound).
SLOW = ("((g1+g2+g3+g4+u+1)*(g1*g2+g3*g4+u+2)/(g1+g2*g3+g4*u+3))**1.5*(g1+g2+g3+u+1)**0.5/(g2+g4+1)"
        " + min(g1, g2)*max(g3, u) - abs(g4 - 0.5)*clip(g1 + g2, 0, 1) + abs(g3)")


def cold_seconds(tree) -> float:
    """CPU seconds of one `canonical(tree)` from an empty cache."""
    canonical.cache_clear()
    start = time.process_time()
    canonical(tree)
    return time.process_time() - start


def row(name: str, seconds: list[float]) -> dict:
    values = np.asarray(seconds) * 1e3
    return {"rewards": name, "count": len(values), "median_ms": float(np.median(values)),
            "p99_ms": float(np.percentile(values, 99)), "max_ms": float(values.max())}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    trees = random_valid_exprs(args.count, 4, seed=args.seed)
    cold_seconds(trees[0])
    expanded, ordered = [], []
    for tree in trees:
        (expanded if expanded_size(tree) <= MAX_EXPANDED_ATOMS else ordered).append(cold_seconds(tree))
    rows = [row("random, expanded by SymPy", expanded)]
    if ordered:
        rows.append(row("random, over the size bound", ordered))
    rows.append(row("the 78-node slow reward", [cold_seconds(parse(SLOW, ["g1", "g2", "g3", "g4"]))]))
    return report("canonical_cpu_time", rows, config={"count": args.count, "seed": args.seed,
                                                      "max_expanded_atoms": MAX_EXPANDED_ATOMS}, out=args.out)


if __name__ == "__main__":
    main()
