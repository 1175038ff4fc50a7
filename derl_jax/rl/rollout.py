"""The rollout stage of the inner loop, one per rollout kind a domain names (`Domain.rollout`).

  "device"  single-turn sampling scored by device primitives: `single_turn` runs inside the
            jitted scan of `derl_jax.rl.loop`.
  "env"     multi-turn episodes against an environment (`derl_jax.domains.env`): `episodes`
            runs every turn (prompt, sample, env.step) in a `lax.scan` inside the same jitted
            loop, so `vmap` over K programs still trains K policies in one call. A pure JAX
            environment runs in the scan; a host environment (batched NumPy) is called from
            it through `derl_jax.rl.host_env.HostEnvBridge`.
  "host"    single-turn sampling scored by host primitives (decoded text): the pieces here
            (`sample_rollouts`, `cut_at_stops`, `completion_logprobs`) are driven by
            `derl_jax.rl.host_loop`, which overlaps scoring with the next sampling.

A device rollout function is `rollout(params, batch: TokenDataset [N rows], key, greedy) ->
(episode, update_batch)`: `episode` is what primitives read (single turn: tokens i32[N, T],
mask bool[N, T]; multi-turn: step_scores f32[N, S], step_mask bool[N, S], success f32[N],
plus tokens/mask of every action [N, S, A], and self_rewards f32[N, S] when the environment
reports info["self_reward"]); `update_batch` holds one row per episode for GRPO, whatever
`DeviceRollout.logprobs` reads: single turn prompts i32[N, Tp], prompt_mask, completions
i32[N, T], mask bool[N, T] True on policy tokens only, old_logp f32[N, T], and when
`keeps_products` the decode's layer products (`SampleOutput.products`); multi-turn the
turns' completions, mask and old_logp [N, S, A] (GRPO treats each [A] slice as a sequence) and
what their prompts are read from (below).

Multi-turn prompts (turn t of an episode) depend on `Domain.history`:

  W (an int, a window)  the task's prompt tokens, then for j = t-W .. t-1 the policy's action
      a_j followed by the observation o_{j+1} it led to (o_0, from reset, is the last slot at
      t = 0), as the left-padded prompt of length P = `Domain.prompt_length` (at most
      Tp + W * (A + O)) that `derl_jax.domains.env.turn_prompts` writes: a longer window drops its
      oldest tokens (`window_history`). Action tokens enter later prompts without their EOS
      (and without pad tokens). The task is read once per episode (`window_episodes`): its
      tokens are a stream (`streams.Stream`) that every turn copies, appends its window to and
      decodes after, the draws `sampling.sample` makes after the written-out prompt; the update
      reads each task once per GRPO group (its G episodes hold the same task) and each turn's
      window and action after it
      (`streams.prefixed_logprobs`): update rows prefix i32[N, Tp] / prefix_mask, blocks
      i32[N, S, H] / block_mask (the window tokens, packed to the right, H = `window_width`).
      An environment that declares an agent layout (`derl_jax.domains.agent_prompt`, a
      pretrained policy's prompt) keeps the raw answers out of the window, shows its rows'
      admissible-actions part for the newest slot only and closes every window with the
      prompt's fixed tail (`domains.env.window_history`).
  "full"  the whole episode so far: the task, o_0, then a_0 o_1 a_1 o_2 ... a_{t-1} o_t, as one
      token stream per episode that is read once (`stream_episodes`): each observation and
      each action is appended to the episode's KV cache (`streams.Stream`) and never run
      again, and the update runs one teacher-forced pass per episode over the packed stream
      (`streams.stream_logprobs`; update rows stream i32[N, C] / stream_valid, starts i32[N, S]).
      An action enters the stream as generated, up to its EOS. The same tokens in a window of
      W >= t + 1 turns give turn t the same prompt (when no action holds a pad token before its
      EOS). With `Domain.prompt_budget` = P > 0, an episode also ends before a turn whose prompt
      would exceed P tokens; the stream holds C = P + A slots.

An episode ends when the environment says `done` or after S = env.max_turns turns; turns after
the end are masked out of the loss and of the step scores.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from derl_jax.domains.base import FULL_HISTORY, TokenDataset
from derl_jax.domains.env import (checked_reset, checked_step, is_host_env, left_pack, prompt_layout, window_history,
                                  window_room)
from derl_jax.models import sampling, streams
from derl_jax.models.config import ModelConfig
from derl_jax.models.transformer import config_of
from derl_jax.rl.host_env import HostEnvBridge

ROLLOUT_KINDS = ("device", "host", "env")


@dataclasses.dataclass(frozen=True)
class DeviceRollout:
    """A rollout stage that runs inside the jitted loop (module docstring).

    fn(params, batch, key, greedy[, scratch]) -> (episode, update_batch)
    prefill_group: rows that share one prompt in update_batch and may be prefilled once (G
      for batches built from G copies of each prompt: single-turn rows, and window episodes,
      whose update runs each task once per group; 1 with the whole history).
    logprobs(params, update_batch, temperature, group_size) -> (logp, entropy), each shaped as
      update_batch["mask"]: the teacher-forced log-probs of the update rows' completions (the
      rows keep their order in groups of `group_size` that share a prompt).
    scratch(params, rows, prompt_tokens) -> buffers or None: for a rollout whose update_batch
      carries the decode's products, buffers of their shapes (over `rows` rows after prompts of
      `prompt_tokens`) that `fn` may be given as `scratch` and overwrites (the loop passes each
      step the products of the step before, so no step zeroes new ones); None for the others.
    """

    fn: Callable
    prefill_group: int
    logprobs: Callable
    scratch: Callable = lambda params, rows, prompt_tokens: None


def row_logprobs(graphdef: nnx.GraphDef) -> Callable:
    """`DeviceRollout.logprobs` of update rows (prompts, prompt_mask, completions, mask, and the
    decode's `products` when the rows hold them: valid for the params that sampled the rows)."""
    def logprobs(params, rows, temperature: float, group_size: int = 1):
        return sampling.sequence_logprobs(graphdef, params, rows["prompts"], rows["prompt_mask"], rows["completions"],
                                          rows["mask"], temperature, group_size=group_size,
                                          saved=rows.get("products"))

    return logprobs


def prefixed_row_logprobs(graphdef: nnx.GraphDef) -> Callable:
    """`DeviceRollout.logprobs` of episodes' turns after their task (prefix, prefix_mask, blocks,
    block_mask, completions, mask)."""
    def logprobs(params, rows, temperature: float, group_size: int = 1):
        return streams.prefixed_logprobs(graphdef, params, rows["prefix"], rows["prefix_mask"], rows["blocks"],
                                         rows["block_mask"], rows["completions"], rows["mask"], temperature,
                                         group_size=group_size)

    return logprobs


def stream_row_logprobs(graphdef: nnx.GraphDef) -> Callable:
    """`DeviceRollout.logprobs` of episode streams (stream, stream_valid, starts, completions, mask)."""
    def logprobs(params, rows, temperature: float, group_size: int = 1):
        del group_size   # every row is its own episode
        return streams.stream_logprobs(graphdef, params, rows["stream"], rows["stream_valid"], rows["starts"],
                                        rows["completions"], rows["mask"], temperature)

    return logprobs


def _generate(graphdef, params, prompts, prompt_mask, key, *, domain, cfg, greedy, group_size, keep_products=False,
              product_scratch=None):
    return sampling.sample(graphdef, params, prompts, prompt_mask, key, max_new_tokens=cfg.max_new_tokens,
                           eos_id=domain.eos_id, pad_id=domain.pad_id, temperature=cfg.temperature,
                           top_k=cfg.top_k, greedy=greedy, group_size=group_size, keep_products=keep_products,
                           product_scratch=product_scratch)


PRODUCTS_MAX_BYTES = 256 * 2**20
"""The decode keeps its layers' products for the update (`keeps_products`) while they take at
most this many bytes a step."""


def _product_buffers(model: ModelConfig, cfg: Any, rows: int, prompt_tokens: int) -> list[dict]:
    """`sampling.product_buffers` of the single-turn decode: its T - 1 fed tokens after prompts of
    `prompt_tokens`."""
    fed = cfg.max_new_tokens - 1
    return sampling.product_buffers(model, rows, fed, prompt_tokens + fed)


def keeps_products(model: ModelConfig, cfg: Any, rows: int, prompt_tokens: int) -> bool:
    """Whether the single-turn decode keeps its layers' products (`SampleOutput.products`) for
    the update to replay: the update's one optimizer step (`grpo.epochs` = `grpo.minibatches` =
    1) differentiates at the params that sampled, the model is not rematerialised, and the
    products of `rows` rows after prompts of `prompt_tokens` (`sampling.product_buffers`) take
    at most PRODUCTS_MAX_BYTES."""
    if not (cfg.grpo.epochs == 1 and cfg.grpo.minibatches == 1 and not model.remat and cfg.max_new_tokens > 1):
        return False
    buffers = jax.eval_shape(lambda: _product_buffers(model, cfg, rows, prompt_tokens))
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(buffers)) <= PRODUCTS_MAX_BYTES


