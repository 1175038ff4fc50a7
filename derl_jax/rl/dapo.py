"""DAPO's additions to GRPO (Yu et al., 2025), as pure functions the inner loop composes.

`inner.algorithm = "dapo"` turns on all four; each is also a setting of its own:

* clip-higher: a wider upper ratio clip than the lower one (`inner.clip_high` > `inner.clip_low`;
  DAPO's 0.28 against 0.2), so unlikely tokens whose advantage is positive can still rise;
* token-level loss: every token of the batch weighs the same (`inner.loss_agg = "token_mean"`);
* dynamic sampling: each step samples `dynamic_oversample` times the prompts it trains on,
  drops the groups whose rewards are all equal (they carry no gradient) and fills the batch
  with the first informative ones (`informative_groups`); with too few, the batch is topped up
  with uninformative groups, whose advantage is 0, and the shortfall is counted;
* overlong reward shaping: a completion longer than `max_new_tokens - overlong_buffer` tokens
  is penalised linearly up to -1 at the generation limit (`overlong_penalty`), and one cut off
  at the limit gets the full -1.

Multi-turn episodes (rollout "env"): a group is the G episodes of one task, and dynamic sampling
keeps or drops whole episode groups by their episode rewards. The overlong penalty applies per
turn, to each action against the per-turn limit `max_new_tokens` (`turn_overlong_penalty`);
an episode's reward adds the mean penalty of its taken turns (`episode_overlong_penalty`, so
in [-1, 0] like a single completion's, whatever the episode's length), and under per-turn
credit each turn's reward adds its own.

`inner.algorithm = "dapo"` resolves the settings once (`resolve`, called by `InnerConfig`): each
of them left at its GRPO default takes DAPO's value, one given another value is kept:
clip_high 0.2 -> 0.28 (`DAPO_CLIP_HIGH`), dynamic_oversample 1 -> 2 (`DAPO_OVERSAMPLE`),
overlong_buffer 0 -> max_new_tokens // 4 (at least 1); loss_agg's default is already
"token_mean". Under "grpo" every setting is used as given (dynamic_oversample 1 and
overlong_buffer 0 are off).

Shapes: P prompts sampled, B prompts trained on, G completions per prompt.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from derl_jax.rl.grpo import GRPOConfig

ALGORITHMS = ("grpo", "dapo")
DAPO_CLIP_HIGH = 0.28
DAPO_OVERSAMPLE = 2
GRPO_CLIP_HIGH = GRPOConfig.clip_high   # the default, as in configs/common.py


def resolve(algorithm: str, clip_high: float, oversample: int, buffer: int, max_new_tokens: int
            ) -> tuple[float, int, int]:
    """(clip_high, dynamic_oversample, overlong_buffer) that `algorithm` trains with (module docstring)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"resolve: algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if algorithm == "grpo":
        return clip_high, oversample, buffer
    return (DAPO_CLIP_HIGH if clip_high == GRPO_CLIP_HIGH else clip_high,
            DAPO_OVERSAMPLE if oversample == 1 else oversample,
            buffer or max(1, max_new_tokens // 4))


def overlong_penalty(lengths: jax.Array, max_new_tokens: int, buffer: int) -> jax.Array:
    """DAPO's soft overlong punishment of completions of `lengths` i32[N] tokens -> f32[N].

    0 up to `max_new_tokens - buffer` tokens; then ((max_new_tokens - buffer) - length) / buffer,
    falling linearly to -1 at `max_new_tokens` (a completion the limit cut off).
    """
    if not 0 < buffer <= max_new_tokens:
        raise ValueError(f"overlong_penalty: need 0 < buffer <= max_new_tokens, got {buffer} and {max_new_tokens}")
    lengths = jnp.asarray(lengths, jnp.float32)
    expected = float(max_new_tokens - buffer)
    return jnp.clip((expected - lengths) / float(buffer), -1.0, 0.0)


def turn_overlong_penalty(lengths: jax.Array, taken: jax.Array, max_new_tokens: int, buffer: int) -> jax.Array:
    """`overlong_penalty` of every action of multi-turn episodes: lengths i32[N, S] tokens per
    turn, taken bool[N, S] (the turns played) -> f32[N, S], 0 on turns not taken."""
    return jnp.where(taken, overlong_penalty(lengths, max_new_tokens, buffer), 0.0)


def episode_overlong_penalty(lengths: jax.Array, taken: jax.Array, max_new_tokens: int, buffer: int) -> jax.Array:
    """f32[N]: the mean `turn_overlong_penalty` over each episode's taken turns (0 for an
    episode without a taken turn)."""
    per_turn = turn_overlong_penalty(lengths, taken, max_new_tokens, buffer)
    turns = jnp.sum(taken, axis=-1, dtype=jnp.float32)
    return jnp.sum(per_turn, axis=-1) / jnp.maximum(turns, 1.0)


def informative_groups(rewards: jax.Array, keep: int) -> tuple[jax.Array, jax.Array]:
    """DAPO's dynamic sampling over rewards f32[P, G] of P sampled groups -> (indices i32[keep],
    shortfall i32[]).

    The indices name the first `keep` groups whose rewards are not all equal, in sampled order,
    then (when fewer are informative) the first uninformative ones; `shortfall` is how many of
    the kept groups are uninformative. Static shapes: it runs inside the jitted inner loop.
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 2:
        raise ValueError(f"informative_groups: rewards must be f32[P, G], got shape {rewards.shape}")
    if not 0 < keep <= rewards.shape[0]:
        raise ValueError(f"informative_groups: keep must be in 1..{rewards.shape[0]}, got {keep}")
    informative = jnp.max(rewards, axis=1) > jnp.min(rewards, axis=1)
    order = jnp.argsort(~informative, stable=True)   # informative groups first, each side in sampled order
    indices = order[:keep].astype(jnp.int32)
    shortfall = keep - jnp.minimum(jnp.sum(informative, dtype=jnp.int32), keep)
    return indices, shortfall


class Selection(NamedTuple):
    """The rollouts one step trains on, out of its M = P*G sampled ones (`select`).

    rows i32[B*G]: the sampled rows trained on, whole groups in `informative_groups` order;
    rewards f32[B*G]: their (shaped) rewards; shortfall i32[]: uninformative groups among the
    B kept; informative_fraction f32[]: the share of the P sampled groups that are informative.
    """

    rows: jax.Array
    rewards: jax.Array
    shortfall: jax.Array
    informative_fraction: jax.Array


def select(rewards: jax.Array, group_size: int, keep: int) -> Selection:
    """Dynamic sampling over rewards f32[P*G] of P sampled groups (rows [p*G, (p+1)*G) form
    group p) -> the `keep` groups to train on, as a `Selection` of B = keep groups."""
    groups = jnp.asarray(rewards, jnp.float32).reshape(-1, group_size)
    indices, shortfall = informative_groups(groups, keep)
    rows = (indices[:, None] * group_size + jnp.arange(group_size, dtype=jnp.int32)).reshape(-1)
    informative = jnp.max(groups, axis=1) > jnp.min(groups, axis=1)
    return Selection(rows=rows, rewards=groups[indices].reshape(-1), shortfall=shortfall,
                     informative_fraction=jnp.mean(informative.astype(jnp.float32)))
