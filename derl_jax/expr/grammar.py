"""The symbol vocabulary of reward expressions and a JAX automaton for constrained decoding.

The Meta-Optimizer writes an expression one *symbol* at a time. A symbol is a whole piece
of expression text (`g3`, `**`, `clip(`), so the automaton never has to split words. The
vocabulary (ids in this order; primitives last so the other ids do not depend on k):

    <pad> <bos> <eos> u 0 1 2 3 4 5 6 7 8 9 . + - * / ** ( ) , min( max( abs( clip( g1 .. gk

`<bos>` only ever appears in the model's input: the mask never allows it and `decode` skips
it. Sampling starts from `init`; each step takes `allowed(grammar, state)` as the logit
mask, samples one symbol and calls `advance`. A sequence is at most `max_length` symbols
long, `<eos>` included, and is padded with `<pad>` after `<eos>`.

The state (`GrammarState`, a pytree of scalars and two stacks of `max_depth` slots) tracks
a *phase*, the open contexts, and how many symbols, characters and tree nodes were spent.

Mask rules (a symbol is allowed when its syntax rule AND the budget rule hold):

Syntax, by phase:
  * expecting an operand (start of the expression, after `(`, `fn(` or `,`; after a binary
    operator; after a unary minus): `g1..gk`, `u`, a digit (starts a number), `(` and
    `min( max( abs( clip(` (these two only while fewer than `max_depth` contexts are open).
    A unary `-` is allowed only at the *start* of an expression or argument (never after a
    binary operator, never twice), so texts like `g1*-g2` or `--g1` are not produced.
  * a number: at most 3 integer digits and no leading zero (`0` may be followed only by
    `.`); a `.` must be followed by 1 to `max_decimals` decimal digits (3 unless the grammar
    is made with more; 8 writes the paper's 0.00000001), so no number ends with `.`.
    While the digits so far form a complete number, everything allowed after an operand
    is allowed too.
  * after a complete operand: `+ - * /`, `**` (see below), `)` when the innermost context
    is a plain parenthesis or a call with all its arguments, `,` when the innermost call
    still needs an argument, `<eos>` when no context is open.
  * `**`: its exponent is one of the literals `1`, `2`, `3`, `0.5` (nothing else may follow
    `**`: no sign, no parenthesis, no primitive, no `u`). There is at most one power per
    operand: `**` is not allowed after an exponent (`g1**2**3`) nor after a parenthesis or
    call whose contents hold a power (`(g1**2)**3`), so powers never nest.
  * after `<eos>`: only `<pad>`; `advance` then keeps the state unchanged.

Operator sets: a grammar made with `operators="paper"` (the DERL paper's language,
`derl_jax.expr.parse.OPERATOR_SETS`) never allows `u`, `**` or a function symbol, so it writes
only `+ - * /` compositions of primitives and numbers with parentheses and a leading unary
minus. The vocabulary (and so every symbol id) is the same under both sets.

Budget: `finish_cost(state)` is the fewest symbols that complete the expression from a state:
one for a pending operand (two for the exponent `0.5` after `**0`), then per open context
two per missing argument (`,` and an operand) and one `)`, then `<eos>`. Every such closing
symbol is one character long and adds at most one tree node. A symbol is allowed only if
after it
    position + finish_cost                     <= the sequence's max_length,
    nodes + (finish_cost - 1 if not done)      <= parse.MAX_NODES (128),
    characters + (finish_cost - 1 if not done) <= parse.MAX_TEXT_LENGTH (256).
By induction the cheapest closing symbol is always allowed, so the mask is never empty and
every sequence sampled under it ends with `<eos>` within `max_length` symbols, decodes to
text of at most 256 characters with at most 128 nodes and `max_depth` (<= 32) nested
contexts that `derl_jax.expr.parse.parse` accepts, and never is the empty expression.

`advance` with a symbol the mask forbids gives an unspecified state; `Grammar.encode`
checks a whole text against the automaton and names the first offending symbol.
"""

from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from derl_jax.expr.parse import MAX_NESTING, MAX_NODES, MAX_TEXT_LENGTH, check_operators, outside_paper

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
DIGIT_SYMBOLS = tuple("0123456789")
CALL_SYMBOLS = ("min(", "max(", "abs(", "clip(")
FIXED_SYMBOLS = (PAD, BOS, EOS, "u", *DIGIT_SYMBOLS, ".", "+", "-", "*", "/", "**", "(", ")", ",", *CALL_SYMBOLS)
CALL_ARGUMENTS = {"min(": 2, "max(": 2, "abs(": 1, "clip(": 3}

