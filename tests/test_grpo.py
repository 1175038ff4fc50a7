"""GRPO pieces against hand-computed numbers and a NumPy reference of one SGD step."""

import functools
import math
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from derl_jax.parallel import make_mesh
from derl_jax.rl import grpo
from derl_jax.rl.placement import update_split

# ----------------------------------------------------------------------------- rewards / advantages


def test_sanitize_rewards_zeroes_and_counts_nonfinite():
    rewards = jnp.array([1.0, jnp.nan, jnp.inf, -jnp.inf, 2.0, -0.5])
    clean, count = grpo.sanitize_rewards(rewards)
    np.testing.assert_array_equal(np.asarray(clean), [1.0, 0.0, 0.0, 0.0, 2.0, -0.5])
    assert int(count) == 3 and count.dtype == jnp.int32
    clean, count = grpo.sanitize_rewards(jnp.ones((2, 3)))
    assert clean.shape == (2, 3) and int(count) == 0


def test_group_advantages_golden_numbers():
    rewards = jnp.array([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
    # group 1: mean 0.5, sample std sqrt(4 * 0.25 / 3) = 1/sqrt(3); group 2 constant.
    expected = np.array([0.5, -0.5, -0.5, 0.5]) / (1 / math.sqrt(3) + 1e-6)
    adv = grpo.group_advantages(rewards, 4)
    np.testing.assert_allclose(np.asarray(adv[:4]), expected, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(adv[4:]), 0.0)


def test_group_advantages_dr_grpo_only_centres():
    rewards = jnp.array([3.0, 1.0, 2.0, 7.0, 7.0, 1.0])
    adv = grpo.group_advantages(rewards, 3, normalize_std=False)
    np.testing.assert_allclose(np.asarray(adv), [1.0, -1.0, 0.0, 2.0, 2.0, -4.0], rtol=1e-6)


def test_zero_variance_groups_are_exactly_zero():
    # 0.1 is not exact in float32, so a naive r - mean could leave a tiny residue.
    rewards = jnp.array([0.1, 0.1, 0.1, 0.3, 0.3, 0.3, -7.7, -7.7, -7.7])
    for normalize in (True, False):
        adv = grpo.group_advantages(rewards, 3, normalize_std=normalize)
        assert np.all(np.asarray(adv) == 0.0)


def test_group_advantages_match_numpy_reference():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(5, 6)).astype(np.float32)
    ref = (rewards - rewards.mean(1, keepdims=True)) / (rewards.std(1, ddof=1, keepdims=True) + 1e-6)
    adv = grpo.group_advantages(jnp.asarray(rewards.reshape(-1)), 6)
    np.testing.assert_allclose(np.asarray(adv), ref.reshape(-1), rtol=1e-5, atol=1e-6)


def test_group_advantages_rejects_bad_group_size():
    with pytest.raises(ValueError, match="group_size=4"):
        grpo.group_advantages(jnp.zeros(6), 4)
    with pytest.raises(ValueError, match="1-D"):
        grpo.group_advantages(jnp.zeros((2, 3)), 3)


# ----------------------------------------------------------------------------- clipped surrogate


def _logs(ratios):
    return jnp.log(jnp.asarray(ratios, jnp.float32))


def test_clipped_surrogate_symmetric_golden_numbers():
    ratios = [[1.5, 0.5, 1.0], [1.5, 0.5, 1.0], [1.1, 1.3, 0.7]]
    advantages = jnp.array([1.0, -1.0, 2.0])
    mask = jnp.array([[True, True, True], [True, True, True], [True, True, False]])
    loss, clip_fraction = grpo.clipped_surrogate(_logs(ratios), jnp.zeros((3, 3)), advantages, mask)
    expected = [
        [-1.2, -0.5, -1.0],  # A=+1: ratio 1.5 clipped to 1.2 (active)
        [1.5, 0.8, 1.0],  # A=-1: ratio 0.5 clipped to 0.8 (active)
        [-2.2, -2.4, 0.0],  # A=+2: ratio 1.3 clipped to 1.2 (active); last token masked
    ]
    np.testing.assert_allclose(np.asarray(loss), expected, rtol=1e-5)
    assert float(clip_fraction) == pytest.approx(3 / 8)


def test_clipped_surrogate_asymmetric_epsilons():
    ratios = [[1.25, 1.35, 0.85, 0.95]]
    mask = jnp.ones((1, 4), bool)
    eps = dict(clip_low=0.1, clip_high=0.3)
    pos, frac_pos = grpo.clipped_surrogate(_logs(ratios), jnp.zeros((1, 4)), jnp.array([1.0]), mask, **eps)
    # A>0: upper clip at 1.3 binds only for 1.35; low ratios keep their own value.
    np.testing.assert_allclose(np.asarray(pos), [[-1.25, -1.3, -0.85, -0.95]], rtol=1e-5)
    assert float(frac_pos) == pytest.approx(0.25)
    neg, frac_neg = grpo.clipped_surrogate(_logs(ratios), jnp.zeros((1, 4)), jnp.array([-1.0]), mask, **eps)
    # A<0: lower clip at 0.9 binds only for 0.85; high ratios keep their own value.
    np.testing.assert_allclose(np.asarray(neg), [[1.25, 1.35, 0.9, 0.95]], rtol=1e-5)
    assert float(frac_neg) == pytest.approx(0.25)


def test_ratio_and_clip():
    ratio, clipped = grpo.ratio_and_clip(_logs([[0.5, 1.0, 2.0]]), jnp.zeros((1, 3)), clip_low=0.1, clip_high=0.5)
    np.testing.assert_allclose(np.asarray(ratio), [[0.5, 1.0, 2.0]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(clipped), [[0.9, 1.0, 1.5]], rtol=1e-6)


# ----------------------------------------------------------------------------- KL


def test_kl_estimators_golden_numbers():
    logp = jnp.array([[-1.0, -2.0, -0.7]])
    ref = jnp.array([[-2.0, -1.0, -0.7]])
    np.testing.assert_allclose(np.asarray(grpo.kl_estimate(logp, ref, "k1")), [[1.0, -1.0, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grpo.kl_estimate(logp, ref, "k2")), [[0.5, 0.5, 0.0]], rtol=1e-6)
    k3 = [[math.exp(-1) + 1 - 1, math.exp(1) - 1 - 1, 0.0]]
    np.testing.assert_allclose(np.asarray(grpo.kl_estimate(logp, ref, "k3")), k3, rtol=1e-6, atol=1e-7)


def test_k3_clips_the_log_ratio():
    logp = jnp.array([[0.0, -50.0]])
    ref = jnp.array([[-50.0, 0.0]])
    k3 = np.asarray(grpo.kl_estimate(logp, ref, "k3"))
    assert np.all(np.isfinite(k3))
    np.testing.assert_allclose(k3, [[math.exp(-20) + 20 - 1, math.exp(20) - 20 - 1]], rtol=1e-5)


def test_kl_rejects_unknown_kind():
    with pytest.raises(ValueError, match="'k4'"):
        grpo.kl_estimate(jnp.zeros((1, 1)), jnp.zeros((1, 1)), "k4")


# ----------------------------------------------------------------------------- aggregation


AGG_VALUES = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
AGG_MASK = jnp.array([[True, True, False], [True, False, False], [False, False, False]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token_mean", (1 + 2 + 4) / 3),
        ("seq_mean_token_mean", ((1 + 2) / 2 + 4) / 2),  # the empty third row is left out
        ("seq_mean_token_sum", ((1 + 2) + 4) / 2),
        ("episode_mean", ((1 + 2) / 2 + 4) / 2),   # one row, one episode
    ],
)
def test_aggregate_modes(mode, expected):
    assert float(grpo.aggregate(AGG_VALUES, AGG_MASK, mode)) == pytest.approx(expected)
    assert float(grpo.aggregate(AGG_VALUES, jnp.zeros((3, 3), bool), mode)) == 0.0


def test_episode_mean_weighs_every_episode_the_same_however_many_turns_it_took():
    rng = np.random.default_rng(3)
    values = rng.normal(size=(4, 3, 5))            # 4 episodes x 3 turns x 5 action tokens
    mask = rng.random((4, 3, 5)) < 0.6
    mask[1] = False                                # an empty episode is left out
    mask[2, 1:] = False                            # a short episode: one turn
    per_episode = [values[n][mask[n]].mean() for n in range(4) if mask[n].any()]
    want = float(np.mean(per_episode))
    packed = grpo.aggregate(jnp.asarray(values, jnp.float32), jnp.asarray(mask), "episode_mean")
    assert float(packed) == pytest.approx(want, rel=1e-5)
    # one row per turn: each row carries its episode's token count, and the rows' shares add up
    episode_tokens = jnp.repeat(jnp.asarray(mask.sum(axis=(1, 2)), jnp.float32), 3)
    rows_mask = jnp.asarray(mask.reshape(12, 5))
    weights, count = grpo.token_weights(rows_mask, "episode_mean", episode_tokens)
    assert float(count) == pytest.approx(3.0)
    row_value = grpo.weighted_sum(jnp.asarray(values.reshape(12, 5), jnp.float32), weights) / count
    assert float(row_value) == pytest.approx(want, rel=1e-5)
    # a half of the rows counts its share of each episode, so shards add up to the whole
    halves = [grpo.token_weights(rows_mask[part], "episode_mean", episode_tokens[part])[1]
              for part in (slice(0, 5), slice(5, 12))]
    assert float(sum(halves)) == pytest.approx(3.0)
    # token_mean instead weighs the long episodes more: the two differ here
    assert abs(float(grpo.aggregate(jnp.asarray(values, jnp.float32), jnp.asarray(mask), "token_mean")) - want) > 1e-3


def test_aggregate_rejects_unknown_mode():
    with pytest.raises(ValueError, match="'sum'"):
        grpo.aggregate(AGG_VALUES, AGG_MASK, "sum")


# ----------------------------------------------------------------------------- config / optimizer


def test_config_validation_and_from_mapping():
    with pytest.raises(ValueError, match="kl_kind"):
        grpo.GRPOConfig(kl_kind="k7")
    with pytest.raises(ValueError, match="weight_decay"):
        grpo.GRPOConfig(optimizer="sgd", weight_decay=0.1)
    with pytest.raises(ValueError, match="unknown fields \\['lr'\\]"):
        grpo.GRPOConfig.from_mapping({"lr": 1.0})
    cfg = grpo.GRPOConfig.from_mapping({"group_size": 4, "optimizer": "sgd"})
    assert cfg.group_size == 4 and cfg.optimizer == "sgd"


def test_warmup_schedule():
    sched = grpo.learning_rate_schedule(grpo.GRPOConfig(learning_rate=0.4, warmup_steps=4))
    np.testing.assert_allclose([float(sched(k)) for k in range(6)], [0.1, 0.2, 0.3, 0.4, 0.4, 0.4], rtol=1e-6)
    flat = grpo.learning_rate_schedule(grpo.GRPOConfig(learning_rate=0.4))
    assert float(flat(0)) == pytest.approx(0.4)


# ----------------------------------------------------------------------------- a tiny linear-softmax policy

DIM, VOCAB = 3, 5


def linear_softmax_logprobs(params, batch):
    """logits = features @ W; returns (logp of batch['tokens'] f32[N, T], entropy f32[N, T])."""
    logits = jnp.einsum("ntd,dv->ntv", batch["features"], params["w"])
    logp_all = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logp_all, batch["tokens"][..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return logp, entropy


def make_batch(seed, n=4, t=3, ratio_noise=0.0, with_ref=True):
    rng = np.random.default_rng(seed)
    params = {"w": jnp.asarray(rng.normal(size=(DIM, VOCAB)), jnp.float32)}
    batch = {
        "features": jnp.asarray(rng.normal(size=(n, t, DIM)), jnp.float32),
        "tokens": jnp.asarray(rng.integers(0, VOCAB, size=(n, t)), jnp.int32),
        "advantages": jnp.asarray(rng.normal(size=n), jnp.float32),
        "mask": jnp.asarray(rng.random((n, t)) < 0.8, bool).at[:, 0].set(True),
    }
    logp, _ = linear_softmax_logprobs(params, batch)
    batch["old_logp"] = logp + jnp.asarray(ratio_noise * rng.normal(size=(n, t)), jnp.float32)
    if with_ref:
        batch["ref_logp"] = logp + jnp.asarray(0.3 * rng.normal(size=(n, t)), jnp.float32)
    return params, batch


def numpy_grpo_grad(w, batch, cfg):
    """Hand-derived gradient of grpo_loss (k3 KL) for the linear-softmax policy."""
    x = np.asarray(batch["features"], np.float64)
    tok = np.asarray(batch["tokens"])
    mask = np.asarray(batch["mask"], np.float64)
    logits = x @ w
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    logp = np.log(np.take_along_axis(probs, tok[..., None], -1)[..., 0])
    ratio = np.exp(logp - np.asarray(batch["old_logp"], np.float64))
    adv = np.asarray(batch["advantages"], np.float64)[:, None]
    clip_active = np.minimum(ratio * adv, np.clip(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high) * adv) < ratio * adv
    dloss_dlogp = np.where(clip_active, 0.0, -ratio * adv)
    d = np.asarray(batch["ref_logp"], np.float64) - logp
    dloss_dlogp = dloss_dlogp + cfg.kl_coef * (1.0 - np.exp(d))
    lengths = mask.sum(-1, keepdims=True)
    if cfg.loss_agg == "token_mean":
        weight = mask / mask.sum()
    elif cfg.loss_agg in ("seq_mean_token_mean", "episode_mean"):   # one sequence per episode here
        weight = mask / lengths / mask.shape[0]
    else:
        weight = mask / mask.shape[0]
    coef = weight * dloss_dlogp
    onehot = np.eye(VOCAB)[tok]
    return np.einsum("nt,ntd,ntv->dv", coef, x, onehot - probs)


@pytest.mark.parametrize("loss_agg", grpo.LOSS_AGGREGATIONS)
def test_one_sgd_step_matches_numpy_reference(loss_agg):
    cfg = grpo.GRPOConfig(
        optimizer="sgd", learning_rate=0.3, kl_coef=0.1, kl_kind="k3", loss_agg=loss_agg,
        max_grad_norm=0.05, clip_low=0.1, clip_high=0.15,
    )
    params, batch = make_batch(1, n=6, t=4, ratio_noise=0.3)
    # the off-policy noise makes some tokens clip; the reference must see that happen
    logp, _ = linear_softmax_logprobs(params, batch)
    _, frac = grpo.clipped_surrogate(
        logp, batch["old_logp"], batch["advantages"], batch["mask"], clip_low=cfg.clip_low, clip_high=cfg.clip_high
    )
    assert 0.0 < float(frac) < 1.0
    optimizer = grpo.make_optimizer(cfg)
    new_params, _, metrics = grpo.grpo_update(
        params, optimizer.init(params), batch, jax.random.key(0), linear_softmax_logprobs, optimizer, cfg
    )

    w = np.asarray(params["w"], np.float64)
    grad = numpy_grpo_grad(w, batch, cfg)
    norm = np.sqrt(np.sum(grad**2))
    assert norm > cfg.max_grad_norm  # the clip is exercised
    expected = w - cfg.learning_rate * grad * min(1.0, cfg.max_grad_norm / norm)
    np.testing.assert_allclose(np.asarray(new_params["w"]), expected, rtol=1e-4, atol=1e-6)
    assert float(metrics["grad_norm"]) == pytest.approx(norm, rel=1e-4)


def test_grpo_loss_metrics_are_token_means():
    cfg = grpo.GRPOConfig(kl_coef=0.0, kl_kind="k1", loss_agg="seq_mean_token_sum")
    params, batch = make_batch(2, n=4, t=5)
    loss, metrics = grpo.grpo_loss(params, batch, linear_softmax_logprobs, cfg)
    logp, entropy = (np.asarray(a) for a in linear_softmax_logprobs(params, batch))
    mask = np.asarray(batch["mask"])
    adv = np.asarray(batch["advantages"])[:, None]
    pg = np.where(mask, -adv * np.ones_like(logp), 0.0)  # on-policy: ratio 1
    assert float(metrics["pg_loss"]) == pytest.approx(pg.sum() / mask.sum(), rel=1e-5)
    assert float(loss) == pytest.approx(pg.sum(-1).mean(), rel=1e-5)
    kl = logp - np.asarray(batch["ref_logp"])
    assert float(metrics["kl"]) == pytest.approx(kl[mask].mean(), rel=1e-5, abs=1e-6)
    assert float(metrics["entropy"]) == pytest.approx(entropy[mask].mean(), rel=1e-5)
    assert float(metrics["clip_fraction"]) == 0.0


def test_kl_penalty_requires_ref_logp():
    params, batch = make_batch(3, with_ref=False)
    _, metrics = grpo.grpo_loss(params, batch, linear_softmax_logprobs, grpo.GRPOConfig())
    assert float(metrics["kl"]) == 0.0
    with pytest.raises(KeyError, match="ref_logp"):
        grpo.grpo_loss(params, batch, linear_softmax_logprobs, grpo.GRPOConfig(kl_coef=0.1))


def test_positive_advantage_raises_token_probability():
    cfg = grpo.GRPOConfig(optimizer="adam", learning_rate=0.05, epochs=2, minibatches=1)
    feature = jnp.array([0.5, -1.0, 2.0])
    params = {"w": jnp.zeros((DIM, VOCAB))}
    batch = {
        "features": jnp.broadcast_to(feature, (2, 1, DIM)),
        "tokens": jnp.array([[3], [1]], jnp.int32),
        "advantages": jnp.array([1.0, -1.0]),
        "mask": jnp.ones((2, 1), bool),
    }
    batch["old_logp"] = linear_softmax_logprobs(params, batch)[0]
    optimizer = grpo.make_optimizer(cfg)
    new_params, _, _ = grpo.grpo_update(
        params, optimizer.init(params), batch, jax.random.key(1), linear_softmax_logprobs, optimizer, cfg
    )
    before = jax.nn.softmax(feature @ params["w"])
    after = jax.nn.softmax(feature @ new_params["w"])
    assert after[3] > before[3] + 1e-3
    assert after[1] < before[1] - 1e-3


def test_epochs_times_minibatches_optimizer_steps():
    cfg = grpo.GRPOConfig(optimizer="adamw", learning_rate=1e-2, epochs=3, minibatches=2)
    params, batch = make_batch(4, n=4)
    optimizer = grpo.make_optimizer(cfg)
    _, opt_state, _ = grpo.grpo_update(
        params, optimizer.init(params), batch, jax.random.key(2), linear_softmax_logprobs, optimizer, cfg
    )
    counts = [int(c) for _, c in optax.tree_utils.tree_get_all_with_path(opt_state, "count")]
    assert counts and all(c == 6 for c in counts)


def test_minibatch_shuffle_is_a_permutation_per_epoch():
    order = np.asarray(grpo.minibatch_indices(jax.random.key(0), 6, epochs=2, minibatches=3))
    assert order.shape == (6, 2)
    for epoch in range(2):
        assert sorted(order[3 * epoch : 3 * epoch + 3].reshape(-1)) == list(range(6))


def test_indivisible_minibatches_raise():
    cfg = grpo.GRPOConfig(optimizer="sgd", minibatches=3)
    params, batch = make_batch(5, n=4)
    optimizer = grpo.make_optimizer(cfg)
    with pytest.raises(ValueError, match="4 rollouts .* minibatches=3"):
        grpo.grpo_update(
            params, optimizer.init(params), batch, jax.random.key(0), linear_softmax_logprobs, optimizer, cfg
        )


@pytest.mark.parametrize("mode", grpo.LOSS_AGGREGATIONS)
def test_token_weights_make_shards_add_up_to_the_whole(mode):
    rng = np.random.default_rng(3)
    values = jnp.asarray(rng.normal(size=(6, 5)), jnp.float32)
    mask = jnp.asarray(rng.random((6, 5)) < 0.6).at[2].set(False)  # one empty sequence
    weights, count = grpo.token_weights(mask, mode)
    assert np.all(np.asarray(weights)[~np.asarray(mask)] == 0.0)
    shards = [grpo.token_weights(mask[rows], mode) for rows in (slice(0, 2), slice(2, 4), slice(4, 6))]
    np.testing.assert_array_equal(np.concatenate([np.asarray(w) for w, _ in shards]), np.asarray(weights))
    assert sum(float(c) for _, c in shards) == float(count) > 0
    total = sum(float(grpo.weighted_sum(values[rows], weights[rows])) for rows in (slice(0, 2), slice(2, 4), slice(4, 6)))
    assert total / float(count) == pytest.approx(float(grpo.aggregate(values, mask, mode)), rel=1e-6)
    # a NaN where the mask is False does not leak into the sum
    poisoned = jnp.where(mask, values, jnp.nan)
    assert float(grpo.aggregate(poisoned, mask, mode)) == pytest.approx(float(grpo.aggregate(values, mask, mode)))


@pytest.mark.parametrize("bucket_bytes", [0, 48, grpo.GRAD_BUCKET_BYTES])
def test_psum_in_buckets_equals_the_leafwise_sum_over_devices(bucket_bytes):
    """Three devices each holding a different tree: every device gets the leafwise sum, in
    each leaf's shape and dtype, however the leaves are packed into buffers."""
    rng = np.random.default_rng(4)
    tree = {"a": rng.normal(size=(3, 4, 5)), "b": rng.normal(size=(3,)), "c": rng.normal(size=(3, 7)),
            "d": rng.normal(size=(3, 2, 2))}
    tree = {name: jnp.asarray(leaf, jnp.bfloat16 if name == "c" else jnp.float32) for name, leaf in tree.items()}
    mesh = make_mesh(1, 3, 1, devices=jax.devices()[:3])
    summed = jax.jit(jax.shard_map(lambda t: grpo.psum_in_buckets(t, "data", bucket_bytes), mesh=mesh,
                                   in_specs=PartitionSpec("data"), out_specs=PartitionSpec("data")))(tree)
    for name, leaf in tree.items():
        assert summed[name].shape == leaf.shape and summed[name].dtype == leaf.dtype
        want = np.asarray(leaf, np.float32).sum(axis=0)
        for device in range(3):
            np.testing.assert_allclose(np.asarray(summed[name][device], np.float32), want,
                                       rtol=1e-2 if name == "c" else 1e-6)


def data_split(devices: int, rows: int) -> dict:
    return update_split(make_mesh(1, devices, 1, devices=jax.devices()[:devices]), rows)


# The fast tier splits the update of a global token count (token_mean) and of a per-episode
# weight under minibatches (episode_mean); the other two modes' shard weights are checked in
# test_token_weights_make_shards_add_up_to_the_whole, their full updates in the slow tier.
@pytest.mark.parametrize("loss_agg, minibatches", [
    ("token_mean", 1), pytest.param("seq_mean_token_mean", 2, marks=pytest.mark.slow),
    pytest.param("seq_mean_token_sum", 1, marks=pytest.mark.slow), ("episode_mean", 2)])
def test_an_update_split_into_row_shards_equals_the_whole_batch_update(loss_agg, minibatches):
    cfg = grpo.GRPOConfig(optimizer="adam", learning_rate=0.05, epochs=2, minibatches=minibatches, kl_coef=0.1,
                          loss_agg=loss_agg, max_grad_norm=0.5)
    params, batch = make_batch(6, n=8, t=5, ratio_noise=0.3)
    batch["mask"] = batch["mask"].at[3, 1:].set(False)  # uneven lengths, so the weights matter
    optimizer = grpo.make_optimizer(cfg)

    def update(**split):
        return jax.jit(functools.partial(grpo.grpo_update, logprob_fn=linear_softmax_logprobs, optimizer=optimizer,
                                         cfg=cfg, **split))(params, optimizer.init(params), batch, jax.random.key(5))

    split = data_split(4 // minibatches, 8 // minibatches)
    assert split["mesh"].shape["data"] == 4 // minibatches
    (whole, _, whole_metrics), (shards, _, split_metrics) = update(), update(**split)
    assert not np.allclose(np.asarray(whole["w"]), np.asarray(params["w"]))
    np.testing.assert_allclose(np.asarray(shards["w"]), np.asarray(whole["w"]), rtol=1e-5, atol=1e-6)
    assert set(split_metrics) == set(whole_metrics)
    for name in whole_metrics:
        np.testing.assert_allclose(float(split_metrics[name]), float(whole_metrics[name]), rtol=1e-5, atol=1e-7,
                                   err_msg=name)
    with pytest.raises(ValueError, match="do not split over the 3 devices of mesh axis 'data'"):
        grpo.grpo_update(params, optimizer.init(params), batch, jax.random.key(5), linear_softmax_logprobs,
                         optimizer, cfg, **dict(split, mesh=make_mesh(1, 3, 1, devices=jax.devices()[:3])))
    with pytest.raises(ValueError, match="data_axis='rows' is not an axis of the mesh"):
        grpo.grpo_update(params, optimizer.init(params), batch, jax.random.key(5), linear_softmax_logprobs,
                         optimizer, cfg, **dict(split, data_axis="rows"))


def test_on_a_data_mesh_the_gradient_is_reduced_as_one_flat_buffer():
    """Rows over a 'data' axis of 2 devices: the update's only floating-point all-reduce carries
    every gradient entry in one array (plus scalars), and the result equals one device's."""
    cfg = grpo.GRPOConfig(optimizer="adam", learning_rate=0.05, kl_coef=0.1)
    params, batch = make_batch(7, n=8, t=4, ratio_noise=0.3)
    params = dict(params, bias=jnp.arange(VOCAB, dtype=jnp.float32) * 0.1)
    optimizer = grpo.make_optimizer(cfg)
    mesh = make_mesh(1, 2, 1, devices=jax.devices()[:2])
    split = update_split(mesh, 8)
    assert split["mesh"] is mesh and split["data_axis"] == "data" and update_split(mesh, 6, group=2) == {}

    def logprobs(p, rows):
        return linear_softmax_logprobs({"w": p["w"] + p["bias"]}, rows)

    def update(p, b, **kwargs):
        return grpo.grpo_update(p, optimizer.init(p), b, jax.random.key(0), logprobs, optimizer, cfg, **kwargs)

    placed = jax.device_put(batch, NamedSharding(mesh, PartitionSpec("data")))
    replicated = jax.device_put(params, NamedSharding(mesh, PartitionSpec()))
    compiled = jax.jit(functools.partial(update, **split)).lower(replicated, placed).compile()
    reductions = [line for line in compiled.as_text().splitlines() if " all-reduce(" in line and "f32[" in line]
    assert len(reductions) == 1, reductions
    buffers = [int(size) for size in re.findall(r"f32\[(\d+)\]", reductions[0].split("all-reduce(")[0])]
    assert max(buffers) >= DIM * VOCAB + VOCAB, reductions  # w and bias in one flat buffer
    got, want = compiled(replicated, placed), jax.jit(update)(params, batch)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_update_jits_and_vmaps_over_policies():
    cfg = grpo.GRPOConfig(optimizer="adam", learning_rate=1e-2, epochs=2, minibatches=2, kl_coef=0.05)
    optimizer = grpo.make_optimizer(cfg)
    update = jax.jit(
        functools.partial(grpo.grpo_update, logprob_fn=linear_softmax_logprobs, optimizer=optimizer, cfg=cfg)
    )
    runs = [make_batch(seed, n=4, ratio_noise=0.2) for seed in (10, 11)]
    keys = [jax.random.key(7), jax.random.key(8)]
    singles = [update(p, optimizer.init(p), b, k) for (p, b), k in zip(runs, keys)]

    stack = lambda *xs: jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *xs)
    params = stack(*[p for p, _ in runs])
    batches = stack(*[b for _, b in runs])
    states = jax.vmap(optimizer.init)(params)
    v_params, _, v_metrics = jax.jit(jax.vmap(update))(params, states, batches, jnp.stack(keys))
    for i, (p, _, m) in enumerate(singles):
        np.testing.assert_allclose(np.asarray(v_params["w"][i]), np.asarray(p["w"]), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(float(v_metrics["loss"][i]), float(m["loss"]), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- with and without jit


class PureFunctionVariants(chex.TestCase):
    """The pure GRPO pieces give the reference numbers with and without `jax.jit`, and reject
    wrongly shaped inputs at their boundary."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_group_advantages(self):
        rewards = jnp.array([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])
        adv = self.variant(functools.partial(grpo.group_advantages, group_size=4))(rewards)
        expected = np.array([0.5, -0.5, -0.5, 0.5]) / (1 / math.sqrt(3) + 1e-6)
        np.testing.assert_allclose(np.asarray(adv[:4]), expected, rtol=1e-6)
        np.testing.assert_array_equal(np.asarray(adv[4:]), 0.0)

    @chex.variants(with_jit=True, without_jit=True)
    def test_one_sgd_step(self):
        cfg = grpo.GRPOConfig(optimizer="sgd", learning_rate=0.3, kl_coef=0.1, max_grad_norm=None,
                              clip_low=0.1, clip_high=0.15)
        params, batch = make_batch(1, n=6, t=4, ratio_noise=0.3)
        optimizer = grpo.make_optimizer(cfg)

        def step(params, batch):
            return grpo.grpo_update(params, optimizer.init(params), batch, jax.random.key(0),
                                    linear_softmax_logprobs, optimizer, cfg)[0]

        new_params = self.variant(step)(params, batch)
        w = np.asarray(params["w"], np.float64)
        expected = w - cfg.learning_rate * numpy_grpo_grad(w, batch, cfg)
        np.testing.assert_allclose(np.asarray(new_params["w"]), expected, rtol=1e-4, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    def test_clipped_surrogate_rejects_misshaped_advantages(self):
        logp = jnp.zeros((3, 4))
        with self.assertRaises(AssertionError):
            self.variant(grpo.clipped_surrogate)(logp, logp, jnp.zeros((4,)), jnp.ones((3, 4), bool))
        with self.assertRaises(AssertionError):
            self.variant(grpo.clipped_surrogate)(logp, jnp.zeros((3, 5)), jnp.zeros((3,)), jnp.ones((3, 4), bool))
