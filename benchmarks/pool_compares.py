"""Pool kept compare runs of one config over disjoint seeds: the endpoints and the protocols over all their seeds.

    python -m benchmarks.pool_compares --config=configs/symbols_compose.py:hard \\
        --runs=docs/results/runs/symbols_compose_hard,docs/results/runs/symbols_compose_hard_s10_14,docs/results/runs/symbols_compose_hard_s15_19 \\
        --methods=derl,random --out=benchmarks/results/symbols_compose_hard_pooled

A compare's seeds are independent replications, so runs of the same command over disjoint seeds
pool into one sample: each kept run's `results.json` (its `per_seed` rows) and `histories/`
give `MethodResult`s and search histories per (method, seed); the endpoints E1-E3 of the first
method against the second (`derl_jax.experiment.endpoints`, the config's domain classifying the
rewards) and the paper's, repeated and re-evaluated protocols (`report.protocol_summary`) are
computed over the union, with the paired difference of each protocol (Student-t over seeds).
Runs whose commands differ other than in their seeds and methods, or that share a seed, are
refused. Writes `<out>.json` and `<out>.md`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from typing import Mapping, Sequence

from derl_jax.experiment import endpoints, stats
from derl_jax.experiment.pages import kept_histories
from derl_jax.experiment.report import RESULTS_JSON, protocol_summary
from derl_jax.experiment.results import MethodResult
from derl_jax.experiment.runtime import RUN_INFO_FILE

VARYING_FLAGS = ("--config.compare.seeds", "--config.compare.methods", "--workdir")


def command_without_varying_flags(command: str) -> list[str]:
    """A kept run's command without the flags that may differ between pooled runs (`VARYING_FLAGS`)."""
    return [word for word in shlex.split(command) if not word.startswith(VARYING_FLAGS)]


def method_results(payload: Mapping, methods: Sequence[str]) -> dict[str, list[MethodResult]]:
    """{method: MethodResults} of a results.json's `per_seed` rows (no curves or budgets: the
    endpoints and protocols need none)."""
    fields = set(MethodResult.__dataclass_fields__)
    out = {}
    for method in methods:
        rows = payload["per_seed"].get(method)
        if rows is None:
            raise ValueError(f"pool_compares: the run has no method {method!r} (it has {sorted(payload['per_seed'])})")
        out[method] = [MethodResult.from_json({"method": method, "budget": {}, "per_iteration": None, "final_curves": {},
                                               **{k: v for k, v in row.items() if k in fields}}) for row in rows]
    return out


def pool(runs: Sequence[tuple[str, Mapping, Mapping]], methods: Sequence[str]
         ) -> tuple[dict[str, list[MethodResult]], dict[str, dict[int, list]]]:
    """(results, histories) over `runs` = [(name, results.json payload, {method: {seed: history}})],
    each seed once per method; a seed in two runs is refused."""
    results: dict[str, list[MethodResult]] = {m: [] for m in methods}
    histories: dict[str, dict[int, list]] = {m: {} for m in methods}
    owner: dict[tuple[str, int], str] = {}
    for name, payload, kept in runs:
        for method, rows in method_results(payload, methods).items():
            for row in rows:
                if (method, row.seed) in owner:
                    raise ValueError(f"pool_compares: seed {row.seed} of {method} is in {owner[method, row.seed]} and {name}")
                owner[method, row.seed] = name
                results[method].append(row)
            histories[method].update(kept.get(method, {}))
    for method in methods:
        results[method].sort(key=lambda r: r.seed)
    return results, histories


