"""GRPO as small pure functions.

Shapes: B prompts, G samples per prompt (`group_size`), N = B*G rollouts, T generated tokens.
Rollouts of one prompt sit next to each other: rows [b*G, (b+1)*G) share prompt b. Token
arrays are [N, T], or [N, ..., T] when a row holds several sequences (the S turns of a
multi-turn episode, [N, S, T]): a row's advantage f32[N] covers all of them (or f32[N, S]
gives each sequence its own), and the per-sequence normalisations (`token_weights`) count
each [T] slice as a sequence.

Pieces, each usable on its own:
  sanitize_rewards    NaN/inf rewards -> 0, counted
  group_advantages    per-group centring (and optional std scaling; Dr.GRPO drops it)
  turn_advantages     the same over every taken turn of a group's episodes (per-turn rewards)
  clipped_surrogate   PPO-style clipped policy-gradient loss per token
  kl_estimate         k1 / k2 / k3 estimators of KL(policy || reference) per token
  token_weights       each normalisation as a weighted token sum over a count
  aggregate           token-level -> scalar loss under three normalisations
  grpo_loss           the full objective for a caller-supplied `logprob_fn`
  grpo_loss_sums      the same as sums over rows and their counts (shards add up)
  psum_in_buckets     a tree summed over a mesh axis in a few flat buffers
  grpo_update         epochs x minibatches optimizer steps inside one `lax.scan`

Rows split over a 'data' mesh axis (`grpo_update(..., mesh=mesh, data_axis='data')`): every
loss term is a weighted token sum divided by a count (`token_weights`), and weights and counts
are per row, so each device takes the gradient of its own rows' sum, their metric sums and
counts (`grpo_loss_sums`, inside a `shard_map` over the axis: each device runs the program of
its own rows, as one device would), and all of them are summed over the axis before the
division. The sum runs over everything packed into a few flat buffers (`psum_in_buckets`): one
all-reduce per buffer instead of one per parameter array, and no collective between sampling
and gradient.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import chex
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, PartitionSpec

from derl_jax.config import field_error

KL_KINDS = ("k1", "k2", "k3")
LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "episode_mean")
OPTIMIZERS = ("adamw", "adam", "sgd")

# k3 exponentiates the log-ratio; beyond |20| exp() over/underflows float32 gradients.
K3_LOG_RATIO_BOUND = 20.0

# gradients summed over a 'data' mesh axis are packed into flat buffers of at most this many bytes
GRAD_BUCKET_BYTES = 25 * 2**20

LogprobFn = Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, jax.Array]]


# ----------------------------------------------------------------------------- rewards


def sanitize_rewards(rewards: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Replace non-finite rewards by 0.

    rewards: f32[...]. Returns (f32[...] with NaN/+-inf set to 0, i32[] how many were).
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    finite = jnp.isfinite(rewards)
    # counted in float32, so that rows sharded over devices are counted by a float all-reduce,
    # which XLA can merge with the update's
    return jnp.where(finite, rewards, 0.0), jnp.sum(~finite, dtype=jnp.float32).astype(jnp.int32)


def group_advantages(
    rewards: jax.Array, group_size: int, *, normalize_std: bool = True, eps: float = 1e-6
) -> jax.Array:
    """Group-relative advantages.

    rewards: f32[B*G], the G samples of each prompt adjacent.
    Returns f32[B*G]: r - mean_group, divided by (std_group + eps) when `normalize_std`
    (GRPO) and left unscaled otherwise (Dr.GRPO). std is the sample standard deviation
    (ddof=1), as in common GRPO implementations. A group whose rewards are all equal gets
    exactly 0 (no rounding residue from the mean).
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim != 1:
        raise ValueError(f"group_advantages: rewards must be 1-D f32[B*G], got shape {rewards.shape}")
    if group_size < 1 or rewards.shape[0] % group_size:
        raise ValueError(
            f"group_advantages: {rewards.shape[0]} rewards cannot be split into groups of group_size={group_size}"
        )
    chex.assert_type(rewards, jnp.float32)
    groups = rewards.reshape(-1, group_size)
    centred = groups - groups.mean(axis=1, keepdims=True)
    if normalize_std:
        dof = max(group_size - 1, 1)
        std = jnp.sqrt(jnp.sum(centred**2, axis=1, keepdims=True) / dof)
        centred = centred / (std + eps)
    constant = groups.max(axis=1, keepdims=True) == groups.min(axis=1, keepdims=True)
    return jnp.where(constant, 0.0, centred).reshape(-1)


