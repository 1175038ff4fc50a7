"""Device primitives of the multi-turn agent domains (household, ScienceWorld, ALFWorld).

Each episode is scored per step (a heuristic step score, e.g. whether the action matched the
task's meta-tag: plan / explore / reflect / act, which a pretrained policy writes as RLVMR's
<planning> / <explore> / <reflection> / <monitor> tags, derl_jax/domains/agent_prompt.py; a
malformed answer scores 0) and once at the end (success). The primitives, in the order that makes them
`g1`..`g4` of a reward expression:

  * ``outcome``      = success of the episode.
  * ``phase_first``  = mean step score over the first third of the episode.
  * ``phase_middle`` = mean step score over the middle third.
  * ``phase_last``   = mean step score over the last third.

Rollout mapping (N episodes, S step slots):
  step_scores: f32[N, S]  score of each step; slots the episode did not take are ignored.
  step_mask:   bool[N, S] True for the steps the episode actually took (normally a prefix).
  success:     f32[N]     1.0 if the episode solved its task, else 0.0.

Phases. An episode that took L = sum(step_mask) steps is cut at
  b1 = round(L / 3) = (L + 1) // 3     and     b2 = round(2L / 3) = (2L + 1) // 3
(L/3 is never a tie, so the rounding is unambiguous). Steps 0..b1-1 form the first phase,
b1..b2-1 the middle one and b2..L-1 the last one. The cut is symmetric: the first and last
phases always have the same size. Phase sizes for small L:

  L     0      1      2      3      4      5      6      7
  sizes 0,0,0  0,1,0  1,0,1  1,1,1  1,2,1  2,1,2  2,2,2  2,3,2

An empty phase (which happens only for L < 3) scores 0. The paper's example holds: scores
[1, 0, 1, 1, 0, 0] give 0.5, 1 and 0. Steps are counted in the order they were taken among
the masked slots, so a mask with holes is treated as the sequence of its True slots.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from primitives.registry import register_primitive

AGENT_PRIMITIVES = ("outcome", "phase_first", "phase_middle", "phase_last")
DOMAIN = "agent"


def _field(rollout: Mapping[str, Any], key: str, ndim: int) -> jax.Array:
    """`rollout[key]` as an array with `ndim` axes; a clear error names what is wrong."""
    if key not in rollout:
        raise KeyError(f"agent primitives: rollout has no {key!r}; keys present: {sorted(rollout)}")
    value = jnp.asarray(rollout[key])
    if value.ndim != ndim:
        raise ValueError(f"agent primitives: rollout[{key!r}] must have {ndim} axes, got shape {value.shape}")
    return value


def _steps(rollout: Mapping[str, Any]) -> tuple[jax.Array, jax.Array]:
    """(scores f32[N, S], mask bool[N, S]) with matching shapes."""
    scores = _field(rollout, "step_scores", 2).astype(jnp.float32)
    mask = _field(rollout, "step_mask", 2).astype(bool)
    if scores.shape != mask.shape:
        raise ValueError(
            f"agent primitives: step_scores has shape {scores.shape} but step_mask has {mask.shape}"
        )
    return scores, mask


def phase_bounds(lengths: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Cut points (b1, b2), each i32[N], of episodes with `lengths` i32[N] steps."""
    lengths = lengths.astype(jnp.int32)
    return (lengths + 1) // 3, (2 * lengths + 1) // 3


def phase_mean(scores: jax.Array, mask: jax.Array, phase: int) -> jax.Array:
    """Mean of `scores` f32[N, S] over phase 0/1/2 of the True slots of `mask` bool[N, S] -> f32[N].

    An empty phase gives 0.
    """
    lengths = jnp.sum(mask, axis=-1)
    first_cut, second_cut = phase_bounds(lengths)
    cuts = jnp.stack([jnp.zeros_like(first_cut), first_cut, second_cut, lengths.astype(jnp.int32)])
    start, stop = cuts[phase], cuts[phase + 1]
    step_number = jnp.cumsum(mask, axis=-1) - 1
    in_phase = mask & (step_number >= start[:, None]) & (step_number < stop[:, None])
    count = jnp.sum(in_phase, axis=-1)
    total = jnp.sum(jnp.where(in_phase, scores, 0.0), axis=-1)
    return jnp.where(count > 0, total / jnp.maximum(count, 1), 0.0).astype(jnp.float32)


@register_primitive("outcome", kind="device", domain=DOMAIN)
def outcome(rollout: Mapping[str, Any], context: Any) -> jax.Array:
    """1.0 where the episode succeeded, else 0.0: `success` f32[N] -> f32[N]."""
    return _field(rollout, "success", 1).astype(jnp.float32)


@register_primitive("phase_first", kind="device", domain=DOMAIN)
def phase_first(rollout: Mapping[str, Any], context: Any) -> jax.Array:
    """Mean step score over the first third of each episode (0 if that third is empty) -> f32[N]."""
    return phase_mean(*_steps(rollout), phase=0)


@register_primitive("phase_middle", kind="device", domain=DOMAIN)
def phase_middle(rollout: Mapping[str, Any], context: Any) -> jax.Array:
    """Mean step score over the middle third of each episode (0 if that third is empty) -> f32[N]."""
    return phase_mean(*_steps(rollout), phase=1)


@register_primitive("phase_last", kind="device", domain=DOMAIN)
def phase_last(rollout: Mapping[str, Any], context: Any) -> jax.Array:
    """Mean step score over the last third of each episode (0 if that third is empty) -> f32[N]."""
    return phase_mean(*_steps(rollout), phase=2)
