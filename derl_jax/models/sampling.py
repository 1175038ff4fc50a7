"""Autoregressive sampling with a static KV cache, logit constraints and teacher forcing.

`sample` runs one prefill forward over the left-padded prompts, then a fixed-length
`lax.scan` that feeds one token per step through a KV cache of length Tp + max_new_tokens
(in phases that read only the slots written so far, rounded up: `decode_phases`).
Prompt positions count real tokens only (the first real token is at position 0), and
padding keys are masked out, so a left-padded row gives the same result as the same prompt
without padding. A row stops at its first `eos_id`; later tokens are `pad_id` and masked.

`sequence_logprobs` recomputes, in one teacher-forced forward over prompt + completion (a
prefill, then one cached forward over the completion), the log-probability of completion
tokens under the model at a given temperature; at temperature 1 it equals
`SampleOutput.logprobs` (the GRPO importance ratio uses these).

Both take `group_size` G: when rows [i*G, (i+1)*G) hold the same prompt (GRPO's G samples
per prompt), the prompt is run through the model once per group.

Shapes: B batch, Tp prompt length, T = max_new_tokens generated tokens, V vocabulary.
"""

from __future__ import annotations

import functools
from typing import Any, Protocol, runtime_checkable

import chex
import jax
import jax.numpy as jnp
from flax import nnx, struct

from derl_jax.models.attention import HeadMajorCache, init_head_major_cache
from derl_jax.models.logits import head_logp_and_entropy
from derl_jax.models.transformer import apply_hidden, apply_logits, config_of
from derl_jax.models.config import ModelConfig


@runtime_checkable
class Constraint(Protocol):
    """A logit mask driven by a per-row state, stepped inside the decode scan (pure jnp).

    init(batch_size) -> state          any pytree with leading axis B (or none)
    allowed(state) -> bool[B, V]       tokens that may come next; at least one per live row
    advance(state, tokens i32[B]) -> state
                                       consume the emitted tokens; rows that have finished
                                       receive `pad_id`, and their `allowed` is ignored

    To pass through `jax.jit` the constraint object itself must be a pytree (for example a
    `flax.struct.dataclass` holding its tables as arrays) or be hashable and marked static.
    """

    def init(self, batch_size: int) -> Any: ...

    def allowed(self, state: Any) -> jax.Array: ...

    def advance(self, state: Any, tokens: jax.Array) -> Any: ...


@struct.dataclass
class AllowedTokens:
    """A stateless constraint: only the tokens where `mask` (bool[V]) is True may be emitted."""

    mask: jax.Array

    def init(self, batch_size: int) -> jax.Array:
        return jnp.zeros((batch_size,), jnp.int32)

    def allowed(self, state: jax.Array) -> jax.Array:
        return jnp.broadcast_to(self.mask, (state.shape[0], self.mask.shape[0]))

    def advance(self, state: jax.Array, tokens: jax.Array) -> jax.Array:
        return state


@struct.dataclass
class SampleOutput:
    """Result of `sample`.

    tokens:            i32[B, T]  generated tokens; `pad_id` after a row's EOS.
    logprobs:          f32[B, T]  log softmax(logits)[token] of the unconstrained model at
                                  temperature 1 (no top-k, no constraint mask): the policy
                                  log-prob GRPO needs; equals `sequence_logprobs`. 0 where masked.
    sampling_logprobs: f32[B, T]  log-prob of the token under the distribution actually used:
                                  log softmax(filtered_logits / temperature)[token], where
                                  filtered = constraint mask then top-k. 0 where masked.
    mask:              bool[B, T] True for generated tokens up to and including EOS.
    lengths:           i32[B]     number of True entries of `mask` per row.
    products:          with `keep_products`, per layer a dict of the decoder layer's products
                       (`transformer.PRODUCTS`) at the T - 1 fed tokens, [B, T - 1, X] each
                       and "probs" f32[B, K, G, T - 1, Tp + T - 1]: what
                       `sequence_logprobs(..., saved=products)` replays. Else None.
    """

    tokens: jax.Array
    logprobs: jax.Array
    sampling_logprobs: jax.Array
    mask: jax.Array
    lengths: jax.Array
    products: Any = None