def turn_advantages(
    rewards: jax.Array, mask: jax.Array, group_size: int, *, normalize_std: bool = True, eps: float = 1e-6
) -> jax.Array:
    """Group-relative advantages of per-turn rewards.

    rewards: f32[B*G, S], each turn's own reward, the G episodes of a prompt adjacent; mask:
    bool[B*G, S], the turns each episode took. Every taken turn of a group's G episodes is one
    sample: returns f32[B*G, S] = r - their mean, divided by (their std + eps) when
    `normalize_std` (sample std, ddof=1), so a longer episode weighs more in its group's
    baseline. Turns not taken, and every turn of a group whose taken turns all have the same
    reward, get exactly 0.
    """
    rewards, mask = jnp.asarray(rewards, jnp.float32), jnp.asarray(mask, bool)
    if rewards.ndim != 2 or mask.shape != rewards.shape:
        raise ValueError(f"turn_advantages: rewards f32[N, S] and mask bool[N, S] must match, got {rewards.shape} "
                         f"and {mask.shape}")
    if group_size < 1 or rewards.shape[0] % group_size:
        raise ValueError(f"turn_advantages: {rewards.shape[0]} episodes cannot be split into groups of "
                         f"group_size={group_size}")
    groups, taken = rewards.reshape(-1, group_size * rewards.shape[1]), mask.reshape(-1, group_size * rewards.shape[1])
    count = jnp.sum(taken, axis=1, keepdims=True).astype(jnp.float32)
    mean = jnp.sum(jnp.where(taken, groups, 0.0), axis=1, keepdims=True) / jnp.maximum(count, 1.0)
    centred = jnp.where(taken, groups - mean, 0.0)
    if normalize_std:
        std = jnp.sqrt(jnp.sum(centred**2, axis=1, keepdims=True) / jnp.maximum(count - 1.0, 1.0))
        centred = centred / (std + eps)
    highest = jnp.max(jnp.where(taken, groups, -jnp.inf), axis=1, keepdims=True)
    lowest = jnp.min(jnp.where(taken, groups, jnp.inf), axis=1, keepdims=True)
    return jnp.where(taken & (highest > lowest), centred, 0.0).reshape(rewards.shape)


# ----------------------------------------------------------------------------- token losses


def _check_rows(x: jax.Array) -> None:
    """Token arrays are [N, T] (one sequence per row) or [N, ..., T] (several sequences per row,
    e.g. the S turns of an episode: [N, S, T]); the last axis is a sequence's tokens."""
    if jnp.ndim(x) < 2:
        raise ValueError(f"grpo: token arrays must be [N, T] or [N, ..., T], got shape {jnp.shape(x)}")


def ratio_and_clip(
    logp: jax.Array, old_logp: jax.Array, *, clip_low: float = 0.2, clip_high: float = 0.2
) -> tuple[jax.Array, jax.Array]:
    """Importance ratio exp(logp - old_logp) and its clip to [1 - clip_low, 1 + clip_high].

    logp, old_logp: f32[N, T] (or f32[N, ..., T]). Returns (ratio, clipped_ratio), shaped as logp.
    """
    chex.assert_equal_shape([logp, old_logp])
    _check_rows(logp)
    ratio = jnp.exp(logp - old_logp)
    return ratio, jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)


def _check_advantages(advantages: jax.Array, shape: tuple[int, ...]) -> None:
    """Advantages are per row f32[N] or per sequence f32[N, ...] of token arrays of `shape` [N, ..., T]
    (AssertionError otherwise)."""
    chex.assert_shape(advantages, tuple(shape[:min(max(jnp.ndim(advantages), 1), max(len(shape) - 1, 1))]))


def _surrogate_and_clip_mask(logp, old_logp, advantages, mask, clip_low, clip_high):
    """(per-token clipped loss f32[N, T], 0 off the mask; bool[N, T] where the clip is the smaller term)."""
    mask = jnp.asarray(mask, bool)
    chex.assert_equal_shape([logp, old_logp, mask])
    _check_advantages(advantages, logp.shape)
    ratio, clipped = ratio_and_clip(logp, old_logp, clip_low=clip_low, clip_high=clip_high)
    adv = jnp.asarray(advantages, jnp.float32)
    adv = adv.reshape(adv.shape + (1,) * (logp.ndim - adv.ndim))
    unclipped_loss = -ratio * adv
    clipped_loss = -clipped * adv
    per_token = jnp.where(mask, jnp.maximum(unclipped_loss, clipped_loss), 0.0)
    return per_token, mask & (clipped_loss > unclipped_loss)


