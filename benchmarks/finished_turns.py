"""How many of a household training step's turn slots belong to episodes that have already ended.

    python benchmarks/finished_turns.py --levels L0 L2 --batches 16 \
        --workdir runs/household --out benchmarks/results/finished_turns.json

The turn scan runs `max_turns` turns for every episode of a step, ended or not (static shapes),
and the update reads every turn row. What that costs is the share of (episode, turn) slots
after an episode's end. For each level the default preset's base policy (built as a run builds
it, `rl.setup.base_policy`, cached in `<workdir>_<level>`) samples `--batches` training steps'
worth of episodes (prompts_per_step x group_size each, the training temperature); per level:
the share of slots that are live, turns per episode (all, and successful ones), the sampled
success, and how many step batches ended every episode before the last turn (only those could
skip turns by stopping the scan early).
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import report  # noqa: E402


def measure(level: str, batches: int, workdir: str, seed: int = 0) -> dict:
    """One level's figures (module docstring)."""
    from configs import household
    from derl_jax.domains.registry import get_domain
    from derl_jax.rl import setup
    from derl_jax.rl.config import inner_config
    from derl_jax.rl.rollout import device_rollout

    cfg = household.get_config("default")
    cfg.seed = seed
    cfg.domain.update(level=level)
    domain = get_domain("household").build(cfg)
    inner = inner_config(cfg, domain.max_new_tokens)
    graphdef, params = setup.base_policy(domain, cfg, f"{workdir}_{level}")
    per_step = inner.rollouts_per_step
    rows = np.random.default_rng(seed).choice(domain.train.size, batches * inner.prompts_per_step, replace=False)
    episodes = domain.train.take(jax.numpy.asarray(np.repeat(rows, inner.group_size)))
    play = jax.jit(device_rollout(domain, graphdef, inner).fn, static_argnums=3)
    episode, _ = play(params, episodes, jax.random.key(seed), False)
    alive = np.asarray(episode["step_mask"])                 # bool[batches * per_step, max_turns]
    success = np.asarray(episode["success"]) > 0
    turns = alive.sum(axis=1)
    steps_ended_early = sum(not alive[i:i + per_step, -1].any() for i in range(0, alive.shape[0], per_step))
    return {"level": level, "episodes": int(alive.shape[0]), "max_turns": int(alive.shape[1]),
            "live_slot_share": float(alive.mean()), "finished_slot_share": float(1.0 - alive.mean()),
            "turns_per_episode": float(turns.mean()),
            "turns_per_successful_episode": float(turns[success].mean()) if success.any() else None,
            "sampled_success": float(success.mean()),
            "step_batches_all_ended_before_last_turn": f"{steps_ended_early}/{batches}"}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", nargs="+", default=["L0"])
    parser.add_argument("--batches", type=int, default=16, help="training steps' worth of episodes per level")
    parser.add_argument("--workdir", default="runs/household", help="base policies are cached in <workdir>_<level>")
    parser.add_argument("--out", default=None, help="also write the result JSON here")
    args = parser.parse_args(argv)
    rows = [measure(level, args.batches, args.workdir) for level in args.levels]
    summary = {f"{row['level']} / finished_slot_share": round(row["finished_slot_share"], 4) for row in rows}
    result = report("finished_turns", rows, config={"levels": args.levels, "batches": args.batches},
                    summary=summary, out=args.out)
    return result


if __name__ == "__main__":
    main()
