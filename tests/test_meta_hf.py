"""The token-trie constraint and the Meta-Optimizer on a Hugging Face backbone.

Uses the real Qwen2.5 tokenizer (`bundled_qwen_tokenizer_dir`) and a tiny random
`transformers.Qwen2ForCausalLM` with Qwen's 151,936-token vocabulary written to a temporary
directory. With 12 primitives `g1` is a token prefix of `g10`..`g12` (`g`,`1`,`0`), so
decoding exercises the deferred completion of a symbol.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from derl_jax.expr.check import check_text
from derl_jax.expr.grammar import make_grammar
from derl_jax.expr.parse import parse
from derl_jax.methods.derl.hf_constraint import (
    build_symbol_trie,
    identity_token_table,
    make_trie_constraint,
    max_completion_tokens,
    symbols_of_tokens,
    tokenizer_token_table,
)
from derl_jax.methods.derl.model import meta_prompt
from derl_jax.methods.derl.optimizer import MetaOptimizer
from derl_jax.models.hf_tokenizer import HFTokenizer, bundled_qwen_tokenizer_dir
from derl_jax.models.sampling import Constraint

QWEN_VOCAB = 151936
NUM_PRIMITIVES = 12
NAMES = [f"g{i + 1}" for i in range(NUM_PRIMITIVES)]
GRAMMAR = make_grammar(NUM_PRIMITIVES, 24, max_depth=4)


@pytest.fixture(scope="module")
def tokenizer():
    return HFTokenizer.from_directory(bundled_qwen_tokenizer_dir())


@pytest.fixture(scope="module")
def qwen_constraint(tokenizer):
    table = tokenizer_token_table(GRAMMAR, tokenizer.encode, tokenizer.eos_id, decode=tokenizer.decode)
    return make_trie_constraint(GRAMMAR, table, QWEN_VOCAB)


# ----------------------------------------------------------------------------- the trie by hand


def test_build_symbol_trie_by_hand():
    # symbols 0, 1 never emitted; 2 = [1]; 3 = [5]; 4 = [5, 6]; 5 = [7, 8, 9]
    trie = build_symbol_trie([None, None, [1], [5], [5, 6], [7, 8, 9]])
    assert np.asarray(trie.token_ids).tolist() == [1, 5, 6, 7, 8, 9]
    children, terminal, leaf = (np.asarray(a) for a in (trie.children, trie.terminal, trie.is_leaf))
    node_1, node_5, node_7 = children[0, 0], children[0, 1], children[0, 3]
    node_56 = children[node_5, 2]
    node_789 = children[children[node_7, 4], 5]
    assert terminal[node_1] == 2 and leaf[node_1]
    assert terminal[node_5] == 3 and not leaf[node_5]  # [5] is a prefix of [5, 6]
    assert terminal[node_56] == 4 and leaf[node_56]
    assert terminal[node_7] == -1 and terminal[node_789] == 5 and leaf[node_789]
    assert np.flatnonzero(np.asarray(trie.reachable)[node_5]).tolist() == [3, 4]
    assert np.flatnonzero(np.asarray(trie.reachable)[0]).tolist() == []
    assert trie.num_nodes == 7 and trie.depth == 3
    # continuation wins; a token that cannot continue completes the pending symbol
    assert symbols_of_tokens(trie, [5, 6, 1, 5, 1, 7, 8, 9, 5]) == [4, 2, 3, 2, 5, 3]
    assert symbols_of_tokens(trie, [1, 1000, 1]) == [2, 2]  # tokens outside the trie are skipped
    with pytest.raises(ValueError, match="token 1 at position 1 continues no symbol"):
        symbols_of_tokens(trie, [7, 1])
    with pytest.raises(ValueError, match="end inside a symbol"):
        symbols_of_tokens(trie, [7, 8])
    with pytest.raises(ValueError, match="symbols 3 and 4 have the same token sequence"):
        build_symbol_trie([None, None, [1], [5], [5]])
    with pytest.raises(ValueError, match="symbol 2 has an empty token sequence"):
        build_symbol_trie([None, None, []])


def test_ambiguous_tokenizations_are_rejected():
    grammar = make_grammar(2, 12)
    table = identity_token_table(grammar)
    star = grammar.symbol_id("*")
    table[grammar.symbol_id("**")] = [star, star]  # '**' written as '*','*' reads as two products
    with pytest.raises(ValueError, match=r"'\*' is a token prefix of '\*\*'"):
        make_trie_constraint(grammar, table, grammar.vocab_size)
    with pytest.raises(ValueError, match="outside the vocabulary of 10 tokens"):
        make_trie_constraint(grammar, identity_token_table(grammar), 10)
    identity = make_trie_constraint(grammar, identity_token_table(grammar), grammar.vocab_size)
    assert not identity.has_pending and identity.trie.depth == 1


def test_qwen_symbol_tokens(tokenizer, qwen_constraint):
    table = tokenizer_token_table(GRAMMAR, tokenizer.encode, tokenizer.eos_id, decode=tokenizer.decode)
    by_symbol = dict(zip(GRAMMAR.symbols, table))
    assert by_symbol["<pad>"] is None and by_symbol["<bos>"] is None
    assert by_symbol["<eos>"] == [tokenizer.eos_id]
    assert by_symbol["g10"] == by_symbol["g1"] + tokenizer.encode("0") and len(by_symbol["g1"]) == 2
    assert by_symbol["min("] == tokenizer.encode("min") + tokenizer.encode("(")
    assert qwen_constraint.has_pending and qwen_constraint.trie.depth == 3
    assert isinstance(qwen_constraint, Constraint)
    four = make_grammar(4, 24)
    few = make_trie_constraint(four, tokenizer_token_table(four, tokenizer.encode, tokenizer.eos_id), QWEN_VOCAB)
    assert not few.has_pending  # g1..g4: no symbol is a token prefix of another
    with pytest.raises(ValueError, match="decodes to"):
        tokenizer_token_table(four, tokenizer.encode, tokenizer.eos_id, decode=lambda ids: "x")
    # the full-vocabulary mask (for `models.sampling.sample`) is the compact one scattered
    full, compact = jax.jit(lambda state: (few.allowed(state), few.allowed_compact(state)))(few.init(2))
    assert full.shape == (2, QWEN_VOCAB)
    starters = sorted(tokenizer.encode(s)[0] for s in ("g", "u", "(", "min", "max", "abs", "clip", "-", *"0123456789"))
    assert np.flatnonzero(np.asarray(full[1])).tolist() == starters
    assert np.asarray(few.token_ids)[np.asarray(compact[1])].tolist() == starters


@pytest.mark.slow
def test_hand_written_sequence_masks(hf_optimizer, tokenizer):
    """The allowed tokens before each token of g1*min(g12,u)<eos> (replayed as in sampling)."""
    tokens = hf_optimizer.encode_text("g1*min(g12,u)")
    masks = np.asarray(hf_optimizer.allowed_masks(np.asarray([tokens])))[0]
    ids = np.asarray(hf_optimizer.backbone.constraint.token_ids)
    allowed = [{tokenizer.decode([int(i)], skip_special_tokens=False) for i in ids[mask]} for mask in masks]
    digits, eos = set("0123456789"), "<|im_end|>"
    operators = {"+", "-", "*", "/", "**"}
    operand = {"g", "u", "(", "min", "max", "abs", "clip"} | digits
    expected = [
        operand | {"-"},  # g      (a unary minus only at the start of an expression or argument)
        digits - {"0"},  # 1       (g1..g9; g1 continues to g10..g12)
        {"0", "1", "2"} | operators | {eos},  # *    (g1 pending: continue, or complete it and go on)
        operand,  # min           (after a binary operator: no unary minus)
        {"("},  # (               (inside the symbol min()
        operand | {"-"},  # g
        digits - {"0"},  # 1
        {"0", "1", "2"} | operators | {","},  # 2   (min( still needs its second argument)
        operators | {","},  # ,
        operand | {"-"},  # u
        operators | {")"},  # )
        operators | {eos},  # <eos>
    ]
    assert [tokenizer.decode([t], skip_special_tokens=False) for t in tokens] == [
        "g", "1", "*", "min", "(", "g", "1", "2", ",", "u", ")", eos]
    assert allowed[: len(expected)] == expected


# ----------------------------------------------------------------------------- the hf Meta-Optimizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=QWEN_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=False, max_position_embeddings=512, rope_theta=10000.0)
    path = tmp_path_factory.mktemp("tiny_qwen2")
    transformers.Qwen2ForCausalLM(config).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def hf_optimizer(checkpoint):
    meta = {
        "backbone": "hf",
        "hf_path": checkpoint,
        "hf_tokenizer": bundled_qwen_tokenizer_dir(),
        "task_description": "grade-school arithmetic",
        "temperature": 1.0,
        "cold_start_corpus": 200,
        "cold_start_steps": 12,
        "cold_start_lr": 1e-2,
        "cold_start_batch_size": 16,
    }
    return MetaOptimizer(meta, GRAMMAR)


@pytest.fixture(scope="module")
def hf_state(hf_optimizer):
    return hf_optimizer.init(jax.random.key(0))


def test_hf_prompt_and_chat_encoding(hf_optimizer, tokenizer):
    backbone = hf_optimizer.backbone
    prompt = tokenizer.decode(backbone.prompt, skip_special_tokens=False)
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    for text in ("g1:", "g12:", "grade-school arithmetic", "clip(x,lo,hi)", "g1+0.5*g2"):
        assert text in prompt
    assert backbone.eos_id == tokenizer.eos_id and backbone.model_config.vocab_size == QWEN_VOCAB
    assert not backbone.model_config.tie_embeddings
    assert backbone.max_new_tokens == max_completion_tokens(GRAMMAR, backbone.constraint.trie) == 23 * 3 + 1
    tokens = hf_optimizer.encode_text("g10+0.5*min(g2,u)")
    expected = []
    for piece in ("g", "1", "0", "+", "0", ".", "5", "*", "min", "(", "g", "2", ",", "u", ")"):
        expected += tokenizer.encode(piece)
    assert tokens == expected + [tokenizer.eos_id]
    assert tokenizer.decode(tokens) == "g10+0.5*min(g2,u)"
    with pytest.raises(ValueError, match="cannot encode"):
        hf_optimizer.encode_text("g13")


@pytest.mark.slow
def test_hf_cold_start_on_chat_replies(hf_optimizer, hf_state, tokenizer):
    corpus = hf_optimizer.corpus
    # the corpus teaches the two-step reading of g10..g12 (g, 1, then 0..2)
    assert any(f"g{i}" in text for text in corpus for i in (10, 11, 12))
    tokens, mask = hf_optimizer.encode_texts(corpus)
    allowed = np.asarray(hf_optimizer.allowed_masks(tokens))
    compact = np.asarray(hf_optimizer.backbone.constraint.compact_index(jnp.asarray(tokens)))
    chosen = np.take_along_axis(allowed, np.maximum(compact, 0)[..., None], axis=-1)[..., 0]
    assert np.all(chosen[mask]) and np.all(compact[mask] >= 0)  # every SFT token is one sampling may emit
    assert [tokenizer.decode(row[keep]) for row, keep in zip(tokens, mask)] == corpus
    # the SFT on these chat replies moves the checkpoint's parameters and fits the corpus
    param_key, sft_key = jax.random.split(jax.random.key(0))
    loaded = hf_optimizer.backbone.initial_params(param_key)
    params, losses = hf_optimizer.cold_start(loaded, sft_key)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), hf_state.params, params))
    assert not jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), loaded, params))
    losses = np.asarray(losses)
    assert losses.shape == (12,) and np.all(np.isfinite(losses))
    assert losses[-3:].mean() < 0.8 * losses[:3].mean()


@pytest.mark.slow
def test_hf_samples_always_parse(hf_optimizer, hf_state, tokenizer):
    n = 64   # measured: 55 valid, 23 with g10..g12 (at n = 200: 188 and 71)
    sample = hf_optimizer.sample(hf_state, jax.random.key(1), n)
    tokens, mask = np.asarray(sample.symbols), np.asarray(sample.mask)
    trie = hf_optimizer.backbone.constraint.trie
    valid, long_primitives = 0, 0
    for row, text in enumerate(sample.texts):
        emitted = tokens[row][mask[row]]
        assert emitted[-1] == tokenizer.eos_id and np.all(tokens[row][~mask[row]] == tokenizer.pad_id)
        parse(text, NAMES)  # always: the grammar and the trie guarantee it
        symbols = symbols_of_tokens(trie, emitted)
        assert "".join(GRAMMAR.symbols[s] for s in symbols[:-1]) == text
        assert GRAMMAR.encode(text) == symbols
        valid += check_text(text, NAMES)[1].ok
        long_primitives += any(f"g{i}" in text for i in (10, 11, 12))
    assert valid > n // 2 and long_primitives > n // 16, (valid, long_primitives)
    assert hf_optimizer.sample(hf_state, jax.random.key(1), n).texts == sample.texts
    recomputed = hf_optimizer.logprobs(hf_state.params, sample)
    np.testing.assert_allclose(np.asarray(recomputed), np.asarray(sample.logp), atol=5e-5)


def test_meta_prompt_and_hf_errors(tmp_path):
    messages = meta_prompt(2, ("1 if the answer is right", "1 if it is boxed"), "math word problems")
    assert [m["role"] for m in messages] == ["system", "user"]
    user = messages[1]["content"]
    assert "Task: math word problems" in user
    assert "- g1: 1 if the answer is right\n- g2: 1 if it is boxed" in user
    with pytest.raises(ValueError, match="1 primitive descriptions for 2 primitives"):
        meta_prompt(2, ("only one",))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        MetaOptimizer({"backbone": "hf", "hf_path": str(tmp_path / "missing")}, GRAMMAR)
    small = transformers.Qwen2Config(vocab_size=1000, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1)
    transformers.Qwen2ForCausalLM(small).save_pretrained(tmp_path / "small")
    meta = {"backbone": "hf", "hf_path": str(tmp_path / "small"), "hf_tokenizer": bundled_qwen_tokenizer_dir()}
    with pytest.raises(ValueError, match="more than the 1000 of the checkpoint"):
        MetaOptimizer(meta, GRAMMAR)
