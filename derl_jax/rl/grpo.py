"""GRPO as small pure functions.

Shapes: B prompts, G samples per prompt (`group_size`), N = B*G rollouts, T generated tokens.
Rollouts of one prompt sit next to each other: rows [b*G, (b+1)*G) share prompt b.

Pieces, each usable on its own:
  sanitize_rewards    NaN/inf rewards -> 0, counted
  group_advantages    per-group centring (and optional std scaling; Dr.GRPO drops it)
  clipped_surrogate   PPO-style clipped policy-gradient loss per token
  kl_estimate         k1 / k2 / k3 estimators of KL(policy || reference) per token
  aggregate           token-level -> scalar loss under three normalisations
  grpo_loss           the full objective for a caller-supplied `logprob_fn`
  grpo_update         epochs x minibatches optimizer steps inside one `lax.scan`
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import chex
import jax
import jax.numpy as jnp
import optax

from derl_jax.config import field_error

KL_KINDS = ("k1", "k2", "k3")
LOSS_AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum")
OPTIMIZERS = ("adamw", "adam", "sgd")

# k3 exponentiates the log-ratio; beyond |20| exp() over/underflows float32 gradients.
K3_LOG_RATIO_BOUND = 20.0

LogprobFn = Callable[[Any, Mapping[str, jax.Array]], tuple[jax.Array, jax.Array]]


# ----------------------------------------------------------------------------- rewards


def sanitize_rewards(rewards: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Replace non-finite rewards by 0.

    rewards: f32[...]. Returns (f32[...] with NaN/+-inf set to 0, i32[] how many were).
    """
    rewards = jnp.asarray(rewards, jnp.float32)
    finite = jnp.isfinite(rewards)
    return jnp.where(finite, rewards, 0.0), jnp.sum(~finite).astype(jnp.int32)


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


# ----------------------------------------------------------------------------- token losses