def clipped_surrogate(
    logp: jax.Array,
    old_logp: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> tuple[jax.Array, jax.Array]:
    """Clipped policy-gradient loss.

    logp, old_logp: f32[N, T] (or f32[N, ..., T]); advantages: f32[N] (broadcast over tokens; or
    one per sequence, e.g. f32[N, S] for [N, S, T]); mask: bool, shaped as logp.
    Returns (per_token_loss f32[N, T] = -min(ratio*A, clip(ratio)*A), 0 where mask is False;
    clip_fraction f32[] = share of valid tokens where the clipped term is the smaller one,
    i.e. where clipping cuts the gradient).
    """
    per_token, clip_active = _surrogate_and_clip_mask(logp, old_logp, advantages, mask, clip_low, clip_high)
    clip_fraction = jnp.sum(clip_active) / jnp.maximum(jnp.sum(mask), 1)
    return per_token, clip_fraction.astype(jnp.float32)


def kl_estimate(logp: jax.Array, ref_logp: jax.Array, kind: str = "k3") -> jax.Array:
    """Per-token estimate of KL(policy || reference) from sampled-token log-probs.

    logp, ref_logp: f32[N, T]. kind:
      k1: logp - ref_logp                      (unbiased, can be negative)
      k2: 0.5 * (logp - ref_logp)^2            (biased, low variance)
      k3: exp(d) - d - 1 with d = ref_logp - logp clipped to [-20, 20] ("low_var_kl";
          unbiased, non-negative; the clip keeps exp() finite in float32)
    Returns f32[N, T].
    """
    chex.assert_equal_shape([logp, ref_logp])
    log_ratio = logp - ref_logp
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio**2
    if kind == "k3":
        d = jnp.clip(-log_ratio, -K3_LOG_RATIO_BOUND, K3_LOG_RATIO_BOUND)
        return jnp.exp(d) - d - 1.0
    raise ValueError(f"kl_estimate: kind must be one of {KL_KINDS}, got {kind!r}")


def token_weights(mask: jax.Array, mode: str = "token_mean",
                  episode_tokens: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(weights f32[N, ..., T], 0 off the mask; count f32[]) with
    aggregate(x, mask, mode) = sum(weights * x) / max(count, 1):

    token_mean:          weight 1,                                 count: valid tokens
    seq_mean_token_mean: weight 1 / (the sequence's valid tokens), count: non-empty sequences
    seq_mean_token_sum:  weight 1,                                 count: non-empty sequences
    episode_mean:        weight 1 / (the episode's valid tokens),  count: non-empty episodes

    A sequence is a row of the last axis. An episode is a row of the leading axis N, unless
    `episode_tokens` f32[N] gives each row its whole episode's valid tokens (an episode cut into
    several rows, e.g. one per turn): each episode then weighs the same however many turns and
    tokens it took. Weights are per row and the count is a sum over rows (episode_mean counts
    each row's share of its episode), so for a batch cut into row shards the shards' weighted
    sums and counts add up to the batch's.
    """
    mask = jnp.asarray(mask, bool)
    _check_rows(mask)
    if mode == "token_mean":
        weights = jnp.where(mask, 1.0, 0.0)
        return weights.astype(jnp.float32), jnp.sum(weights).astype(jnp.float32)
    if mode == "episode_mean":
        if episode_tokens is None:
            episode_tokens = jnp.sum(mask, axis=tuple(range(1, mask.ndim)))
        per_row = jnp.reshape(jnp.asarray(episode_tokens, jnp.float32), (-1,) + (1,) * (mask.ndim - 1))
        weights = jnp.where(mask, 1.0 / jnp.maximum(per_row, 1.0), 0.0).astype(jnp.float32)
        return weights, jnp.sum(weights)
    tokens_per_seq = jnp.sum(mask, axis=-1, keepdims=True)
    if mode in ("seq_mean_token_mean", "seq_mean_token_sum"):
        count = jnp.sum(tokens_per_seq > 0)
        weight = 1.0 / jnp.maximum(tokens_per_seq, 1) if mode == "seq_mean_token_mean" else 1.0
    else:
        raise ValueError(f"aggregate: mode must be one of {LOSS_AGGREGATIONS}, got {mode!r}")
    return jnp.where(mask, weight, 0.0).astype(jnp.float32), count.astype(jnp.float32)


def weighted_sum(per_token: jax.Array, weights: jax.Array) -> jax.Array:
    """f32[]: sum of per_token f32[N, T] times weights f32[N, T], tokens of weight 0 left out
    (so a NaN or inf there cannot leak in)."""
    chex.assert_equal_shape([per_token, weights])
    return jnp.sum(jnp.where(weights != 0, per_token * weights, 0.0))


def aggregate(per_token: jax.Array, mask: jax.Array, mode: str = "token_mean") -> jax.Array:
    """Reduce f32[N, T] over the valid tokens of bool[N, T] mask to f32[].

    token_mean:          sum of valid values / number of valid tokens
    seq_mean_token_mean: per sequence the mean over its tokens, then the mean over sequences
    seq_mean_token_sum:  per sequence the sum over its tokens, then the mean over sequences
    episode_mean:        per row of N (an episode) the mean over all its tokens, then the mean
                         over episodes
    Sequences without valid tokens are left out of the mean over sequences; with no valid
    token at all the result is 0.
    """
    chex.assert_equal_shape([per_token, mask])
    weights, count = token_weights(mask, mode)
    return weighted_sum(per_token, weights) / jnp.maximum(count, 1.0)


# ----------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """Hyper-parameters of the inner GRPO update.

    group_size:    G, samples per prompt.
    normalize_std: divide advantages by the group std (False = Dr.GRPO).
    clip_low, clip_high: ratio clip range [1 - clip_low, 1 + clip_high].
    kl_coef:       beta on the KL penalty against the reference policy (0 disables it).
    kl_kind:       "k1" | "k2" | "k3".
    loss_agg:      one of LOSS_AGGREGATIONS.
    epochs:        passes over one rollout batch.
    minibatches:   equal minibatches per pass (one optimizer step each).
    max_grad_norm: global-norm gradient clip; None disables it.
    learning_rate, optimizer ("adamw" | "adam" | "sgd"), weight_decay (adamw only),
    b1, b2 (adam/adamw), warmup_steps (linear warmup: step k uses lr * min(1, (k+1)/warmup)).
    """

    group_size: int = 4
    normalize_std: bool = True
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    kl_kind: str = "k3"
    loss_agg: str = "token_mean"
    epochs: int = 1
    minibatches: int = 1
    max_grad_norm: float | None = 1.0
    learning_rate: float = 3e-4
    optimizer: str = "adamw"
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    warmup_steps: int = 0

    def __post_init__(self):
        if self.group_size < 1:
            raise field_error(self, "group_size", "must be >= 1")
        if self.clip_low < 0 or self.clip_high < 0 or self.clip_low >= 1:
            raise field_error(self, "clip_low", f"need 0 <= clip_low < 1 and clip_high >= 0 (clip_high={self.clip_high})")
        if self.kl_coef < 0:
            raise field_error(self, "kl_coef", "must be >= 0")
        if self.kl_kind not in KL_KINDS:
            raise field_error(self, "kl_kind", f"must be one of {KL_KINDS}")
        if self.loss_agg not in LOSS_AGGREGATIONS:
            raise field_error(self, "loss_agg", f"must be one of {LOSS_AGGREGATIONS}")
        if self.epochs < 1:
            raise field_error(self, "epochs", "must be >= 1")
        if self.minibatches < 1:
            raise field_error(self, "minibatches", "must be >= 1")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise field_error(self, "max_grad_norm", "must be > 0 or None")
        if self.learning_rate < 0:
            raise field_error(self, "learning_rate", "must be >= 0")
        if self.optimizer not in OPTIMIZERS:
            raise field_error(self, "optimizer", f"must be one of {OPTIMIZERS}")
        if self.weight_decay and self.optimizer != "adamw":
            raise field_error(self, "weight_decay", f"only applies to optimizer='adamw', got optimizer={self.optimizer!r}")
        if self.warmup_steps < 0:
            raise field_error(self, "warmup_steps", "must be >= 0")

    @classmethod
    def from_mapping(cls, fields: Mapping[str, Any]) -> "GRPOConfig":
        """Build from a dict or ml_collections ConfigDict; unknown keys are an error."""
        fields = dict(fields)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"GRPOConfig.from_mapping: unknown fields {unknown}; known: {sorted(known)}")
        return cls(**fields)


def learning_rate_schedule(cfg: GRPOConfig) -> optax.Schedule:
    """Linear warmup to cfg.learning_rate over cfg.warmup_steps (step k: (k+1)/warmup), then constant."""
    peak, warmup = cfg.learning_rate, cfg.warmup_steps

    def schedule(count):
        if warmup == 0:
            return jnp.asarray(peak, jnp.float32)
        return peak * jnp.minimum(1.0, (count + 1.0) / warmup)

    return schedule


def make_optimizer(cfg: GRPOConfig) -> optax.GradientTransformation:
    """Global-norm clip (unless max_grad_norm is None) followed by the configured optimizer."""
    lr = learning_rate_schedule(cfg)
    if cfg.optimizer == "adamw":
        opt = optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay)
    elif cfg.optimizer == "adam":
        opt = optax.adam(lr, b1=cfg.b1, b2=cfg.b2)
    else:
        opt = optax.sgd(lr)
    if cfg.max_grad_norm is None:
        return opt
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), opt)


# ----------------------------------------------------------------------------- loss and update


def grpo_loss_sums(
    params: Any, batch: Mapping[str, jax.Array], logprob_fn: LogprobFn, cfg: GRPOConfig
) -> tuple[jax.Array, tuple[dict[str, jax.Array], dict[str, jax.Array]]]:
    """The GRPO objective on a batch of rows as sums, before the division by a count.

    batch, logprob_fn: as `grpo_loss`. Returns (loss_sum f32[], (sums, counts)): sums holds
    loss, pg_loss, kl, entropy, clip_fraction as weighted token sums (`token_weights`); counts
    {"loss": under cfg.loss_agg, "token": valid tokens}, f32[]. Every output is a sum over
    rows: for rows cut into shards the shards' outputs add up to the whole batch's, and
    `normalized` turns them into `grpo_loss`'s.
    """
    for key in ("old_logp", "advantages", "mask"):
        if key not in batch:
            raise KeyError(f"grpo_loss: batch has no {key!r}; keys: {sorted(batch)}")
    mask = jnp.asarray(batch["mask"], bool)
    _check_rows(mask)
    _check_advantages(batch["advantages"], mask.shape)
    chex.assert_shape(batch["old_logp"], mask.shape)
    loss_weights, loss_count = token_weights(mask, cfg.loss_agg, batch.get("episode_tokens"))
    weights, count = token_weights(mask, "token_mean")
    logp, entropy = logprob_fn(params, batch)
    chex.assert_shape([logp, entropy], mask.shape)
    chex.assert_type([logp, entropy], jnp.float32)
    pg, clip_active = _surrogate_and_clip_mask(logp, batch["old_logp"], batch["advantages"], mask,
                                               cfg.clip_low, cfg.clip_high)
    if cfg.kl_coef > 0:
        if "ref_logp" not in batch:
            raise KeyError(f"grpo_loss: kl_coef={cfg.kl_coef} needs batch['ref_logp']; keys: {sorted(batch)}")
        kl = jnp.where(mask, kl_estimate(logp, batch["ref_logp"], cfg.kl_kind), 0.0)
    elif "ref_logp" in batch:
        kl = jax.lax.stop_gradient(jnp.where(mask, kl_estimate(logp, batch["ref_logp"], cfg.kl_kind), 0.0))
    else:
        kl = jnp.zeros_like(pg)
    loss_sum = weighted_sum(pg + cfg.kl_coef * kl, loss_weights)
    sums = {
        "loss": loss_sum,
        "pg_loss": weighted_sum(pg, weights),
        "kl": weighted_sum(kl, weights),
        "entropy": weighted_sum(jax.lax.stop_gradient(entropy), weights),
        "clip_fraction": weighted_sum(clip_active.astype(jnp.float32), weights),
    }
    return loss_sum, (jax.tree_util.tree_map(jax.lax.stop_gradient, sums), {"loss": loss_count, "token": count})


def normalized(sums: Mapping[str, jax.Array], counts: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """`grpo_loss_sums`' sums divided by their counts: "loss" by the loss count, the rest by the
    valid tokens (a batch without valid tokens gives 0)."""
    return {name: value / jnp.maximum(counts["loss" if name == "loss" else "token"], 1.0)
            for name, value in sums.items()}


def grpo_loss(
    params: Any, batch: Mapping[str, jax.Array], logprob_fn: LogprobFn, cfg: GRPOConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The GRPO objective on one (mini)batch.

    batch: old_logp f32[N, T], advantages f32[N] (or per sequence, f32[N, S] for [N, S, T] rows),
      mask bool[N, T], ref_logp f32[N, T]
      (may be absent when cfg.kl_coef == 0), optionally episode_tokens f32[N] (`token_weights`:
      for loss_agg "episode_mean" when an episode spans several rows), plus whatever
      `logprob_fn` reads.
    logprob_fn(params, batch) -> (logp f32[N, T] of the sampled tokens, entropy f32[N, T]).
    Returns (loss f32[], metrics) where loss = aggregate(pg + kl_coef * kl, mask, cfg.loss_agg)
    and metrics loss, pg_loss, kl, entropy, clip_fraction (pg_loss/kl/entropy are means over
    valid tokens).
    """
    loss_sum, (sums, counts) = grpo_loss_sums(params, batch, logprob_fn, cfg)
    return loss_sum / jnp.maximum(counts["loss"], 1.0), normalized(sums, counts)


def psum_in_buckets(tree: Any, axis_name: str, bucket_bytes: int = GRAD_BUCKET_BYTES) -> Any:
    """`jax.lax.psum(tree, axis_name)` (inside a `shard_map` over that mesh axis) in flat buffers.

    Leaves are packed, in order, into flat f32 buffers of at most `bucket_bytes` (a leaf larger
    than that gets one of its own) and each buffer is summed as one array: one all-reduce per
    buffer, not one per leaf (XLA:CPU's in-process collectives are slow at many small ones).
    `bucket_bytes` = 0 sums every leaf on its own (for leaves sharded over another mesh axis,
    which a flat buffer would gather). Every leaf keeps its shape and dtype.
    """
    if bucket_bytes <= 0:
        return jax.lax.psum(tree, axis_name)
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    sizes = [math.prod(jnp.shape(leaf)) for leaf in leaves]
    buckets, filled = [[]], 0
    for index, size in enumerate(sizes):
        if buckets[-1] and (filled + size) * 4 > bucket_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(index)
        filled += size
    summed = [None] * len(leaves)
    for bucket in buckets:
        total = jax.lax.psum(jnp.concatenate([jnp.ravel(leaves[i]).astype(jnp.float32) for i in bucket]), axis_name)
        start = 0
        for i in bucket:
            summed[i] = total[start:start + sizes[i]].reshape(jnp.shape(leaves[i])).astype(leaves[i].dtype)
            start += sizes[i]
    return jax.tree_util.tree_unflatten(treedef, summed)


def minibatch_indices(key: jax.Array, num_rows: int, epochs: int, minibatches: int) -> jax.Array:
    """i32[epochs * minibatches, num_rows // minibatches]: the rows of each epoch cut in equal parts.

    Each epoch takes a fresh permutation of the rows. With one minibatch every step takes the
    whole batch, so an order cannot change what it sees: the rows then keep their given order
    (a `logprob_fn` may rely on it, e.g. on grouped prompts).
    """
    if num_rows % minibatches:
        raise ValueError(
            f"grpo_update: batch of {num_rows} rollouts does not split into minibatches={minibatches} equal parts"
        )
    if minibatches == 1:
        return jnp.broadcast_to(jnp.arange(num_rows, dtype=jnp.int32), (epochs, num_rows))
    keys = jax.random.split(key, epochs)
    orders = jax.vmap(lambda k: jax.random.permutation(k, num_rows))(keys)
    return orders.reshape(epochs * minibatches, num_rows // minibatches)


def grpo_update(
    params: Any,
    opt_state: optax.OptState,
    batch: Mapping[str, jax.Array],
    key: jax.Array,
    logprob_fn: LogprobFn,
    optimizer: optax.GradientTransformation,
    cfg: GRPOConfig,
    *,
    mesh: Mesh | None = None,
    data_axis: str | None = None,
    manual_axes: tuple[str, ...] = (),
    bucket_bytes: int = GRAD_BUCKET_BYTES,
) -> tuple[Any, optax.OptState, dict[str, jax.Array]]:
    """cfg.epochs passes over a rollout batch, cfg.minibatches optimizer steps per pass.

    Every leaf of `batch` has leading axis N (rollouts); N must be divisible by
    cfg.minibatches. Minibatches come from `minibatch_indices` (with cfg.minibatches == 1 every
    step sees the batch in its given order). All steps run in one `lax.scan`, so the function
    jit-compiles once and vmaps over independent policies (params, opt_state, batch, key with
    a leading axis).

    With a `mesh` and its `data_axis` of size D, each minibatch's rows are cut into D
    consecutive shards, one per device along that axis (the layout of rows sharded over it):
    inside a `shard_map` (manual over `data_axis` and `manual_axes`, e.g. a candidate axis a
    caller vmaps over with `spmd_axis_name`; automatic over the others, which may shard the
    parameters) each device takes its rows' gradient of the loss as a sum (`grpo_loss_sums`),
    their metric sums and counts, sums them over the axis in one go with
    `psum_in_buckets(..., bucket_bytes)` and then divides by the counts: one all-reduce per flat
    buffer and no other collective before the division. The result equals the unsplit update
    up to float rounding. `logprob_fn` then sees N / (M*D) rows at a time.
    Returns (params, opt_state, metrics averaged over the steps, with grad_norm added).
    """
    if "mask" not in batch:
        raise KeyError(f"grpo_update: batch has no 'mask'; keys: {sorted(batch)}")
    num_rows = batch["mask"].shape[0]
    for path, leaf in jax.tree_util.tree_leaves_with_path(batch):
        if jnp.ndim(leaf) == 0 or jnp.shape(leaf)[0] != num_rows:
            raise ValueError(
                f"grpo_update: batch{jax.tree_util.keystr(path)} has shape {jnp.shape(leaf)}, expected leading axis "
                f"N={num_rows}"
            )
    order = minibatch_indices(key, num_rows, cfg.epochs, cfg.minibatches)
    if mesh is not None:
        if data_axis not in mesh.shape:
            raise ValueError(f"grpo_update: data_axis={data_axis!r} is not an axis of the mesh {dict(mesh.shape)}")
        if order.shape[1] % mesh.shape[data_axis]:
            raise ValueError(f"grpo_update: minibatches of {order.shape[1]} rollouts do not split over the "
                             f"{mesh.shape[data_axis]} devices of mesh axis {data_axis!r}")
    loss_grad = jax.grad(grpo_loss, has_aux=True)
    sums_grad = jax.grad(grpo_loss_sums, has_aux=True)

    def summed_over_devices(params, rows):
        grads, (sums, counts) = sums_grad(params, rows, logprob_fn, cfg)
        return psum_in_buckets((grads, sums, counts), data_axis, bucket_bytes)

    def minibatch_grads(params, minibatch):
        if mesh is None:
            return loss_grad(params, minibatch, logprob_fn, cfg)
        # check_vma=False: the gradient of the replicated parameters stays each device's own
        # (with the check it would be summed over the axis leaf by leaf) until psum_in_buckets
        over_devices = jax.shard_map(summed_over_devices, mesh=mesh,
                                     in_specs=(PartitionSpec(), PartitionSpec(data_axis)), out_specs=PartitionSpec(),
                                     axis_names={data_axis, *manual_axes}, check_vma=False)
        grads, sums, counts = over_devices(params, dict(minibatch))
        scale = 1.0 / jnp.maximum(counts["loss"], 1.0)
        return jax.tree_util.tree_map(lambda g: (g * scale).astype(g.dtype), grads), normalized(sums, counts)

    def step(carry, rows):
        params, opt_state = carry
        minibatch = batch if cfg.minibatches == 1 else jax.tree_util.tree_map(lambda leaf: leaf[rows], batch)
        grads, metrics = minibatch_grads(params, minibatch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = dict(metrics, grad_norm=optax.global_norm(grads))
        return (params, opt_state), metrics

    (params, opt_state), metrics = jax.lax.scan(step, (params, opt_state), order)
    return params, opt_state, jax.tree_util.tree_map(lambda m: m.mean(axis=0), metrics)
