"""What the household policy does with a window and with the whole history: warm-started base
policies of the default preset, their greedy success and how often they walk back.

    python benchmarks/household_history.py --levels L0 L2 --seeds 0 1 2 --workdir runs/history \
        --out benchmarks/results/household_history.json

For every level, seed and history setting (HISTORIES: the W = 2 window at prompt_budget 128, the
whole history at 384) the run's base policy is built as a run builds it (`rl.setup.base_policy`:
the warm start on the perturbed expert, the validation rows held out; cached in --workdir) and
played greedily on the validation and test tasks. Per setting: success, turns per episode, and
`revisit_rate`, the share of `go to` actions that lead back to a receptacle the episode had
already gone to (the back-and-forth a window that forgets where it searched leads to). The
scripted expert's rate on the same tasks is the reference (it goes back only to a receptacle it
needs: the goal, an appliance). Rows per (setting, level, seed); the summary gives each
setting's mean over the seeds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import report  # noqa: E402

HISTORIES = {
    "window W=2, prompt_budget=128": {"history": "window", "window": 2, "prompt_budget": 128},
    "whole history, prompt_budget=384": {"history": "full", "prompt_budget": 384},
}


def revisits(tokens: np.ndarray, taken: np.ndarray, tasks) -> tuple[int, int]:
    """(go-to actions that return to a receptacle gone to before in the episode, go-to actions) of
    greedy episodes: tokens i32[N, S, A], taken bool[N, S], tasks the N episodes' `Task` rows."""
    from derl_jax.domains.household import actions as A
    from derl_jax.domains.household import tasks as T

    parse = jax.jit(jax.vmap(jax.vmap(A.parse_action, in_axes=(0, None))))
    parsed = parse(jax.numpy.asarray(tokens), T.to_device(tasks))
    template, recep = np.asarray(parsed.template), np.asarray(parsed.recep)
    back = total = 0
    for n in range(tokens.shape[0]):
        seen = set()
        for t in np.flatnonzero(taken[n]):
            if template[n, t] == A.GO and recep[n, t] >= 0:
                total += 1
                back += int(recep[n, t]) in seen
                seen.add(int(recep[n, t]))
    return back, total


def measure(level: str, seed: int, label: str, overrides: dict, workdir: str) -> dict:
    """One base policy's greedy figures (module docstring)."""
    from configs import household
    from derl_jax.domains.base import split_train
    from derl_jax.domains.household.domain import tasks_of
    from derl_jax.domains.registry import get_domain
    from derl_jax.rl import setup
    from derl_jax.rl.config import inner_config
    from derl_jax.rl.rollout import device_rollout

    cfg = household.get_config("default")
    cfg.seed = seed
    cfg.domain.update(level=level, **overrides)
    domain = get_domain("household").build(cfg)
    start = time.perf_counter()
    graphdef, params = setup.base_policy(domain, cfg, os.path.join(workdir, f"{level}_seed{seed}_{overrides['history']}"))
    warm_start_s = time.perf_counter() - start
    _, validation = split_train(domain.train, int(cfg.outer.split_seed))
    play = jax.jit(device_rollout(domain, graphdef, inner_config(cfg, domain.max_new_tokens)).fn, static_argnums=3)
    row = {"setting": label, "level": level, "seed": seed, "warm_start_s": round(warm_start_s, 1)}
    for name, split in (("validation", validation), ("test", domain.test)):
        episode, _ = play(params, split, jax.random.key(0), True)
        taken = np.asarray(episode["step_mask"])
        back, total = revisits(np.asarray(episode["tokens"]), taken, tasks_of(split))
        row.update({f"{name}_success": float(np.mean(np.asarray(episode["success"]))),
                    f"{name}_turns": float(taken.sum(1).mean()),
                    f"{name}_revisit_rate": back / max(total, 1)})
    return row


def expert_row(level: str) -> dict:
    """The scripted expert's success, turns and revisit rate on the test tasks of `level`."""
    from configs import household
    from derl_jax.domains.household import expert
    from derl_jax.domains.household.domain import tasks_of
    from derl_jax.domains.registry import get_domain

    cfg = household.get_config("default")
    cfg.domain.update(level=level)
    domain = get_domain("household").build(cfg)
    tasks = tasks_of(domain.test)
    from derl_jax.domains.household import tasks as T

    episodes = jax.device_get(expert.rollout(domain.env, T.to_device(tasks), jax.random.key(0)))
    taken = np.asarray(episodes["step_mask"])
    back, total = revisits(np.asarray(episodes["actions"]), taken, tasks)
    return {"setting": "scripted expert", "level": level, "seed": None,
            "test_success": float(np.asarray(episodes["success"]).mean()), "test_turns": float(taken.sum(1).mean()),
            "test_revisit_rate": back / max(total, 1)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", nargs="+", default=["L0"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--workdir", default="runs/household_history", help="where the base policies are cached")
    parser.add_argument("--out", default=None, help="also write the result JSON here")
    args = parser.parse_args(argv)
    rows = [expert_row(level) for level in args.levels]
    rows += [measure(level, seed, label, overrides, args.workdir)
             for level in args.levels for seed in args.seeds for label, overrides in HISTORIES.items()]
    summary = {}
    for label in HISTORIES:
        for level in args.levels:
            mine = [r for r in rows if r["setting"] == label and r["level"] == level]
            for name in ("validation_success", "test_success", "test_turns", "test_revisit_rate"):
                summary[f"{label} / {level} / {name}"] = round(statistics.mean(r[name] for r in mine), 4)
    result = report("household_history", rows, config={"levels": args.levels, "seeds": args.seeds},
                    summary=summary, out=args.out)
    return result


if __name__ == "__main__":
    main()