def single_turn(domain: Any, graphdef: nnx.GraphDef, cfg: Any, over_data: Callable = lambda x: x) -> DeviceRollout:
    """Device single-turn rollouts: sample T tokens after each prompt (rows [b*G, (b+1)*G)
    share a prompt when sampling for training). A training batch (not greedy) carries the
    decode's products (`update_batch["products"]`) when `keeps_products`: the update's forward
    then replays them instead of running its matmuls again. `scratch`: buffers for them
    (`DeviceRollout.scratch`) that the decode overwrites."""
    group = cfg.group_size

    def fn(params, batch: TokenDataset, key, greedy: bool, scratch=None):
        prompts, prompt_mask = over_data(batch.prompts), over_data(batch.prompt_mask)
        keep = not greedy and keeps_products(config_of(graphdef, params), cfg, *prompts.shape)
        out = _generate(graphdef, params, prompts, prompt_mask, key, domain=domain, cfg=cfg, greedy=greedy,
                        group_size=1 if greedy else group, keep_products=keep,
                        product_scratch=scratch if keep else None)
        episode = {"tokens": out.tokens, "mask": out.mask}
        update_batch = {"prompts": prompts, "prompt_mask": prompt_mask, "completions": out.tokens,
                        "mask": out.mask, "old_logp": out.sampling_logprobs}
        if keep:
            update_batch["products"] = jax.tree_util.tree_map(over_data, out.products)
        return episode, update_batch

    def scratch(params, rows: int, prompt_tokens: int):
        model = config_of(graphdef, params)
        if not keeps_products(model, cfg, rows, prompt_tokens):
            return None
        return jax.tree_util.tree_map(over_data, _product_buffers(model, cfg, rows, prompt_tokens))

    return DeviceRollout(fn=fn, prefill_group=group, logprobs=row_logprobs(graphdef), scratch=scratch)


