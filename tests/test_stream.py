"""Token streams (`streams.Stream`): each token read once, and the same numbers as a prompt.

An episode with the whole history is one stream: chunks appended to a KV cache, actions decoded
after it, and one teacher-forced pass over the packed stream in the update. The references are
the plain prompt functions (`prefill`, `sample`, `sequence_logprobs`) on prompts written out
token by token from Python lists.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from derl_jax.models import sampling, streams
from derl_jax.models.transformer import init_params, tiny_config

PAD, EOS, VOCAB = 0, 1, 23
# jitted once for the whole module: run op by op, one stream test compiles hundreds of small programs
start_stream = jax.jit(streams.start_stream, static_argnums=(0, 2, 3, 4, 5))
append = jax.jit(streams.append, static_argnums=0)
stream_decode = jax.jit(streams.stream_decode, static_argnums=0,
                        static_argnames=("max_new_tokens", "eos_id", "pad_id", "greedy", "reads"))
prefill = jax.jit(sampling.prefill, static_argnums=(0, 4))
# every test's rows written out are padded to this many rows and prompt tokens: one compiled
# reference (`written_out_scores`) per layer count serves them all
REFERENCE_ROWS, REFERENCE_WIDTH = 18, 24


def tiny_model(seed: int = 0, max_position: int = 96, num_layers: int = 2):
    config = tiny_config(VOCAB, hidden_size=32, intermediate_size=64, num_layers=num_layers, num_heads=4,
                         num_kv_heads=2, max_position=max_position)
    return init_params(config, jax.random.key(seed))


def left_padded(rows: list[list[int]], width: int | None = None) -> tuple[jax.Array, jax.Array]:
    """i32[B, L] / bool[B, L] prompts of token lists, real tokens packed to the right."""
    width = width or max(len(r) for r in rows)
    tokens = np.full((len(rows), width), PAD, np.int32)
    for b, row in enumerate(rows):
        tokens[b, width - len(row):] = row
    mask = np.arange(width)[None, :] >= width - np.array([len(r) for r in rows])[:, None]
    return jnp.asarray(tokens), jnp.asarray(mask)


def random_chunk(rng, batch: int, width: int, empty_rows=()) -> tuple[np.ndarray, np.ndarray]:
    """A chunk of tokens 2.. (never pad or eos) with holes anywhere; `empty_rows` have none."""
    tokens = rng.integers(2, VOCAB, (batch, width)).astype(np.int32)
    valid = rng.random((batch, width)) < 0.7
    valid[list(empty_rows)] = False
    return np.where(valid, tokens, PAD), valid


# greedy: the full tier (the greedy pick is `decode`'s, checked against its reference in test_sampling.py)
@pytest.mark.parametrize("greedy", [pytest.param(True, marks=pytest.mark.slow), False])
def test_appended_chunks_read_like_one_prompt_of_their_tokens(greedy):
    graphdef, params = tiny_model()
    rng = np.random.default_rng(0)
    batch, capacity = 3, 40
    stream = start_stream(graphdef, params, batch, capacity, 4, PAD)
    rows: list[list[int]] = [[] for _ in range(batch)]
    for empty in ((), (1,), (0, 2)):   # chunks of one width: one compiled `append` for this file's streams
        tokens, valid = random_chunk(rng, batch, 6, empty)
        stream = append(graphdef, params, stream, jnp.asarray(tokens), jnp.asarray(valid))
        for b in range(batch):
            rows[b] += tokens[b][valid[b]].tolist()
    prompts, mask = left_padded(rows)
    last, _ = prefill(graphdef, params, prompts, mask, prompts.shape[1])
    np.testing.assert_allclose(np.asarray(stream.last_hidden), np.asarray(last), rtol=1e-5, atol=1e-5)
    length, tokens, valid = (np.asarray(a) for a in (stream.length, stream.tokens, stream.valid))
    for b in range(batch):
        assert int(length[b]) == len(rows[b])
        assert tokens[b, : len(rows[b])].tolist() == rows[b]
        assert valid[b].tolist() == [s < len(rows[b]) for s in range(capacity)]
    # decoding after the stream draws what sampling after the prompt draws, key for key
    key = jax.random.key(3)
    out = stream_decode(graphdef, params, stream, key, max_new_tokens=5, eos_id=EOS, pad_id=PAD, greedy=greedy,
                        reads=streams.DECODE_READS)
    want = sampling.sample_jit(graphdef, params, prompts, mask, key, max_new_tokens=5, eos_id=EOS, pad_id=PAD,
                               greedy=greedy)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(want.tokens))
    np.testing.assert_array_equal(np.asarray(out.mask), np.asarray(want.mask))
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(want.logprobs), rtol=1e-5, atol=1e-5)


def test_a_chunk_packed_to_its_fullest_row_gives_the_same_stream():
    """A chunk's valid tokens packed to the front and run at the least width that holds its
    fullest row leave the stream one `append` of the whole chunk leaves (rows not live keep
    theirs), whichever width that is."""
    graphdef, params = tiny_model()
    rng = np.random.default_rng(4)
    stream = start_stream(graphdef, params, 3, 40, 4, PAD)
    first, first_valid = random_chunk(rng, 3, 6)
    stream = append(graphdef, params, stream, jnp.asarray(first), jnp.asarray(first_valid))
    assert streams.block_widths(11, 4) == (3, 6, 9, 11)
    packed = jax.jit(streams.append_packed, static_argnums=(0, 5))
    for most in (2, 5, 11):   # the widths 3, 6 and 11 run
        tokens, valid = random_chunk(rng, 3, 11, empty_rows=(2,))
        valid &= np.cumsum(valid, axis=1) <= most
        valid[0, -most:] = True   # row 0 holds `most` (or more, at 11) valid tokens
        valid[0, :-most] = False
        live = jnp.array([True, True, False])
        whole = append(graphdef, params, stream, jnp.asarray(tokens), jnp.asarray(valid), live=live)
        got = packed(graphdef, params, stream, jnp.asarray(tokens), jnp.asarray(valid), 4, live)
        assert int(valid[:2].sum(axis=1).max()) == most
        for name in ("tokens", "valid", "length"):
            np.testing.assert_array_equal(np.asarray(getattr(got, name)), np.asarray(getattr(whole, name)),
                                          err_msg=name)
        np.testing.assert_allclose(np.asarray(got.last_hidden), np.asarray(whole.last_hidden), rtol=1e-5, atol=1e-5)
        held = np.asarray(whole.valid)
        for layer in range(2):
            for mine, want in ((got.cache.k[layer], whole.cache.k[layer]), (got.cache.v[layer], whole.cache.v[layer])):
                mine = np.moveaxis(np.asarray(mine)[:, :, :40], 2, 1)
                want = np.moveaxis(np.asarray(want)[:, :, :40], 2, 1)
                np.testing.assert_allclose(mine[held], want[held], rtol=1e-5, atol=1e-5)


def test_decoding_reads_the_slots_streams_hold_and_maps_one_read_over_streams():
    """`stream_decode` reading the least of 4 slot counts that holds the streams draws what it
    draws reading all slots, for short and long streams; under `vmap` over streams of
    different lengths one read runs (a `cond` stays in the jaxpr) and every stream draws what
    it draws alone."""
    graphdef, params = tiny_model()
    rng = np.random.default_rng(8)
    made = []
    for chunks in (1, 6):   # 40 slots: reads of 10 (up to 6 tokens) and of all 40 (36 tokens)
        stream = start_stream(graphdef, params, 3, 40, 4, PAD)
        for _ in range(chunks):
            tokens, valid = random_chunk(rng, 3, 6)
            valid |= chunks > 1
            stream = append(graphdef, params, stream, jnp.asarray(tokens), jnp.asarray(valid))
        made.append(stream)
    assert int(made[0].length.max()) <= 10 and int(made[1].length.min()) > 30
    key = jax.random.key(9)
    outs = []
    for stream in made:
        every = stream_decode(graphdef, params, stream, key, max_new_tokens=5, eos_id=EOS, pad_id=PAD, greedy=False,
                              reads=1)
        first = stream_decode(graphdef, params, stream, key, max_new_tokens=5, eos_id=EOS, pad_id=PAD, greedy=False,
                              reads=streams.DECODE_READS)
        np.testing.assert_array_equal(np.asarray(first.tokens), np.asarray(every.tokens))
        np.testing.assert_allclose(np.asarray(first.logprobs), np.asarray(every.logprobs), rtol=1e-5, atol=1e-5)
        outs.append(first)
    stacked = jax.tree_util.tree_map(lambda a, b: jnp.asarray(np.stack([a, b])), *made)

    def one(stream):
        return streams.stream_decode(graphdef, params, stream, key, max_new_tokens=5, eos_id=EOS, pad_id=PAD).tokens

    traced = jax.jit(jax.vmap(one)).trace(stacked)   # one trace for the jaxpr and the run
    assert "cond[" in str(traced.jaxpr)
    mapped = np.asarray(traced.lower().compile()(stacked))
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(mapped[k], np.asarray(out.tokens))


def test_rows_that_are_not_live_or_full_keep_what_they_hold():
    """The streams and chunks of the tests above (40 slots, chunks of 6 and of 11 tokens): six full
    chunks fill 36 slots, then a full chunk of 11 leaves a row that is not live as it was and
    fills the other rows' last 4 slots, counting all 11 tokens."""
    graphdef, params = tiny_model()
    rng = np.random.default_rng(1)
    stream = start_stream(graphdef, params, 3, 40, 4, PAD)
    written = []
    for _ in range(6):
        tokens, _ = random_chunk(rng, 3, 6)
        stream = append(graphdef, params, stream, jnp.asarray(tokens), jnp.ones((3, 6), bool))
        written.append(tokens)
    written = np.concatenate(written, axis=1)
    before = jax.device_get(stream)
    more, _ = random_chunk(rng, 3, 11)
    stream = jax.device_get(append(graphdef, params, stream, jnp.asarray(more), jnp.ones((3, 11), bool),
                                   live=jnp.array([False, True, True])))
    np.testing.assert_array_equal(stream.tokens[0], before.tokens[0])
    np.testing.assert_array_equal(stream.last_hidden[0], before.last_hidden[0])
    assert stream.length.tolist() == [36, 47, 47]
    for b in (1, 2):
        assert stream.tokens[b].tolist() == written[b].tolist() + more[b][:4].tolist()
        assert stream.valid[b].all()
    for layer in range(2):   # the decoder's scratch slots past the stream are not written by an overflow
        np.testing.assert_array_equal(stream.cache.k[layer][:, :, 40:], 0.0)


