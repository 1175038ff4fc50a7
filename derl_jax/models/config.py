"""`ModelConfig`: the shapes and numerics of a Qwen2 / Qwen3 model (`derl_jax.models.transformer`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
FAMILIES = ("qwen2", "qwen3")
"""Model families: "qwen2" (Qwen2 / Qwen2.5: q/k/v projections with bias) and "qwen3" (no q/k/v
bias; an RMSNorm over each query and key head, applied before the rotary embedding)."""


def default_compute_dtype() -> str:
    """"float32" on CPU, "bfloat16" on accelerators (GPU/TPU)."""
    return "float32" if jax.default_backend() == "cpu" else "bfloat16"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shapes and numerics of a Qwen2 / Qwen3 model.

    family: "qwen2" or "qwen3" (`FAMILIES`); the two differ only in the attention block.
    dtype: compute dtype name (activations, matmuls, KV cache); softmax and logits are f32.
    param_dtype: storage dtype name of the parameters.
    remat: recompute each layer's activations in the backward pass (gradient checkpointing).
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_embeddings: bool = True
    max_position: int = 32768
    dtype: str = "float32"
    param_dtype: str = "float32"
    remat: bool = False
    family: str = "qwen2"

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for rotary embedding, got {self.head_dim}")
        if not self.rope_theta > 0 or not self.rms_norm_eps > 0:
            raise ValueError(
                f"ModelConfig.rope_theta and rms_norm_eps must be positive, got "
                f"{self.rope_theta!r} and {self.rms_norm_eps!r}")
        if self.family not in FAMILIES:
            raise ValueError(f"ModelConfig.family must be one of {FAMILIES}, got {self.family!r}")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in DTYPES:
                raise ValueError(
                    f"ModelConfig.{name} must be one of {sorted(DTYPES)}, got {getattr(self, name)!r}")

    @property
    def compute_dtype(self) -> Any:
        return DTYPES[self.dtype]

    @property
    def weight_dtype(self) -> Any:
        return DTYPES[self.param_dtype]

    @property
    def qkv_bias(self) -> bool:
        """Whether the q, k and v projections have biases (Qwen2)."""
        return self.family == "qwen2"

    @property
    def qk_norm(self) -> bool:
        """Whether each query and key head is RMS-normed before the rotary embedding (Qwen3)."""
        return self.family == "qwen3"

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.num_heads // self.num_kv_heads

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)