# ----------------------------------------------------------------------------- multi-turn


def _shift_in(history: jax.Array, latest: jax.Array) -> jax.Array:
    """[N, W, L] history with its oldest slot dropped and `latest` [N, L] appended."""
    return jnp.concatenate([history[:, 1:], latest[:, None]], axis=1)


def _episode_env(domain: Any, cfg: Any):
    """(env (a host environment behind `HostEnvBridge`), vmapped reset, vmapped step) of a
    multi-turn domain whose actions are `cfg.max_new_tokens` tokens."""
    env = domain.env
    if is_host_env(env):
        env = HostEnvBridge(env)
    if int(env.action_length) != cfg.max_new_tokens:
        raise ValueError(f"multi-turn domain {domain.name!r}: env.action_length={env.action_length} but the policy "
                         f"generates max_new_tokens={cfg.max_new_tokens} tokens per turn")
    reset = jax.vmap(lambda key, task: checked_reset(env, key, task))
    step = jax.vmap(lambda state, action: checked_step(env, state, action))
    return env, reset, step


def _keep(alive: jax.Array) -> Callable:
    """keep(new, old): `new` on the rows where `alive` bool[N] holds, `old` elsewhere."""
    return lambda new, old: jnp.where(alive.reshape(alive.shape + (1,) * (new.ndim - 1)), new, old)


