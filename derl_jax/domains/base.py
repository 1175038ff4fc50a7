"""What a domain provides to the inner and outer loops.

A domain names its data splits, how prompts are encoded, its ordered primitive list
(`g1`..`gk`), how a rollout is produced (single-turn token sampling or a multi-turn
episode) and its validation metric. Token domains keep every split as fixed-shape arrays so
the whole inner loop can run under `jit`.

Shapes: M examples, Tp prompt tokens (left padded), N rollouts in a batch, T generated tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from primitives.registry import Primitive


@struct.dataclass
class TokenDataset:
    """One split of a token domain.

    prompts:     i32[M, Tp]  left-padded prompt tokens.
    prompt_mask: bool[M, Tp] True on real prompt tokens.
    context:     mapping of arrays with leading axis M (gold answer tokens, numbers, ...),
                 handed to device primitives row by row with the matching rollouts.
    """

    prompts: jax.Array
    prompt_mask: jax.Array
    context: Mapping[str, jax.Array]

    @property
    def size(self) -> int:
        return int(self.prompts.shape[0])

    def take(self, indices) -> "TokenDataset":
        """Rows `indices` of every array (NumPy or jnp indices; works under jit)."""
        return jax.tree_util.tree_map(lambda x: x[indices], self)

    def split(self, fraction: float, seed: int) -> tuple["TokenDataset", "TokenDataset"]:
        """Shuffle with `seed` and cut into (first `fraction`, rest); e.g. 0.8 -> inner-train, validation."""
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"split fraction must be in (0, 1), got {fraction}")
        order = np.random.default_rng(seed).permutation(self.size)
        cut = int(round(fraction * self.size))
        if cut == 0 or cut == self.size:
            raise ValueError(f"split of {self.size} examples at {fraction} leaves an empty part")
        return self.take(np.sort(order[:cut])), self.take(np.sort(order[cut:]))


@dataclasses.dataclass(frozen=True)
class TokenDomain:
    """A single-turn token domain whose primitives are all device primitives.

    primitives: ordered; the i-th is `g{i+1}` in reward expressions.
    outcome_index: which primitive is task success (the validation metric and `outcome`).
    train, test: the domain's splits; the outer loop cuts validation out of `train` itself.
    Device primitives receive rollout = {"tokens": i32[N, T], "mask": bool[N, T]} (generated
    tokens, mask True up to and including EOS) and the matching rows of the split's context.
    """

    name: str
    primitives: tuple[Primitive, ...]
    outcome_index: int
    train: TokenDataset
    test: TokenDataset
    tokenizer: Any
    max_new_tokens: int
    eos_id: int
    pad_id: int
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def primitive_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.primitives)

    def primitive_values(self, rollout: Mapping[str, jax.Array], context: Mapping[str, jax.Array]) -> jax.Array:
        """f32[N, P]: every primitive on every rollout (jit-compatible)."""
        cols = [jnp.asarray(p.fn(rollout, context), jnp.float32) for p in self.primitives]
        return jnp.stack(cols, axis=-1)

    def success(self, rollout: Mapping[str, jax.Array], context: Mapping[str, jax.Array]) -> jax.Array:
        """f32[N]: the validation metric of each rollout (the outcome primitive)."""
        return jnp.asarray(self.primitives[self.outcome_index].fn(rollout, context), jnp.float32)


def check_primitive_kinds(prims: Sequence[Primitive], kind: str, where: str) -> None:
    wrong = [p.name for p in prims if p.kind != kind]
    if wrong:
        raise ValueError(f"{where}: primitives {wrong} are not of kind {kind!r}")
