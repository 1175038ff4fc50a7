"""The inner loop's one config class, its training-progress variable `u` and its metric names.

`InnerConfig` mirrors the run config's `inner` block (plus `final.steps`); every rollout kind
reads the same fields. Fields of `config.inner` (defaults in brackets):

  steps, prompts_per_step (B), group_size (G)         GRPO steps and batch shape (required)
  lr, kl [0.0], kl_kind ["k3"], kl_metric [True]      learning rate, KL weight and estimator;
                                                      kl_metric reports KL to the start policy
                                                      even when kl == 0 (one extra forward pass)
  clip_low [0.2], clip_high [0.2]                     ratio clip range [1 - clip_low, 1 + clip_high]
  epochs [1], minibatches [1]                         optimizer passes / steps per pass per batch
  normalize_std [True], loss_agg ["token_mean"]       GRPO (True) or Dr.GRPO (False); loss reduction
  max_grad_norm [1.0], weight_decay [0.0],            gradient clip (0 or None: off), AdamW decay,
  warmup_steps [0]                                    linear warm-up of the learning rate
  algorithm ["grpo"]                                  "grpo" | "dapo": DAPO's settings where left at
                                                      GRPO's defaults (`derl_jax.rl.dapo.resolve`)
  dynamic_oversample [1], overlong_buffer [0]        dynamic sampling: sample this x B prompts and
                                                      train on B informative groups (1 = off);
                                                      overlong penalty over the last this many of
                                                      the T tokens (0 = off; multi-turn: per turn,
                                                      T being the action limit)
  temperature [1.0], top_k [0]                        how rollouts are sampled (top_k 0 = all tokens)
  chunk_size [0]                                      device kinds: candidates vmapped per chunk;
                                                      host kinds: candidates trained interleaved
                                                      (0 = all K at once)
  eval_batch_size [64]                                prompts per greedy-evaluation batch
  common_random_numbers [True]                        every candidate of a call trains with the same key
  dispatch ["auto"]                                   device kinds: "batched" | "loop" | "auto"
  budget_factor [0.0], budget_reference               host kinds: compute budget (x outcome-only
  ["base_lengths"], budget_tokens [0],                tokens; 0 disables), inner time limit (s),
  time_limit_s [0.0], host_workers [4],               host primitive threads, whether trained
  return_params [True]                                policies come back on the host
  self_reward_credit ["episode"]                      Self-Guide's self-rewards (primitive g_sg):
                                                      "episode" sums them into the episode's reward
                                                      (one advantage for all its turns); "turn"
                                                      credits each to its own turn (derl_jax/rl/loop.py)

Training progress: step s of an S-step run (s = 0..S-1) sees u = s / (S - 1), so u is exactly
0 on the first step and exactly 1 on the last; a one-step run has only a first step and
sees u = 0 (`progress`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from derl_jax.config import ConfigError, field_error
from derl_jax.rl import dapo
from derl_jax.rl.grpo import GRPOConfig

DISPATCH_MODES = ("auto", "batched", "loop")
BUDGET_REFERENCES = ("base_lengths", "outcome_run")
SELF_REWARD_CREDITS = ("episode", "turn")


def progress(step, steps: int):
    """u of step `step` (0-based; int or traced array) in a run of `steps` steps: step / (steps - 1),
    0 when steps == 1. Exactly 0 on the first step and exactly 1 on the last."""
    if steps < 1:
        raise ValueError(f"progress: steps must be >= 1, got {steps}")
    if steps == 1:
        return step * 0.0
    return step / (steps - 1)


@dataclasses.dataclass(frozen=True)
class InnerConfig:
    """One inner GRPO run's settings (see the module docstring for every field).

    grpo.group_size is set from `group_size`; final_steps defaults to `steps`. Under
    algorithm "dapo", grpo.clip_high, dynamic_oversample and overlong_buffer hold the resolved
    values (`derl_jax.rl.dapo.resolve`; resolving again changes nothing).
    """

    steps: int
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)
    final_steps: int = 0
    temperature: float = 1.0
    top_k: int = 0
    chunk_size: int = 0
    eval_batch_size: int = 64
    kl_metric: bool = True
    common_random_numbers: bool = True
    dispatch: str = "auto"
    budget_factor: float = 0.0
    budget_reference: str = "base_lengths"
    budget_tokens: int = 0
    time_limit_s: float = 0.0
    host_workers: int = 4
    return_params: bool = True
    algorithm: str = "grpo"
    dynamic_oversample: int = 1
    overlong_buffer: int = 0
    self_reward_credit: str = "episode"

    def __post_init__(self):
        def integer(name, minimum):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
                raise field_error(self, name, f"must be an int >= {minimum}")

        for name in ("steps", "prompts_per_step", "group_size", "max_new_tokens", "eval_batch_size", "host_workers"):
            integer(name, 1)
        for name in ("final_steps", "top_k", "chunk_size", "budget_tokens", "overlong_buffer"):
            integer(name, 0)
        integer("dynamic_oversample", 1)
        if self.algorithm not in dapo.ALGORITHMS:
            raise field_error(self, "algorithm", f"must be one of {dapo.ALGORITHMS}")
        if self.overlong_buffer > self.max_new_tokens:
            raise field_error(self, "overlong_buffer", f"must be <= max_new_tokens={self.max_new_tokens}")
        if not self.temperature > 0:
            raise field_error(self, "temperature", "must be > 0")
        if not isinstance(self.grpo, GRPOConfig):
            raise field_error(self, "grpo", "must be a GRPOConfig")
        if self.dispatch not in DISPATCH_MODES:
            raise field_error(self, "dispatch", f"must be one of {DISPATCH_MODES}")
        if self.budget_reference not in BUDGET_REFERENCES:
            raise field_error(self, "budget_reference", f"must be one of {BUDGET_REFERENCES}")
        if self.self_reward_credit not in SELF_REWARD_CREDITS:
            raise field_error(self, "self_reward_credit", f"must be one of {SELF_REWARD_CREDITS}")
        if not math.isfinite(self.budget_factor):
            raise field_error(self, "budget_factor", "must be finite")
        if not math.isfinite(self.time_limit_s) or self.time_limit_s < 0:
            raise field_error(self, "time_limit_s", "must be finite and >= 0")
        clip_high, oversample, buffer = dapo.resolve(self.algorithm, self.grpo.clip_high, int(self.dynamic_oversample),
                                                     int(self.overlong_buffer), int(self.max_new_tokens))
        object.__setattr__(self, "dynamic_oversample", oversample)
        object.__setattr__(self, "overlong_buffer", buffer)
        object.__setattr__(self, "grpo", dataclasses.replace(self.grpo, group_size=int(self.group_size),
                                                             clip_high=clip_high))
        if not self.final_steps:
            object.__setattr__(self, "final_steps", int(self.steps))
        if self.rollouts_per_step % self.grpo.minibatches:
            raise field_error(self, "grpo", f"minibatches={self.grpo.minibatches} must divide the "
                                            f"{self.rollouts_per_step} rollouts per step")

    @property
    def uses_reference(self) -> bool:
        """Whether each step computes the reference policy's log-probs."""
        return self.grpo.kl_coef > 0 or self.kl_metric

    @property
    def rollouts_per_step(self) -> int:
        """N = B * G."""
        return self.prompts_per_step * self.group_size

    @property
    def sampled_per_step(self) -> int:
        """dynamic_oversample * N: the rollouts sampled per step (N of them trained on)."""
        return self.dynamic_oversample * self.rollouts_per_step

    @property
    def dynamic_sampling(self) -> bool:
        """Whether each step samples more groups than it trains on (`derl_jax.rl.dapo.select`)."""
        return self.dynamic_oversample > 1

    def replace(self, **changes) -> "InnerConfig":
        return dataclasses.replace(self, **changes)


