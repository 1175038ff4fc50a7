"""A learning curve: test accuracy of policies trained with one reward for 0, 10, 20, ... steps.

    python launch/learning_curve.py --config=configs/household.py --expression=g1 \\
        --steps=0,10,20,30,40 --seeds=0,1,2 --workdir=runs/household_curve

Each point is a final-mode training (the full training split, the seed's final key) of that
many steps from the base policy, tested greedily on the test split; step 0 is the base policy
itself. Every (steps, seed) point is written to `<workdir>/steps_<S>/seed_<s>.json` when done,
so an interrupted curve resumes where it stopped. `curve.json` holds the per-point results (and
each point's per-item test scores), the mean with its Student-t 95% interval over seeds;
`curve.png` draws it.

Several curves of one domain (e.g. one per `inner.loss_agg`, same seeds and test items) compare
point by point with `compare_curves`: paired differences over seeds and items, as a compare
reports its methods.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

import numpy as np

from derl_jax.checkpoint import atomic_write_json
from derl_jax.experiment import build, plots, protocol, stats
from derl_jax.experiment.runtime import run_cores

CURVE_JSON = "curve.json"
CURVE_PLOT = "curve.png"


def point_path(workdir: str, steps: int, seed: int) -> str:
    return os.path.join(workdir, f"steps_{steps}", f"seed_{seed}.json")


def learning_curve(cfg: Any, workdir: str, expression: str, steps: Sequence[int], seeds: Sequence[int],
                   *, label: str | None = None) -> dict:
    """Train and test every (steps, seed) point not yet in `workdir`; returns the curve.json content
    {"expression", "steps", "seeds", "test": f[S, seeds] (fractions), "mean", "ci95_low", "ci95_high"}."""
    steps, seeds = sorted({int(s) for s in steps}), [int(s) for s in seeds]
    if not steps or steps[0] < 0 or not seeds:
        raise ValueError(f"learning_curve: needs steps >= 0 and at least one seed, got {steps} and {seeds}")
    domain = build.build_domain(cfg)
    protocol.compile_checked(expression, domain.primitive_names, domain.outcome_index)
    base_params, evaluator = build.build_inner(domain, cfg, workdir, run_cores("final"))
    for count in steps:
        for seed in seeds:
            path = point_path(workdir, count, seed)
            if os.path.exists(path):
                continue
            if count == 0:
                tests, items = protocol.test_accuracies(domain, evaluator, base_params)
                point = {"test": protocol.headline_accuracy(tests), "test_items": items}
            else:
                final = protocol.train_final(expression, domain, evaluator, protocol.run_keys(seed)["final"],
                                             base_params, steps=count)
                point = {"test": final.test, "test_items": final.test_items, "curves": final.curves}
            atomic_write_json(path, {"steps": count, "seed": seed, "expression": expression, **point})
    return summarize_curve(workdir, expression, steps, seeds, label=label)


def summarize_curve(workdir: str, expression: str, steps: Sequence[int], seeds: Sequence[int],
                    *, label: str | None = None) -> dict:
    """curve.json and curve.png from the points in `workdir`."""
    points = [[_load(point_path(workdir, s, seed)) for seed in seeds] for s in steps]
    test = np.array([[point["test"] for point in row] for row in points], np.float64)
    summaries = [stats.summarize(row) for row in test]
    payload = {"label": label or expression, "expression": expression, "steps": list(steps), "seeds": list(seeds),
               "test": test.tolist(),
               "mean": [s["mean"] for s in summaries], "ci95_low": [s["ci95_low"] for s in summaries],
               "ci95_high": [s["ci95_high"] for s in summaries]}
    if all("test_items" in point for row in points for point in row):   # f[steps, seeds, items]
        payload["test_items"] = [[point["test_items"] for point in row] for row in points]
    atomic_write_json(os.path.join(workdir, CURVE_JSON), payload, indent=None)   # per-item scores: one line
    plots.plot_outer_curves({label or expression: test.T}, os.path.join(workdir, CURVE_PLOT), x=list(steps),
                            xlabel="inner GRPO steps", ylabel="greedy test success")
    return payload


def compare_curves(curves: Sequence[Mapping[str, Any]]) -> list[dict]:
    """Each curve after the first against the first, at every step count they share.

    curves: curve.json payloads with `test_items` f[steps, seeds, items], made with the same seeds
    and test items. Returns one row per (curve, steps): {"label", "baseline", "steps"} and
    `stats.paired_difference`'s fields (fractions; Student-t over seeds, two-way bootstrap beside it).
    """
    if len(curves) < 2:
        return []
    first = curves[0]
    rows = []
    for other in curves[1:]:
        if other["seeds"] != first["seeds"]:
            raise ValueError(f"compare_curves: {other['label']!r} has seeds {other['seeds']}, "
                             f"{first['label']!r} has {first['seeds']}: a paired difference needs the same seeds")
        for count in sorted(set(first["steps"]) & set(other["steps"])):
            if count == 0:   # the base policy on both sides
                continue
            a = np.asarray(other["test_items"][other["steps"].index(count)], np.float64)
            b = np.asarray(first["test_items"][first["steps"].index(count)], np.float64)
            rows.append({"label": other["label"], "baseline": first["label"], "steps": count,
                         **stats.paired_difference(a, b)})
    return rows


def _load(path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)
