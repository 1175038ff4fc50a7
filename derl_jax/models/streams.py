"""Token streams: sequences read once, and rows that share a prefix read once.

A `Stream` is one KV cache per row that tokens are appended to (`append`, `append_packed`)
and decoded after (`stream_decode`, the draws of `sampling.sample` after a prompt holding the
stream's tokens); `stream_logprobs` is the teacher-forced pass over a packed stream that gives
every completion generated along it its log-probabilities. `prefixed_logprobs` is the same for
rows that are a shared prefix (an episode's task) followed by a block of their own (a turn's
window and action): the prefix runs through the model once for all its rows.

Shapes: B rows, C stream slots, S completions per row, T completion tokens, D hidden size.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
from flax import nnx, struct

from derl_jax.models.attention import HeadMajorCache, init_head_major_cache, write_slots
from derl_jax.models.logits import head_logp_and_entropy
from derl_jax.models.sampling import SampleOutput, decode, prompt_positions
from derl_jax.models.transformer import apply_hidden, config_of



@struct.dataclass
class Stream:
    """Token streams, one per row, each read once: every token appended is run through the model
    once, at its own slot and position, and stays in the cache for everything after it.

    A stream's tokens are packed: the t-th token appended sits at slot t and position t (so a
    stream of real tokens has the positions `prompt_positions` gives the same tokens in a padded
    prompt). The cache has C stream slots and, after them, `scratch` slots the decoder writes
    the tokens it feeds to (`stream_decode`); the tokens it emits enter the stream only when
    appended.

    cache:       HeadMajorCache, per layer [B, K, C + scratch, Dh].
    tokens:      i32[B, C]  the token of every stream slot (pad_id where none).
    valid:       bool[B, C] slots that hold a token.
    length:      i32[B]     tokens appended so far; beyond C they were not kept (the row is full).
    last_hidden: [B, D]     hidden state at the last token appended (it predicts the next token).
    """

    cache: HeadMajorCache
    tokens: jax.Array
    valid: jax.Array
    length: jax.Array
    last_hidden: jax.Array

    @property
    def capacity(self) -> int:
        """C, the stream slots."""
        return int(self.tokens.shape[1])


def start_stream(graphdef: nnx.GraphDef, params: nnx.State, batch_size: int, capacity: int, scratch: int,
                 pad_id: int) -> Stream:
    """B empty streams of `capacity` slots plus `scratch` decoder slots."""
    config = config_of(graphdef, params)
    if capacity > config.max_position:
        raise ValueError(f"start_stream: {capacity} stream positions exceed the model's max_position "
                         f"{config.max_position}")
    return Stream(cache=init_head_major_cache(config, batch_size, capacity + scratch),
                  tokens=jnp.full((batch_size, capacity), pad_id, jnp.int32),
                  valid=jnp.zeros((batch_size, capacity), bool), length=jnp.zeros((batch_size,), jnp.int32),
                  last_hidden=jnp.zeros((batch_size, config.hidden_size), config.compute_dtype))


def append_slots(length: jax.Array, valid: jax.Array, capacity: int, dropped: int) -> tuple[jax.Array, jax.Array]:
    """(slots i32[B, T], kept bool[B, T]) of the tokens marked by `valid` bool[B, T] appended, in
    order, to streams of `length` i32[B] tokens: token j goes to slot length + (valid tokens
    before it); tokens not valid or beyond `capacity` are not kept and get slot `dropped`."""
    slots = length[:, None] + jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1
    kept = valid & (slots < capacity)
    return jnp.where(kept, slots, dropped), kept


def append(graphdef: nnx.GraphDef, params: nnx.State, stream: Stream, tokens: jax.Array, valid: jax.Array,
           live: jax.Array | None = None) -> Stream:
    """`stream` with the tokens of i32[B, T] where `valid` bool[B, T] appended in order, in one
    forward over the T columns (each new token reads the stream and the new tokens before it).

    Rows with no valid token keep their `last_hidden`. Rows where `live` bool[B] is False are
    left as they were (their cache slots past the stream may be overwritten; no slot they
    hold is). Tokens beyond the capacity are counted in `length` and not kept.
    """
    batch, width = tokens.shape
    capacity, cache_length = stream.capacity, stream.cache.length
    live = jnp.ones((batch,), bool) if live is None else live
    valid = valid.astype(bool) & live[:, None]
    # the valid tokens to the right end of the columns: the last column is then the last token
    order = jnp.argsort(valid.astype(jnp.int32), axis=-1, stable=True)
    tokens, valid = jnp.take_along_axis(tokens, order, axis=-1), jnp.take_along_axis(valid, order, axis=-1)
    slots, kept = append_slots(stream.length, valid, capacity, cache_length)
    positions = stream.length[:, None] + jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1
    written = write_slots(jnp.zeros((batch, capacity), bool), kept, slots, axis=1)
    readable = jnp.pad(stream.valid | written, ((0, 0), (0, cache_length - capacity)))
    query_at = jnp.where(valid, positions, -1)
    mask = readable[:, None, :] & (jnp.arange(cache_length)[None, None, :] <= query_at[:, :, None])
    hidden, cache = apply_hidden(graphdef, params, tokens.astype(jnp.int32), jnp.maximum(positions, 0), mask,
                                 stream.cache, slots, last=1)
    any_new = jnp.any(valid, axis=1)
    return Stream(cache=cache, tokens=write_slots(stream.tokens, tokens, slots, axis=1),
                  valid=stream.valid | written, length=stream.length + jnp.sum(valid, axis=1, dtype=jnp.int32),
                  last_hidden=jnp.where(any_new[:, None], hidden[:, -1], stream.last_hidden))


def block_widths(width: int, count: int) -> tuple[int, ...]:
    """The widths, smallest first, that a group of blocks `width` wide may be cut to: width *
    k / count rounded up, k = 1..count (each at least 1, no repeats)."""
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"block_widths: count must be an int >= 1, got {count!r}")
    return tuple(sorted({max(1, -(-width * k // count)) for k in range(1, count + 1)}))


@jax.custom_batching.custom_vmap
def _widest_over_batch(index: jax.Array) -> jax.Array:
    """`index` itself; under `vmap`, its maximum over the mapped axis, unmapped, so that a
    `lax.switch` on it runs one branch for every mapped row rather than all of them."""
    return index


@_widest_over_batch.def_vmap
def _widest_over_batch_rule(axis_size, in_batched, index):
    del axis_size
    return (jnp.max(index, axis=0) if in_batched[0] else index), False


def _least_holding(needed: jax.Array, choices: tuple[int, ...]) -> jax.Array:
    """i32[...]: the index into `choices` (ascending) of the least that holds `needed` i32[...]
    (the last when none does), the branch a `lax.switch` over them takes; under `vmap` the
    widest any mapped row needs (`_widest_over_batch`), so that one branch runs."""
    return _widest_over_batch(jnp.sum(needed[..., None] > jnp.asarray(choices[:-1], jnp.int32), axis=-1))


APPEND_WIDTHS = 6
"""Widths `append_packed` may run a chunk at: its T columns times 1/6, 2/6, ..., 6/6."""


def append_packed(graphdef: nnx.GraphDef, params: nnx.State, stream: Stream, tokens: jax.Array, valid: jax.Array,
                  widths: int = APPEND_WIDTHS, live: jax.Array | None = None) -> Stream:
    """`append` of the valid tokens of tokens i32[B, T] / valid bool[B, T], packed to the front
    and run at the least of `block_widths(T, widths)` columns that holds the row with the most
    (a `lax.switch`, each width a program of its own): a chunk that is mostly padding (an
    observation slot of which a few words are used, a window shorter than its slots) costs what
    its longest row holds, in one forward. Same stream as one `append` of the T columns (up to
    float rounding); rows where `live` is False are left as they were. Under `vmap` every
    mapped stream takes the widest width any of them needs (one branch runs)."""
    batch, total = tokens.shape
    live = jnp.ones((batch,), bool) if live is None else live
    valid = valid.astype(bool) & live[:, None]
    order = jnp.argsort(~valid, axis=-1, stable=True)    # the valid tokens first, in order
    tokens, valid = jnp.take_along_axis(tokens, order, axis=-1), jnp.take_along_axis(valid, order, axis=-1)
    choices = block_widths(total, widths)
    most = jnp.max(jnp.sum(valid, axis=1, dtype=jnp.int32))
    index = _least_holding(most, choices)
    branches = [lambda stream, width=width: append(graphdef, params, stream, tokens[:, :width], valid[:, :width])
                for width in choices]
    return jax.lax.switch(index, branches, stream)


DECODE_READS = 4
"""Slot counts `stream_decode` may read: the C stream slots times 1/4, 2/4, 3/4, 4/4."""


def stream_decode(graphdef: nnx.GraphDef, params: nnx.State, stream: Stream, key: jax.Array, *,
                  max_new_tokens: int, eos_id: int, pad_id: int, temperature: float = 1.0, top_k: int = 0,
                  greedy: bool = False, reads: int = DECODE_READS) -> SampleOutput:
    """Generate up to `max_new_tokens` tokens after every stream, exactly as `sample` would after
    a prompt holding the stream's tokens (the same key gives the same draws). The fed tokens go to
    the scratch slots; the stream is not changed (append what was generated to keep it).

    The decode reads only the first slots of the stream, the least of `block_widths(C, reads)`
    that holds every row's tokens, and the scratch slots after them (a `lax.switch`, each a
    program of its own; under `vmap` the most any mapped stream needs): a stream that holds
    few tokens yet (early turns, short windows) is not read to its end.
    """
    capacity, scratch = stream.capacity, stream.cache.length - stream.capacity
    if scratch < max_new_tokens - 1:
        raise ValueError(f"stream_decode: {scratch} scratch slots cannot hold {max_new_tokens - 1} fed tokens")
    batch = stream.tokens.shape[0]
    choices = block_widths(capacity, reads)
    held = jnp.minimum(jnp.max(stream.length), capacity)
    index = _least_holding(held, choices)

    def read_first(slots):
        def first(a):
            return jnp.pad(a[:, :, :slots], ((0, 0), (0, 0), (0, scratch), (0, 0))) if slots < capacity else a

        cache = HeadMajorCache(k=tuple(map(first, stream.cache.k)), v=tuple(map(first, stream.cache.v)))
        key_valid = jnp.concatenate([stream.valid[:, :slots], jnp.ones((batch, scratch), bool)], axis=1)
        out, _ = decode(graphdef, params, cache, key_valid, stream.last_hidden, slots, stream.length, key,
                        max_new_tokens=max_new_tokens, eos_id=eos_id, pad_id=pad_id, temperature=temperature,
                        top_k=top_k, greedy=greedy)
        return out

    return jax.lax.switch(index, [lambda slots=slots: read_first(slots) for slots in choices])


STREAM_BLOCK = 96
"""Queries per block of `causal_hidden`'s pass over a stream (see there)."""


