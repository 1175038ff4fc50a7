"""DERL on the JAX household environment (ALFWorld's six task kinds, word-level tokens).

Presets (`--config=configs/household.py:<preset>`):

  default  GRPO + outcome, GRPO + average, DERL and DERL-pop over 3 seeds at each generalisation
           level L0, L1, L2 (`compare.levels`; one after another in <workdir>/<level>, then the
           methods x levels table results_levels.md), with tiny models; 1,000 training tasks
           (800 inner-training, 200 validation) and 1,000 test tasks; candidates train 30 inner
           steps and final policies 40, where outcome-only GRPO's greedy success has risen
           (docs/results/household.md). Time, estimated from one candidate (~30 CPU-s of training
           and validation) and one final policy (~55 CPU-s with its test): about 2 CPU-hours
           for the three levels:

      python launch/run.py --config=configs/household.py --mode=compare --workdir=runs/household
      python launch/run.py --config=configs/household.py --mode=compare --config.compare.levels="()" \\
          --config.domain.level=L2 --workdir=runs/household_L2      # one level

  smoke    the same pipeline at toy sizes (used by tests):

      python launch/run.py --config=configs/household.py:smoke --mode=compare --workdir=runs/household_smoke

  self_guide  Self-Guide's ablation table in one compare (the policy writes a self-assessment
              before every action; 3 seeds, L0/L1/L2): `outcome` (GRPO with self-guidance, no
              self-reward: the assessments are written and steer actions, the reward is R_env
              alone), `self_guide` (R_env + lambda(u) * g_sg, trapezoid trust schedule `trust`),
              `self_guide_no_warmup` (lambda = 1 from the start), `self_guide_no_anneal` (no
              annealing). Inference-only self-guidance (no RL) is the compare's base-policy line
              (the self-assessing warm start, tested as it is); GRPO without self-assessment is
              `outcome` of the default compare.
  sg_smoke    self_guide at smoke sizes

      python launch/run.py --config=configs/household.py:self_guide --mode=compare --workdir=runs/household_sg

Every field can be overridden from the command line, e.g. `--config.domain.max_turns=20`.

Fields of this experiment (the shared blocks are documented in configs/common.py):
  domain.*   kind, level ("L0" | "L1" | "L2" | "L2-seen"), seed (tasks and the seen/unseen type split),
             num_train / num_test tasks, held_out_kinds (the two kinds L2 tests on; indices of
             pick, examine, clean, heat, cool, pick_two), max_turns per episode, history
             ("window": each turn's prompt holds the task and the last `window` turns, the task
             read once per episode and each turn's window after it; "full": every turn since
             reset, one token stream per episode whose tokens are each read once, in sampling
             and in the update; docs/agent_speed.md),
             window (W), prompt_budget (the most tokens of a turn's prompt; with the window 128
             drops the oldest window tokens of 0.4% of the expert's prompts and halves an inner
             step against 0, room for the whole 221-token window; with the whole history an
             episode ends before a turn whose prompt would not fit: 384 cuts 0.3% of the expert's
             turns (the last turns of its longest episodes), 0 gives every episode room for all
             its turns, 1,221 tokens)
             self_guide (the policy writes progress+ / progress= / progress- before each
             action; adds primitive g_sg, the episode's summed self-reward), self_rewards
             (the internal rewards of the three words, default (0.1, 0.0, -0.1))
  inner.kl_metric  False here: with no KL penalty (inner.kl = 0) the KL-to-start curve would cost a
             reference forward over every turn's row; turn it on to watch the drift
             (--config.inner.kl_metric=True)
  trust.*    Self-Guide's trust schedule lambda(u) (method `self_guide`): warmup, ramp_end,
             anneal_start, fractions of inner training (derl_jax/selfguide.py)
  policy.*   the policy model and its warm start on the perturbed expert's turns:
             sft_perturb_rate (share of random actions), sft_extra_tasks (fresh training tasks
             played for the corpus besides the training split), sft_rename (each corpus episode
             renames its entities within their strata); checkpoint / tokenizer (a
             pretrained policy: the agent prompt of derl_jax/domains/agent_prompt.py, with the
             domain's obs_length / admissible_length / answer_length, and sft_steps > 0 its cold
             start on the expert's turns in that prompt), prompt_style ("auto" | "agent" |
             "compact")
"""

from __future__ import annotations

import ml_collections

from configs import common

METHODS = ("outcome", "average", "derl", "derl_pop")
TASK = ("The policy is a household robot in a text world of ALFWorld's six task kinds: each turn it reads what it "
        "sees and writes one action, until the task it was given is done.")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The config of preset `arg`: "default" (None or empty), "smoke", "self_guide" or "sg_smoke"."""
    return common.preset({"default": default, "smoke": smoke, "self_guide": self_guide, "sg_smoke": sg_smoke}, arg,
                         "configs/household.py")


def default() -> ml_collections.ConfigDict:
    domain = {"kind": "household", "level": "L0", "seed": 0, "num_train": 1000, "num_test": 1000,
              "held_out_kinds": (4, 5), "max_turns": 16, "history": "window", "window": 2, "prompt_budget": 128, "self_guide": False,
              "self_rewards": (0.1, 0.0, -0.1)}
    policy = {**common.SCRATCH_MODEL, "prompt_style": "auto", "sft_steps": 3000, "sft_lr": 3e-3, "sft_batch_size": 32,
              "sft_perturb_rate": 0.1, "sft_extra_tasks": 480, "sft_rename": False}
    cfg = common.base("household", domain, policy)
    cfg.meta.update(task_description=TASK, primitive_descriptions=common.AGENT_PRIMITIVE_DESCRIPTIONS)
    cfg.inner.update(steps=30, prompts_per_step=4, group_size=8, lr=3e-4, kl_metric=False)
    cfg.outer.update(iterations=2, num_candidates=4)
    cfg.final.steps = 40
    cfg.compare.update(methods=METHODS, candidate_test=False)
    cfg.compare.levels = ("L0", "L1", "L2")
    return cfg


def smoke() -> ml_collections.ConfigDict:
    cfg = common.toy_search(default())
    cfg.name = "household_smoke"
    cfg.domain.update(num_train=20, num_test=8, max_turns=6)
    cfg.policy.update(**common.TOY_MODEL, sft_steps=10, sft_batch_size=16, sft_extra_tasks=0)
    cfg.inner.update(prompts_per_step=2, group_size=2, eval_batch_size=8)
    cfg.compare.update(methods=("derl", "outcome"), levels=())
    return cfg


def self_guide() -> ml_collections.ConfigDict:
    return common.self_guide(default(), "household_self_guide")


def sg_smoke() -> ml_collections.ConfigDict:
    return common.self_guide(smoke(), "household_sg_smoke")