def episode_streams(rng, batch: int, turns: int, length: int):
    """Streams of `turns` turns (a random first chunk; per turn an action of 1..length tokens,
    EOS-terminated or not, then an observation), written out token by token.

    Returns (tokens i32[B, C], valid bool[B, C], starts i32[B, S], completions i32[B, S, T],
    mask bool[B, S, T], turn_taken bool[B, S]); turns not taken keep their completions masked.
    """
    rows, starts = [], np.zeros((batch, turns), np.int32)
    completions = np.full((batch, turns, length), PAD, np.int32)
    mask = np.zeros((batch, turns, length), bool)
    taken = rng.random((batch, turns)) < 0.8
    taken[:, 0] = True
    taken = np.cumprod(taken, axis=1).astype(bool)   # an episode ends and stays ended
    for b in range(batch):
        row = rng.integers(2, VOCAB, rng.integers(3, 7)).tolist()
        for s in range(turns):
            starts[b, s] = len(row)
            said = int(rng.integers(0, length + 1))   # tokens before EOS; `length` means no EOS
            action = rng.integers(2, VOCAB, said).tolist()
            ended = said < length
            completions[b, s, :said + ended] = action + [EOS] * ended
            mask[b, s, :said + ended] = taken[b, s]
            if taken[b, s]:
                row += action + rng.integers(2, VOCAB, rng.integers(0, 4)).tolist()
        rows.append(row)
    capacity = max(len(r) for r in rows) + 2
    tokens = np.full((batch, capacity), PAD, np.int32)
    valid = np.zeros((batch, capacity), bool)
    for b, row in enumerate(rows):
        tokens[b, : len(row)], valid[b, : len(row)] = row, True
    return tokens, valid, starts, completions, mask, taken


