"""The blocks every experiment shares, defined once; `configs/<experiment>.py` overrides what differs.

`base(name, domain, policy)` is a whole run config: the experiment's `domain` and `policy`
blocks plus these shared blocks at their defaults (the arithmetic domain's scale):

  seed                 run seed (search and final training keys of the `search`/`final` modes)
  inner.*              the inner GRPO loop (`derl_jax.rl.config.InnerConfig` documents every key):
                       steps, prompts per step, group size, learning rate, KL weight and
                       estimator, clip range, loss aggregation, epochs and minibatches per
                       batch, gradient clip, weight decay, warm-up, the algorithm ("grpo" or
                       "dapo") with DAPO's dynamic sampling and overlong penalty, sampling
                       temperature and top-k, candidates trained at once (chunk_size, 0 = all), greedy
                       evaluation batch, common random numbers, dispatch, for host-scored
                       domains the compute budget, time limit and host primitive threads, and
                       how Self-Guide's self-rewards are credited (per episode or per turn)
  meta.*               the Meta-Optimizer: backbone ("scratch": a tiny model trained from random
                       init; "hf": a local Hugging Face checkpoint at `hf_path`), model sizes,
                       task / primitive descriptions for the hf prompt, sampling temperature,
                       longest expression in grammar symbols, nesting depth, decimals per
                       number, operator set ("extended": + - * / ** min max abs clip and the
                       training progress u; "paper": the DERL paper's + - * / with parentheses;
                       it binds the automaton, the prompt, the cold-start corpus and the
                       validity of every searched candidate), cold-start SFT
                       corpus size / steps / learning rate, GRPO learning rate, KL weight, epochs
  outer.*              outer loop: strategy (search mode), iterations, candidates per iteration
                       (the Meta-Optimizer's GRPO group size n), seed of the 8:2 inner-train /
                       validation split, iterations of population strategies (0: iterations)
                       and their inner steps per generation (0: final.steps // their
                       iterations, so DERL-pop's evolved policy trains as long as the final
                       policy)
  evolution.*          the evolution baseline: first generation, population capacity, tournament
                       size, mutation rate, depth of random trees
  final.steps          inner steps of the final policy of every search method
  final.baseline_steps inner steps of the fixed-expression baselines' final policies (0: final.steps;
                       the agent presets give them 150 to DERL's 100, as the paper does)
  final.repeats        final trainings of the chosen reward with independent keys, tested and
                       averaged beside the first key's test (0: 3 on arith, symbols and symbols_compose, 1 elsewhere;
                       derl_jax/experiment/reevaluate.py)
  final.reevaluate_top_k  the k best distinct candidates trained again with a fresh key before the
                       choice, charged as k more candidates (0: off)
  compare.*            methods, seeds, whether every iteration's best expression is also
                       trained in final mode and tested (costs one final training per iteration),
                       whether each candidate's trained policy is also tested (candidate_test),
                       whether each final policy is kept in its run directory
                       (keep_final_policies, final_policy.npz; a run that finds it tests it
                       instead of training again; a multi-level compare sets it on every level
                       but the last),
                       and levels: generalisation levels of the domain to run the whole compare
                       on, one after another in <workdir>/<level> (() = `domain.level` only),
                       and workers: processes that share out the method x seed runs (0: one
                       per CPU core on a CPU host, 1 on accelerators; derl_jax/experiment/workers.py)
                       and own_base_policy: every seed warm-starts its own base policy (seed s with
                       config.seed = s) instead of sharing config.seed's (False; the symbols presets
                       set it, their warm start costs about a CPU-minute)
  mesh.*               device mesh sizes for the axes (cand, data, model); -1 fills with every
                       device; data 0 (the default) is automatic: on a CPU host, one XLA host
                       device per core and a step's rollouts split over them (for policies of at
                       most 50M parameters, when the rollouts split evenly; not in a compare,
                       whose workers use the cores), else 1 (derl_jax/rl/placement.py: auto_data_size)
  primitives.modules   modules outside the `primitives` package to import so their primitives
                       register (dotted names; the package's own modules are always found)
  primitives.extra     registered primitives of this domain to add after its own (g5, g6, ...
                       for a 4-primitive domain); expressions may also use their names
"""

from __future__ import annotations

from typing import Any, Mapping

import ml_collections

from derl_jax.outer import ALL_METHODS

SCRATCH_MODEL = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                 "head_dim": 16}
TOY_MODEL = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1}

GRPO = {
    "kl_kind": "k3",
    "clip_low": 0.2,
    "clip_high": 0.2,
    "normalize_std": True,
    "loss_agg": "token_mean",
    "epochs": 1,
    "minibatches": 1,
    "max_grad_norm": 1.0,
    "weight_decay": 0.0,
    "warmup_steps": 0,
}

