"""DERL on the JAX household environment (ALFWorld's six task kinds, word-level tokens).

Presets (`--config=configs/household.py:<preset>`):

  default  GRPO + outcome, GRPO + average, DERL and DERL-pop over 3 seeds at one generalisation
           level (`domain.level`, L0 by default; run once per level for the L0/L1/L2 table),
           with tiny models:

      python launch/run.py --config=configs/household.py --mode=compare --workdir=runs/household_L0
      python launch/run.py --config=configs/household.py --config.domain.level=L2 --mode=compare \\
          --workdir=runs/household_L2

  smoke    the same pipeline at toy sizes (used by tests):

      python launch/run.py --config=configs/household.py:smoke --mode=compare --workdir=runs/household_smoke

Every field can be overridden from the command line, e.g. `--config.domain.max_turns=20`.

Fields of this experiment (the shared blocks are documented in configs/common.py):
  domain.*   kind, level ("L0" | "L1" | "L2"), seed (tasks and the seen/unseen type split),
             num_train / num_test tasks, held_out_kinds (the two kinds L2 tests on; indices of
             pick, examine, clean, heat, cool, pick_two), max_turns per episode, history (W,
             the turns of actions and observations in each prompt)
  policy.*   the policy model and its warm start on the perturbed expert's turns:
             sft_perturb_rate (share of random actions), sft_extra_tasks (fresh training tasks
             played for the corpus besides the training split)
"""

from __future__ import annotations

import ml_collections

from configs import common

METHODS = ("outcome", "average", "derl", "derl_pop")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The config of preset `arg`: "default" (None or empty) or "smoke"."""
    return common.preset({"default": default, "smoke": smoke}, arg, "configs/household.py")


def default() -> ml_collections.ConfigDict:
    domain = {"kind": "household", "level": "L0", "seed": 0, "num_train": 240, "num_test": 120,
              "held_out_kinds": (4, 5), "max_turns": 20, "history": 2}
    policy = {**common.SCRATCH_MODEL, "sft_steps": 400, "sft_lr": 3e-3, "sft_batch_size": 64,
              "sft_perturb_rate": 0.3, "sft_extra_tasks": 480}
    cfg = common.base("household", domain, policy)
    cfg.inner.update(prompts_per_step=4, group_size=4)
    cfg.compare.methods = METHODS
    return cfg


def smoke() -> ml_collections.ConfigDict:
    cfg = common.toy_search(default())
    cfg.name = "household_smoke"
    cfg.domain.update(num_train=20, num_test=8, max_turns=6)
    cfg.policy.update(**common.TOY_MODEL, sft_steps=10, sft_batch_size=16, sft_extra_tasks=0)
    cfg.inner.update(prompts_per_step=2, group_size=2, eval_batch_size=8)
    cfg.compare.methods = ("derl", "outcome")
    return cfg
