"""Reward expression text -> `Expr` tree: a hand-written tokenizer and recursive-descent parser.

Nothing here ever calls `eval`; model-written text is only ever tokenized and parsed.

The language (EBNF; whitespace — space, tab, newline — is allowed between any two tokens)::

    expression = sum ;
    sum        = product , { ( "+" | "-" ) , product } ;           (* left-associative *)
    product    = signed , { ( "*" | "/" ) , signed } ;             (* left-associative *)
    signed     = ( "-" | "+" ) , signed | power ;                  (* unary minus / plus *)
    power      = atom , [ "**" , signed ] ;                        (* right-associative *)
    atom       = number | "u" | primitive | call | "(" , expression , ")" ;
    call       = ( "min" | "max" ) , "(" , expression , "," , expression , ")"
               | "abs" , "(" , expression , ")"
               | "clip" , "(" , expression , "," , expression , "," , expression , ")" ;
    primitive  = "g" , positive integer (1 .. k)  |  alias supplied by the caller ;
    number     = ( digits , [ "." , [ digits ] ] | "." , digits ) ,
                 [ ( "e" | "E" ) , [ "+" | "-" ] , digits ] ;
    digits     = digit , { digit } ;                               (* ASCII 0-9 only *)

Precedence is Python's: `**` binds tighter than a unary minus on its left (`-g1**2` is
`-(g1**2)`) and may take a signed right operand (`g1**-2`); `* /` bind tighter than `+ -`.
The right operand of `**` must be constant: it may not contain a primitive or `u`.

`u` is the fraction of inner-loop training done (0..1). Primitives are written `g1`..`gk`
(1-based; `Prim.index` is 0-based and `Prim.name` is always the canonical `g{i+1}`), or by
an alias from `primitive_names`.

Limits: at most `MAX_TEXT_LENGTH` (256) characters, parenthesis/call nesting at most
`MAX_NESTING` (32), at most `MAX_NODES` (128) tree nodes. A unary plus makes no node.

Operator sets (`operators`): "extended" is the whole language above; "paper" is the DERL
paper's reward language (its Eq. 3 and Appendix A: weighted `+ - * /` compositions of the
primitives with parentheses, numbers and unary minus), so `u`, `**` and the functions are
rejected with a reason naming the operator set.

Every rejection raises `ExpressionError(reason, position, text)` (a `ValueError`), whose
message shows the reason and a caret under the offending character.

`to_text(expr)` prints a tree with the fewest parentheses such that `parse(to_text(e)) == e`
for every tree the parser can produce (constants non-negative and finite; a negative `Num`
built by hand prints as `(-3)`, which parses back as `Unary("neg", Num(3))`).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence, Union

import numpy as np

from derl_jax.expr.ast import FUNCTIONS, PROGRESS_VAR, Binary, Call, Expr, Num, Prim, Unary, Var, walk

MAX_TEXT_LENGTH = 256
MAX_NESTING = 32
MAX_NODES = 128
OPERATOR_SETS = ("extended", "paper")
PAPER_LANGUAGE = "+ - * /, parentheses, numbers and the primitives"

_WHITESPACE = " \t\n\r"
_DIGITS = "0123456789"
_IDENT_START = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
_IDENT_CHARS = _IDENT_START + _DIGITS
_FLOAT32_MAX = float(np.finfo(np.float32).max)

PrimitiveNames = Union[Sequence[str], Mapping[str, int], None]


class ExpressionError(ValueError):
    """A rejected expression: `reason` (short, human readable), 0-based `position`, `text`."""

    def __init__(self, reason: str, position: int, text: str):
        self.reason = reason
        self.position = int(position)
        self.text = text
        super().__init__(reason, self.position, text)

    def __str__(self) -> str:
        shown = "".join(" " if c in "\t\n\r" else c for c in self.text)
        return f"{self.reason} at position {self.position}\n  {shown}\n  {' ' * self.position}^"

    def __reduce__(self):
        return (type(self), (self.reason, self.position, self.text))


# ----------------------------------------------------------------------------- tokens

NUMBER, NAME, OP, END = "number", "name", "op", "end"


class _Token:
    __slots__ = ("kind", "text", "pos", "value")

    def __init__(self, kind: str, text: str, pos: int, value: float | None = None):
        self.kind, self.text, self.pos, self.value = kind, text, pos, value

    def describe(self) -> str:
        if self.kind == END:
            return "end of input"
        return f"{self.kind} {self.text!r}" if self.kind != OP else repr(self.text)


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in _WHITESPACE:
            i += 1
        elif c in _DIGITS or (c == "." and i + 1 < n and text[i + 1] in _DIGITS):
            start = i
            while i < n and text[i] in _DIGITS:
                i += 1
            if i < n and text[i] == ".":
                i += 1
                while i < n and text[i] in _DIGITS:
                    i += 1
            if i < n and text[i] in "eE":
                j = i + 1
                if j < n and text[j] in "+-":
                    j += 1
                if j >= n or text[j] not in _DIGITS:
                    raise ExpressionError("malformed exponent in number", j if j < n else n, text)
                i = j
                while i < n and text[i] in _DIGITS:
                    i += 1
            literal = text[start:i]
            value = float(literal)
            if not math.isfinite(value) or abs(value) > _FLOAT32_MAX:
                raise ExpressionError(f"number {literal} is out of float32 range", start, text)
            tokens.append(_Token(NUMBER, literal, start, value))
        elif c in _IDENT_START:
            start = i
            while i < n and text[i] in _IDENT_CHARS:
                i += 1
            tokens.append(_Token(NAME, text[start:i], start))
        elif c == "*" and text.startswith("**", i):
            tokens.append(_Token(OP, "**", i))
            i += 2
        elif c in "+-*/(),":
            tokens.append(_Token(OP, c, i))
            i += 1
        else:
            shown = c if c.isprintable() and c.isascii() else f"U+{ord(c):04X}"
            raise ExpressionError(f"unexpected character {shown!r}", i, text)
    tokens.append(_Token(END, "", n))
    return tokens


# ----------------------------------------------------------------------------- names


def _symbol_table(primitive_names: PrimitiveNames) -> tuple[dict[str, int], int | None]:
    """(alias -> index, number of primitives or None when unbounded)."""
    if primitive_names is None:
        return {}, None
    if isinstance(primitive_names, Mapping):
        table = {str(k): int(v) for k, v in primitive_names.items()}
        count = max(table.values(), default=-1) + 1
    else:
        names = list(primitive_names)
        table = {str(name): i for i, name in enumerate(names)}
        if len(table) != len(names):
            raise ValueError(f"duplicate primitive names in {names}")
        count = len(names)
    for symbol, index in table.items():
        if index < 0:
            raise ValueError(f"primitive symbol {symbol!r} has negative index {index}")
        if symbol in FUNCTIONS or symbol == PROGRESS_VAR:
            raise ValueError(f"primitive symbol {symbol!r} clashes with a reserved name")
        canonical = _canonical_index(symbol)
        if canonical is not None and canonical != index:
            raise ValueError(f"primitive symbol {symbol!r} is given index {index} (g{index + 1})")
    return table, count


def _canonical_index(name: str) -> int | None:
    """0-based index for `g<digits>` names (`g0` gives -1), else None."""
    if len(name) >= 2 and name[0] == "g" and all(ch in _DIGITS for ch in name[1:]):
        return int(name[1:]) - 1
    return None


# ----------------------------------------------------------------------------- parser


def check_operators(operators: str, where: str = "operators") -> str:
    """`operators` when it names an operator set (`OPERATOR_SETS`); ValueError naming `where` otherwise."""
    if operators not in OPERATOR_SETS:
        raise ValueError(f"{where} must be one of {OPERATOR_SETS}, got {operators!r}")
    return operators


def outside_paper(what: str) -> str:
    """The reason a text using `what` is refused under the "paper" operator set."""
    return f"{what} is not in the paper operator set (operators='paper' allows {PAPER_LANGUAGE})"


class _Parser:
    def __init__(self, text: str, table: dict[str, int], count: int | None, operators: str = "extended"):
        self.paper = operators == "paper"
        self.text = text
        self.tokens = _tokenize(text)
        self.i = 0
        self.table = table
        self.count = count
        self.nesting = 0
        self.nodes = 0

    # helpers
    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def error(self, reason: str, pos: int | None = None):
        raise ExpressionError(reason, self.tok.pos if pos is None else pos, self.text)

    def is_op(self, *ops: str) -> bool:
        return self.tok.kind == OP and self.tok.text in ops

    def expect(self, op: str, context: str) -> _Token:
        if not self.is_op(op):
            self.error(f"expected {op!r} {context}, found {self.tok.describe()}")
        tok = self.tok
        self.i += 1
        return tok

    def node(self, expr: Expr, pos: int) -> Expr:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            self.error(f"expression has more than {MAX_NODES} nodes", pos)
        return expr

    def open_paren(self, pos: int):
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            self.error(f"parentheses nested deeper than {MAX_NESTING}", pos)

    # grammar
    def parse(self) -> Expr:
        if self.tok.kind == END:
            self.error("empty expression")
        expr = self.sum()
        if self.tok.kind != END:
            if self.is_op(")"):
                self.error("unbalanced ')'")
            self.error(f"unexpected {self.tok.describe()} after a complete expression")
        return expr

    def sum(self) -> Expr:
        return self.left_associative(("+", "-"), self.product)

    def product(self) -> Expr:
        return self.left_associative(("*", "/"), self.signed)

    def left_associative(self, ops: tuple[str, ...], operand: Callable[[], Expr]) -> Expr:
        """operand (op operand)* with op in `ops`, grouped from the left."""
        left = operand()
        while self.is_op(*ops):
            op = self.tok
            self.i += 1
            right = operand()
            left = self.node(Binary(op.text, left, right), op.pos)
        return left

    def signed(self) -> Expr:
        if self.is_op("-"):
            op = self.tok
            self.i += 1
            return self.node(Unary("neg", self.signed()), op.pos)
        if self.is_op("+"):
            self.i += 1
            return self.signed()
        return self.power()

    def power(self) -> Expr:
        base = self.atom()
        if self.is_op("**"):
            op = self.tok
            if self.paper:
                self.error(outside_paper("the power '**'"))
            self.i += 1
            exponent_pos = self.tok.pos
            exponent = self.signed()
            if _has_variable(exponent):
                self.error("the exponent of '**' must be a constant (no primitive and no u)", exponent_pos)
            return self.node(Binary("**", base, exponent), op.pos)
        return base

    def atom(self) -> Expr:
        tok = self.tok
        if tok.kind == NUMBER:
            self.i += 1
            return self.node(Num(tok.value), tok.pos)
        if tok.kind == NAME:
            self.i += 1
            if tok.text in FUNCTIONS:
                if self.paper:
                    self.error(outside_paper(f"the function {tok.text}()"), tok.pos)
                return self.call(tok)
            if tok.text == PROGRESS_VAR:
                if self.paper:
                    self.error(outside_paper("u (training progress)"), tok.pos)
                return self.node(Var(PROGRESS_VAR), tok.pos)
            return self.node(self.primitive(tok), tok.pos)
        if self.is_op("("):
            self.i += 1
            self.open_paren(tok.pos)
            if self.is_op(")"):
                self.error("empty parentheses")
            inner = self.sum()
            self.expect(")", f"to close the '(' at position {tok.pos}")
            self.nesting -= 1
            return inner
        if tok.kind == END:
            self.error("expression ends where an operand is expected")
        if self.is_op(")"):
            self.error("unexpected ')' where an operand is expected")
        self.error(f"unexpected {tok.describe()} where an operand is expected")

    def call(self, name: _Token) -> Expr:
        arity = FUNCTIONS[name.text]
        if not self.is_op("("):
            self.error(f"expected '(' after function {name.text!r}, found {self.tok.describe()}")
        paren = self.tok
        self.i += 1
        self.open_paren(paren.pos)
        args: list[Expr] = []
        if self.is_op(")"):
            self.error(f"{name.text}() takes {arity} argument{'s' if arity > 1 else ''}, got 0")
        while True:
            args.append(self.sum())
            if self.is_op(","):
                if len(args) >= arity:
                    self.error(f"{name.text}() takes {arity} argument{'s' if arity > 1 else ''}, got more")
                self.i += 1
                continue
            if self.is_op(")"):
                if len(args) != arity:
                    self.error(
                        f"{name.text}() takes {arity} argument{'s' if arity > 1 else ''}, got {len(args)}"
                    )
                self.i += 1
                break
            self.error(f"expected ',' or ')' in the arguments of {name.text}(), found {self.tok.describe()}")
        self.nesting -= 1
        return self.node(Call(name.text, tuple(args)), name.pos)

    def primitive(self, tok: _Token) -> Prim:
        index = _canonical_index(tok.text)
        if index is None:
            index = self.table.get(tok.text)
            if index is None:
                self.error(f"unknown name {tok.text!r}", tok.pos)
        elif index < 0:
            self.error(f"no primitive {tok.text!r}: primitives are numbered from g1", tok.pos)
        elif tok.text != f"g{index + 1}":
            self.error(f"write primitive {tok.text!r} as g{index + 1}", tok.pos)
        if self.count is not None and index >= self.count:
            self.error(f"unknown primitive {tok.text!r}: only g1..g{self.count} exist", tok.pos)
        return Prim(index, f"g{index + 1}")


def _has_variable(expr: Expr) -> bool:
    return any(isinstance(n, (Prim, Var)) for n in walk(expr))


def parse(text: str, primitive_names: PrimitiveNames = None, operators: str = "extended") -> Expr:
    """Parse reward-expression `text` into an `Expr`.

    `primitive_names`: a sequence of names (index i is `g{i+1}` and `names[i]`), a mapping
    symbol -> 0-based index (e.g. `primitives.registry.symbol_table(...)`; then `g1`..`gk` with
    k = max index + 1 are always accepted), or None (any `g<n>`, n >= 1, no aliases; the
    caller checks the count, e.g. with `check`). `operators`: one of `OPERATOR_SETS` (module
    docstring). Raises `ExpressionError`.
    """
    check_operators(operators, "parse: operators")
    if not isinstance(text, str):
        raise ExpressionError(f"expression must be a string, got {type(text).__name__}", 0, str(text)[:MAX_TEXT_LENGTH])
    if len(text) > MAX_TEXT_LENGTH:
        raise ExpressionError(f"expression longer than {MAX_TEXT_LENGTH} characters", MAX_TEXT_LENGTH, text)
    table, count = _symbol_table(primitive_names)
    return _Parser(text, table, count, operators).parse()


# ----------------------------------------------------------------------------- printing

# Precedence levels: sum 1, product 2, signed 3, power 4, atom 5.
_SUM, _PRODUCT, _SIGNED, _POWER, _ATOM = 1, 2, 3, 4, 5


def format_number(value: float) -> str:
    """Shortest text that parses back to exactly `value` (non-negative finite values)."""
    value = float(value)
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    text = repr(value)
    return text


def _text(expr: Expr) -> tuple[str, int]:
    if isinstance(expr, Num):
        if expr.value < 0:
            return f"(-{format_number(-expr.value)})", _ATOM
        return format_number(expr.value), _ATOM
    if isinstance(expr, Var):
        return expr.name, _ATOM
    if isinstance(expr, Prim):
        return f"g{expr.index + 1}", _ATOM
    if isinstance(expr, Call):
        return f"{expr.fn}(" + ", ".join(_text(a)[0] for a in expr.args) + ")", _ATOM
    if isinstance(expr, Unary):
        return "-" + _wrap(expr.operand, _SIGNED), _SIGNED
    if isinstance(expr, Binary):
        if expr.op in "+-":
            return _wrap(expr.left, _SUM) + expr.op + _wrap(expr.right, _PRODUCT), _SUM
        if expr.op in "*/":
            return _wrap(expr.left, _PRODUCT) + expr.op + _wrap(expr.right, _SIGNED), _PRODUCT
        if expr.op == "**":
            return _wrap(expr.left, _ATOM) + "**" + _wrap(expr.right, _SIGNED), _POWER
    raise TypeError(f"not an expression node: {expr!r}")


def parenthesized(rendered: tuple[str, int], minimum: int, opening: str = "(", closing: str = ")") -> str:
    """The text of a rendered (text, precedence level) pair, bracketed when its level is below `minimum`."""
    text, level = rendered
    return text if level >= minimum else f"{opening}{text}{closing}"


def _wrap(expr: Expr, minimum: int) -> str:
    return parenthesized(_text(expr), minimum)


def to_text(expr: Expr) -> str:
    """Minimal-parenthesis text of `expr`; `parse(to_text(e)) == e` (see the module doc)."""
    return _text(expr)[0]