INNER = {
    "steps": 24,
    "prompts_per_step": 8,
    "group_size": 4,
    "lr": 3e-4,
    "kl": 0.0,
    "kl_metric": True,
    **GRPO,
    "algorithm": "grpo",
    "dynamic_oversample": 1,
    "overlong_buffer": 0,
    "chunk_size": 0,
    "temperature": 1.0,
    "top_k": 0,
    "eval_batch_size": 64,
    "common_random_numbers": True,
    "dispatch": "auto",
    "budget_factor": 0.0,
    "budget_reference": "base_lengths",
    "budget_tokens": 0,
    "time_limit_s": 0.0,
    "host_workers": 4,
    "return_params": True,
    "self_reward_credit": "episode",
}

META = {
    "backbone": "scratch",
    "hf_path": "",
    "hf_tokenizer": "",
    "hf_param_dtype": "float32",
    "task_description": "",
    "primitive_descriptions": (),
    **SCRATCH_MODEL,
    "temperature": 1.0,
    "max_symbols": 32,
    "max_depth": 4,
    "max_decimals": 3,
    "operators": "extended",
    "cold_start_corpus": 256,
    "cold_start_steps": 150,
    "cold_start_lr": 3e-3,
    "cold_start_batch_size": 32,
    "cold_start_seed": 0,
    "lr": 3e-3,
    "kl": 0.01,
    "kl_kind": "k3",
    "epochs": 3,
    "clip_eps": 0.2,
    "max_grad_norm": 1.0,
    "loss_agg": "token_mean",
}

# A pretrained (`meta.backbone="hf"`) Meta-Optimizer's training settings, the same in every
# preset that uses one (`hf_meta`). The paper leaves the outer loop's hyperparameters at its RL
# framework's defaults; these are the authors' released math scripts' values (AdamW lr 1e-6,
# 4 epochs per update, KL 0.001 with the k3 estimator, sampling temperature 0.7), a cold start
# at lr 1e-5, and our choice of 64 cold-start steps (8 passes over the 256-expression corpus at
# 32 per step).
META_HF = {"lr": 1e-6, "cold_start_lr": 1e-5, "cold_start_steps": 64, "kl": 0.001, "kl_kind": "k3", "epochs": 4,
           "temperature": 0.7}
# The grammar of the paper presets: room for every expression the DERL paper prints (Table 3 and
# the examples of the text; tests/test_paper_expressions.py): 45 symbols, 4 nested contexts, 8
# decimals (0.00000001), and the beginnings of the cut-off ones (11 nested contexts); and the
# paper's operator set (Eq. 3, Appendix A and the authors' vocabulary mask: + - * / compositions
# of the primitives and numbers with parentheses; no u, ** or functions).
PAPER_GRAMMAR = {"max_symbols": 64, "max_depth": 12, "max_decimals": 8, "operators": "paper"}
# One line per agent primitive g1..g4 (outcome, phase_first, phase_middle, phase_last), for the
# Meta-Optimizer's instruction prompt.
AGENT_PRIMITIVE_DESCRIPTIONS = (
    "1 if the episode ends with the task done, else 0",
    "the mean step score (actions that fit the task's stage) over the first third of the episode's turns",
    "the mean step score over the middle third of the episode's turns",
    "the mean step score over the last third of the episode's turns",
)
# Self-Guide's ablation table as one compare (docs/methods/self_guide.md): GRPO with the
# assessments written but no self-reward (`outcome`), Self-Guide, and its two schedule ablations.
SELF_GUIDE_METHODS = ("outcome", "self_guide", "self_guide_no_warmup", "self_guide_no_anneal")
SELF_GUIDE_DESCRIPTION = "the episode's summed self-rewards of the policy's own progress+ / progress= / progress- words"
# Qwen2.5-1.5B(-Instruct)'s shape: the policy sizes `--mode=plan` reads when the checkpoint is not on disk.
QWEN25_1_5B_SHAPE = {"vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_layers": 28,
                     "num_heads": 12, "num_kv_heads": 2, "head_dim": 128}
# Qwen3-1.7B's and Qwen3-4B's shapes (their public config.json: 8 kv heads of 128, tied embeddings),
# with the model family: the policy sizes `--mode=plan` reads when the checkpoint is not on disk.
# Self-Guide's paper trains these two (and Qwen2.5-7B); `self_guide_qwen3` uses them.
QWEN3_1_7B_SHAPE = {"family": "qwen3", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
                    "num_layers": 28, "num_heads": 16, "num_kv_heads": 8, "head_dim": 128}
QWEN3_4B_SHAPE = {"family": "qwen3", "vocab_size": 151936, "hidden_size": 2560, "intermediate_size": 9728,
                  "num_layers": 36, "num_heads": 32, "num_kv_heads": 8, "head_dim": 128}
QWEN3_POLICIES = {"1_7b": ("/models/Qwen3-1.7B", QWEN3_1_7B_SHAPE), "4b": ("/models/Qwen3-4B", QWEN3_4B_SHAPE)}

OUTER = {"strategy": "derl", "iterations": 4, "num_candidates": 8, "split_seed": 0, "population_iterations": 0,
         "population_inner_steps": 0}
