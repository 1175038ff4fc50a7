"""DERL on the symbols domain: reverse a short letter string, a task whose best rewards are known.

Presets (`--config=configs/symbols.py:<preset>`):

  default  one candidate's inner training costs about 0.5 CPU-seconds, so the outer loop can
           run many iterations over many seeds (docs/domains/symbols.md has the reference
           table and the timings). A fixed reward (under a minute):

      python launch/run.py --config=configs/symbols.py --mode=final --expression="g2" --workdir=runs/symbols_g2

           a DERL search of 20 outer iterations x 8 candidates (about 3 CPU-minutes; 6.5
           minutes on a 2-core CPU shared with other jobs):

      python launch/run.py --config=configs/symbols.py --mode=search --config.outer.iterations=20 \\
          --workdir=runs/symbols_search

           DERL over 10 seeds (15 minutes on that shared 2-core CPU):

      python launch/run.py --config=configs/symbols.py --mode=compare --config.outer.iterations=20 \\
          --config.compare.methods="('derl',)" --config.compare.seeds="(0,1,2,3,4,5,6,7,8,9)"

  smoke    the same pipeline at toy sizes (used by tests; about 1.5 minutes on that shared
           2-core CPU, mostly start-up and compilation):

      python launch/run.py --config=configs/symbols.py:smoke --mode=compare --workdir=runs/symbols_smoke

Every field can be overridden from the command line (`--config.inner.steps=32`). The shared
blocks are documented in configs/common.py; this experiment writes:
  domain.*   strings: domain kind, generation seed, train/test sizes, alphabet size, string
             lengths, generation budget per completion (max_new_tokens), the base policy's
             declared band (base_policy_band: a run whose warm start falls outside is refused)
  policy.*   the policy model (a tiny Qwen2-style decoder) and its supervised warm start on a
             corpus that mostly copies the string (sft_mix, sft_reverse_rate,
             sft_extra_strings: `derl_jax/domains/symbols.py`)
  compare.own_base_policy  every compare seed warm-starts its own base policy (seed s: config.seed=s)
  inner.*    a short, cheap inner run; final.steps equals inner.steps, so a final policy gets
             the budget of one candidate
"""

from __future__ import annotations

import ml_collections

from configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The config of preset `arg`: "default" (None or empty) or "smoke"."""
    return common.preset({"default": default, "smoke": smoke}, arg, "configs/symbols.py")


def default() -> ml_collections.ConfigDict:
    domain = {"kind": "symbols", "seed": 0, "num_train": 1250, "num_test": 1000, "alphabet_size": 8, "min_len": 4,
              "max_len": 6, "max_new_tokens": 8,
              # ours: the base policy's sampled means measured over seeds 0-5 (position 0.305-0.318, exact
              # 0.004-0.008; benchmarks/results/symbols_band.json), about 4 standard errors either side
              "base_policy_band": {"position": (0.27, 0.35), "exact": (0.0, 0.03)}}
    policy = {
        **common.SCRATCH_MODEL,
        "sft_steps": 2000,
        "sft_lr": 3e-3,
        "sft_batch_size": 64,
        "sft_mix": {"mixed": 0.85, "marked": 0.15},
        "sft_reverse_rate": 0.2,
        "sft_extra_strings": 6000,
    }
    cfg = common.base("symbols", domain, policy)
    cfg.inner.update(steps=64, prompts_per_step=8, group_size=8, lr=1e-3, kl_metric=False, eval_batch_size=256)
    cfg.final.steps = cfg.inner.steps
    cfg.compare.own_base_policy = True   # a warm start is about a CPU-minute: every compare seed builds its own
    return cfg


def smoke() -> ml_collections.ConfigDict:
    cfg = common.toy_search(default())
    cfg.name = "symbols_smoke"
    cfg.domain.update(num_train=40, num_test=20)
    cfg.policy.update(**common.TOY_MODEL, sft_steps=20, sft_batch_size=16, sft_extra_strings=0)
    cfg.domain.base_policy_band = {}   # the toy warm start has no declared difficulty
    cfg.inner.update(prompts_per_step=4, group_size=2)
    return cfg