MAX_INTEGER_DIGITS = 3
MAX_FRACTION_DIGITS = 3  # the default of `max_decimals`
MAX_DECIMALS = 12  # the most `max_decimals` may be (float32 holds about 7 significant digits)
EXPONENT_DIGITS = (1, 2, 3)  # and the literal 0.5

# Symbol kinds.
K_PAD, K_BOS, K_EOS, K_PRIM, K_VAR, K_DIGIT, K_DOT, K_BINARY, K_MINUS, K_POW, K_OPEN, K_CALL, K_CLOSE, K_COMMA = range(14)
# Kinds a grammar with operators="paper" never allows; what each is, for error messages.
EXTENDED_ONLY_KINDS = {K_VAR: "u (training progress)", K_POW: "the power '**'", K_CALL: "a function"}

# Phases.
(
    START,  # expecting an operand at the start of an expression or argument (unary minus allowed)
    OPERAND,  # expecting an operand after a binary operator
    AFTER_NEG,  # expecting an operand after a unary minus
    AFTER_OPERAND,  # an operand is complete
    INTEGER,  # inside a number's integer digits (complete)
    FRACTION_START,  # right after a number's '.'
    FRACTION,  # inside a number's decimal digits (complete)
    EXPONENT,  # right after '**'
    EXPONENT_ZERO,  # after '**0' (must continue '.5')
    EXPONENT_HALF,  # after '**0.' (must continue '5')
    DONE,  # after '<eos>'
) = range(11)

PHASE_DESCRIPTIONS = (
    "at the start of an expression or argument",
    "after a binary operator (an operand must follow)",
    "after a unary minus (an operand must follow)",
    "after a complete operand",
    "inside the integer part of a number",
    "right after a decimal point (a digit must follow)",
    "inside the decimal part of a number",
    "right after '**' (only 1, 2, 3 or 0.5 may follow)",
    "inside the exponent 0.5",
    "inside the exponent 0.5",
    "after the end of the expression",
)
# Fewest symbols that complete the operand pending in each phase.
_PHASE_OPERAND_COST = (1, 1, 1, 0, 0, 1, 0, 1, 2, 1, 0)
_EXPECTING_PHASES = (START, OPERAND, AFTER_NEG)
_COMPLETE_PHASES = (AFTER_OPERAND, INTEGER, FRACTION)


def vocabulary(num_primitives: int) -> tuple[str, ...]:
    """All symbols, in id order, for a domain with `num_primitives` primitives."""
    return FIXED_SYMBOLS + tuple(f"g{i + 1}" for i in range(num_primitives))