def prompt_positions(token_mask: jax.Array) -> jax.Array:
    """i32[B, T]: rank of each real token among the real tokens of its row (padding gets 0 or the previous rank)."""
    return jnp.maximum(jnp.cumsum(token_mask.astype(jnp.int32), axis=1) - 1, 0)


def _check_prompts(where: str, prompts: jax.Array, prompt_mask: jax.Array) -> None:
    if prompts.ndim != 2 or prompts.shape[1] == 0:
        raise ValueError(f"{where}: prompts must be i32[B, Tp] with Tp >= 1, got shape {prompts.shape}")
    if prompt_mask.shape != prompts.shape:
        raise ValueError(
            f"{where}: prompt_mask shape {prompt_mask.shape} differs from prompts shape {prompts.shape}")
    chex.assert_type(prompts, int)


def _check_group(where: str, batch: int, group_size: int) -> None:
    if not isinstance(group_size, int) or group_size < 1 or batch % group_size:
        raise ValueError(
            f"{where}: group_size must be a positive int dividing the batch of {batch} rows, got {group_size!r}")


def prefill(graphdef: nnx.GraphDef, params: nnx.State, prompts: jax.Array, prompt_mask: jax.Array,
            cache_length: int, group_size: int = 1) -> tuple[jax.Array, HeadMajorCache]:
    """Run left-padded prompts through the model into a fresh (head-major) cache of
    `cache_length` positions.

    prompts: i32[B, Tp]; prompt_mask: bool[B, Tp]. Returns (hidden [B, D] at the last prompt
    position, cache with positions [0, Tp) written). Rows [i*G, (i+1)*G) with G = group_size
    must hold the same prompt: it runs once per group and its outputs are repeated G times.
    """
    config = config_of(graphdef, params)
    prompts, prompt_mask = prompts[::group_size].astype(jnp.int32), prompt_mask[::group_size].astype(bool)
    batch, prompt_length = prompts.shape
    query_at = jnp.arange(prompt_length)
    mask = prompt_mask[:, None, :] & (query_at[None, :] <= query_at[:, None])[None]
    mask = jnp.pad(mask, ((0, 0), (0, 0), (0, cache_length - prompt_length)))
    hidden, cache = apply_hidden(graphdef, params, prompts, prompt_positions(prompt_mask), mask,
                                 init_head_major_cache(config, batch, cache_length), 0, last=1)
    last = hidden[:, -1]
    if group_size > 1:
        last, cache = jnp.repeat(last, group_size, axis=0), cache.repeat(group_size)
    return last, cache


def _filter_logits(logits: jax.Array, allowed: jax.Array | None, top_k: int) -> jax.Array:
    """f32[B, V]: disallowed tokens and tokens outside the top k set to -inf."""
    if allowed is not None:
        logits = jnp.where(allowed, logits, -jnp.inf)
    if top_k > 0:
        kth_largest = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits >= kth_largest, logits, -jnp.inf)
    return logits


def _token_logprob(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """f32[B]: log softmax(logits f32[B, V])[tokens i32[B]]."""
    return jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), tokens[:, None], axis=-1)[:, 0]


PREDRAWN_NOISE_MAX_ELEMENTS = 1 << 24  # 64 MiB of float32


DECODE_BLOCK = 16
DECODE_MAX_PHASES = 4   # each phase compiles its own copy of the decode step


