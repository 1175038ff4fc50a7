"""DERL on ALFWorld (the real engine: TextWorld's PDDL games through the host-environment
adapter; needs `pip install 'derl_jax[alfworld]'`).

Presets (`--config=configs/alfworld.py:<preset>`):

  default  the paper's setup (Section 3.2, Appendix B) where it states one, ours elsewhere: a
           Qwen2.5-1.5B-Instruct policy prompted as the field prompts agents (chat template, task,
           recent history, admissible actions, RLVMR's reasoning tags, <action> tags;
           derl_jax/domains/agent_prompt.py) and cold-started on expert turns written that way
           (policy.sft_*: 200 steps at 1e-5, 32 turns a step, 10% harmless detours, an expert
           that searches for the task's object in the order of the admissible list instead of
           going where the planner knows it is: ours, the paper gives no cold-start settings), a
           Qwen2.5-0.5B-Instruct Meta-Optimizer from local directories (its training settings
           and sampling temperature 0.7 from the authors' scripts, and its grammar in the
           paper's operator set: configs/common.py META_HF, PAPER_GRAMMAR), 8 rewards per outer
           iteration, 40 inner steps per candidate, 10 outer iterations; final policies of
           DERL 100 steps and of the baselines 150 (`final.baseline_steps`); DERL-pop 10
           iterations x 10 inner steps (`outer.population_iterations`, its steps per candidate
           the final budget divided by them). GRPO + outcome, GRPO + average, DERL and DERL-pop
           over 3 seeds at one level (`domain.level`; run once per level) on every training
           game of ALFWorld's data directory ($ALFWORLD_DATA, as `alfworld-download` writes it),
           tested on ALFWorld's own seen (L0) or unseen (L1, L2) evaluation games. The rollout
           shape (16 tasks x 8 episodes per step, 50 turns, turn prompts of the task, 2 rows of
           256-token observations, a 256-token admissible-actions line and the instruction,
           128-token answers, 8 minibatches) is ours (docs/scale.md); the paper states none.
           Days on 8 accelerators; `--mode=plan` first:

      python launch/run.py --config=configs/alfworld.py --mode=compare --workdir=runs/alfworld_L0 \\
          --config.policy.checkpoint=/models/Qwen2.5-1.5B-Instruct \\
          --config.meta.hf_path=/models/Qwen2.5-0.5B-Instruct

  derl_pop the default preset comparing DERL-pop alone.

  self_guide  Self-Guide's ablation table on the default preset (docs/methods/self_guide.md):
           the policy writes progress+ / progress= / progress- before each action
           (`domain.self_guide`, primitive g_sg = g5), methods `outcome` (GRPO with the
           assessments, no self-reward), `self_guide`, `self_guide_no_warmup`,
           `self_guide_no_anneal`; the compare's base-policy line is inference-only
           self-guidance (no RL).

  self_guide_qwen3_1_7b, self_guide_qwen3_4b  self_guide with the Qwen3-1.7B / Qwen3-4B policy
           that Self-Guide's paper trains (/models/Qwen3-1.7B, /models/Qwen3-4B; their public
           shapes in configs/common.py QWEN3_*_SHAPE, so `--mode=plan` plans them without the files).

  tiny     generated games (no data directory), 6 training + 2 test games, 6 turns, a tiny
           scratch policy on the word vocabulary; about a minute on a laptop CPU:

      python launch/run.py --config=configs/alfworld.py:tiny --mode=final \\
          --expression='g1+0.5*g2' --workdir=runs/alfworld_tiny

  sg_tiny  tiny with self-assessment and self_guide's methods; final mode with the Self-Guide
           reward of the default trust schedule:

      python launch/run.py --config=configs/alfworld.py:sg_tiny --mode=final \\
          --expression='g1+clip(min((u-0.2)/0.2,(1-u)/0.2),0,1)*g5' --workdir=runs/alfworld_sg_tiny

Every field can be overridden from the command line, e.g. `--config.domain.level=L2`.

Fields of this experiment (the shared blocks are documented in configs/common.py):
  domain.*   kind, data_dir (ALFWorld's json_2.1.1 directory or the one holding it, environment
             variables expanded; "" = games generated from split_seed, see
             derl_jax/domains/alfworld/problems.py), level ("L0" | "L1" | "L2";
             derl_jax/domains/alfworld/splits.py), kinds (ALFWorld task kinds played),
             held_out_kinds (the kinds L2 evaluates on and never trains on), num_train /
             num_test games per kind (0 = every game of the data directory's split; N = N per
             kind drawn at random with split_seed), split_seed, max_turns per episode, history (W, the turns
             of actions and observations in each prompt), obs_length / action_length (tokens
             per observation / action), description_length (tokens of the task line in the task
             prompt), num_workers (engine processes; 0 = in this process), self_guide (the
             policy writes a self-assessment word before each action, which the engine never
             sees; adds primitive g_sg), self_rewards (the internal rewards of progress+ /
             progress= / progress-, default (0.1, 0.0, -0.1))
  trust.*    Self-Guide's trust schedule (methods `self_guide*`; configs/common.py)
  policy.*   the policy: checkpoint / tokenizer (local Hugging Face directories; "" = a scratch
             policy on the domain's word vocabulary), its warm start or cold start on expert
             episodes: sft_steps, sft_lr, sft_batch_size, sft_perturb_rate, sft_expert ("search":
             the task's object searched for in the admissible list's order, then the planner;
             "planner": the planner's plan, which knows where the object is)
"""