@struct.dataclass
class Grammar:
    """The vocabulary and limits of constrained expression decoding (a pytree with no leaves).

    Build it with `make_grammar`. `max_length` counts symbols including `<eos>`;
    `max_decimals` is the most digits after a number's decimal point; `operators` is the
    operator set ("extended" or "paper", module docstring).
    """

    num_primitives: int = struct.field(pytree_node=False)
    max_length: int = struct.field(pytree_node=False)
    max_depth: int = struct.field(pytree_node=False)
    symbols: tuple[str, ...] = struct.field(pytree_node=False)
    max_decimals: int = struct.field(pytree_node=False, default=MAX_FRACTION_DIGITS)
    operators: str = struct.field(pytree_node=False, default="extended")

    @property
    def pad_id(self) -> int:
        return FIXED_SYMBOLS.index(PAD)

    @property
    def bos_id(self) -> int:
        return FIXED_SYMBOLS.index(BOS)

    @property
    def eos_id(self) -> int:
        return FIXED_SYMBOLS.index(EOS)

    @property
    def vocab_size(self) -> int:
        return len(self.symbols)

    def symbol_id(self, symbol: str) -> int:
        """The id of `symbol`; KeyError naming the symbol if it is not in the vocabulary."""
        try:
            return self.symbols.index(symbol)
        except ValueError:
            raise KeyError(f"{symbol!r} is not a symbol of this grammar (vocabulary: {self.symbols})") from None

    def decode(self, ids: Sequence[int]) -> str:
        """Text of the symbols `ids` (i32[T]) up to the first `<eos>`; `<pad>`/`<bos>` are skipped."""
        ids = np.asarray(ids)
        if ids.ndim != 1:
            raise ValueError(f"decode expects a 1-D sequence of ids, got shape {ids.shape}")
        parts = []
        for position, symbol_id in enumerate(ids.tolist()):
            if not 0 <= symbol_id < self.vocab_size:
                raise ValueError(
                    f"decode: id {symbol_id} at position {position} is outside the vocabulary of {self.vocab_size} symbols"
                )
            if symbol_id == self.eos_id:
                break
            if symbol_id not in (self.pad_id, self.bos_id):
                parts.append(self.symbols[symbol_id])
        return "".join(parts)

    def tokenize(self, text: str) -> list[int]:
        """Symbol ids of `text` (longest match, whitespace skipped), without `<eos>` and unchecked."""
        return [symbol_id for symbol_id, _ in self._tokens(text)]

    def encode(self, text: str) -> list[int]:
        """Ids of `text` followed by `<eos>`: exactly a sequence the automaton could sample.

        Raises ValueError naming the character position when `text` uses something the
        symbol set cannot write, or when the automaton would not produce it (a form the
        mask excludes, such as `g1**4`, or a text too long for `max_length`).
        """
        tokens = self._tokens(text)
        if len(tokens) + 1 > self.max_length:
            raise ValueError(
                f"cannot encode {text!r}: it needs {len(tokens) + 1} symbols with <eos>, "
                f"more than max_length={self.max_length}"
            )
        ids = np.full(self.max_length, self.pad_id, np.int32)
        ids[: len(tokens)] = [symbol_id for symbol_id, _ in tokens]
        ids[len(tokens)] = self.eos_id
        self._check_trace(text, tokens, ids, len(tokens) + 1)
        return ids[: len(tokens) + 1].tolist()

    def encode_prefix(self, text: str) -> list[int]:
        """Ids of `text` (no `<eos>`) when the automaton could sample it as the beginning of an
        expression: every symbol allowed in turn, with room left to finish within `max_length`.
        ValueError naming the first offending symbol otherwise (as `encode`)."""
        tokens = self._tokens(text)
        if len(tokens) >= self.max_length:
            raise ValueError(f"cannot encode {text!r} as a prefix: its {len(tokens)} symbols leave no room for "
                             f"<eos> within max_length={self.max_length}")
        ids = np.full(self.max_length, self.pad_id, np.int32)
        ids[: len(tokens)] = [symbol_id for symbol_id, _ in tokens]
        self._check_trace(text, tokens, ids, len(tokens))
        return ids[: len(tokens)].tolist()

    def _check_trace(self, text: str, tokens: list[tuple[int, int]], ids: np.ndarray, checked: int) -> None:
        """ValueError naming the first of the first `checked` symbols of `ids` i32[max_length] the mask forbids."""
        allowed_steps, syntax_steps, phases = (np.asarray(a)[:checked] for a in _trace(self, jnp.asarray(ids)))
        if not allowed_steps.all():
            step = int(np.argmin(allowed_steps))
            where = f"at character {tokens[step][1]}" if step < len(tokens) else "at the end"
            symbol = self.symbols[int(ids[step])]
            reason = PHASE_DESCRIPTIONS[int(phases[step])]
            excluded = self.operators == "paper" and int(_tables(self).kind[int(ids[step])]) in EXTENDED_ONLY_KINDS
            if excluded:
                reason = f"({outside_paper(EXTENDED_ONLY_KINDS[int(_tables(self).kind[int(ids[step])])])})"
            elif syntax_steps[step]:
                reason += f" (it would leave too little room to finish within max_length={self.max_length}, "
                reason += f"{MAX_TEXT_LENGTH} characters or {MAX_NODES} nodes)"
            raise ValueError(f"cannot encode {text!r}: symbol {symbol!r} {where} is not allowed {reason}")

    def _tokens(self, text: str) -> list[tuple[int, int]]:
        """(symbol id, character offset) for each symbol of `text`."""
        if not isinstance(text, str):
            raise TypeError(f"expected expression text, got {type(text).__name__}")
        by_text = {symbol: i for i, symbol in enumerate(self.symbols) if symbol not in (PAD, BOS, EOS)}
        longest = max(len(symbol) for symbol in by_text)
        tokens, position = [], 0
        while position < len(text):
            if text[position].isspace():
                position += 1
                continue
            for size in range(longest, 0, -1):
                symbol_id = by_text.get(text[position : position + size])
                if symbol_id is not None:
                    tokens.append((symbol_id, position))
                    position += size
                    break
            else:
                raise ValueError(
                    f"cannot encode {text!r}: no symbol matches at character {position} "
                    f"({text[position : position + 8]!r}); the symbols are u, digits, . + - * / ** ( ) , "
                    f"min( max( abs( clip( and g1..g{self.num_primitives}"
                )
        return tokens