# the second layer reads the first's keys and values alike: two layers for one case, one for the other
@pytest.mark.parametrize("temperature, block, layers", [(1.0, streams.STREAM_BLOCK, 2), (0.7, 5, 1)])
def test_one_pass_over_a_stream_gives_every_turn_its_rows_log_probs_and_gradients(temperature, block, layers):
    """Each turn's completion scored in the packed pass equals its own row (the stream up to the
    turn as a prompt, the completion after it), and so does the gradient of any weighting."""
    graphdef, params = tiny_model(seed=2, num_layers=layers)
    rng = np.random.default_rng(2)
    batch, turns, length = 3, 4, 3
    tokens, valid, starts, completions, mask, taken = episode_streams(rng, batch, turns, length)
    weights = jnp.asarray(rng.normal(size=mask.shape).astype(np.float32))

    def packed(p):
        return streams.stream_logprobs(graphdef, p, jnp.asarray(tokens), jnp.asarray(valid), jnp.asarray(starts),
                                       jnp.asarray(completions), jnp.asarray(mask), temperature, block=block)

    assert np.asarray(mask).any(axis=-1).sum() > batch   # several turns of every kind are scored
    assert_scored_like_written_out_rows(graphdef, params, packed, [tokens[b, : starts[b, s]].tolist() for b in range(batch)
                                                                   for s in range(turns)],
                                        completions, mask, weights, temperature)


