"""DERL on the embedded arithmetic domain (procedural integer expressions, character tokens).

Presets (`--config=configs/arith.py:<preset>`):

  default  the full comparison: derl, derl_pop, random, evolution and the three fixed
           baselines (outcome, outcome_format, average) over 3 seeds, with tiny models.
           Target run time: under 15 minutes on a 2-core CPU:

      python launch/run.py --config=configs/arith.py --mode=compare --workdir=runs/arith

  smoke    the same pipeline with toy sizes (used by tests; well under a minute of work
           outside start-up):

      python launch/run.py --config=configs/arith.py:smoke --mode=compare --workdir=runs/arith_smoke

Every field can be overridden from the command line, e.g. `--config.outer.iterations=3`
or `--config.compare.methods="('derl','outcome')"`. `derl_jax.meta.protocol.validate_config`
checks the values when a run starts and names the first bad field.

Fields:
  seed                     run seed (search and final training keys for `search`/`final` modes)
  domain.*                 problems: domain kind, generation seed, train/test sizes, difficulty levels,
                           generation budget per completion
  policy.*                 the policy model (a tiny Qwen2-style decoder) and its supervised
                           warm start (the "base policy" every method starts from)
  inner.*                  GRPO inner loop: steps per candidate, prompts per step, group size,
                           learning rate, KL weight, candidates trained at once (0: all),
                           sampling temperature, whether the candidates of one outer
                           iteration share their training key (common random numbers)
  meta.*                   the Meta-Optimizer: backbone ("scratch": a tiny model trained from
                           random init; "hf": a local Hugging Face checkpoint at `hf_path`),
                           model sizes, sampling temperature, the longest expression in
                           grammar symbols, nesting depth, cold-start SFT corpus size / steps /
                           learning rate, GRPO learning rate, KL weight, epochs per update
  outer.*                  outer loop: strategy (search mode), iterations, candidates per
                           iteration (GRPO group size n), seed of the 8:2 inner-train /
                           validation split
  evolution.*              the evolution baseline: first generation, population capacity,
                           tournament size, mutation rate, depth of random trees
  final.steps              inner steps of the final policy (the same for every method)
  compare.*                methods, seeds, and whether every iteration's best expression is
                           also trained in final mode and tested (the paper's Figure 3 test
                           curve; costs one final training per iteration per method and seed)
  mesh.*                   device mesh sizes for the axes (cand, data, model); -1 fills
"""

from __future__ import annotations

import ml_collections

ALL_METHODS = ("derl", "derl_pop", "random", "evolution", "outcome", "outcome_format", "average")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The config of preset `arg` ("default" when None or empty, or "smoke")."""
    preset = (arg or "default").strip()
    cfg = _default()
    if preset == "default":
        return cfg
    if preset == "smoke":
        return _smoke(cfg)
    raise ValueError(f"configs/arith.py: unknown preset {preset!r}; expected 'default' or 'smoke'")


def _default() -> ml_collections.ConfigDict:
    cfg = ml_collections.ConfigDict()
    cfg.name = "arith"
    cfg.seed = 0

    cfg.domain = ml_collections.ConfigDict(
        {"kind": "arith", "seed": 0, "num_train": 320, "num_test": 200, "levels": (1, 2), "max_new_tokens": 28}
    )
    cfg.policy = ml_collections.ConfigDict(
        {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_layers": 2,
            "num_heads": 4,
            "num_kv_heads": 2,
            "head_dim": 16,
            "sft_steps": 600,
            "sft_lr": 3e-3,
            "sft_batch_size": 64,
            "sft_extra_problems": 1000,
            "sft_mix": {"steps": 0.35, "no_box": 0.35, "no_steps": 0.1, "wrong_step": 0.1, "plain": 0.1},
        }
    )
    cfg.inner = ml_collections.ConfigDict(
        {
            "steps": 24,
            "prompts_per_step": 8,
            "group_size": 4,
            "lr": 3e-4,
            "kl": 0.0,
            "chunk_size": 0,
            "temperature": 1.0,
            "common_random_numbers": True,
        }
    )
    cfg.meta = ml_collections.ConfigDict(
        {
            "backbone": "scratch",
            "hf_path": "",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_layers": 2,
            "num_heads": 4,
            "num_kv_heads": 2,
            "head_dim": 16,
            "temperature": 1.0,
            "max_symbols": 32,
            "max_depth": 4,
            "cold_start_corpus": 256,
            "cold_start_steps": 150,
            "cold_start_lr": 3e-3,
            "lr": 3e-3,
            "kl": 0.01,
            "epochs": 3,
        }
    )
    cfg.outer = ml_collections.ConfigDict(
        {"strategy": "derl", "iterations": 4, "num_candidates": 8, "split_seed": 0}
    )
    cfg.evolution = ml_collections.ConfigDict(
        {"init": "cold_start", "capacity": 8, "tournament": 2, "mutation_rate": 0.5, "initial_depth": 3}
    )
    cfg.final = ml_collections.ConfigDict({"steps": 24})
    cfg.compare = ml_collections.ConfigDict({"methods": ALL_METHODS, "seeds": (0, 1, 2), "per_iteration_test": False})
    cfg.mesh = ml_collections.ConfigDict({"cand": 1, "data": 1, "model": 1})
    return cfg


def _smoke(cfg: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    cfg.name = "arith_smoke"
    cfg.domain.update(num_train=40, num_test=20, levels=(1,), max_new_tokens=16)
    cfg.policy.update(
        hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, sft_steps=20, sft_batch_size=16,
        sft_extra_problems=0,
    )
    cfg.inner.update(steps=2, prompts_per_step=4, group_size=2)
    cfg.meta.update(
        hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
        max_symbols=16, max_depth=3, cold_start_corpus=32, cold_start_steps=10,
    )
    cfg.outer.update(iterations=2, num_candidates=2)
    cfg.evolution.update(capacity=4)
    cfg.final.steps = 2
    cfg.compare.update(methods=("derl", "outcome"), seeds=(0,))
    return cfg