EVOLUTION = {"init": "cold_start", "capacity": 8, "tournament": 2, "mutation_rate": 0.5, "initial_depth": 3}
FINAL = {"steps": 24, "baseline_steps": 0, "repeats": 0, "reevaluate_top_k": 0}
COMPARE = {"methods": ALL_METHODS, "seeds": (0, 1, 2), "per_iteration_test": False, "candidate_test": True,
           "keep_final_policies": False, "levels": (),
           "workers": 0, "own_base_policy": False}
MESH = {"cand": 1, "data": 0, "model": 1}
TRUST = {"warmup": 0.2, "ramp_end": 0.4, "anneal_start": 0.8}
ARBO = {
    "schedule": "adaptive", "initial_explore": 1, "patience": 2, "reexplore": 1,
    "belief": True, "observations": "full", "history": "all", "retrieve_k": 4, "framework": True, "task": "",
    "agent": {"backend": "openai", "url": "http://127.0.0.1:8000/v1", "model": "", "api_key_env": "",
              "checkpoint": "", "tokenizer": "", "temperature": 0.7, "max_tokens": 1024, "timeout_s": 120.0,
              "max_turns": 24, "max_tries": 6, "retry_base_s": 1.0, "retry_max_s": 60.0},
}


def base(name: str, domain: Mapping[str, Any], policy: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """A run config: `name`, the experiment's `domain` and `policy` blocks, the shared blocks."""
    blocks = {
        "domain": domain, "policy": policy, "inner": INNER, "meta": META, "outer": OUTER, "evolution": EVOLUTION,
        "final": FINAL, "compare": COMPARE, "mesh": MESH, "primitives": {"modules": (), "extra": ()},
        "trust": TRUST, "arbo": ARBO,
    }
    cfg = ml_collections.ConfigDict({"name": name, "seed": 0})
    for block, fields in blocks.items():
        cfg[block] = ml_collections.ConfigDict(dict(fields))
    return cfg


def hf_meta(cfg: ml_collections.ConfigDict, path: str) -> ml_collections.ConfigDict:
    """`cfg` with the Meta-Optimizer of the paper presets: the local checkpoint `path` as its
    backbone, the pretrained backbone's training settings (`META_HF`) and the paper's grammar
    (`PAPER_GRAMMAR`). Every preset with an "hf" Meta-Optimizer is made by this function."""
    cfg.meta.update(backbone="hf", hf_path=path, **META_HF, **PAPER_GRAMMAR)
    return cfg


def toy_search(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The search blocks at toy sizes (the `smoke` / `tiny` presets): a 1-layer scratch Meta-Optimizer
    with the scratch model's training settings and grammar limits (16 symbols, 3 nested contexts,
    3 decimals), 2 outer iterations x 2 candidates, 2 inner and final steps (baselines too),
    one final key, DERL-pop's schedule from the final budget, methods derl and outcome, seed 0."""
    cfg.meta.update({k: META[k] for k in META_HF})
    cfg.meta.update(backbone="scratch", hf_path="", **TOY_MODEL, max_symbols=16, max_depth=3,
                    max_decimals=META["max_decimals"], cold_start_corpus=32, cold_start_steps=10)
    cfg.inner.steps = 2
    cfg.outer.update(iterations=2, num_candidates=2, population_iterations=0, population_inner_steps=0)
    cfg.evolution.update(capacity=4)
    cfg.final.update(steps=2, baseline_steps=0, repeats=1)
    cfg.compare.update(methods=("derl", "outcome"), seeds=(0,))
    return cfg


def self_guide(cfg: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
    """`cfg` (an agent preset) as Self-Guide's ablation compare named `name`: the policy writes a
    self-assessment before each action (`domain.self_guide`, adding the primitive g_sg and its
    description line), and the methods are `SELF_GUIDE_METHODS`."""
    cfg.name = name
    cfg.domain.self_guide = True
    cfg.meta.primitive_descriptions = tuple(cfg.meta.primitive_descriptions) + (SELF_GUIDE_DESCRIPTION,)
    cfg.compare.methods = SELF_GUIDE_METHODS
    return cfg


def self_guide_qwen3(cfg: ml_collections.ConfigDict, size: str) -> ml_collections.ConfigDict:
    """`cfg` (a Self-Guide preset) with the Qwen3 policy of `size` ("1_7b" or "4b", `QWEN3_POLICIES`),
    the checkpoint Self-Guide's paper trains, read from /models/Qwen3-<size> (override
    `policy.checkpoint`); the name gets the suffix `_qwen3_<size>`."""
    checkpoint, shape = QWEN3_POLICIES[size]
    cfg.name = f"{cfg.name}_qwen3_{size}"
    cfg.policy.update(checkpoint=checkpoint, tokenizer="", **shape)
    return cfg


def preset(get: Mapping[str, Any], arg: str | None, where: str) -> ml_collections.ConfigDict:
    """The config of preset `arg` (None or empty: "default") from `get`, a preset name -> builder map."""
    name = (arg or "").strip() or "default"
    if name not in get:
        raise ValueError(f"{where}: unknown preset {name!r}; expected one of {tuple(get)}")
    return get[name]()
