"""The inner loop: K policies trained by GRPO under K reward programs in one compiled call.

    loop = make_inner_loop(domain, graphdef, InnerConfig(...))
    params, metrics = loop.train(params, program, key, dataset)            # one policy
    params, metrics = loop.train_many(params, programs, keys, dataset)     # K policies
    scores = loop.accuracy_many(params, val_set)                           # f32[K]

For domains whose rollout stage runs on device ("device": single-turn sampling scored by
device primitives; "env": multi-turn episodes against a pure JAX environment, see
`derl_jax.rl.rollout`), `train` is a pure function whose whole run is ONE `lax.scan` over
steps. Step s:

    pick B prompts (tasks) from fold_in(key, s) -> repeat each G times (rows [b*G, (b+1)*G)
    form a group) -> rollout stage (sample completions, or play episodes) -> primitive values
    f32[N, P] -> reward = evaluate(program, prims, u) with u = progress(s, S) (0 on the first
    step, 1 on the last) -> NaN/inf rewards set to 0 and counted -> group advantages (one per
    episode, shared by all its turns; with `inner.self_reward_credit="turn"` one per turn,
    see below) -> reference log-probs under the frozen initial
    policy (for the KL penalty or the KL metric) -> `grpo_update` (epochs x minibatches
    optimizer steps; the importance ratio's old log-probs are the sampler's; with one
    optimizer step per batch the update replays the decode's layer products instead of
    running its forward pass again, `rollout.keeps_products`; the buffers that hold them are
    carried to the next step, whose decode overwrites them in place instead of zeroing new
    ones, `DeviceRollout.scratch`).

DAPO's additions (`derl_jax.rl.dapo`): with `overlong_buffer` > 0 each completion's reward
gets `overlong_penalty` of its length before the advantages (multi-turn: each episode gets the
mean penalty of its actions, `dapo.episode_overlong_penalty`, and under per-turn credit each
turn its own); with `dynamic_oversample` = O > 1 the step samples O*B prompts' (tasks')
groups (O*N rollouts or episodes), and trains on the B groups `dapo.select` picks from their
rewards (static shapes, so it runs under jit and under vmap over K programs).
`rewards_and_advantages` does both, for the host kind too.

Per-turn credit of Self-Guide's self-rewards (`inner.self_reward_credit="turn"`, a domain with
the primitive g_sg): turn t of episode n is rewarded by the expression evaluated on the
episode's primitives with g_sg replaced by that turn's own self-reward r_sg_{n,t} (not the
episode's sum), e.g. R_env + lambda(u) * r_sg_{n,t} for Self-Guide's reward, and its advantage
is that reward's group-relative value among every taken turn of the group's episodes
(`grpo.turn_advantages`); the update rows get one advantage per turn, [N, S].
The per-step `reward_mean` stays the episode reward's mean.

Reward expressions are data (`Program` arrays), so `train_many` — `jax.vmap` of `train` over
the stacked programs and keys, the policy shared (one initial policy for every candidate)
or stacked [K, ...] — compiles once for any set of K expressions. With `chunk_size = c > 0`
it runs K/c chunks one after another (`derl_jax.rl.placement.map_candidates`).

Sharding: with a mesh (axes 'cand', 'data', 'model', see `derl_jax.parallel`) the candidate
axis runs over 'cand' (the vmap is told `spmd_axis_name='cand'`) and every batch of prompts
and rollouts inside a policy's loop is constrained to 'data'. The update takes each device's
gradient of its own rows (a `shard_map` over 'data') and sums them in flat buffers
(`derl_jax.rl.placement.update_split`).

Host-scored domains ("host") train through `derl_jax.rl.host_loop` with the same config,
update step, u and metric names; `make_evaluator` picks the driver from the domain.

Validation metric: greedy pass@1, the domain's outcome primitive on greedy rollouts.

Shapes: K candidates, M examples in a split, B prompts per step, G group size, N = B*G
rollouts (one update row each), Tp prompt tokens, T = max_new_tokens,
P primitives, S steps, O = dynamic_oversample (O*N rollouts sampled per step).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from derl_jax.domains.base import Domain, TokenDataset
from derl_jax.expr.program import Program
from derl_jax.expr.vm import evaluate
from derl_jax.parallel import CAND_AXIS, DATA_AXIS, replicated
from derl_jax.rl import dapo
from derl_jax.rl.config import InnerConfig, check_rollout_kind, metric_names, progress
from derl_jax.rl.grpo import group_advantages, grpo_update, make_optimizer, sanitize_rewards, turn_advantages
from derl_jax.rl.placement import leading_size, map_candidates, params_candidate_axis, update_split
from derl_jax.rl.rollout import device_rollout
from derl_jax.selfguide import SELF_REWARD_PRIMITIVE

_GREEDY_KEY_SEED = 0  # greedy decoding ignores the key; sample() still takes one


def _repeat_rows(tree: Any, times: int) -> Any:
    """Every row repeated `times` times, copies adjacent: [M, ...] -> [M*times, ...]."""
    return jax.tree_util.tree_map(lambda x: jnp.repeat(x, times, axis=0), tree)


class StepRewards(NamedTuple):
    """One step's rewards (`rewards_and_advantages`), O*N rollouts sampled and N trained on.

    rewards f32[O*N]: the program's rewards, non-finite values set to 0 (before any shaping);
    nonfinite i32[]: how many were; advantages f32[N]: group advantages of the trained rows;
    rows i32[N] or None: the sampled rows trained on (None: all of them, O = 1);
    stats: dynamic sampling's metrics (shortfall i32[], informative_fraction f32[]) or {}.
    """

    rewards: jax.Array
    nonfinite: jax.Array
    advantages: jax.Array
    rows: jax.Array | None
    stats: dict


def step_draws(key: jax.Array, index: jax.Array, num_examples: int, sampled: int
               ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Inner step `index`'s draws from the run's key -> (prompt rows i32[sampled] of the
    `num_examples` dataset rows, the rollout's key, the update's key)."""
    prompt_key, sample_key, update_key = jax.random.split(jax.random.fold_in(key, index), 3)
    rows = jax.random.choice(prompt_key, num_examples, (sampled,), replace=sampled > num_examples)
    return rows, sample_key, update_key