def ratio_and_clip(
    logp: jax.Array, old_logp: jax.Array, *, clip_low: float = 0.2, clip_high: float = 0.2
) -> tuple[jax.Array, jax.Array]:
    """Importance ratio exp(logp - old_logp) and its clip to [1 - clip_low, 1 + clip_high].

    logp, old_logp: f32[N, T]. Returns (ratio f32[N, T], clipped_ratio f32[N, T]).
    """
    chex.assert_equal_shape([logp, old_logp])
    chex.assert_rank(logp, 2)
    ratio = jnp.exp(logp - old_logp)
    return ratio, jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)


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

    logp, old_logp: f32[N, T]; advantages: f32[N] (broadcast over tokens); mask: bool[N, T].
    Returns (per_token_loss f32[N, T] = -min(ratio*A, clip(ratio)*A), 0 where mask is False;
    clip_fraction f32[] = share of valid tokens where the clipped term is the smaller one,
    i.e. where clipping cuts the gradient).
    """
    mask = jnp.asarray(mask, bool)
    chex.assert_equal_shape([logp, old_logp, mask])
    chex.assert_shape(advantages, logp.shape[:1])
    ratio, clipped = ratio_and_clip(logp, old_logp, clip_low=clip_low, clip_high=clip_high)
    adv = jnp.asarray(advantages, jnp.float32)[:, None]
    unclipped_loss = -ratio * adv
    clipped_loss = -clipped * adv
    per_token = jnp.where(mask, jnp.maximum(unclipped_loss, clipped_loss), 0.0)
    clip_active = mask & (clipped_loss > unclipped_loss)
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


def aggregate(per_token: jax.Array, mask: jax.Array, mode: str = "token_mean") -> jax.Array:
    """Reduce f32[N, T] over the valid tokens of bool[N, T] mask to f32[].

    token_mean:          sum of valid values / number of valid tokens
    seq_mean_token_mean: per sequence the mean over its tokens, then the mean over sequences
    seq_mean_token_sum:  per sequence the sum over its tokens, then the mean over sequences
    Sequences without valid tokens are left out of the mean over sequences; with no valid
    token at all the result is 0.
    """
    mask = jnp.asarray(mask, bool)
    chex.assert_equal_shape([per_token, mask])
    values = jnp.where(mask, per_token, 0.0)
    if mode == "token_mean":
        return jnp.sum(values) / jnp.maximum(jnp.sum(mask), 1)
    tokens_per_seq = jnp.sum(mask, axis=-1)
    seq_sum = jnp.sum(values, axis=-1)
    if mode == "seq_mean_token_mean":
        per_seq = seq_sum / jnp.maximum(tokens_per_seq, 1)
    elif mode == "seq_mean_token_sum":
        per_seq = seq_sum
    else:
        raise ValueError(f"aggregate: mode must be one of {LOSS_AGGREGATIONS}, got {mode!r}")
    nonempty = tokens_per_seq > 0
    return jnp.sum(jnp.where(nonempty, per_seq, 0.0)) / jnp.maximum(jnp.sum(nonempty), 1)


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

    group_size: int = 8
    normalize_std: bool = True
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    kl_kind: str = "k3"
    loss_agg: str = "token_mean"
    epochs: int = 1
    minibatches: int = 1
    max_grad_norm: float | None = 1.0
    learning_rate: float = 1e-5
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


def grpo_loss(
    params: Any, batch: Mapping[str, jax.Array], logprob_fn: LogprobFn, cfg: GRPOConfig
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The GRPO objective on one (mini)batch.

    batch: old_logp f32[N, T], advantages f32[N], mask bool[N, T], ref_logp f32[N, T]
      (may be absent when cfg.kl_coef == 0), plus whatever `logprob_fn` reads.
    logprob_fn(params, batch) -> (logp f32[N, T] of the sampled tokens, entropy f32[N, T]).
    Returns (loss f32[], metrics) where loss = aggregate(pg + kl_coef * kl, mask, cfg.loss_agg)
    and metrics loss, pg_loss, kl, entropy, clip_fraction (pg_loss/kl/entropy are means over
    valid tokens).
    """
    for key in ("old_logp", "advantages", "mask"):
        if key not in batch:
            raise KeyError(f"grpo_loss: batch has no {key!r}; keys: {sorted(batch)}")
    mask = jnp.asarray(batch["mask"], bool)
    chex.assert_rank(mask, 2)
    chex.assert_shape(batch["advantages"], mask.shape[:1])
    chex.assert_shape(batch["old_logp"], mask.shape)
    logp, entropy = logprob_fn(params, batch)
    chex.assert_shape([logp, entropy], mask.shape)
    chex.assert_type([logp, entropy], jnp.float32)
    pg, clip_fraction = clipped_surrogate(
        logp, batch["old_logp"], batch["advantages"], mask, clip_low=cfg.clip_low, clip_high=cfg.clip_high
    )
    if cfg.kl_coef > 0:
        if "ref_logp" not in batch:
            raise KeyError(f"grpo_loss: kl_coef={cfg.kl_coef} needs batch['ref_logp']; keys: {sorted(batch)}")
        kl = jnp.where(mask, kl_estimate(logp, batch["ref_logp"], cfg.kl_kind), 0.0)
    elif "ref_logp" in batch:
        kl = jax.lax.stop_gradient(jnp.where(mask, kl_estimate(logp, batch["ref_logp"], cfg.kl_kind), 0.0))
    else:
        kl = jnp.zeros_like(pg)
    loss = aggregate(pg + cfg.kl_coef * kl, mask, cfg.loss_agg)
    metrics = {
        "loss": loss,
        "pg_loss": aggregate(pg, mask, "token_mean"),
        "kl": aggregate(kl, mask, "token_mean"),
        "entropy": aggregate(jax.lax.stop_gradient(entropy), mask, "token_mean"),
        "clip_fraction": clip_fraction,
    }
    return loss, jax.tree_util.tree_map(jax.lax.stop_gradient, metrics)


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
) -> tuple[Any, optax.OptState, dict[str, jax.Array]]:
    """cfg.epochs passes over a rollout batch, cfg.minibatches optimizer steps per pass.

    Every leaf of `batch` has leading axis N (rollouts); N must be divisible by
    cfg.minibatches. Minibatches come from `minibatch_indices` (with cfg.minibatches == 1 every
    step sees the batch in its given order). All steps run in one `lax.scan`, so the function
    jit-compiles once and vmaps over independent policies (params, opt_state, batch, key with
    a leading axis).
    Returns (params, opt_state, metrics averaged over the steps, with grad_norm added).
    """
    if "mask" not in batch:
        raise KeyError(f"grpo_update: batch has no 'mask'; keys: {sorted(batch)}")
    num_rows = batch["mask"].shape[0]
    for name, leaf in batch.items():
        if jnp.ndim(leaf) == 0 or jnp.shape(leaf)[0] != num_rows:
            raise ValueError(
                f"grpo_update: batch[{name!r}] has shape {jnp.shape(leaf)}, expected leading axis N={num_rows}"
            )
    order = minibatch_indices(key, num_rows, cfg.epochs, cfg.minibatches)
    grad_fn = jax.grad(grpo_loss, has_aux=True)

    def step(carry, rows):
        params, opt_state = carry
        minibatch = batch if cfg.minibatches == 1 else {name: leaf[rows] for name, leaf in batch.items()}
        grads, metrics = grad_fn(params, minibatch, logprob_fn, cfg)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = dict(metrics, grad_norm=optax.global_norm(grads))
        return (params, opt_state), metrics

    (params, opt_state), metrics = jax.lax.scan(step, (params, opt_state), order)
    return params, opt_state, jax.tree_util.tree_map(lambda m: m.mean(axis=0), metrics)