def make_grammar(num_primitives: int, max_length: int, max_depth: int = 8,
                 max_decimals: int = MAX_FRACTION_DIGITS, operators: str = "extended") -> Grammar:
    """A grammar over `g1..g{num_primitives}` for sequences of at most `max_length` symbols
    (`<eos>` included) with at most `max_depth` nested parentheses/calls, at most
    `max_decimals` digits after a decimal point and the operator set `operators`."""
    check_operators(operators, "make_grammar: operators")
    if not isinstance(num_primitives, int) or num_primitives < 1:
        raise ValueError(f"make_grammar: num_primitives must be a positive int, got {num_primitives!r}")
    if not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"make_grammar: max_length must be an int >= 2 (an operand and <eos>), got {max_length!r}")
    if not isinstance(max_depth, int) or not 1 <= max_depth <= MAX_NESTING:
        raise ValueError(f"make_grammar: max_depth must be an int in [1, {MAX_NESTING}], got {max_depth!r}")
    if isinstance(max_decimals, bool) or not isinstance(max_decimals, int) or not 1 <= max_decimals <= MAX_DECIMALS:
        raise ValueError(f"make_grammar: max_decimals must be an int in [1, {MAX_DECIMALS}], got {max_decimals!r}")
    return Grammar(num_primitives, max_length, max_depth, vocabulary(num_primitives), max_decimals, operators)


class _Tables(NamedTuple):
    kind: np.ndarray  # i32[V]
    digit: np.ndarray  # i32[V], -1 for non-digits
    commas: np.ndarray  # i32[V], commas a call symbol needs
    chars: np.ndarray  # i32[V], text length (0 for special symbols)


@functools.lru_cache(maxsize=None)
def _tables(grammar: Grammar) -> _Tables:
    kinds = {PAD: K_PAD, BOS: K_BOS, EOS: K_EOS, "u": K_VAR, ".": K_DOT, "-": K_MINUS, "**": K_POW}
    kinds.update({op: K_BINARY for op in "+*/"})
    kinds.update({"(": K_OPEN, ")": K_CLOSE, ",": K_COMMA})
    kinds.update({symbol: K_CALL for symbol in CALL_SYMBOLS})
    kinds.update({symbol: K_DIGIT for symbol in DIGIT_SYMBOLS})
    kind = [kinds.get(symbol, K_PRIM) for symbol in grammar.symbols]
    digit = [int(s) if s in DIGIT_SYMBOLS else -1 for s in grammar.symbols]
    commas = [CALL_ARGUMENTS.get(s, 1) - 1 for s in grammar.symbols]
    chars = [0 if s in (PAD, BOS, EOS) else len(s) for s in grammar.symbols]
    return _Tables(*(np.asarray(t, np.int32) for t in (kind, digit, commas, chars)))


@struct.dataclass
class GrammarState:
    """Automaton state of one sequence (vmap for a batch; every field gains a leading axis).

    position:        i32[]  symbols consumed, `<eos>` included.
    limit:           i32[]  this sequence's max_length.
    phase:           i32[]  one of START .. DONE.
    digits:          i32[]  digits so far in the current number part (integer or decimal).
    leading_zero:    bool[] the current number starts with 0.
    operand_has_power: bool[] the operand just completed is or encloses a power.
    group_has_power: bool[] the innermost open context (or the top level) holds a power.
    depth:           i32[]  open contexts.
    commas_needed:   i32[D] per open context (slot < depth): commas it still needs.
    outer_has_power: bool[D] per open context: `group_has_power` of its enclosing context.
    nodes:           i32[]  tree nodes the text so far will produce (upper bound).
    chars:           i32[]  characters of text so far.
    done:            bool[] `<eos>` was consumed.
    """

    position: jax.Array
    limit: jax.Array
    phase: jax.Array
    digits: jax.Array
    leading_zero: jax.Array
    operand_has_power: jax.Array
    group_has_power: jax.Array
    depth: jax.Array
    commas_needed: jax.Array
    outer_has_power: jax.Array
    nodes: jax.Array
    chars: jax.Array
    done: jax.Array


