"""Batches of the host-driven inner loop: the step schedule of training rows, prompt buckets,
a split held on the host with its primitive contexts, programs one by one."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from derl_jax.domains.base import TokenDataset
from derl_jax.expr.program import Program


def key_seed(key: jax.Array) -> list[int]:
    """The uint32 words of a PRNG key (typed or raw), as a NumPy seed."""
    key = jnp.asarray(key) if not isinstance(key, jax.Array) else key
    data = jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    return [int(v) for v in np.asarray(data).reshape(-1)]


def batch_schedule(key: jax.Array, num_rows: int, batch_size: int, steps: int) -> np.ndarray:
    """i64[steps, batch_size]: rows of each step, consecutive epochs of fresh permutations."""
    if num_rows < 1:
        raise ValueError("batch_schedule: the training split is empty")
    rng = np.random.default_rng(key_seed(key))
    epochs = -(-steps * batch_size // num_rows)
    order = np.concatenate([rng.permutation(num_rows) for _ in range(epochs)])
    return order[: steps * batch_size].reshape(steps, batch_size)


def trim_to_bucket(prompts: np.ndarray, mask: np.ndarray, bucket_sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded (prompts, mask) [N, Tp] cut to the smallest bucket that holds every row's tokens."""
    width = prompts.shape[1]
    longest = int(mask.sum(axis=1).max()) if mask.size else 0
    fitting = [b for b in sorted(bucket_sizes) if longest <= b <= width]
    keep = fitting[0] if fitting else width
    if mask[:, : width - keep].any():
        raise ValueError("trim_to_bucket: prompts are not left padded (real tokens before the kept columns)")
    return prompts[:, width - keep:], mask[:, width - keep:]


class HostSplit:
    """One TokenDataset on the host: prompts, masks and the primitive contexts of every row."""

    def __init__(self, dataset: TokenDataset, domain: Any):
        self.prompts = np.asarray(jax.device_get(dataset.prompts), np.int32)
        self.mask = np.asarray(jax.device_get(dataset.prompt_mask), bool)
        self.contexts = domain.contexts(dataset)
        self.size = int(self.prompts.shape[0])
        if self.size == 0:
            raise ValueError("host inner loop: a dataset split is empty")

    def batch(self, rows: np.ndarray, repeat: int, bucket_sizes: Sequence[int]):
        """(prompts i32[R*repeat, Tb], mask, contexts): each row repeated `repeat` times, adjacent."""
        rows = np.repeat(np.asarray(rows), repeat)
        prompts, mask = trim_to_bucket(self.prompts[rows], self.mask[rows], bucket_sizes)
        return prompts, mask, [self.contexts[r] for r in rows]


def unstack_programs(programs: Program) -> list[Program]:
    """Program[K] -> K programs (host arrays)."""
    ops, args, sizes = np.asarray(programs.ops), np.asarray(programs.args), np.asarray(programs.size)
    if ops.ndim != 2:
        raise ValueError(f"evaluate_candidates: programs must be stacked Program[K], got ops of shape {ops.shape}")
    return [Program(ops=ops[k], args=args[k], size=sizes[k]) for k in range(ops.shape[0])]
