"""Logits of a transformers model and of ours on the same tokens, for the checkpoint parity tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from derl_jax.models import transformer as tr

_forward = jax.jit(tr.apply, static_argnums=0)


def torch_logits(model, tokens: np.ndarray, attention_mask: np.ndarray | None = None,
                 positions: np.ndarray | None = None) -> np.ndarray:
    """f32[B, T, V] logits of a transformers causal LM; `attention_mask` i64[B, T] with `positions`."""
    kwargs = {}
    if attention_mask is not None:
        kwargs = dict(attention_mask=torch.tensor(attention_mask, dtype=torch.long),
                      position_ids=torch.tensor(positions, dtype=torch.long))
    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long), **kwargs).logits.float().numpy()


def our_logits(config, params, tokens: np.ndarray, mask: np.ndarray | None = None, positions=None) -> np.ndarray:
    """f32[B, T, V] logits of our model: causal attention, `mask` bool[B, T] of real keys."""
    graphdef, _ = tr.abstract_model(config)
    batch, length = tokens.shape
    if positions is None:
        positions = np.broadcast_to(np.arange(length), (batch, length))
    attention = None if mask is None else mask[:, None, :] & np.tril(np.ones((length, length), bool))[None]
    logits, _ = _forward(graphdef, params, jnp.asarray(tokens, jnp.int32), jnp.asarray(positions, jnp.int32),
                         None if attention is None else jnp.asarray(attention))
    return np.asarray(logits)
