"""The grammar automaton: every masked sample parses and compiles; specific masks by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from derl_jax.expr import ast
from derl_jax.expr import grammar as G
from derl_jax.expr.parse import MAX_NESTING, MAX_NODES, MAX_TEXT_LENGTH, ExpressionError, parse
from derl_jax.expr.program import compile_expr

ALLOWED = jax.jit(G.allowed)
ADVANCE = jax.jit(G.advance)
FINISH_COST = jax.jit(G.finish_cost)


def _sample(grammar, key, limits, eos_bias):
    """Sample len(limits) sequences under the mask with uniform logits (plus `eos_bias` f32[B]
    on <eos>). Returns ids i32[B, T], any-symbol-allowed bool[T, B], final states."""
    batch, vocab = limits.shape[0], grammar.vocab_size
    bias = jnp.zeros((batch, vocab)).at[:, grammar.eos_id].set(eos_bias)
    states = jax.vmap(G.init, in_axes=(None, 0))(grammar, limits)

    def step(states, step_key):
        masks = jax.vmap(G.allowed, in_axes=(None, 0))(grammar, states)
        symbols = jax.random.categorical(step_key, jnp.where(masks, bias, -jnp.inf))
        return jax.vmap(G.advance, in_axes=(None, 0, 0))(grammar, states, symbols), (symbols, masks.any(-1))

    final, (ids, any_allowed) = jax.lax.scan(step, states, jax.random.split(key, grammar.max_length))
    return ids.T, any_allowed, final


SAMPLE = jax.jit(_sample)


def nesting(text: str) -> tuple[int, int]:
    """(deepest nesting, final balance) of the parentheses in `text`; balance never negative."""
    level = deepest = 0
    for char in text:
        level += (char == "(") - (char == ")")
        assert level >= 0, f"')' without '(' in {text!r}"
        deepest = max(deepest, level)
    return deepest, level


def check_samples(grammar, ids, limits, final):
    """Every row: <eos> within its budget, then only <pad>; text parses, compiles, within limits."""
    names = [f"g{i + 1}" for i in range(grammar.num_primitives)]
    specials = {grammar.pad_id, grammar.bos_id, grammar.eos_id}
    assert bool(np.all(final.done))
    texts = []
    for row, limit in zip(ids, limits):
        eos_positions = np.flatnonzero(row == grammar.eos_id)
        assert len(eos_positions) >= 1, row
        end = int(eos_positions[0])
        assert 1 <= end < limit
        assert not set(row[:end].tolist()) & specials
        assert np.all(row[end + 1 :] == grammar.pad_id)
        text = grammar.decode(row)
        try:
            expr = parse(text, names)
        except ExpressionError as err:  # pragma: no cover - the message is the diagnosis
            pytest.fail(f"sample {text!r} does not parse: {err}")
        deepest, balance = nesting(text)
        assert balance == 0 and deepest <= grammar.max_depth, text
        assert len(text) <= MAX_TEXT_LENGTH and ast.node_count(expr) <= MAX_NODES, text
        program = compile_expr(expr, num_primitives=grammar.num_primitives)
        assert int(program.size) == ast.node_count(expr)
        texts.append(text)
    return texts


def draw_samples(batch: int):
    """(grammar, ids, limits, any_allowed, final) of `batch` samples at budgets of 2 to 96 symbols."""
    grammar = G.make_grammar(4, 96, max_depth=8)
    rng = np.random.default_rng(0)
    limits = rng.choice([2, 3, 5, 8, 24, 48, 96], size=batch).astype(np.int32)
    eos_bias = np.where(rng.random(batch) < 0.5, -4.0, 0.0).astype(np.float32)
    ids, any_allowed, final = SAMPLE(grammar, jax.random.key(0), jnp.asarray(limits), jnp.asarray(eos_bias))
    return grammar, np.asarray(ids), limits, np.asarray(any_allowed), final


@pytest.fixture(scope="module")
def samples():
    return draw_samples(10_000)


@pytest.mark.slow
def test_every_sample_parses_compiles_and_ends_in_budget(samples):
    grammar, ids, limits, any_allowed, final = samples
    assert any_allowed.all(), "a state with an empty mask was reached"
    texts = check_samples(grammar, ids, limits, final)
    assert all(texts)
    lengths = np.argmax(ids == grammar.eos_id, axis=1) + 1
    # The budget binds: many sequences use every symbol they were given.
    for limit in (3, 8, 24, 96):
        assert np.mean(lengths[limits == limit] == limit) > 0.2, limit
    # The mask is not needlessly narrow: every symbol but <bos> gets sampled.
    used = np.bincount(ids.ravel(), minlength=grammar.vocab_size)
    unused = [grammar.symbols[i] for i in np.flatnonzero(used == 0)]
    assert unused == [G.BOS], unused


def test_samples_reencode_to_the_same_ids():
    grammar, ids, limits, _, _ = draw_samples(150)
    for row in ids:
        end = int(np.argmax(row == grammar.eos_id))
        assert grammar.encode(grammar.decode(row)) == row[: end + 1].tolist()


@pytest.mark.slow
def test_long_samples_respect_text_and_node_limits():
    grammar = G.make_grammar(12, 400, max_depth=MAX_NESTING)
    batch = 256
    limits = np.full(batch, 400, np.int32)
    ids, any_allowed, final = SAMPLE(grammar, jax.random.key(1), jnp.asarray(limits), jnp.full(batch, -8.0))
    assert np.asarray(any_allowed).all()
    texts = check_samples(grammar, np.asarray(ids), limits, final)
    names = [f"g{i + 1}" for i in range(12)]
    assert max(len(t) for t in texts) >= MAX_TEXT_LENGTH - 4
    assert max(ast.node_count(parse(t, names)) for t in texts) >= 80
    assert any("g12" in t for t in texts)


def state_after(grammar, text):
    state = G.init(grammar)
    for symbol_id in grammar.tokenize(text):
        assert ALLOWED(grammar, state)[symbol_id], f"{grammar.symbols[symbol_id]!r} refused in {text!r}"
        state = ADVANCE(grammar, state, symbol_id)
    return state


def allowed_after(grammar, text, state=None):
    state = state_after(grammar, text) if state is None else state
    return {grammar.symbols[i] for i in np.flatnonzero(np.asarray(ALLOWED(grammar, state)))}


GRAMMAR = G.make_grammar(4, 48)
OPERAND_STARTS = {"u", *G.DIGIT_SYMBOLS, "(", *G.CALL_SYMBOLS, "g1", "g2", "g3", "g4"}
AFTER_OPERAND = {"+", "-", "*", "/", "**"}


def test_vocabulary_and_construction_errors():
    assert GRAMMAR.symbols[:3] == (G.PAD, G.BOS, G.EOS)
    assert (GRAMMAR.pad_id, GRAMMAR.bos_id, GRAMMAR.eos_id) == (0, 1, 2)
    assert GRAMMAR.symbols[-4:] == ("g1", "g2", "g3", "g4") and len(set(GRAMMAR.symbols)) == GRAMMAR.vocab_size
    for symbol in ("u", ".", "**", "(", ")", ",", "min(", "max(", "abs(", "clip(", *"0123456789+-*/"):
        assert symbol in GRAMMAR.symbols
    with pytest.raises(ValueError, match="num_primitives"):
        G.make_grammar(0, 10)
    with pytest.raises(ValueError, match="max_length"):
        G.make_grammar(4, 1)
    with pytest.raises(ValueError, match="max_depth"):
        G.make_grammar(4, 10, max_depth=MAX_NESTING + 1)


def test_start_mask_excludes_the_empty_expression():
    assert allowed_after(GRAMMAR, "") == OPERAND_STARTS | {"-"}
    assert allowed_after(GRAMMAR, "", G.init(GRAMMAR, max_length=2)) == {"u", *G.DIGIT_SYMBOLS, "g1", "g2", "g3", "g4"}


def test_after_power_only_the_exponent_literals():
    assert allowed_after(GRAMMAR, "g1**") == {"0", "1", "2", "3"}
    assert allowed_after(GRAMMAR, "g1**0") == {"."}
    assert allowed_after(GRAMMAR, "g1**0.") == {"5"}
    assert allowed_after(GRAMMAR, "g1**2") == {G.EOS, "+", "-", "*", "/"}
    for nested in ("(g1**2)", "abs(g1**0.5)", "(g2+g1**3*g3)", "((u**2))"):
        assert "**" not in allowed_after(GRAMMAR, nested), nested
    for fine in ("(g1)", "g1**2*g2", "min(g1,g2)", "(g1**2)+u", "0.5"):
        assert "**" in allowed_after(GRAMMAR, fine), fine


def test_after_open_no_close_and_unary_minus_only_at_starts():
    for prefix in ("(", "g1+(", "min(", "clip(g1,", "abs(("):
        assert allowed_after(GRAMMAR, prefix) == OPERAND_STARTS | {"-"}, prefix
    for prefix in ("g1+", "g1*", "g1-", "g1/", "-"):
        assert allowed_after(GRAMMAR, prefix) == OPERAND_STARTS, prefix


def test_eos_and_commas_inside_calls():
    assert allowed_after(GRAMMAR, "min(g1") == AFTER_OPERAND | {","}
    assert allowed_after(GRAMMAR, "min(g1,g2") == AFTER_OPERAND | {")"}
    assert allowed_after(GRAMMAR, "clip(g1,g2") == AFTER_OPERAND | {","}
    assert allowed_after(GRAMMAR, "abs(g1") == AFTER_OPERAND | {")"}
    assert allowed_after(GRAMMAR, "(g1") == AFTER_OPERAND | {")"}
    assert allowed_after(GRAMMAR, "min(g1,g2)") == AFTER_OPERAND | {G.EOS}


def test_numbers():
    digits = set(G.DIGIT_SYMBOLS)
    assert allowed_after(GRAMMAR, "0") == AFTER_OPERAND | {".", G.EOS}
    assert allowed_after(GRAMMAR, "12") == AFTER_OPERAND | digits | {".", G.EOS}
    assert allowed_after(GRAMMAR, "123") == AFTER_OPERAND | {".", G.EOS}
    assert allowed_after(GRAMMAR, "1.") == digits
    assert allowed_after(GRAMMAR, "1.23") == AFTER_OPERAND | digits | {G.EOS}
    assert allowed_after(GRAMMAR, "1.234") == AFTER_OPERAND | {G.EOS}
    assert allowed_after(GRAMMAR, "g1") == AFTER_OPERAND | {G.EOS}


def test_max_decimals_sets_the_digits_after_the_point():
    digits = set(G.DIGIT_SYMBOLS)
    eight = G.make_grammar(4, 48, max_decimals=8)
    assert GRAMMAR.max_decimals == G.MAX_FRACTION_DIGITS == 3
    assert allowed_after(eight, "1.234") == AFTER_OPERAND | digits | {G.EOS}
    assert allowed_after(eight, "0.0000000") == AFTER_OPERAND | digits | {G.EOS}
    assert allowed_after(eight, "0.00000001") == AFTER_OPERAND | {G.EOS}
    assert eight.encode("g1+0.00000001*g4")[-1] == eight.eos_id
    with pytest.raises(ValueError, match="symbol '1' at character 13 is not allowed inside the decimal part"):
        eight.encode("g1+0.000000001")
    for bad in (0, G.MAX_DECIMALS + 1, True, 2.0):
        with pytest.raises(ValueError, match="max_decimals must be an int"):
            G.make_grammar(4, 10, max_decimals=bad)


def test_encode_prefix_accepts_what_the_automaton_could_continue():
    assert GRAMMAR.encode_prefix("min(g1,") == GRAMMAR.encode("min(g1,g2)")[:3]
    assert GRAMMAR.encode_prefix("") == []
    with pytest.raises(ValueError, match=r"symbol '\)' at character 6 is not allowed"):
        GRAMMAR.encode_prefix("min(g1)")
    tight = G.make_grammar(4, 6)
    tight.encode_prefix("abs(g1")             # abs(g1) <eos> still fits in 6
    with pytest.raises(ValueError, match="too little room to finish within max_length=6"):
        tight.encode_prefix("abs(g1+g2+")


def test_budget_leaves_only_closing_symbols():
    grammar = G.make_grammar(4, 6)
    state = state_after(grammar, "abs(abs(g1")
    assert int(FINISH_COST(grammar, state)) == 3
    for expected in (")", ")", G.EOS):
        assert allowed_after(grammar, "", state) == {expected}
        state = ADVANCE(grammar, state, grammar.symbol_id(expected))
    assert allowed_after(grammar, "", state) == {G.PAD}
    # The same budget through a per-sequence limit of a larger grammar.
    state = G.init(GRAMMAR, max_length=7)
    for symbol in grammar.tokenize("min(g1"):
        state = ADVANCE(GRAMMAR, state, symbol)
    assert allowed_after(GRAMMAR, "", state) == {","}  # `,0)` and <eos> need the last 4 symbols
    state = ADVANCE(GRAMMAR, state, GRAMMAR.symbol_id(","))
    assert allowed_after(GRAMMAR, "", state) == {"-", "u", *G.DIGIT_SYMBOLS, "g1", "g2", "g3", "g4"}


@pytest.mark.parametrize(
    "prefix, cost",
    [("", 2), ("g1", 1), ("clip(g1", 6), ("min(abs(g1**0", 7), ("max(-", 5), ("(((", 5), ("1.", 2), ("g1,", None)],
)
def test_finish_cost_by_hand(prefix, cost):
    if cost is None:
        with pytest.raises(AssertionError, match="refused"):
            state_after(GRAMMAR, prefix)
    else:
        assert int(FINISH_COST(GRAMMAR, state_after(GRAMMAR, prefix))) == cost


def test_depth_limit():
    grammar = G.make_grammar(2, 40, max_depth=2)
    assert "(" in allowed_after(grammar, "(")
    assert not {"(", "min(", "abs("} & allowed_after(grammar, "(min(")
    assert allowed_after(grammar, "(min(") == {"u", *G.DIGIT_SYMBOLS, "g1", "g2", "-"}


def test_done_state_only_pads_and_stays():
    state = state_after(GRAMMAR, "g1")
    state = ADVANCE(GRAMMAR, state, GRAMMAR.eos_id)
    assert bool(state.done) and allowed_after(GRAMMAR, "", state) == {G.PAD}
    padded = ADVANCE(GRAMMAR, state, GRAMMAR.pad_id)
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(a, b), state, padded)


def test_vmap_equals_loop():
    prefixes = ["", "g1**", "min(g1,", "1.2", "(u", "abs(-g3"]
    states = [state_after(GRAMMAR, p) for p in prefixes]
    loop = np.stack([np.asarray(ALLOWED(GRAMMAR, s)) for s in states])
    batch = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *states)
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(G.allowed, in_axes=(None, 0)))(GRAMMAR, batch)), loop)


@pytest.mark.parametrize(
    "text",
    ["g1+0.5*g2", "clip(g1-0.2*g3,0,1)", "max(g1,u*g2)", "g1+(g2*(g3/2))-(g4/3)", "-abs(g4)**0.5", "min(u,0.25)*g1/(g2+1)"],
)
def test_encode_decode_round_trip(text):
    ids = GRAMMAR.encode(text)
    assert ids[-1] == GRAMMAR.eos_id and GRAMMAR.eos_id not in ids[:-1]
    assert GRAMMAR.decode(ids) == text
    assert GRAMMAR.decode([GRAMMAR.bos_id, *ids, GRAMMAR.pad_id]) == text
    names = ["g1", "g2", "g3", "g4"]
    assert parse(GRAMMAR.decode(ids), names) == parse(text, names)


def test_encode_spaces_and_exact_ids():
    assert GRAMMAR.encode(" g1 ** 2 + clip( u ,0, 1)") == [
        GRAMMAR.symbol_id(s) for s in ("g1", "**", "2", "+", "clip(", "u", ",", "0", ",", "1", ")", G.EOS)
    ]


@pytest.mark.parametrize(
    "text, message",
    [
        ("g5", "no symbol matches at character 0"),
        ("g1 # g2", "no symbol matches at character 3"),
        ("min (g1,g2)", "no symbol matches at character 0"),
        ("g1**4", "'4' at character 4 is not allowed right after '\\*\\*'"),
        ("g1+", "'<eos>' at the end is not allowed after a binary operator"),
        ("g1*-g2", "'-' at character 3"),
        ("0012", "'0' at character 1"),
        ("1.", "'<eos>' at the end"),
        ("min(g1)", "'\\)' at character 6"),
        ("(g1**2)**2", "'\\*\\*' at character 7"),
        ("", "'<eos>' at the end is not allowed at the start"),
        ("+".join(["g1"] * 30), "needs 60 symbols"),
    ],
)
def test_encode_errors(text, message):
    with pytest.raises(ValueError, match=message):
        GRAMMAR.encode(text)


def test_encode_error_names_the_budget():
    too_many_nodes = "+".join(["1"] * 65)  # 129 nodes in 129 characters
    with pytest.raises(ValueError, match="'\\+' at character 127 is not allowed .* too little room"):
        G.make_grammar(4, 200).encode(too_many_nodes)
    with pytest.raises(ExpressionError, match="more than 128 nodes"):
        parse(too_many_nodes, ["g1"])


def test_decode_rejects_bad_ids():
    with pytest.raises(ValueError, match="id 99 at position 1"):
        GRAMMAR.decode([GRAMMAR.symbol_id("g1"), 99])
    with pytest.raises(ValueError, match="1-D"):
        GRAMMAR.decode([[1, 2]])
    with pytest.raises(KeyError, match="'g9' is not a symbol"):
        GRAMMAR.symbol_id("g9")