def episodes(domain: Any, graphdef: nnx.GraphDef, cfg: Any, over_data: Callable = lambda x: x) -> DeviceRollout:
    """Multi-turn rollouts against `domain.env`, every turn in one scan (a pure JAX environment
    runs in the scan itself, a host environment through `HostEnvBridge` callbacks): the whole
    history in one stream per episode (`stream_episodes`) or a window read after the task every turn
    (`window_episodes`), as `domain.history` says."""
    if domain.history == FULL_HISTORY:
        if prompt_layout(domain.env) is not None:
            raise ValueError(f"multi-turn domain {domain.name!r}: the agent prompt needs a window history (an int W)")
        return stream_episodes(domain, graphdef, cfg, over_data)
    return window_episodes(domain, graphdef, cfg, over_data)


def window_width(domain: Any) -> int:
    """H, the most window tokens a turn's prompt of `domain` holds: min(W * (A + O), P - the fewest
    real task tokens of any example of its splits). A prompt is the task's real tokens, then at
    most H window tokens (`window_history`'s `width`), so for the domain's own examples the
    bound is the prompt length's; an example of another dataset with a shorter task gets no
    more than H window tokens either."""
    full = window_room(domain.env, int(domain.history))
    splits = [split for split in (domain.train, domain.test) if split is not None]
    fewest = min(int(np.min(np.sum(np.asarray(split.prompt_mask), axis=1))) for split in splits)
    return max(1, min(full, int(domain.prompt_length) - fewest))


def window_episodes(domain: Any, graphdef: nnx.GraphDef, cfg: Any, over_data: Callable = lambda x: x
                    ) -> DeviceRollout:
    """Episodes whose turn t prompt is the task and the last W turns: the task is read once per
    episode (a stream of its tokens), every turn appends its window to a copy of that stream and
    decodes after it; the update reads each task once per group of `cfg.group_size` episodes
    (the loop's batches repeat each task that many times; `prefill_group`) and every turn's
    window and action after it (`streams.prefixed_logprobs`). One update row per episode: prefix i32[N, Tp] /
    prefix_mask (the task prompt), blocks i32[N, S, H] / block_mask (each turn's window tokens,
    packed to the right; H = `window_width`), completions / mask / old_logp [N, S, A]."""
    env, reset, step = _episode_env(domain, cfg)
    window, pad, eos = int(domain.history), domain.pad_id, domain.eos_id
    turns, obs_len, act_len = int(env.max_turns), int(env.obs_length), int(env.action_length)
    length = int(domain.prompt_length)   # a split narrower than the widest keeps its own full width
    width = window_width(domain)
    layout = prompt_layout(domain.env)   # an agent prompt's rows and tail, or None

    def fn(params, batch: TokenDataset, key, greedy: bool):
        count = batch.size
        reset_key, turn_key = jax.random.split(key)
        obs, state = reset(jax.random.split(reset_key, count), dict(batch.context))
        observations = jnp.full((count, window, obs_len), pad, jnp.int32).at[:, -1].set(obs)
        actions = jnp.full((count, window, act_len), pad, jnp.int32)
        task = streams.start_stream(graphdef, params, count, length, act_len, pad)
        task = streams.append(graphdef, params, task, over_data(batch.prompts), over_data(batch.prompt_mask))

        def turn(carry, index):
            state, observations, actions, alive, success = carry
            history, kept = window_history(batch.prompt_mask, actions, actions != pad, observations,
                                           observations != pad, length, pad, width, layout)
            history, kept = over_data(history), over_data(kept)
            block, block_mask = left_pack(history, kept)
            block, block_mask = block[:, -width:], block_mask[:, -width:]
            # 3 append widths and one decode read: as fast as more at the household default (the
            # batch's longest prompt nearly fills the stream every turn), and fewer programs to compile
            prompt = streams.append_packed(graphdef, params, task, block, block_mask, widths=3)
            out = streams.stream_decode(graphdef, params, prompt, jax.random.fold_in(turn_key, index),
                                        max_new_tokens=act_len, eos_id=eos, pad_id=pad, temperature=cfg.temperature,
                                        top_k=cfg.top_k, greedy=greedy, reads=1)
            action = jnp.where(out.mask & (out.tokens != eos), out.tokens, pad)
            obs, new_state, _, done, info = step(state, action)
            keep = _keep(alive)
            state = jax.tree_util.tree_map(keep, new_state, state)
            observations = keep(_shift_in(observations, obs), observations)
            actions = keep(_shift_in(actions, action), actions)
            success = jnp.where(alive, jnp.maximum(success, info["success"].astype(jnp.float32)), success)
            record = {"blocks": block, "block_mask": block_mask, "completions": out.tokens,
                      "mask": out.mask & alive[:, None], "old_logp": out.sampling_logprobs,
                      "step_score": info["step_score"].astype(jnp.float32), "alive": alive}
            if "self_reward" in info:   # an environment with self-assessment (Self-Guide)
                record["self_reward"] = info["self_reward"].astype(jnp.float32)
            return (state, observations, actions, alive & ~done, success), record

        carry = (state, observations, actions, jnp.ones((count,), bool), jnp.zeros((count,), jnp.float32))
        (*_, success), records = jax.lax.scan(turn, carry, jnp.arange(turns))
        per_episode = jax.tree_util.tree_map(lambda x: jnp.swapaxes(x, 0, 1), records)  # [N, S, ...]
        episode = {"step_scores": per_episode["step_score"], "step_mask": per_episode["alive"], "success": success,
                   "tokens": per_episode["completions"], "mask": per_episode["mask"]}
        if "self_reward" in per_episode:
            episode["self_rewards"] = per_episode["self_reward"]
        rows = {"prefix": batch.prompts, "prefix_mask": batch.prompt_mask,
                **{name: per_episode[name] for name in ("blocks", "block_mask", "completions", "mask", "old_logp")}}
        return episode, rows

    return DeviceRollout(fn=fn, prefill_group=cfg.group_size, logprobs=prefixed_row_logprobs(graphdef))