def causal_hidden(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array, valid: jax.Array,
                  block: int = STREAM_BLOCK) -> jax.Array:
    """Hidden states [B, C, D] of packed streams (tokens i32[B, C], valid bool[B, C]; token t at
    position t, reading the valid tokens up to itself), computed in blocks of `block` queries.

    Block i runs through the model with a cache of the blocks before it, so it reads (i + 1) *
    block keys, not C: about half the attention of one causal pass over C, and arrays that stay
    small (the attention's cost on a CPU grows faster than its size once they leave the cache).
    Equals one causal forward over C up to float rounding.
    """
    batch, capacity = tokens.shape
    config = config_of(graphdef, params)
    slots = jnp.arange(capacity)
    cache = init_head_major_cache(config, batch, 0)
    hidden = []
    for start in range(0, capacity, block):
        end = min(capacity, start + block)
        grow = lambda arrays: tuple(jnp.pad(a, ((0, 0), (0, 0), (0, end - start), (0, 0))) for a in arrays)  # noqa: E731
        cache = HeadMajorCache(k=grow(cache.k), v=grow(cache.v))
        mask = valid[:, None, :end] & (slots[None, None, :end] <= slots[None, start:end, None])
        positions = jnp.broadcast_to(slots[start:end], (batch, end - start))
        out, cache = apply_hidden(graphdef, params, tokens[:, start:end].astype(jnp.int32), positions, mask, cache,
                                  start)
        hidden.append(out)
    return jnp.concatenate(hidden, axis=1)


