"""The Meta-Optimizer's settings (`MetaConfig`) and the check of a run's `meta` block.

`MetaConfig` takes the fields of the run config's `meta` block (configs/common.py `META`
holds every default; a test holds the two equal) plus a few the block may leave out.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from derl_jax.config import ConfigError, choice, config_value, field_error, has_field, int_at_least, model_sizes, number
from derl_jax.domains.registry import get_domain
from derl_jax.expr.grammar import MAX_DECIMALS, Grammar
from derl_jax.expr.parse import MAX_NESTING, OPERATOR_SETS
from derl_jax.rl.grpo import KL_KINDS, LOSS_AGGREGATIONS, GRPOConfig
from primitives.registry import configured

BACKBONES = ("scratch", "hf")
PARAM_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class MetaConfig:
    """Settings of the Meta-Optimizer (module docstring). Build with `MetaConfig.from_config`."""

    backbone: str = "scratch"                   # one of BACKBONES
    # scratch model size (the fields of derl_jax.config.MODEL_SIZE_FIELDS)
    hidden_size: int = 64                       # D
    intermediate_size: int = 128                # MLP width
    num_layers: int = 2
    num_heads: int = 4                          # query heads
    num_kv_heads: int = 2                       # key/value heads; divides num_heads
    head_dim: int = 16
    # hf backbone
    hf_path: str = ""                           # local checkpoint directory
    hf_tokenizer: str = ""                      # tokenizer directory ("" = hf_path)
    hf_param_dtype: str = "float32"             # one of PARAM_DTYPES
    task_description: str = ""                  # the task, in the instruction prompt
    primitive_descriptions: tuple[str, ...] = ()  # one line per primitive g1..gk, in the prompt
    temperature: float = 1.0                    # sampling temperature (> 0)
    # cold start: SFT on the corpus inside `init`
    cold_start_corpus: int = 256                # expressions in the corpus
    cold_start_steps: int = 150                 # Adam steps (0 = no cold start)
    cold_start_lr: float = 3e-3
    cold_start_batch_size: int = 32             # sequences per step
    cold_start_seed: int = 0                    # seed of the corpus
    # GRPO update
    lr: float = 3e-3                            # AdamW learning rate
    kl: float = 0.01                            # weight of the KL term to the reference
    kl_kind: str = "k3"                         # one of KL_KINDS
    epochs: int = 3                             # full-batch steps per update
    clip_eps: float = 0.2                       # ratio clip, in (0, 1)
    max_grad_norm: float = 1.0                  # global gradient-norm clip
    loss_agg: str = "token_mean"                # one of LOSS_AGGREGATIONS
    # checked against the grammar by `check_grammar` (None = not checked)
    max_symbols: int | None = None
    max_depth: int | None = None
    max_decimals: int | None = None
    operators: str | None = None                # "extended" or "paper" (derl_jax.expr.parse.OPERATOR_SETS)
    num_primitives: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "primitive_descriptions", tuple(str(d) for d in self.primitive_descriptions))

        if self.backbone not in BACKBONES:
            raise field_error(self, "backbone", f"must be one of {BACKBONES}")
        if self.backbone == "hf" and not str(self.hf_path).strip():
            raise field_error(self, "hf_path", "must name a local Hugging Face checkpoint directory when backbone='hf'")
        positive = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                    "cold_start_corpus", "cold_start_batch_size", "epochs")
        for field in positive:
            value = getattr(self, field)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise field_error(self, field, "must be a positive int")
        if self.num_heads % self.num_kv_heads:
            raise field_error(self, "num_heads", f"must be a multiple of num_kv_heads={self.num_kv_heads}")
        if not isinstance(self.cold_start_steps, (int, np.integer)) or self.cold_start_steps < 0:
            raise field_error(self, "cold_start_steps", "must be an int >= 0")
        if self.hf_param_dtype not in PARAM_DTYPES:
            raise field_error(self, "hf_param_dtype", f"must be one of {PARAM_DTYPES}")
        if not self.temperature > 0:
            raise field_error(self, "temperature", "must be > 0")
        for field in ("cold_start_lr", "lr", "kl"):
            if not getattr(self, field) >= 0:
                raise field_error(self, field, "must be >= 0")
        if not 0 < self.clip_eps < 1:
            raise field_error(self, "clip_eps", "must be in (0, 1)")
        if not self.max_grad_norm > 0:
            raise field_error(self, "max_grad_norm", "must be > 0")
        if self.kl_kind not in KL_KINDS:
            raise field_error(self, "kl_kind", f"must be one of {KL_KINDS}")
        if self.loss_agg not in LOSS_AGGREGATIONS:
            raise field_error(self, "loss_agg", f"must be one of {LOSS_AGGREGATIONS}")
        if self.operators is not None and self.operators not in OPERATOR_SETS:
            raise field_error(self, "operators", f"must be one of {OPERATOR_SETS}")

    @classmethod
    def from_config(cls, cfg: Any) -> "MetaConfig":
        """From a MetaConfig, a run config holding a `meta` block (ml_collections ConfigDict
        or mapping), or the meta block itself. Unknown fields are an error naming them."""
        if isinstance(cfg, cls):
            return cfg
        fields = _as_dict(cfg)
        if "meta" in fields and "backbone" not in fields:
            fields = _as_dict(fields["meta"])
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"MetaConfig: unknown fields {unknown} in the meta config; known: {sorted(known)}")
        return cls(**fields)

    def check_grammar(self, grammar: Grammar) -> None:
        """ValueError when max_symbols / max_depth / max_decimals / operators / num_primitives (if set)
        disagree with `grammar`."""
        if self.operators is not None and self.operators != grammar.operators:
            raise ValueError(f"MetaConfig.operators={self.operators!r} but the grammar has operators={grammar.operators!r}")
        for field, actual in (("max_symbols", grammar.max_length), ("max_depth", grammar.max_depth),
                              ("max_decimals", grammar.max_decimals), ("num_primitives", grammar.num_primitives)):
            value = getattr(self, field)
            if value is not None and int(value) != actual:
                raise ValueError(f"MetaConfig.{field}={value!r} but the grammar has {field}={actual}")

    def grpo(self, group_size: int) -> GRPOConfig:
        """The GRPO settings of one update over a group of `group_size` samples."""
        return GRPOConfig(
            group_size=group_size, normalize_std=True, clip_low=self.clip_eps, clip_high=self.clip_eps,
            kl_coef=self.kl, kl_kind=self.kl_kind, loss_agg=self.loss_agg, epochs=self.epochs, minibatches=1,
            max_grad_norm=self.max_grad_norm, learning_rate=self.lr, optimizer="adamw",
        )


def _as_dict(cfg: Any) -> dict:
    if hasattr(cfg, "to_dict"):
        return dict(cfg.to_dict())
    if isinstance(cfg, Mapping):
        return dict(cfg)
    raise TypeError(f"MetaConfig.from_config: expected a ConfigDict, a mapping or a MetaConfig, got {type(cfg).__name__}")


def check_meta_block(cfg: Any) -> None:
    """The Meta-Optimizer's fields (`config.meta`), for strategies that sample from it."""
    backbone = choice(cfg, "meta.backbone", ("scratch", "hf"))
    if backbone == "hf" and not str(config_value(cfg, "meta.hf_path")).strip():
        raise ConfigError("config.meta.hf_path must name a local checkpoint directory when config.meta.backbone='hf'")
    if backbone == "scratch":
        model_sizes(cfg, "meta")
    number(cfg, "meta.temperature", minimum=0.0, strict=True)
    int_at_least(cfg, "meta.max_symbols", 2)
    depth = int_at_least(cfg, "meta.max_depth", 1)
    if depth > MAX_NESTING:
        raise ConfigError(f"config.meta.max_depth must be <= {MAX_NESTING}, got {depth}")
    if has_field(cfg, "meta.max_decimals"):
        decimals = int_at_least(cfg, "meta.max_decimals", 1)
        if decimals > MAX_DECIMALS:
            raise ConfigError(f"config.meta.max_decimals must be <= {MAX_DECIMALS}, got {decimals}")
    _check_descriptions(cfg)
    int_at_least(cfg, "meta.cold_start_corpus", 1)
    int_at_least(cfg, "meta.cold_start_steps", 0)
    number(cfg, "meta.cold_start_lr", minimum=0.0, strict=True)
    number(cfg, "meta.lr", minimum=0.0, strict=True)
    number(cfg, "meta.kl", minimum=0.0, strict=False)
    int_at_least(cfg, "meta.epochs", 1)


def _check_descriptions(cfg: Any) -> None:
    """`meta.primitive_descriptions`: empty, or one non-empty line per primitive of the run (the
    domain's, then `primitives.extra`)."""
    descriptions = tuple(config_value(cfg, "meta.primitive_descriptions") or ())
    if not descriptions:
        return
    names = tuple(get_domain(config_value(cfg, "domain.kind")).primitive_names(cfg)) + configured(cfg, "extra")
    if len(descriptions) != len(names) or not all(isinstance(d, str) and d.strip() for d in descriptions):
        raise ConfigError(f"config.meta.primitive_descriptions must hold one non-empty line per primitive "
                          f"{names}, got {len(descriptions)} lines")