def _value(block: Any, name: str, default: Any = dataclasses.MISSING) -> Any:
    if isinstance(block, Mapping) or hasattr(block, "get"):
        if name in block:
            return block[name]
    elif hasattr(block, name):
        return getattr(block, name)
    if default is dataclasses.MISSING:
        raise ValueError(f"config.inner.{name} is missing")
    return default


# config.inner key -> GRPOConfig field, for the GRPO settings a run config may set
GRPO_KEYS = {"lr": "learning_rate", "kl": "kl_coef", "kl_kind": "kl_kind", "epochs": "epochs",
             "minibatches": "minibatches", "clip_low": "clip_low", "clip_high": "clip_high",
             "normalize_std": "normalize_std", "loss_agg": "loss_agg", "max_grad_norm": "max_grad_norm",
             "weight_decay": "weight_decay", "warmup_steps": "warmup_steps"}


def grpo_config(block: Any) -> GRPOConfig:
    """The GRPOConfig of a `config.inner` block: `lr` required, every other key of `GRPO_KEYS`
    at GRPOConfig's default when absent (group_size is set by InnerConfig)."""
    defaults = GRPOConfig()
    values = {field: _value(block, key, dataclasses.MISSING if key == "lr" else getattr(defaults, field))
              for key, field in GRPO_KEYS.items()}
    casts = {field: type(getattr(defaults, field)) for field in values}
    casts["max_grad_norm"] = lambda norm: float(norm) if norm else None   # 0 or None: no clipping
    return GRPOConfig(**{field: casts[field](value) for field, value in values.items()})