def init(grammar: Grammar, max_length=None) -> GrammarState:
    """The state before the first symbol. `max_length` (i32[], may be traced) overrides the
    grammar's budget for this sequence; it is clipped to [2, grammar.max_length]."""
    if max_length is None:
        max_length = grammar.max_length
    elif isinstance(max_length, (int, np.integer)) and not 2 <= max_length <= grammar.max_length:
        raise ValueError(f"init: max_length must be in [2, {grammar.max_length}], got {max_length}")
    zero, false = jnp.zeros((), jnp.int32), jnp.zeros((), bool)
    return GrammarState(
        position=zero,
        limit=jnp.clip(jnp.asarray(max_length, jnp.int32), 2, grammar.max_length),
        phase=jnp.asarray(START, jnp.int32),
        digits=zero,
        leading_zero=false,
        operand_has_power=false,
        group_has_power=false,
        depth=zero,
        commas_needed=jnp.zeros((grammar.max_depth,), jnp.int32),
        outer_has_power=jnp.zeros((grammar.max_depth,), bool),
        nodes=zero,
        chars=zero,
        done=false,
    )


def _in(phase: jax.Array, phases: Sequence[int]) -> jax.Array:
    return jnp.isin(phase, jnp.asarray(phases, jnp.int32))


def finish_cost(grammar: Grammar, state: GrammarState) -> jax.Array:
    """i32[]: the fewest symbols, `<eos>` included, that complete the expression from `state`."""
    operand = jnp.asarray(_PHASE_OPERAND_COST, jnp.int32)[state.phase]
    is_open = jnp.arange(grammar.max_depth) < state.depth
    contexts = jnp.sum(jnp.where(is_open, 2 * state.commas_needed + 1, 0))
    return jnp.where(state.done, 0, operand + contexts + 1).astype(jnp.int32)


def advance(grammar: Grammar, state: GrammarState, symbol) -> GrammarState:
    """The state after consuming `symbol` (i32[]), which must be allowed in `state`.
    Once done, the state no longer changes."""
    tables = _tables(grammar)
    symbol = jnp.asarray(symbol, jnp.int32)
    kind = jnp.asarray(tables.kind)[symbol]
    digit = jnp.asarray(tables.digit)[symbol]
    phase = state.phase
    expecting = _in(phase, _EXPECTING_PHASES)
    is_digit = kind == K_DIGIT
    starts_atom = (kind == K_PRIM) | (kind == K_VAR) | (is_digit & expecting)
    ends_exponent = is_digit & (((phase == EXPONENT) & (digit != 0)) | (phase == EXPONENT_HALF))
    opens = (kind == K_OPEN) | (kind == K_CALL)
    closes = kind == K_CLOSE
    top = jnp.maximum(state.depth - 1, 0)
    push_slot = jnp.minimum(state.depth, grammar.max_depth - 1)
    closed_group_power = state.group_has_power

    new_phase = jnp.select(
        [
            (kind == K_PRIM) | (kind == K_VAR) | ends_exponent | closes,
            is_digit & (expecting | (phase == INTEGER)),
            is_digit & _in(phase, (FRACTION_START, FRACTION)),
            is_digit & (phase == EXPONENT),
            (kind == K_DOT) & (phase == INTEGER),
            (kind == K_DOT) & (phase == EXPONENT_ZERO),
            (kind == K_MINUS) & (phase == START),
            (kind == K_BINARY) | (kind == K_MINUS),
            kind == K_POW,
            opens | (kind == K_COMMA),
            kind == K_EOS,
        ],
        [AFTER_OPERAND, INTEGER, FRACTION, EXPONENT_ZERO, FRACTION_START, EXPONENT_HALF, AFTER_NEG, OPERAND, EXPONENT, START, DONE],
        phase,
    )
    digits = jnp.select(
        [is_digit & expecting, is_digit & _in(phase, (INTEGER, FRACTION, FRACTION_START))],
        [1, state.digits + 1],
        0,
    )
    node_added = (
        (kind == K_PRIM)
        | (kind == K_VAR)
        | (kind == K_BINARY)
        | (kind == K_MINUS)
        | (kind == K_POW)
        | (kind == K_CALL)
        | (is_digit & (expecting | (phase == EXPONENT)))
    )
    new = GrammarState(
        position=state.position + 1,
        limit=state.limit,
        phase=new_phase.astype(jnp.int32),
        digits=digits.astype(jnp.int32),
        leading_zero=jnp.where(is_digit & expecting, digit == 0, state.leading_zero),
        operand_has_power=jnp.select(
            [starts_atom, ends_exponent, closes], [False, True, closed_group_power], state.operand_has_power
        ),
        group_has_power=jnp.select(
            [ends_exponent, opens, closes],
            [True, False, state.outer_has_power[top] | closed_group_power],
            state.group_has_power,
        ),
        depth=jnp.clip(state.depth + opens.astype(jnp.int32) - closes.astype(jnp.int32), 0, grammar.max_depth),
        commas_needed=jnp.where(
            opens,
            state.commas_needed.at[push_slot].set(jnp.asarray(tables.commas)[symbol] * (kind == K_CALL)),
            jnp.where(kind == K_COMMA, state.commas_needed.at[top].add(-1), state.commas_needed),
        ),
        outer_has_power=jnp.where(
            opens, state.outer_has_power.at[push_slot].set(state.group_has_power), state.outer_has_power
        ),
        nodes=state.nodes + node_added.astype(jnp.int32),
        chars=state.chars + jnp.asarray(tables.chars)[symbol],
        done=kind == K_EOS,
    )
    return jax.tree_util.tree_map(lambda old, updated: jnp.where(state.done, old, updated), state, new)