def decode_phases(write_from: int, max_new_tokens: int, cache_length: int) -> list[tuple[int, int, int]]:
    """The phases of `decode`'s loop, [(first step, end step, slots read)].

    Step i (1 <= i < max_new_tokens) writes the token emitted before it at slot write_from + i - 1
    and reads the slots [0, write_from + i); a phase's steps read only the cache's first `slots`
    slots: the fewest that hold its last step's, rounded up to a block of DECODE_BLOCK slots (a
    multiple of it when that would give more than about DECODE_MAX_PHASES phases), or the whole
    cache. Early steps then skip the cache's empty end: about 3% of a 128-completion arith step
    on a CPU, and over a third of the decode's attention when the generation is long.
    """
    block = DECODE_BLOCK * max(1, -(-cache_length // (DECODE_MAX_PHASES * DECODE_BLOCK)))
    phases, step = [], 1
    while step < max_new_tokens:
        slots = min(cache_length, -(-(write_from + step) // block) * block)
        end = max_new_tokens if slots == cache_length else min(max_new_tokens, slots - write_from + 1)
        phases.append((step, end, slots))
        step = end
    return phases


def _prefix(cache: HeadMajorCache, slots: int) -> HeadMajorCache:
    keys = tuple(a[..., :slots] if cache.keys_last else a[:, :, :slots] for a in cache.k)
    return HeadMajorCache(k=keys, v=tuple(a[:, :, :slots] for a in cache.v), keys_last=cache.keys_last)


def _with_prefix(cache: HeadMajorCache, prefix: HeadMajorCache) -> HeadMajorCache:
    """`cache` with its first slots replaced by `prefix`'s."""
    def put(full, part):
        return jax.lax.dynamic_update_slice(full, part, (0, 0, 0, 0))

    return HeadMajorCache(k=tuple(map(put, cache.k, prefix.k)), v=tuple(map(put, cache.v, prefix.v)),
                          keys_last=cache.keys_last)


def product_buffers(config: ModelConfig, batch: int, tokens: int, keys: int) -> list[dict]:
    """Per layer, zero buffers for the products (`transformer.PRODUCTS`) of `tokens` fed tokens
    that read `keys` key slots: [batch, tokens, X] in the compute dtype, and "probs" f32[batch, K,
    G, tokens, keys]; `decode` writes one token's column per step (`write_products`)."""
    widths = {"qkv": (config.num_heads + 2 * config.num_kv_heads) * config.head_dim,
              "attn": config.num_heads * config.head_dim, "o": config.hidden_size,
              "gate_up": 2 * config.intermediate_size, "down": config.hidden_size}
    probs = (batch, config.num_kv_heads, config.group_size, tokens, keys)
    return [dict({name: jnp.zeros((batch, tokens, width), config.compute_dtype) for name, width in widths.items()},
                 probs=jnp.zeros(probs, jnp.float32)) for _ in range(config.num_layers)]


def write_products(buffers: list[dict], record: list[dict], column: jax.Array) -> list[dict]:
    """`buffers` (`product_buffers`) with one decode step's products `record` (per layer [B, 1, X],
    "probs" [B, K, G, S'] over the S' slots the step read, cut or padded with zeros to the
    buffer's keys) written at token `column`. The decode writes every element of the buffers,
    so they may start with any values (`decode`'s product_scratch)."""
    zero = jnp.zeros((), jnp.int32)

    def write(name, kept, new):
        if name == "probs":   # every key slot is written, 0 after the slots the step read
            keys = kept.shape[-1]
            new = jnp.pad(new[..., :keys], ((0, 0), (0, 0), (0, 0), (0, max(0, keys - new.shape[-1]))))
            return jax.lax.dynamic_update_slice(kept, new[:, :, :, None].astype(kept.dtype),
                                                (zero, zero, zero, column, zero))
        return jax.lax.dynamic_update_slice(kept, new.astype(kept.dtype), (zero, column, zero))

    return [{name: write(name, kept[name], new[name]) for name in kept} for kept, new in zip(buffers, record)]


def step_gumbel_noise(key: jax.Array, index: jax.Array | int, shape: tuple[int, ...]) -> jax.Array:
    """f32[*shape]: the Gumbel noise of decode step `index`, `jax.random.gumbel(fold_in(key, index))`.

    `jax.random.categorical(k, logits)` is `argmax(gumbel(k, logits.shape) + logits)`, so
    step i of `sample` adding this to its logits draws exactly what
    `categorical(fold_in(key, i), logits)` draws.
    """
    return jax.random.gumbel(jax.random.fold_in(key, index), shape, jnp.float32)


def gumbel_noise(key: jax.Array, steps: int, shape: tuple[int, ...]) -> jax.Array:
    """f32[steps, *shape]: `step_gumbel_noise` of steps 0..steps-1, drawn in one call (no PRNG
    call inside the decode loop; `sample` does this while the array stays under
    PREDRAWN_NOISE_MAX_ELEMENTS, and draws step by step beyond)."""
    return jax.vmap(lambda i: step_gumbel_noise(key, i, shape))(jnp.arange(steps, dtype=jnp.int32))


def first_argmax(x: jax.Array) -> jax.Array:
    """i32[...]: `jnp.argmax(x, axis=-1)` of f32[..., V] (the first index of the largest value; a
    NaN counts as the largest), written as two plain reductions, a max and then the smallest
    index holding it. XLA:CPU runs argmax's paired (value, index) reduction several times
    slower, and the sampler takes one per decode step."""
    top = jnp.max(x, axis=-1, keepdims=True)
    index = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where((x == top) | jnp.isnan(x), index, x.shape[-1]), axis=-1)


def _decode_step(logits, constraint, constraint_state, done, noise, *, temperature, top_k,
                 eos_id, pad_id):
    """Choose one token per row from next-token logits f32[B, V] and update the row states.

    noise: f32[B, V] Gumbel noise of this step (sampling), or None (greedy: argmax).
    Returns (emitted i32[B], logprob f32[B], sampling_logprob f32[B], live bool[B],
    done bool[B], constraint_state).
    """
    allowed = None
    if constraint is not None:
        allowed = constraint.allowed(constraint_state) | done[:, None]
    scaled = _filter_logits(logits, allowed, top_k) / temperature
    if noise is None:
        token = first_argmax(scaled)
    else:
        token = first_argmax(noise + scaled)
    live = ~done
    emitted = jnp.where(live, token, pad_id).astype(jnp.int32)
    logprob = jnp.where(live, _token_logprob(logits, token), 0.0)
    sampling_logprob = jnp.where(live, _token_logprob(scaled, token), 0.0)
    done = done | (live & (emitted == eos_id))
    if constraint is not None:
        constraint_state = constraint.advance(constraint_state, emitted)
    return emitted, logprob, sampling_logprob, live, done, constraint_state


def sample(graphdef: nnx.GraphDef, params: nnx.State, prompts: jax.Array, prompt_mask: jax.Array,
           key: jax.Array, *, max_new_tokens: int, eos_id: int, pad_id: int,
           temperature: float = 1.0, top_k: int = 0, greedy: bool = False,
           constraint: Constraint | None = None, group_size: int = 1, keep_products: bool = False,
           product_scratch: list[dict] | None = None) -> SampleOutput:
    """Generate up to `max_new_tokens` tokens after left-padded `prompts`.

    prompts: i32[B, Tp] (left padded); prompt_mask: bool[B, Tp] True on real tokens.
    key: PRNG key; step i uses fold_in(key, i), so the same key gives the same output.
    eos_id: ends a row (any int; one outside the vocabulary never fires). pad_id: fills rows
    after their EOS and is fed to the model there, so it must be a vocabulary token.
    temperature: divides the filtered logits before sampling (must be > 0).
    top_k: keep only the k largest logits (0: all). greedy: argmax instead of sampling.
    constraint: optional logit mask (see `Constraint`), also applied when greedy.
    group_size: G; rows [i*G, (i+1)*G) hold the same prompt, which is prefilled once per group
    (see `prefill`); the rows are still sampled independently.
    keep_products: also return the decoder layers' products at every fed token
    (`SampleOutput.products`), so that the update can replay them instead of recomputing them.
    product_scratch: with keep_products, buffers shaped as `product_buffers`' (e.g. the products
    of the step before) that the decode overwrites instead of allocating zeroed ones.
    Static under jit: graphdef, max_new_tokens, top_k, greedy, group_size, keep_products (see `sample_jit`).
    """
    _check_prompts("sample", prompts, prompt_mask)
    _check_group("sample", prompts.shape[0], group_size)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"sample: max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"sample: top_k must be a non-negative int, got {top_k!r}")
    if isinstance(temperature, (int, float)) and not temperature > 0:
        raise ValueError(f"sample: temperature must be > 0, got {temperature!r}")
    config = config_of(graphdef, params)
    if isinstance(pad_id, int) and not 0 <= pad_id < config.vocab_size:
        raise ValueError(f"sample: pad_id {pad_id} is not a token of the vocabulary [0, {config.vocab_size})")
    batch, prompt_length = prompts.shape
    cache_length = prompt_length + max_new_tokens
    if cache_length > config.max_position:
        raise ValueError(
            f"sample: prompt length {prompt_length} + max_new_tokens {max_new_tokens} exceeds the "
            f"model's max_position {config.max_position}")

    if constraint is not None:
        allowed = jax.eval_shape(lambda: constraint.allowed(constraint.init(batch)))
        if allowed.shape != (batch, config.vocab_size):
            raise ValueError(
                f"sample: constraint.allowed returned shape {allowed.shape}, expected [B, V] = "
                f"{(batch, config.vocab_size)}")

    prompt_mask = prompt_mask.astype(bool)
    key_valid = jnp.concatenate([prompt_mask, jnp.ones((batch, max_new_tokens), bool)], axis=1)
    last_hidden, cache = prefill(graphdef, params, prompts, prompt_mask, cache_length, group_size)
    num_real = jnp.sum(prompt_mask, axis=1, dtype=jnp.int32)
    out, _ = decode(graphdef, params, cache, key_valid, last_hidden, prompt_length, num_real, key,
                    max_new_tokens=max_new_tokens, eos_id=eos_id, pad_id=pad_id, temperature=temperature,
                    top_k=top_k, greedy=greedy, constraint=constraint, keep_products=keep_products,
                    product_scratch=product_scratch)
    return out


def decode(graphdef: nnx.GraphDef, params: nnx.State, cache: HeadMajorCache, key_valid: jax.Array,
           last_hidden: jax.Array, write_from: int, positions_from: jax.Array, key: jax.Array, *,
           max_new_tokens: int, eos_id: int, pad_id: int, temperature: float = 1.0, top_k: int = 0,
           greedy: bool = False, constraint: Constraint | None = None, keep_products: bool = False,
           product_scratch: list[dict] | None = None) -> tuple[SampleOutput, HeadMajorCache]:
    """The decode loop of `sample` after a prefill (shapes and arguments as there).

    cache: S slots; key_valid bool[B, S]: the slots the new tokens may read (the prompt's real
    tokens, and True on the slots [write_from, write_from + T - 1) the fed tokens are written
    to); last_hidden [B, D]: the hidden state that predicts the first new token; new token i
    (fed at step i + 1) is written at slot write_from + i with position positions_from + i
    (i32[B]). Returns (the output, the cache with the fed tokens written, in the layout it came
    in). keep_products, product_scratch: as in `sample`. The loop reads the cache with its keys
    laid out [B, K, Dh, S] (`HeadMajorCache.keys_last`: each step's scores are one batched
    matmul; about 0.97x the 128-completion arith step on a CPU).
    """
    batch = last_hidden.shape[0]
    config = config_of(graphdef, params)
    keys_last = cache.keys_last
    cache = cache.with_keys_last(True)
    key_slots = jnp.arange(cache.length)
    first_logits = apply_logits(graphdef, params, last_hidden)
    step = functools.partial(_decode_step, constraint=constraint, temperature=temperature, top_k=top_k,
                             eos_id=eos_id, pad_id=pad_id)
    constraint_state = constraint.init(batch) if constraint is not None else None
    noise_shape = (batch, config.vocab_size)
    predrawn = not greedy and max_new_tokens * batch * config.vocab_size <= PREDRAWN_NOISE_MAX_ELEMENTS
    noise = gumbel_noise(key, max_new_tokens, noise_shape) if predrawn else None
    first = step(first_logits, constraint_state=constraint_state, done=jnp.zeros((batch,), bool),
                 noise=None if greedy else noise[0] if predrawn else step_gumbel_noise(key, 0, noise_shape))

    def decode_step(carry, inputs, slots):
        index, step_noise = inputs
        if not greedy and not predrawn:
            step_noise = step_gumbel_noise(key, index, noise_shape)
        cache, previous, done, constraint_state, products = carry
        write_at = write_from + index - 1
        mask = key_valid[:, None, :slots] & (key_slots[:slots] <= write_at)[None, None, :]
        positions = (positions_from + index - 1)[:, None]
        record = [] if keep_products else None
        hidden, cache = apply_hidden(graphdef, params, previous[:, None], positions, mask, cache, write_at,
                                     record=record)
        if keep_products:
            products = write_products(products, record, index - 1)
        logits = apply_logits(graphdef, params, hidden[:, 0])
        emitted, logprob, sampling_logprob, live, done, constraint_state = step(
            logits, constraint_state=constraint_state, done=done, noise=step_noise)
        return (cache, emitted, done, constraint_state, products), (emitted, logprob, sampling_logprob, live)

    emitted0, logprob0, sampling_logprob0, live0, done0, constraint_state = first
    products = None
    if keep_products and max_new_tokens > 1:
        products = product_buffers(config, batch, max_new_tokens - 1, write_from + max_new_tokens - 1)
        if product_scratch is not None:
            chex.assert_trees_all_equal_shapes_and_dtypes(product_scratch, products)
            products = product_scratch
    carry, phase_outputs = (emitted0, done0, constraint_state, products), []
    for start, end, slots in decode_phases(write_from, max_new_tokens, cache.length):
        (prefix, *carry), out = jax.lax.scan(functools.partial(decode_step, slots=slots),
                                             (_prefix(cache, slots), *carry),
                                             (jnp.arange(start, end, dtype=jnp.int32),
                                              noise[start:end] if predrawn else None))
        cache = _with_prefix(cache, prefix)
        phase_outputs.append(out)
    products = carry[-1]
    if phase_outputs:
        rest = [jnp.concatenate(parts, axis=0) for parts in zip(*phase_outputs)]
    else:   # a single new token: no step after the first
        rest = [jnp.zeros((0, batch), x.dtype) for x in (emitted0, logprob0, sampling_logprob0, live0)]
    columns = [jnp.concatenate([head[:, None], tail.T], axis=1)
               for head, tail in zip((emitted0, logprob0, sampling_logprob0, live0), rest)]
    tokens, logprobs, sampling_logprobs, mask = columns
    chex.assert_shape([tokens, logprobs, sampling_logprobs, mask], (batch, max_new_tokens))
    chex.assert_type([tokens, logprobs, sampling_logprobs, mask], [int, jnp.float32, jnp.float32, bool])
    out = SampleOutput(tokens=tokens, logprobs=logprobs, sampling_logprobs=sampling_logprobs,
                       mask=mask, lengths=jnp.sum(mask, axis=1, dtype=jnp.int32), products=products)
    return out, cache.with_keys_last(keys_last)


sample_jit = jax.jit(sample, static_argnames=("graphdef", "max_new_tokens", "top_k", "greedy", "group_size",
                                              "keep_products"))
"""`sample` under `jax.jit` (graphdef, max_new_tokens, top_k, greedy and group_size static)."""


def constraint_masks(constraint: Constraint, tokens: jax.Array) -> jax.Array:
    """bool[B, T, V]: the constraint's allowed set before each of `tokens` (i32[B, T]).

    Replays the constraint over the tokens exactly as `sample` stepped it, so
    `sequence_logprobs(..., allowed=constraint_masks(constraint, out.tokens))` gives the
    log-probs of the constrained distribution (`SampleOutput.sampling_logprobs` when no top-k).
    """
    def step(state, column):
        return constraint.advance(state, column), constraint.allowed(state)

    _, masks = jax.lax.scan(step, constraint.init(tokens.shape[0]), tokens.T.astype(jnp.int32))
    return jnp.swapaxes(masks, 0, 1)


def sequence_logprobs(graphdef: nnx.GraphDef, params: nnx.State, prompts: jax.Array,
                      prompt_mask: jax.Array, completions: jax.Array, completion_mask: jax.Array,
                      temperature: float = 1.0, allowed: jax.Array | None = None, group_size: int = 1,
                      saved: Any = None) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced (logp f32[B, T], entropy f32[B, T]) of `completions` after `prompts`.

    prompts/prompt_mask: as for `sample`; completions: i32[B, T]; completion_mask: bool[B, T]
    (a prefix of True per row, as `SampleOutput.mask`). logp[b, t] = log softmax(logits /
    temperature)[completions[b, t]], over the tokens in `allowed` (bool[B, T, V], e.g. from
    `constraint_masks`) when given; entropy is that distribution's entropy (nats). Both are 0
    where completion_mask is False. Differentiable in `params`.

    The causal forward over prompt + completion is run as `sample` runs it: the prompts are
    prefilled into a cache (once per group of `group_size` rows holding the same prompt, see
    `prefill`), then every completion token but the last (which predicts nothing) goes through
    one cached forward. saved: `SampleOutput.products` of the decode that sampled these
    completions with these same params: that forward then replays the layers' products
    instead of recomputing them (the same values up to float rounding; their matmuls run only
    in the backward pass).
    """
    _check_prompts("sequence_logprobs", prompts, prompt_mask)
    if completions.ndim != 2 or completions.shape[0] != prompts.shape[0]:
        raise ValueError(
            f"sequence_logprobs: completions must be [B, T] with B = {prompts.shape[0]}, got {completions.shape}")
    if completion_mask.shape != completions.shape:
        raise ValueError(
            f"sequence_logprobs: completion_mask shape {completion_mask.shape} differs from "
            f"completions shape {completions.shape}")
    _check_group("sequence_logprobs", prompts.shape[0], group_size)
    chex.assert_type(completions, int)
    prompt_length, completion_length = prompts.shape[1], completions.shape[1]
    if completion_length == 0:
        return jnp.zeros(completions.shape, jnp.float32), jnp.zeros(completions.shape, jnp.float32)
    prompt_mask, completion_mask = prompt_mask.astype(bool), completion_mask.astype(bool)
    total = prompt_length + completion_length - 1
    predicting, cache = prefill(graphdef, params, prompts, prompt_mask, total, group_size)
    predicting = predicting[:, None]
    if completion_length > 1:
        key_valid = jnp.concatenate([prompt_mask, completion_mask[:, :-1]], axis=1)
        query_at = prompt_length + jnp.arange(completion_length - 1)
        mask = key_valid[:, None, :] & (jnp.arange(total)[None, None, :] <= query_at[None, :, None])
        positions = prompt_positions(key_valid)[:, prompt_length:]
        hidden, _ = apply_hidden(graphdef, params, completions[:, :-1].astype(jnp.int32), positions, mask, cache,
                                 prompt_length, saved=saved)
        predicting = jnp.concatenate([predicting, hidden], axis=1)
    if allowed is not None and allowed.shape != (*completions.shape, config_of(graphdef, params).vocab_size):
        raise ValueError(f"sequence_logprobs: allowed must be [B, T, V] = "
                         f"{(*completions.shape, config_of(graphdef, params).vocab_size)}, got {allowed.shape}")
    logp, entropy = head_logp_and_entropy(graphdef, params, predicting, completions, temperature, allowed)
    logp, entropy = jnp.where(completion_mask, logp, 0.0), jnp.where(completion_mask, entropy, 0.0)
    chex.assert_shape([logp, entropy], completions.shape)
    return logp, entropy