from __future__ import annotations

import ml_collections

from configs import common

METHODS = ("outcome", "average", "derl", "derl_pop")
ALL_KINDS = ("pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
             "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place")
# L2 holds out cool & place and pick two & place, as the household domain does (our choice).
L2_HELD_OUT = ("pick_cool_then_place_in_recep", "pick_two_obj_and_place")
TASK = ("The policy is a household robot in a text game (ALFWorld): each turn it reads what it sees and writes "
        "one action, until the task it was given (put, clean, heat, cool or examine objects) is done.")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The config of preset `arg`: "default" (None or empty), "derl_pop", "self_guide", "tiny", "sg_tiny",
    "self_guide_qwen3_1_7b" or "self_guide_qwen3_4b"."""
    return common.preset({"default": default, "derl_pop": derl_pop, "self_guide": self_guide, "tiny": tiny,
                          "sg_tiny": sg_tiny,
                          "self_guide_qwen3_1_7b": lambda: common.self_guide_qwen3(self_guide(), "1_7b"),
                          "self_guide_qwen3_4b": lambda: common.self_guide_qwen3(self_guide(), "4b")},
                         arg, "configs/alfworld.py")


def default() -> ml_collections.ConfigDict:
    domain = {"kind": "alfworld", "data_dir": "$ALFWORLD_DATA", "level": "L0", "kinds": ALL_KINDS,
              "held_out_kinds": L2_HELD_OUT, "num_train": 0, "num_test": 0, "split_seed": 0, "max_turns": 50,
              "history": 2, "obs_length": 256, "action_length": 128, "description_length": 255, "admissible_length": 256,
              "num_workers": 16,
              "self_guide": False, "self_rewards": (0.1, 0.0, -0.1)}
    policy = {"checkpoint": "/models/Qwen2.5-1.5B-Instruct", "tokenizer": "", "param_dtype": "float32",
              "compute_dtype": "bfloat16", "remat": True, **common.QWEN25_1_5B_SHAPE, "prompt_style": "auto",
              "sft_steps": 200, "sft_lr": 1e-5, "sft_batch_size": 32, "sft_perturb_rate": 0.1,
              "sft_expert": "search"}
    cfg = common.base("alfworld", domain, policy)
    cfg.inner.update(steps=40, prompts_per_step=16, group_size=8, lr=1e-6, kl=0.01, minibatches=8, eval_batch_size=64)
    common.hf_meta(cfg, "/models/Qwen2.5-0.5B-Instruct")
    cfg.meta.update(task_description=TASK, primitive_descriptions=common.AGENT_PRIMITIVE_DESCRIPTIONS)
    cfg.outer.update(iterations=10, num_candidates=8, population_iterations=10, population_inner_steps=0)
    cfg.final.update(steps=100, baseline_steps=150)
    cfg.compare.methods = METHODS
    return cfg


def derl_pop() -> ml_collections.ConfigDict:
    cfg = default()
    cfg.name = "alfworld_derl_pop"
    cfg.compare.methods = ("derl_pop",)
    return cfg


def self_guide() -> ml_collections.ConfigDict:
    return common.self_guide(default(), "alfworld_self_guide")


def tiny() -> ml_collections.ConfigDict:
    cfg = common.toy_search(default())
    cfg.name = "alfworld_tiny"
    cfg.domain.update(data_dir="", num_train=3, num_test=1, kinds=(ALL_KINDS[0], ALL_KINDS[2]), held_out_kinds=(),
                      max_turns=6, history=1, obs_length=40, action_length=10, description_length=16, num_workers=0)
    cfg.policy.update(checkpoint="", tokenizer="", param_dtype="float32", compute_dtype="float32", remat=False,
                      **common.TOY_MODEL, head_dim=16, sft_steps=40, sft_lr=1e-2, sft_batch_size=16,
                      sft_perturb_rate=0.3)
    cfg.inner.update(prompts_per_step=2, group_size=2, lr=3e-4, kl=0.0, minibatches=1, eval_batch_size=8)
    return cfg


def sg_tiny() -> ml_collections.ConfigDict:
    return common.self_guide(tiny(), "alfworld_sg_tiny")