def stream_episodes(domain: Any, graphdef: nnx.GraphDef, cfg: Any, over_data: Callable = lambda x: x
                    ) -> DeviceRollout:
    """Episodes that see their whole history, each read once as a token stream: the task and o_0
    are prefilled, then every turn decodes an action after the stream and appends the action
    (up to its EOS) and the observation it led to (module docstring). The update batch holds
    one row per episode: stream i32[N, C], stream_valid bool[N, C], starts i32[N, S] (the
    prompt length of each turn), completions i32[N, S, A], mask bool[N, S, A] (True on the
    tokens of the turns taken, up to and including EOS), old_logp f32[N, S, A]."""
    env, reset, step = _episode_env(domain, cfg)
    pad, eos = domain.pad_id, domain.eos_id
    turns, act_len = int(env.max_turns), int(env.action_length)
    budget = int(domain.prompt_length)   # the longest prompt of a turn
    capacity = budget + act_len

    def fn(params, batch: TokenDataset, key, greedy: bool):
        count = batch.size
        reset_key, turn_key = jax.random.split(key)
        obs, state = reset(jax.random.split(reset_key, count), dict(batch.context))
        stream = streams.start_stream(graphdef, params, count, capacity, act_len, pad)
        first = jnp.concatenate([batch.prompts, obs], axis=1)
        first_valid = jnp.concatenate([batch.prompt_mask, obs != pad], axis=1)
        stream = streams.append(graphdef, params, stream, over_data(first), over_data(first_valid))

        def turn(carry, index):
            state, stream, alive, success = carry
            alive = alive & (stream.length <= budget)
            out = streams.stream_decode(graphdef, params, stream, jax.random.fold_in(turn_key, index),
                                         max_new_tokens=act_len, eos_id=eos, pad_id=pad, temperature=cfg.temperature,
                                         top_k=cfg.top_k, greedy=greedy)
            said = out.mask & (out.tokens != eos)   # the action up to its EOS
            action = jnp.where(said, out.tokens, pad)
            obs, new_state, _, done, info = step(state, action)
            state = jax.tree_util.tree_map(_keep(alive), new_state, state)
            starts = stream.length
            stream = streams.append_packed(graphdef, params, stream,
                                           over_data(jnp.concatenate([out.tokens, obs], axis=1)),
                                           over_data(jnp.concatenate([said, obs != pad], axis=1)), live=alive)
            success = jnp.where(alive, jnp.maximum(success, info["success"].astype(jnp.float32)), success)
            record = {"starts": starts, "completions": out.tokens, "mask": out.mask & alive[:, None],
                      "old_logp": out.sampling_logprobs, "step_score": info["step_score"].astype(jnp.float32),
                      "alive": alive}
            if "self_reward" in info:   # an environment with self-assessment (Self-Guide)
                record["self_reward"] = info["self_reward"].astype(jnp.float32)
            return (state, stream, alive & ~done, success), record

        carry = (state, stream, jnp.ones((count,), bool), jnp.zeros((count,), jnp.float32))
        (_, stream, _, success), records = jax.lax.scan(turn, carry, jnp.arange(turns))
        per_episode = jax.tree_util.tree_map(lambda x: jnp.swapaxes(x, 0, 1), records)  # [N, S, ...]
        episode = {"step_scores": per_episode["step_score"], "step_mask": per_episode["alive"], "success": success,
                   "tokens": per_episode["completions"], "mask": per_episode["mask"]}
        if "self_reward" in per_episode:
            episode["self_rewards"] = per_episode["self_reward"]
        rows = {"stream": stream.tokens, "stream_valid": stream.valid,
                **{name: per_episode[name] for name in ("starts", "completions", "mask", "old_logp")}}
        return episode, rows

    return DeviceRollout(fn=fn, prefill_group=1, logprobs=stream_row_logprobs(graphdef))