def prefixed_rows(rng, batch: int, turns: int, width: int, length: int, longest: int | None = None,
                  group_size: int = 1):
    """Rows that share a prefix: prefix token lists (of different lengths) left padded to 8, each
    row's block of 0..`longest` (default `width`) real tokens packed to the right of `width`
    columns (row (1, 2) empty), completions and their masks (a prefix of True per row). With
    `group_size` G, prefixes [i*G, (i+1)*G) are the same."""
    longest = width if longest is None else longest
    distinct = [rng.integers(2, VOCAB, n).tolist() for n in rng.integers(1, 9, batch // group_size)]
    prefix_rows = [row for row in distinct for _ in range(group_size)]
    prefix, prefix_mask = left_padded(prefix_rows, 8)
    block_rows = [[rng.integers(2, VOCAB, rng.integers(0, longest + 1)).tolist() for _ in range(turns)]
                  for _ in range(batch)]
    block_rows[1][2] = []
    blocks = np.full((batch, turns, width), PAD, np.int32)
    block_mask = np.zeros((batch, turns, width), bool)
    completions = rng.integers(2, VOCAB, (batch, turns, length)).astype(np.int32)
    mask = np.arange(length)[None, None, :] < rng.integers(0, length + 1, (batch, turns))[:, :, None]
    for b in range(batch):
        for s in range(turns):
            row = block_rows[b][s]
            blocks[b, s, width - len(row):], block_mask[b, s, width - len(row):] = row, True
    completions = np.where(mask, completions, PAD)
    written_out = [prefix_rows[b] + block_rows[b][s] for b in range(batch) for s in range(turns)]
    return prefix, prefix_mask, blocks, block_mask, completions, mask, written_out


# fast: every row at the block's width in chunks (3, 1, 1); the rows in groups in the fast tier:
# test_groups_of_rows_with_one_prefix_run_it_once[2-3-2] (in chunks) and, the last group padded,
# test_policies_mapped_side_by_side_take_one_width_per_group
@pytest.mark.parametrize("temperature, chunks, groups, widths, layers",
                         [(0.7, 3, 1, 1, 2),
                          *(pytest.param(*case, marks=pytest.mark.slow)
                            for case in [(1.0, 1, 1, 1, 2), (1.0, 1, 8, 4, 1), (1.0, 2, 8, 4, 1), (0.7, 3, 5, 3, 1)])])
def test_rows_that_share_a_prefix_score_like_their_written_out_rows(temperature, chunks, groups, widths, layers):
    """A shared prefix (left padded, of different lengths), then each row's own block (real tokens
    to the right, one row with none) and completion: log-probs, entropies and gradients equal
    `sequence_logprobs` of every row written out as one prompt, whether every row runs at the
    block's width or the rows run in groups by block length, each cut to a width of its own
    (12 rows in 8 or 5 groups of two or three rows, the last padded, and 4 or 3 widths). The
    layers read the prefix's keys and values alike: two layers for the rows at the block's width,
    one for the grouped rows."""
    graphdef, params = tiny_model(seed=4, num_layers=layers)
    rng = np.random.default_rng(4)
    prefix, prefix_mask, blocks, block_mask, completions, mask, rows = prefixed_rows(rng, 3, 4, 6, 3)
    weights = jnp.asarray(rng.normal(size=mask.shape).astype(np.float32))

    def shared(p):
        return streams.prefixed_logprobs(graphdef, p, prefix, prefix_mask, jnp.asarray(blocks), jnp.asarray(block_mask),
                                         jnp.asarray(completions), jnp.asarray(mask), temperature, chunks=chunks,
                                         groups=groups, widths=widths)

    assert mask.any(axis=-1).sum() > 3 and mask[1, 2].any()
    lengths = block_mask.sum(-1)
    assert lengths.min() == 0 and lengths.max() > 4   # groups cut to the narrowest and to the full width
    assert_scored_like_written_out_rows(graphdef, params, shared, rows, completions, mask, weights, temperature)


# fast: [2-3-2], the rows in groups by block length; every row at the block's width ([3-1-1]) finds
# its distinct prefix by the same indexing
@pytest.mark.parametrize("group_size, groups, widths", [(2, 3, 2), pytest.param(3, 1, 1, marks=pytest.mark.slow)])
def test_groups_of_rows_with_one_prefix_run_it_once(group_size, groups, widths):
    """Prefixes repeated in groups of `group_size` (GRPO's episodes of one task), run once per
    group: log-probs, entropies and gradients still equal every row written out, and the jaxpr's
    prefix pass covers the distinct prefixes only; a group size that does not divide the
    prefixes is refused. One layer: the layers' reading of the prefix is the test above's."""
    graphdef, params = tiny_model(seed=5, num_layers=1)
    rng = np.random.default_rng(5)
    batch = 2 * group_size
    prefix, prefix_mask, blocks, block_mask, completions, mask, rows = prefixed_rows(rng, batch, 3, 6, 3,
                                                                                     group_size=group_size)
    weights = jnp.asarray(rng.normal(size=mask.shape).astype(np.float32))

    # two chunks: one chunk of the widest group (4 rows, 6 + 2 columns) would have the shape of an
    # undeduplicated prefix pass, which the jaxpr check below looks for
    def shared(p, group_size=group_size):
        return streams.prefixed_logprobs(graphdef, p, prefix, prefix_mask, jnp.asarray(blocks), jnp.asarray(block_mask),
                                         jnp.asarray(completions), jnp.asarray(mask), chunks=2, groups=groups,
                                         widths=widths, group_size=group_size)

    assert_scored_like_written_out_rows(graphdef, params, shared, rows, completions, mask, weights, 1.0)
    prefix_pass = f"f32[2,{prefix.shape[1]},32]"   # the embedded prefix tokens: one row per distinct prefix
    jaxpr = str(jax.make_jaxpr(shared)(params))
    assert prefix_pass in jaxpr and f"f32[{batch},{prefix.shape[1]},32]" not in jaxpr
    with pytest.raises(ValueError, match="group_size must be a positive int dividing the"):
        shared(params, group_size=batch + 1)


def test_block_widths_hold_every_length_up_to_the_width():
    assert streams.block_widths(84, 4) == (21, 42, 63, 84)
    assert streams.block_widths(6, 4) == (2, 3, 5, 6)
    assert streams.block_widths(3, 6) == (1, 2, 3)
    assert streams.block_widths(7, 1) == (7,)
    with pytest.raises(ValueError, match="count must be an int >= 1"):
        streams.block_widths(8, 0)


def test_policies_mapped_side_by_side_take_one_width_per_group():
    """Under `vmap` over policies and their rows (8 rows each, in 3 groups of 3, the last padded),
    each group's width is the widest any policy needs (one branch of the switch runs, not every
    branch with a select), and every policy's log-probs, entropies and gradients equal those of
    its rows written out."""
    # one layer: the rows' layers are read as in the tests above, what is new here is the mapping
    graphdef, params = tiny_model(seed=6, num_layers=1)
    _, other = tiny_model(seed=7, num_layers=1)
    stacked = jax.tree_util.tree_map(lambda a, b: jnp.asarray(np.stack([a, b])), params, other)
    rng = np.random.default_rng(6)
    short = prefixed_rows(rng, 2, 4, 8, 3, longest=2)
    long = prefixed_rows(rng, 2, 4, 8, 3)
    both = tuple(jnp.asarray(np.stack([a, b])) for a, b in zip(short[:6], long[:6]))
    weights = np.arange(1.0, short[5].size + 1, dtype=np.float32).reshape(short[5].shape) / short[5].size

    def weighted_grad(p, prefix, prefix_mask, blocks, block_mask, completions, mask):
        def loss(p):
            logp, entropy = streams.prefixed_logprobs(graphdef, p, prefix, prefix_mask, blocks, block_mask,
                                                      completions, mask, chunks=1, groups=3, widths=2)
            return jnp.sum(logp * weights), (logp, entropy)
        return jax.grad(loss, has_aux=True)(p)

    traced = jax.jit(jax.vmap(weighted_grad)).trace(stacked, *both)   # one trace for the jaxpr and the run
    assert "cond[" in str(traced.jaxpr)   # with a mapped index every branch would run and a select_n pick one
    grads, scores = jax.device_get(traced.lower().compile()(stacked, *both))
    for k, (p, (*_, completions, mask, rows)) in enumerate([(params, short), (other, long)]):
        want, want_grads = written_out_reference(graphdef, p, rows, completions, mask, weights, 1.0)
        for a, b in zip(scores, want):
            np.testing.assert_allclose(a[k], b, rtol=1e-5, atol=1e-5)
        for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(want_grads), strict=True):
            np.testing.assert_allclose(a[k], b, rtol=1e-4, atol=1e-6)


@functools.partial(jax.jit, static_argnums=0)
def written_out_scores(graphdef, params, prompts, prompt_mask, completions, mask, weights, temperature):
    """((logp, entropy) f32[R, T], gradient of the `weights`-weighted log-probs): `sequence_logprobs`
    of completions i32[R, T] / mask bool[R, T] after prompts i32[R, L] / prompt_mask bool[R, L] at
    `temperature` (traced: one compiled reference for every temperature)."""
    def loss(p):
        logp, entropy = sampling.sequence_logprobs(graphdef, p, prompts, prompt_mask, completions, mask, temperature)
        return jnp.sum(weights * logp), (logp, entropy)

    (_, scores), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return scores, grads


def written_out_reference(graphdef, params, rows, completions, mask, weights, temperature):
    """((logp, entropy) f32[B, S, T], gradient of the `weights`-weighted log-probs), as NumPy
    arrays, of `sequence_logprobs` over the rows written out (token lists `rows`, B*S of them,
    row-major, completions i32[B, S, T] / mask bool[B, S, T]), padded to REFERENCE_ROWS (rows of
    one token, nothing scored) and REFERENCE_WIDTH tokens."""
    count, length = len(rows), completions.shape[-1]
    assert count <= REFERENCE_ROWS and max(map(len, rows)) <= REFERENCE_WIDTH
    filler = REFERENCE_ROWS - count

    def padded(a, value):
        return jnp.asarray(np.concatenate([np.reshape(a, (count, length)), np.full((filler, length), value, a.dtype)]))

    prompts, prompt_mask = left_padded(rows + [[2]] * filler, REFERENCE_WIDTH)
    scores, grads = jax.device_get(written_out_scores(graphdef, params, prompts, prompt_mask, padded(completions, PAD),
                                                      padded(mask, False), padded(np.asarray(weights), 0.0),
                                                      temperature))
    return [a[:count].reshape(mask.shape) for a in scores], grads


def assert_scored_like_written_out_rows(graphdef, params, scored, rows, completions, mask, weights, temperature):
    """`scored(params) -> (logp, entropy)` [B, S, T] equals `sequence_logprobs` over the rows
    written out (token lists `rows`, B*S of them, row-major), and so does the gradient of the
    `weights`-weighted log-probs (`written_out_reference`); both outputs are 0 off the mask."""
    want, want_grads = written_out_reference(graphdef, params, rows, completions, mask, weights, temperature)

    def loss(p):
        logp, entropy = scored(p)
        return jnp.sum(weights * logp), (logp, entropy)

    (_, got), got_grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), b, rtol=1e-5, atol=1e-5)
        assert (np.asarray(a)[~np.asarray(mask)] == 0).all() and (b[~np.asarray(mask)] == 0).all()
    for a, b in zip(jax.tree_util.tree_leaves(got_grads), jax.tree_util.tree_leaves(want_grads), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
