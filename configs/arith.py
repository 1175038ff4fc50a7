"""DERL on the embedded arithmetic domain (procedural integer expressions, character tokens).

Presets (`--config=configs/arith.py:<preset>`):

  default  the full comparison: every method of `ALL_METHODS` (derl, derl_pop, random,
           evolution and the three fixed baselines outcome, outcome_format, average) over
           5 seeds, 1,000 training problems (800 inner-training, 200 validation) and 1,000
           test problems, with tiny models (wall time and CPU time: docs/results/arith.md):

      python launch/run.py --config=configs/arith.py --mode=compare --workdir=runs/arith

  smoke    the same pipeline at toy sizes (used by tests; well under a minute of work
           outside start-up):

      python launch/run.py --config=configs/arith.py:smoke --mode=compare --workdir=runs/arith_smoke

Every field can be overridden from the command line, e.g. `--config.outer.iterations=3`
or `--config.compare.methods="('derl','outcome')"`; the launcher checks every value before
anything is built and names the first bad field.

Fields of this experiment (the shared blocks inner, meta, outer, evolution, final, compare,
mesh and primitives are documented in configs/common.py):
  domain.*   problems: domain kind, generation seed, train/test sizes, difficulty levels,
             generation budget per completion (max_new_tokens)
  policy.*   the policy model (a tiny Qwen2-style decoder) and its supervised warm start on
             the domain's corpus (the "base policy" every method starts from)
"""

from __future__ import annotations

import ml_collections

from configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The config of preset `arg`: "default" (None or empty) or "smoke"."""
    return common.preset({"default": default, "smoke": smoke}, arg, "configs/arith.py")


def default() -> ml_collections.ConfigDict:
    domain = {"kind": "arith", "seed": 0, "num_train": 1000, "num_test": 1000, "levels": (1, 2), "max_new_tokens": 28}
    policy = {
        **common.SCRATCH_MODEL,
        "sft_steps": 600,
        "sft_lr": 3e-3,
        "sft_batch_size": 64,
        "sft_extra_problems": 1000,
        "sft_mix": {"steps": 0.35, "no_box": 0.35, "no_steps": 0.1, "wrong_step": 0.1, "plain": 0.1},
    }
    cfg = common.base("arith", domain, policy)
    cfg.compare.seeds = (0, 1, 2, 3, 4)
    return cfg


def smoke() -> ml_collections.ConfigDict:
    cfg = common.toy_search(default())
    cfg.name = "arith_smoke"
    cfg.domain.update(num_train=40, num_test=20, levels=(1,), max_new_tokens=16)
    cfg.policy.update(**common.TOY_MODEL, sft_steps=20, sft_batch_size=16, sft_extra_problems=0)
    cfg.inner.update(prompts_per_step=4, group_size=2)
    return cfg
