"""DERL on ALFWorld (the real engine: TextWorld's PDDL games through the host-environment
adapter; needs `pip install 'derl_jax[alfworld]'`).

Presets (`--config=configs/alfworld.py:<preset>`):

  default  the paper's settings (Section 4 and Appendix C): Qwen2.5-1.5B-Instruct policy and
           Qwen2.5-0.5B-Instruct Meta-Optimizer from local directories, 8 rewards per outer
           iteration, 40 inner steps per candidate, 10 outer iterations, 100 final steps; GRPO +
           outcome, GRPO + average, DERL and DERL-pop over 3 seeds at one level (`domain.level`;
           run once per level) on the games of ALFWorld's data directory:

      python launch/run.py --config=configs/alfworld.py --mode=compare --workdir=runs/alfworld_L0 \\
          --config.domain.data_dir=$ALFWORLD_DATA/json_2.1.1 \\
          --config.policy.checkpoint=/models/Qwen2.5-1.5B-Instruct \\
          --config.meta.hf_path=/models/Qwen2.5-0.5B-Instruct

  derl_pop the paper's DERL-pop schedule on ALFWorld: 10 outer iterations x 10 inner steps.

  tiny     generated games (no data directory), 6 training + 2 test games, 6 turns, a tiny
           scratch policy on the word vocabulary; about a minute on a laptop CPU:

      python launch/run.py --config=configs/alfworld.py:tiny --mode=final \\
          --expression='g1+0.5*g2' --workdir=runs/alfworld_tiny

Every field can be overridden from the command line, e.g. `--config.domain.level=L2`.

Fields of this experiment (the shared blocks are documented in configs/common.py):
  domain.*   kind, data_dir (ALFWorld's json_2.1.1 directory; "" = games generated from
             split_seed, see derl_jax/domains/alfworld/problems.py), level ("L0" | "L1" | "L2";
             derl_jax/domains/alfworld/splits.py), kinds (ALFWorld task kinds played),
             held_out_kinds (the kinds L2 evaluates on and never trains on), num_train /
             num_test games per kind, split_seed, max_turns per episode, history (W, the turns
             of actions and observations in each prompt), obs_length / action_length (tokens
             per observation / action), description_length (tokens of the task line in the task
             prompt), num_workers (engine processes; 0 = in this process)
  policy.*   the policy: checkpoint / tokenizer (local Hugging Face directories; "" = a scratch
             policy on the domain's word vocabulary, warm-started on the planner's plans:
             sft_steps, sft_lr, sft_batch_size, sft_perturb_rate)
"""

from __future__ import annotations

import ml_collections

from configs import common

METHODS = ("outcome", "average", "derl", "derl_pop")
ALL_KINDS = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
             "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")
# L2 holds out cool & place and pick two & place, as the household domain does (our choice).
L2_HELD_OUT = ("pick_cool_then_place_in_recep", "pick_two_obj_and_place")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The config of preset `arg`: "default" (None or empty), "derl_pop" or "tiny"."""
    return common.preset({"default": default, "derl_pop": derl_pop, "tiny": tiny}, arg, "configs/alfworld.py")


def default() -> ml_collections.ConfigDict:
    domain = {"kind": "alfworld", "data_dir": "", "level": "L0", "kinds": ALL_KINDS, "held_out_kinds": L2_HELD_OUT,
              "num_train": 20, "num_test": 10, "split_seed": 0, "max_turns": 30, "history": 2, "obs_length": 128,
              "action_length": 16, "description_length": 32, "num_workers": 16}
    policy = {"checkpoint": "/models/Qwen2.5-1.5B-Instruct", "tokenizer": "", "param_dtype": "bfloat16",
              "compute_dtype": "bfloat16", "remat": True, **common.SCRATCH_MODEL, "sft_steps": 0, "sft_lr": 3e-3,
              "sft_batch_size": 64, "sft_perturb_rate": 0.3}
    cfg = common.base("alfworld", domain, policy)
    cfg.inner.update(steps=40, prompts_per_step=8, group_size=8, lr=1e-6, kl=0.01, eval_batch_size=64)
    cfg.meta.update(backbone="hf", hf_path="/models/Qwen2.5-0.5B-Instruct")
    cfg.outer.update(iterations=10, num_candidates=8, population_inner_steps=10)
    cfg.final.steps = 100
    cfg.compare.methods = METHODS
    return cfg


def derl_pop() -> ml_collections.ConfigDict:
    cfg = default()
    cfg.name = "alfworld_derl_pop"
    cfg.outer.update(iterations=10, population_inner_steps=10)
    cfg.compare.methods = ("derl_pop",)
    return cfg


def tiny() -> ml_collections.ConfigDict:
    cfg = common.toy_search(default())
    cfg.name = "alfworld_tiny"
    cfg.domain.update(num_train=3, num_test=1, kinds=(ALL_KINDS[0], ALL_KINDS[2]), held_out_kinds=(), max_turns=6, history=1,
                      obs_length=40, action_length=10, description_length=16, num_workers=0)
    cfg.policy.update(checkpoint="", tokenizer="", param_dtype="float32", compute_dtype="float32", remat=False,
                      **common.TOY_MODEL, sft_steps=40, sft_lr=1e-2, sft_batch_size=16)
    cfg.inner.update(prompts_per_step=2, group_size=2, lr=3e-4, kl=0.0, eval_batch_size=8)
    cfg.meta.update(hf_path="")
    cfg.outer.population_inner_steps = 0
    return cfg