def protocol_differences(results: Mapping[str, Sequence[MethodResult]], method: str, baseline: str) -> dict:
    """{protocol: stats.t_test of the per-seed difference method − baseline} for the paper's
    protocol (the first key's retrained test), the repeated one (mean over keys) and the
    re-evaluated one, where both methods have it (fractions)."""
    by_seed = {m: {r.seed: r for r in results[m]} for m in (method, baseline)}
    seeds = sorted(set(by_seed[method]) & set(by_seed[baseline]))
    values = {
        "paper": lambda r: float(r.retrained_test if r.retrained_test is not None else r.test),
        "repeated": endpoints.repeated_test,
        "reevaluated": lambda r: float(r.reevaluated["test"]) if r.reevaluated else None,
    }
    out = {}
    for protocol, value in values.items():
        pairs = [(value(by_seed[method][s]), value(by_seed[baseline][s])) for s in seeds]
        if pairs and all(a is not None and b is not None for a, b in pairs):
            out[protocol] = stats.t_test([a - b for a, b in pairs])
    return out


def markdown(found: Mapping, method: str, baseline: str) -> str:
    """The pooled endpoints table, the protocols per method and their paired differences (%)."""
    lines = [f"Pooled over seeds {found['seeds']} ({len(found['seeds'])}) of {', '.join(found['runs'])}.", "",
             endpoints.endpoints_table(found["endpoints"]),
             "| method | paper | repeated | re-evaluated |", "|---|---|---|---|"]
    for m, row in found["protocols"].items():
        lines.append(f"| {m} | " + " | ".join(stats.format_summary(row[k], digits=1) if k in row else "-"
                                              for k in ("paper", "repeated", "reevaluated")) + " |")
    lines += ["", f"| {method} − {baseline} | difference | 95% CI (t over seeds) | p |", "|---|---:|---|---:|"]
    for protocol, row in found["differences"].items():
        lines.append(f"| {protocol} | {100 * row['difference']:+.1f} | [{100 * row['ci95_low']:+.1f}, "
                     f"{100 * row['ci95_high']:+.1f}] | {row['p_value']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the runs' config (path[:preset]): its domain classifies the rewards")
    parser.add_argument("--runs", required=True, help="','-separated kept run folders")
    parser.add_argument("--methods", default="derl,random", help="method,baseline")
    parser.add_argument("--out", required=True, help="<out>.json and <out>.md")
    args = parser.parse_args(argv)
    method, baseline = [m.strip() for m in args.methods.split(",")]
    folders = [f.strip() for f in args.runs.split(",") if f.strip()]
    runs, commands = [], {}
    for folder in folders:
        with open(os.path.join(folder, RESULTS_JSON), encoding="utf-8") as handle:
            payload = json.load(handle)
        with open(os.path.join(folder, RUN_INFO_FILE), encoding="utf-8") as handle:
            commands[folder] = command_without_varying_flags(json.load(handle)["command"])
        runs.append((os.path.basename(folder.rstrip("/")), payload, kept_histories(folder)))
    first = folders[0]
    for folder, command in commands.items():
        if command != commands[first]:
            raise SystemExit(f"pool_compares: {folder} ran {' '.join(command)}, {first} ran {' '.join(commands[first])}")
    if f"--config={args.config}" not in commands[first]:
        raise SystemExit(f"pool_compares: the runs did not use --config={args.config}")

    from benchmarks.symbols_reference import load_config
    from derl_jax.domains.base import reward_classifier
    from derl_jax.domains.registry import get_domain

    cfg = load_config(args.config, 0, [w for w in commands[first] if w.startswith("--config.") and "=" in w])
    domain = get_domain(cfg.domain.kind).build(cfg)
    results, histories = pool(runs, (method, baseline))
    found = {
        "runs": [name for name, _, _ in runs],
        "seeds": [r.seed for r in results[method]],
        "endpoints": endpoints.endpoint_rows(results, histories, reward_classifier(domain), pairs=((method, baseline),)),
        "protocols": protocol_summary(results),
        "differences": protocol_differences(results, method, baseline),
    }
    with open(args.out + ".json", "w", encoding="utf-8") as handle:
        json.dump(found, handle, indent=1)
    text = markdown(found, method, baseline)
    with open(args.out + ".md", "w", encoding="utf-8") as handle:
        handle.write(text)
    print(text)


if __name__ == "__main__":
    main()