def stream_logprobs(graphdef: nnx.GraphDef, params: nnx.State, tokens: jax.Array, valid: jax.Array,
                    starts: jax.Array, completions: jax.Array, completion_mask: jax.Array,
                    temperature: float = 1.0, block: int = STREAM_BLOCK) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced (logp, entropy) f32[B, S, T] of S completions per stream, in one causal
    forward over each stream.

    tokens i32[B, C] / valid bool[B, C]: packed streams (`Stream.tokens`, `Stream.valid`: real
    token t at slot and position t). Completion s of row b, completions[b, s] i32[T] with
    completion_mask[b, s] bool[T] (a prefix of True, as `SampleOutput.mask`), was generated
    after the stream's first starts[b, s] tokens and its tokens up to its first EOS were appended
    right after them: token j of it is predicted by the hidden state at slot starts[b, s] - 1 + j.
    Equals `sequence_logprobs` of each completion after a prompt of the stream's first
    starts[b, s] tokens, up to float rounding. Both outputs are 0 where completion_mask is False.
    The pass runs in blocks of `block` queries (`causal_hidden`).
    """
    batch, capacity = tokens.shape
    chex.assert_shape(valid, (batch, capacity))
    chex.assert_rank([starts, completions, completion_mask], [2, 3, 3])
    turns, length = completions.shape[1:]
    hidden = causal_hidden(graphdef, params, tokens, valid, block)
    at = jnp.clip(starts[:, :, None] - 1 + jnp.arange(length), 0, capacity - 1).reshape(batch, turns * length)
    predicting = jnp.take_along_axis(hidden, at[:, :, None], axis=1)
    logp, entropy = head_logp_and_entropy(graphdef, params, predicting,
                                          completions.reshape(batch, turns * length), temperature)
    logp, entropy = logp.reshape(completions.shape), entropy.reshape(completions.shape)
    completion_mask = completion_mask.astype(bool)
    return jnp.where(completion_mask, logp, 0.0), jnp.where(completion_mask, entropy, 0.0)


PREFIXED_CHUNKS = 3
"""Chunks of `prefixed_logprobs`' pass over each row's block (see there)."""
PREFIXED_GROUPS = 8
"""Groups of rows, by block length, that `prefixed_logprobs` runs each at its own width."""
PREFIXED_WIDTHS = 6
"""Widths a group's blocks may be cut to (`block_widths`): the block width H times 1/6, 2/6, ...,
6/6. Each is a program of its own: more widths fit the blocks closer and compile longer (the
household default's inner step on a 2-core CPU, one device: 0.49 s with every row at H, 0.29 to
0.35 s with 8 groups and 4 widths, 6-8% less with 6; compile 11 s, 23 s and 30 s)."""


def prefixed_logprobs(graphdef: nnx.GraphDef, params: nnx.State, prefix: jax.Array, prefix_mask: jax.Array,
                      blocks: jax.Array, block_mask: jax.Array, completions: jax.Array, completion_mask: jax.Array,
                      temperature: float = 1.0, chunks: int = PREFIXED_CHUNKS, groups: int = PREFIXED_GROUPS,
                      widths: int = PREFIXED_WIDTHS, group_size: int = 1) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced (logp, entropy) f32[B, S, T] of rows that share a prefix: row (b, s) is
    the prefix b (prefix i32[B, Tp] / prefix_mask bool[B, Tp], left padded), then its own block
    (blocks i32[B, S, H] / block_mask bool[B, S, H], its real tokens packed to the right), and its
    completion (completions i32[B, S, T] / completion_mask bool[B, S, T], a prefix of True).

    Equals `sequence_logprobs` of every row with the prompt prefix + block written out
    (the real tokens, left padded), up to float rounding, and so do the gradients; each prefix
    runs through the model once, its keys and values read by its S rows (their gradients
    summed). With `group_size` G, prefixes [i*G, (i+1)*G) are the same (GRPO's G episodes of a
    task) and only the first of each group runs; its G*S rows read it (about 10% of the
    household default's update). Both outputs are 0 where completion_mask is False.

    Blocks are mostly shorter than H, and their padding need not run: the B*S rows, sorted by
    their block's real length, are cut into `groups` groups of near-equal size, and each group
    runs with its blocks cut to the least of `block_widths(H, widths)` that holds its longest
    block (a `lax.switch` over the widths, each a program of its own). groups = widths = 1 runs
    every row at H. A row's block and completion run in `chunks` chunks of columns, each reading
    the prefix and the chunks before it from a cache: a chunk does not attend to the columns
    after it (at a block of 84 and 8 completion tokens, 3 chunks take 15% less time than one
    pass on a CPU).
    """
    chex.assert_rank([prefix, prefix_mask, blocks, block_mask, completions, completion_mask], [2, 2, 3, 3, 3, 3])
    batch, prefix_length = prefix.shape
    turns, width = blocks.shape[1:]
    length = completions.shape[2]
    chex.assert_shape(block_mask, blocks.shape)
    chex.assert_shape([completions, completion_mask], (batch, turns, length))
    if not isinstance(chunks, int) or chunks < 1 or length < 1:
        raise ValueError(f"prefixed_logprobs: chunks must be an int >= 1 and completions at least 1 token long, "
                         f"got chunks={chunks!r} and {length} tokens")
    if not isinstance(groups, int) or groups < 1:
        raise ValueError(f"prefixed_logprobs: groups must be an int >= 1, got {groups!r}")
    if not isinstance(group_size, int) or group_size < 1 or batch % group_size:
        raise ValueError(f"prefixed_logprobs: group_size must be a positive int dividing the {batch} prefixes, "
                         f"got {group_size!r}")
    choices = block_widths(width, widths)
    # the distinct prefixes, one per group of group_size rows
    prefix_mask = prefix_mask[::group_size].astype(bool)
    causal = jnp.arange(prefix_length)[None, :] <= jnp.arange(prefix_length)[:, None]
    prefix_last, prefix_cache = apply_hidden(graphdef, params, prefix[::group_size].astype(jnp.int32),
                                             prompt_positions(prefix_mask), prefix_mask[:, None, :] & causal[None],
                                             init_head_major_cache(config_of(graphdef, params), batch // group_size,
                                                                   prefix_length),
                                             0, last=1)
    rows = batch * turns
    row_blocks, row_block_mask = blocks.reshape(rows, width), block_mask.reshape(rows, width).astype(bool)
    row_completions = completions.reshape(rows, length).astype(jnp.int32)
    row_mask = completion_mask.reshape(rows, length).astype(bool)
    block_length = jnp.sum(row_block_mask, axis=1)

    def group_pass(members, cut):
        """(logp, entropy) f32[len(members), T] of rows `members`, blocks cut to their last `cut` columns."""
        task = members // turns // group_size   # the row's distinct prefix
        cache = HeadMajorCache(k=tuple(a[task] for a in prefix_cache.k), v=tuple(a[task] for a in prefix_cache.v))
        return _after_prefix(graphdef, params, prefix_last[task, 0], prefix_mask[task], cache,
                             row_blocks[members, width - cut:], row_block_mask[members, width - cut:],
                             row_completions[members], row_mask[members], temperature, chunks)

    if len(choices) == 1 and groups == 1:
        logp, entropy = group_pass(jnp.arange(rows), width)
        return logp.reshape(completions.shape), entropy.reshape(completions.shape)
    order = jnp.argsort(block_length, stable=True)
    groups = min(groups, rows)
    per_group = -(-rows // groups)
    padded = jnp.concatenate([order, jnp.full((per_group * groups - rows,), order[-1])]).reshape(groups, per_group)
    needed = jnp.max(block_length[padded], axis=1)
    # any width that holds a group's blocks gives the same result: under vmap (policies trained
    # side by side) every policy's group takes the widest any of them needs
    index = _least_holding(needed, choices)
    # each branch is rematerialised: the switch's backward recomputes its branch's forward, rather
    # than every branch returning (zero-filled) residuals for all of them
    branches = [jax.checkpoint(lambda m, cut=cut: group_pass(m, cut)) for cut in choices]
    logp, entropy = jax.lax.map(lambda args: jax.lax.switch(args[1], branches, args[0]), (padded, index))
    back = jnp.argsort(order)
    logp, entropy = logp.reshape(-1, length)[back], entropy.reshape(-1, length)[back]
    return logp.reshape(completions.shape), entropy.reshape(completions.shape)


def _after_prefix(graphdef, params, prefix_last, prefix_mask, prefix_cache, blocks, block_mask, completions,
                  completion_mask, temperature, chunks):
    """`prefixed_logprobs` of N rows given their prefix's pass: prefix_last [N, D] (the hidden
    state at the prefix's last token), prefix_mask bool[N, Tp], prefix_cache (per layer
    [N, K, Tp, Dh]); blocks / block_mask [N, W], completions / completion_mask [N, T].
    Returns (logp, entropy) f32[N, T], 0 where completion_mask is False."""
    rows, prefix_length = prefix_mask.shape
    length = completions.shape[1]
    fed = jnp.concatenate([blocks, completions[:, :-1]], axis=1)
    fed_valid = jnp.concatenate([block_mask, completion_mask[:, :-1]], axis=1)
    key_valid = jnp.concatenate([prefix_mask, fed_valid], axis=1)
    positions = prompt_positions(key_valid)[:, prefix_length:]
    cache = prefix_cache
    # the fed columns in chunks, each reading the prefix and the chunks before it; the last one
    # holds the `length` columns that predict completion tokens
    split = (fed.shape[1] - length) // chunks
    bounds = [i * split for i in range(chunks)] + [fed.shape[1]]
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end == start:
            continue
        cache = HeadMajorCache(k=tuple(jnp.pad(a, ((0, 0), (0, 0), (0, end - start), (0, 0))) for a in cache.k),
                               v=tuple(jnp.pad(a, ((0, 0), (0, 0), (0, end - start), (0, 0))) for a in cache.v))
        query_at = prefix_length + jnp.arange(start, end)
        mask = key_valid[:, None, :prefix_length + end] & (
            jnp.arange(prefix_length + end)[None, None, :] <= query_at[None, :, None])
        hidden, cache = apply_hidden(graphdef, params, fed[:, start:end].astype(jnp.int32), positions[:, start:end],
                                     mask, cache, prefix_length + start, last=length if end == fed.shape[1] else 1)
    # the first completion token is predicted by the block's last token, or the prefix's when the block is empty
    has_block = jnp.any(block_mask, axis=1, keepdims=True)
    first = jnp.where(has_block, hidden[:, 0], prefix_last)
    predicting = jnp.concatenate([first[:, None], hidden[:, 1:]], axis=1)
    logp, entropy = head_logp_and_entropy(graphdef, params, predicting, completions, temperature)
    return jnp.where(completion_mask, logp, 0.0), jnp.where(completion_mask, entropy, 0.0)