def device_rollout(domain: Any, graphdef: nnx.GraphDef, cfg: Any, over_data: Callable = lambda x: x) -> DeviceRollout:
    """The in-scan rollout stage of `domain.rollout` ("device" or "env")."""
    if domain.rollout == "device":
        return single_turn(domain, graphdef, cfg, over_data)
    if domain.rollout == "env":
        return episodes(domain, graphdef, cfg, over_data)
    raise ValueError(f"device_rollout: domain {domain.name!r} has rollout kind {domain.rollout!r}; the jitted loop "
                     f"runs 'device' and 'env' (host kinds go through derl_jax.rl.host_loop)")


# ----------------------------------------------------------------------------- host-scored single turn


@struct.dataclass
class Rollouts:
    """A batch of sampled completions (N rows) for host scoring.

    prompts i32[N, Tp], prompt_mask bool[N, Tp]: the left-padded prompts;
    completions i32[N, T] (pad after the stop token); mask bool[N, T] True up to and
    including the first stop token; logprobs f32[N, T] temperature-1 policy log-probs of the
    completion tokens (0 where masked); lengths i32[N].
    """

    prompts: jax.Array
    prompt_mask: jax.Array
    completions: jax.Array
    mask: jax.Array
    logprobs: jax.Array
    lengths: jax.Array


def cut_at_stops(tokens: jax.Array, mask: jax.Array, stop_ids: Sequence[int]) -> jax.Array:
    """bool[N, T]: `mask` with every position after the first stop token of a row cleared."""
    is_stop = jnp.isin(tokens, jnp.asarray(tuple(stop_ids), jnp.int32)) & mask
    stops_before = jnp.cumsum(is_stop.astype(jnp.int32), axis=1) - is_stop.astype(jnp.int32)
    return mask & (stops_before == 0)


def sample_rollouts(graphdef: nnx.GraphDef, params: nnx.State, prompts: jax.Array, prompt_mask: jax.Array,
                    key: jax.Array, *, max_new_tokens: int, eos_id: int, pad_id: int, stop_ids: tuple[int, ...],
                    temperature: float, top_k: int, greedy: bool) -> Rollouts:
    """Sample (or greedily decode) completions of `prompts` i32[N, Tp]; cut at stop tokens."""
    out = sampling.sample(graphdef, params, prompts, prompt_mask, key, max_new_tokens=max_new_tokens, eos_id=eos_id,
                          pad_id=pad_id, temperature=temperature, top_k=top_k, greedy=greedy)
    mask = cut_at_stops(out.tokens, out.mask, stop_ids)
    return Rollouts(prompts=prompts, prompt_mask=prompt_mask, completions=jnp.where(mask, out.tokens, pad_id),
                    mask=mask, logprobs=jnp.where(mask, out.logprobs, 0.0),
                    lengths=jnp.sum(mask, axis=1, dtype=jnp.int32))


def completion_logprobs(graphdef: nnx.GraphDef, params: nnx.State, rollouts: Rollouts) -> jax.Array:
    """f32[N, T]: teacher-forced temperature-1 log-probs of the completion tokens under `params`."""
    logp, _ = sampling.sequence_logprobs(graphdef, params, rollouts.prompts, rollouts.prompt_mask,
                                         rollouts.completions, rollouts.mask)
    return logp