def inner_config(cfg: Any, max_new_tokens: int) -> InnerConfig:
    """InnerConfig of a run config: `inner.*`, `final.steps` (optional) and the domain's T."""
    block = cfg["inner"] if isinstance(cfg, Mapping) else cfg.inner
    final = cfg.get("final") if isinstance(cfg, Mapping) or hasattr(cfg, "get") else getattr(cfg, "final", None)
    final_steps = int(_value(final, "steps", 0)) if final is not None else 0
    fields = {f.name: f for f in dataclasses.fields(InnerConfig)}
    optional = {name: _value(block, name, fields[name].default)
                for name in ("temperature", "top_k", "chunk_size", "eval_batch_size", "kl_metric",
                             "common_random_numbers", "dispatch", "budget_factor", "budget_reference",
                             "budget_tokens", "time_limit_s", "host_workers", "return_params", "algorithm",
                             "dynamic_oversample", "overlong_buffer", "self_reward_credit")}
    casts = {f.name: type(f.default) for f in fields.values() if f.name in optional}
    return InnerConfig(
        steps=int(_value(block, "steps")), prompts_per_step=int(_value(block, "prompts_per_step")),
        group_size=int(_value(block, "group_size")), max_new_tokens=int(max_new_tokens), grpo=grpo_config(block),
        final_steps=final_steps, **{name: casts[name](value) for name, value in optional.items()})


def metric_names(primitive_names, uses_reference: bool, host: bool = False,
                 dynamic_sampling: bool = False) -> tuple[str, ...]:
    """Per-step curves of every rollout kind: mean (sanitized) reward, each primitive's mean
    (`primitive/{name}`), the count of non-finite rewards, GRPO statistics (KL to the start
    policy when computed), the mean response length (tokens per completion; per action for
    multi-turn episodes); reward, primitive and length means are over every sampled rollout.
    With dynamic sampling: shortfall (uninformative groups among the B trained on) and
    informative_fraction (informative share of the sampled groups). Host kinds add trained
    (1 while the run trains, 0 after a budget stop), generated_tokens, tokens_cumulative,
    host_seconds, step_seconds, host_share."""
    kl = ("kl",) if uses_reference else ()
    names = ("reward_mean", *(f"primitive/{name}" for name in primitive_names), "nonfinite", *kl, "entropy",
             "clip_fraction", "loss", "grad_norm", "response_length")
    if dynamic_sampling:
        names += ("shortfall", "informative_fraction")
    if host:
        names += ("trained", "generated_tokens", "tokens_cumulative", "host_seconds", "step_seconds", "host_share")
    return names


def check_rollout_kind(cfg: InnerConfig, domain: Any) -> None:
    """ConfigError when `cfg` asks `domain` for what its rollout kind lacks: per-turn credit of
    self-rewards (`self_reward_credit="turn"`) needs multi-turn episodes (rollout "env"). DAPO's
    additions run on every kind (`derl_jax.rl.dapo`: over episode groups on "env")."""
    if cfg.self_reward_credit == "turn" and getattr(domain, "rollout", None) != "env":
        name = getattr(domain, "name", "?")
        raise ConfigError(f"config.inner.self_reward_credit='turn' needs a multi-turn domain; {name!r} has rollout "
                          f"{getattr(domain, 'rollout', None)!r}: use 'episode'")