def rewards_and_advantages(program: Program, prims: jax.Array, u: jax.Array, group_size: int, normalize_std: bool,
                           lengths: jax.Array | None = None, *, max_new_tokens: int = 0, overlong_buffer: int = 0,
                           oversample: int = 1, taken: jax.Array | None = None) -> StepRewards:
    """`program` on prims f32[O*N, P] at progress u -> StepRewards (O = oversample, G-row groups
    adjacent). With overlong_buffer > 0 the rewards the advantages see add
    `dapo.overlong_penalty(lengths i32[O*N], max_new_tokens, overlong_buffer)`, or for episodes
    (lengths i32[O*N, S] per turn, taken bool[O*N, S]) `dapo.episode_overlong_penalty`; with
    oversample > 1 the N rows trained on are `dapo.select`'s B = N / G groups of those shaped rewards."""
    rewards, nonfinite = sanitize_rewards(evaluate(program, prims, u))
    shaped, rows, stats = rewards, None, {}
    if overlong_buffer and lengths.ndim == 2:
        shaped = shaped + dapo.episode_overlong_penalty(lengths, taken, max_new_tokens, overlong_buffer)
    elif overlong_buffer:
        shaped = shaped + dapo.overlong_penalty(lengths, max_new_tokens, overlong_buffer)
    if oversample > 1:
        if rewards.shape[0] % (oversample * group_size):
            raise ValueError(f"rewards_and_advantages: {rewards.shape[0]} rewards are not {oversample} x whole "
                             f"groups of {group_size}")
        chosen = dapo.select(shaped, group_size, rewards.shape[0] // (oversample * group_size))
        shaped, rows = chosen.rewards, chosen.rows
        stats = {"shortfall": chosen.shortfall, "informative_fraction": chosen.informative_fraction}
    advantages = group_advantages(shaped, group_size, normalize_std=normalize_std)
    return StepRewards(rewards, nonfinite, advantages, rows, stats)


def turn_rewards(program: Program, prims: jax.Array, self_rewards: jax.Array, column: int, u: jax.Array) -> jax.Array:
    """f32[N, S]: `program` at progress u on each turn's primitives: prims f32[N, P] with column
    `column` (g_sg) replaced by the turn's own self-reward self_rewards f32[N, S]; non-finite
    rewards set to 0."""
    (count, width), turns = prims.shape, self_rewards.shape[1]
    per_turn = jnp.broadcast_to(prims[:, None, :], (count, turns, width)).at[:, :, column].set(self_rewards)
    rewards, _ = sanitize_rewards(evaluate(program, per_turn.reshape(count * turns, width), u))
    return rewards.reshape(count, turns)


def _self_reward_column(domain: Domain, cfg: InnerConfig) -> int | None:
    """The column of g_sg among the domain's primitives under per-turn credit (None under episode
    credit); ValueError when the domain cannot credit turns."""
    if cfg.self_reward_credit != "turn":
        return None
    if domain.rollout != "env" or SELF_REWARD_PRIMITIVE not in domain.primitive_names:
        raise ValueError(f"make_inner_loop: self_reward_credit='turn' needs a multi-turn domain with the primitive "
                         f"{SELF_REWARD_PRIMITIVE!r}; {domain.name!r} has rollout {domain.rollout!r} and primitives "
                         f"{tuple(domain.primitive_names)} (set config.domain.self_guide=True)")
    return list(domain.primitive_names).index(SELF_REWARD_PRIMITIVE)


# ----------------------------------------------------------------------------- the loop


@dataclasses.dataclass(frozen=True)
class InnerLoop:
    """Pure functions of one inner-loop setup (jit them; see the module docstring).

    train(params, program, key, dataset) -> (params, metrics name -> [S])
    train_many(params [K,...] or shared, programs Program[K], keys [K], dataset)
        -> (params [K, ...], metrics name -> [K, S])
    accuracy(params, dataset) -> f32[]           greedy pass@1
    item_scores(params, dataset) -> f32[N]       each example's greedy success (their mean is `accuracy`)
    accuracy_many(params [K, ...], dataset) -> f32[K]
    metric_names: the keys of `metrics`.

    When `train_many` continues a stack of policies, jit it with `donate_argnums=0`: the
    stack is replaced by its trained version.
    """

    cfg: InnerConfig
    train: Callable
    train_many: Callable
    accuracy: Callable
    accuracy_many: Callable
    metric_names: tuple[str, ...]
    item_scores: Callable


def make_inner_loop(domain: Domain, graphdef: nnx.GraphDef, cfg: InnerConfig,
                    mesh: Mesh | None = None) -> InnerLoop:
    """The inner loop of `domain`'s policy (`graphdef`) under `cfg`, optionally on `mesh`."""
    if not isinstance(cfg, InnerConfig):
        raise TypeError(f"make_inner_loop: cfg must be an InnerConfig, got {type(cfg).__name__}")
    check_rollout_kind(cfg, domain)
    if mesh is not None:
        data_size = mesh.shape[DATA_AXIS]
        if cfg.rollouts_per_step % data_size:
            raise ValueError(
                f"make_inner_loop: {cfg.rollouts_per_step} rollouts per step do not split over the "
                f"'data' mesh axis of size {data_size}")
    batch, group, steps = cfg.prompts_per_step, cfg.group_size, cfg.steps
    sampled = batch * cfg.dynamic_oversample   # prompts sampled per step (B without dynamic sampling)
    optimizer = make_optimizer(cfg.grpo)
    spmd_axis = CAND_AXIS if mesh is not None else None
    names = metric_names(domain.primitive_names, cfg.uses_reference, dynamic_sampling=cfg.dynamic_sampling)

    def over_data(x):
        if mesh is None:
            return x
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(DATA_AXIS)))

    def everywhere(x):
        if mesh is None:
            return x
        return jax.lax.with_sharding_constraint(x, replicated(mesh))

    rollout = device_rollout(domain, graphdef, cfg, over_data)
    self_reward_column = _self_reward_column(domain, cfg)
    # rows [b*G, (b+1)*G) share a prompt; the update keeps that order only with one minibatch
    update_groups = rollout.prefill_group if cfg.grpo.minibatches == 1 else 1
    minibatch_rows = cfg.rollouts_per_step // cfg.grpo.minibatches
    data_split = update_split(mesh, minibatch_rows, update_groups)

    def completion_logprobs(params, update_batch, group_size=update_groups):
        return rollout.logprobs(params, update_batch, cfg.temperature, group_size)

    def train(params, program: Program, key, dataset: TokenDataset):
        num_examples = dataset.size
        reference = params

        def step(carry, index):
            params, opt_state, scratch = carry
            rows, sample_key, update_key = step_draws(key, index, num_examples, sampled)
            rows = everywhere(rows)   # every device draws all the prompt rows and keeps its own
            chosen = _repeat_rows(dataset.take(rows), group)
            context = jax.tree_util.tree_map(over_data, dict(chosen.context))
            episode, update_batch = rollout.fn(params, chosen, sample_key, False,
                                               **({} if scratch is None else {"scratch": scratch}))
            if scratch is not None:   # the next step's decode overwrites these buffers in place
                scratch = update_batch["products"]
            prims = domain.primitive_values(episode, context)
            lengths = jnp.sum(update_batch["mask"], axis=-1)   # completion tokens i32[O*N] (episodes: [O*N, S])
            taken = jnp.any(update_batch["mask"], axis=-1)
            u = progress(index.astype(jnp.float32), steps)
            scored = rewards_and_advantages(program, prims, u, group, cfg.grpo.normalize_std, lengths,
                                            max_new_tokens=cfg.max_new_tokens, overlong_buffer=cfg.overlong_buffer,
                                            oversample=cfg.dynamic_oversample, taken=taken)
            if scored.rows is not None:   # dynamic sampling: the chosen groups' rows (one per rollout or episode)
                update_batch = jax.tree_util.tree_map(lambda x: over_data(x[scored.rows]), update_batch)
            if self_reward_column is None:   # one advantage per episode
                advantages = scored.advantages
            else:                            # one per turn [N, S]
                per_turn = turn_rewards(program, prims, episode["self_rewards"], self_reward_column, u)
                if cfg.overlong_buffer:
                    per_turn = per_turn + dapo.turn_overlong_penalty(lengths, taken, cfg.max_new_tokens,
                                                                     cfg.overlong_buffer)
                step_mask = episode["step_mask"]
                if scored.rows is not None:
                    per_turn, step_mask = per_turn[scored.rows], step_mask[scored.rows]
                advantages = turn_advantages(per_turn, step_mask, group, normalize_std=cfg.grpo.normalize_std)
            update_batch = dict(update_batch, advantages=advantages)
            if cfg.top_k != 0:  # the top-k filtered sampling distribution is not the one the update differentiates
                update_batch["old_logp"] = completion_logprobs(params, update_batch, rollout.prefill_group)[0]
            if cfg.uses_reference:   # the decode's products belong to `params`, not to the reference
                reference_rows = {name: rows for name, rows in update_batch.items() if name != "products"}
                update_batch["ref_logp"] = completion_logprobs(reference, reference_rows, rollout.prefill_group)[0]
            update_batch = jax.lax.stop_gradient(update_batch)
            params, opt_state, update = grpo_update(params, opt_state, update_batch, update_key,
                                                    completion_logprobs, optimizer, cfg.grpo, **data_split)
            metrics = {"reward_mean": jnp.mean(scored.rewards), **scored.stats}
            metrics.update({f"primitive/{name}": jnp.mean(prims[:, j])
                            for j, name in enumerate(domain.primitive_names)})
            metrics.update(nonfinite=scored.nonfinite, kl=update["kl"], entropy=update["entropy"],
                           clip_fraction=update["clip_fraction"], loss=update["loss"],
                           grad_norm=update["grad_norm"],
                           response_length=jnp.sum(lengths.astype(jnp.float32))
                           / jnp.maximum(jnp.sum(taken, dtype=jnp.float32), 1))
            return (params, opt_state, scratch), {name: metrics[name] for name in names}

        scratch = rollout.scratch(params, sampled * group, dataset.prompts.shape[1])
        (params, _, _), metrics = jax.lax.scan(step, (params, optimizer.init(params), scratch), jnp.arange(steps))
        return params, metrics

    def item_scores(params, dataset: TokenDataset):
        num_examples = dataset.size
        data_size = 1 if mesh is None else mesh.shape[DATA_AXIS]
        per_batch = min(cfg.eval_batch_size, num_examples)
        per_batch = -(-per_batch // data_size) * data_size
        num_batches = -(-num_examples // per_batch)
        positions = jnp.arange(num_batches * per_batch).reshape(num_batches, per_batch)
        batches = dataset.take(jnp.minimum(positions, num_examples - 1))
        greedy_key = jax.random.key(_GREEDY_KEY_SEED)

        def successes(args):
            chunk, valid = args
            episode, _ = rollout.fn(params, chunk, greedy_key, True)
            context = jax.tree_util.tree_map(over_data, dict(chunk.context))
            return jnp.where(valid, domain.success(episode, context), 0.0)

        return jax.lax.map(successes, (batches, positions < num_examples)).reshape(-1)[:num_examples]

    def accuracy(params, dataset: TokenDataset):
        return jnp.sum(item_scores(params, dataset)) / dataset.size

    def train_many(params, programs: Program, keys, dataset: TokenDataset):
        axis = params_candidate_axis(graphdef, params)
        stacked = {"programs": programs, "keys": keys} if axis is None else {"programs": programs, "keys": keys,
                                                                              "params": params}
        leading_size(stacked, "train_many")  # one K for everything stacked
        return map_candidates(train, (axis, 0, 0, None), cfg.chunk_size, spmd_axis)(params, programs, keys, dataset)

    def accuracy_many(params, dataset: TokenDataset):
        if params_candidate_axis(graphdef, params) != 0:
            raise ValueError("accuracy_many: params must be stacked along a leading candidate axis K")
        return map_candidates(accuracy, (0, None), cfg.chunk_size, spmd_axis)(params, dataset)

    return InnerLoop(cfg=cfg, train=train, train_many=train_many, accuracy=accuracy,
                     accuracy_many=accuracy_many, metric_names=names, item_scores=item_scores)