def _syntax_allowed(grammar: Grammar, state: GrammarState) -> jax.Array:
    """bool[V]: the symbols the syntax rules allow in `state`, ignoring the budget."""
    tables = _tables(grammar)
    kind, digit = jnp.asarray(tables.kind), jnp.asarray(tables.digit)
    phase = state.phase
    expecting = _in(phase, _EXPECTING_PHASES)
    complete = _in(phase, _COMPLETE_PHASES)
    can_open = state.depth < grammar.max_depth
    top_commas = jnp.where(state.depth > 0, state.commas_needed[jnp.maximum(state.depth - 1, 0)], -1)
    digit_allowed = (
        expecting
        | ((phase == INTEGER) & (state.digits < MAX_INTEGER_DIGITS) & ~state.leading_zero)
        | (phase == FRACTION_START)
        | ((phase == FRACTION) & (state.digits < grammar.max_decimals))
        | ((phase == EXPONENT) & jnp.isin(digit, jnp.asarray((0, *EXPONENT_DIGITS))))
        | ((phase == EXPONENT_HALF) & (digit == 5))
    )
    by_kind = {
        K_PAD: state.done,
        K_BOS: False,
        K_EOS: complete & (state.depth == 0),
        K_PRIM: expecting,
        K_VAR: expecting,
        K_DIGIT: digit_allowed,
        K_DOT: (phase == INTEGER) | (phase == EXPONENT_ZERO),
        K_BINARY: complete,
        K_MINUS: complete | (phase == START),
        K_POW: complete & ~state.operand_has_power,
        K_OPEN: expecting & can_open,
        K_CALL: expecting & can_open,
        K_CLOSE: complete & (top_commas == 0),
        K_COMMA: complete & (top_commas > 0),
    }
    if grammar.operators == "paper":
        by_kind.update({k: False for k in EXTENDED_ONLY_KINDS})
    result = jnp.zeros(kind.shape, bool)
    for k, rule in by_kind.items():
        result = result | ((kind == k) & rule)
    return result


def allowed(grammar: Grammar, state: GrammarState) -> jax.Array:
    """bool[V]: the symbols that may come next (see the module docstring for the rules)."""
    syntax = _syntax_allowed(grammar, state)
    after = jax.vmap(lambda symbol: advance(grammar, state, symbol))(jnp.arange(grammar.vocab_size))
    cost = jax.vmap(lambda s: finish_cost(grammar, s))(after)
    closing = cost - jnp.where(after.done, 0, 1)
    fits = (
        (after.position + cost <= state.limit)
        & (after.nodes + closing <= MAX_NODES)
        & (after.chars + closing <= MAX_TEXT_LENGTH)
    )
    only_pad = jnp.arange(grammar.vocab_size) == grammar.pad_id
    return jnp.where(state.done, only_pad, syntax & fits)


@jax.jit
def _trace(grammar: Grammar, ids: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Feed `ids` i32[T] from `init`: (allowed bool[T], syntax-allowed bool[T], phase before i32[T])."""

    def step(state, symbol):
        ok = allowed(grammar, state)[symbol]
        syntax_ok = _syntax_allowed(grammar, state)[symbol]
        return advance(grammar, state, symbol), (ok, syntax_ok, state.phase)

    _, outputs = jax.lax.scan(step, init(grammar), ids)
    return outputs
