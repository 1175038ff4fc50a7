"""Grammar-constrained decoding over a real LM vocabulary: a token trie over the grammar symbols.

The grammar automaton (`derl_jax.expr.grammar`) works on *symbols* (`g3`, `min(`, `**`, a
digit). A pretrained LM writes *tokens*, and in Qwen's tokenizer many symbols are several
tokens (`g12` is `g`,`1`,`2`; `min(` is `min`,`(`). Each symbol s is given one fixed token
sequence `tokens(s)` (its tokenization on its own; `<eos>` is the LM's end-of-turn token),
and the sequences form a trie. Decoding state = (grammar state, trie node):

  * at node n, token t may follow when the trie has an edge n -t-> c and some symbol whose
    sequence passes through c is allowed by the grammar ("continuation");
  * when n completes a symbol s (n is terminal) that the grammar allows, and t has NO edge
    out of n, t may also start a new symbol after s: s is fed to the grammar and t must lead
    from the root towards a symbol the grammar allows after s ("completion").
  * a node that completes a symbol and has no children (a leaf) is resolved at once: the
    symbol goes to the grammar and the state returns to the root.

Continuation wins over completion, just as the grammar's own text tokenizer takes the
longest match (`g1` followed by `0` is `g10`, not `g1` then a digit). That is only sound when
completion-then-start can never be what the grammar means; `make_trie_constraint` checks it:
whenever a symbol's sequence is a proper prefix of another's and the next token of the
longer one also starts a symbol at the root, the shorter symbol must be a primitive or `u`
and every symbol that token starts must be a digit (the grammar never puts a digit right
after an operand). Otherwise construction fails with an error naming both symbols.

When no symbol's sequence is a proper prefix of another's (every terminal node is a leaf, as
for a model whose vocabulary is the symbols, or Qwen with at most 9 primitives), the
completion branch is compiled out (`TokenTrieConstraint.has_pending` False).

Everything is a static array, so the constraint runs inside the jitted decode scan over the
full vocabulary (151,936 for Qwen2.5): the trie is a transition table over the compact
list of the M token ids the symbols use, and the bool[B, M] result is scattered into
bool[B, V]. Shapes: B rows, N trie nodes (node 0 is the root), M used tokens, S grammar
symbols, V LM vocabulary.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from derl_jax.expr import grammar as G
from derl_jax.expr.grammar import Grammar, GrammarState

ROOT = 0
TokenTable = Sequence[Sequence[int] | None]


@struct.dataclass
class SymbolTrie:
    """Token trie over the grammar symbols' token sequences (static arrays).

    token_ids: i32[M]     the LM token ids the symbols use, ascending (compact index = position)
    children:  i32[N, M]  child node of node n via compact token m, -1 if none
    terminal:  i32[N]     symbol whose sequence ends at node n, -1 if none
    reachable: bool[N, S] symbols whose sequence passes through (or ends at) node n
    is_leaf:   bool[N]    node completes a symbol and has no children
    """

    token_ids: jax.Array
    children: jax.Array
    terminal: jax.Array
    reachable: jax.Array
    is_leaf: jax.Array

    @property
    def num_nodes(self) -> int:
        return int(self.children.shape[0])

    @property
    def depth(self) -> int:
        """Longest token sequence of a symbol."""
        children = np.asarray(self.children)
        level, frontier = 0, {ROOT}
        while True:
            frontier = {int(c) for n in frontier for c in children[n] if c >= 0}
            if not frontier:
                return level
            level += 1


def build_symbol_trie(token_table: TokenTable) -> SymbolTrie:
    """The trie of `token_table[s]` (token ids of symbol s, or None for symbols never emitted).

    Raises ValueError naming the symbol when a sequence is empty or two symbols share one.
    """
    num_symbols = len(token_table)
    used = sorted({int(t) for seq in token_table if seq is not None for t in seq})
    compact = {token: index for index, token in enumerate(used)}
    edges: list[dict[int, int]] = [{}]
    terminal = [-1]
    paths: list[list[int]] = [[]]  # nodes on the path of each symbol
    for symbol, seq in enumerate(token_table):
        if seq is None:
            paths.append([])
            continue
        seq = [int(t) for t in seq]
        if not seq:
            raise ValueError(f"build_symbol_trie: symbol {symbol} has an empty token sequence")
        if min(seq) < 0:
            raise ValueError(f"build_symbol_trie: symbol {symbol} has a negative token id in {seq}")
        node, path = ROOT, []
        for token in seq:
            nxt = edges[node].get(compact[token])
            if nxt is None:
                nxt = len(edges)
                edges[node][compact[token]] = nxt
                edges.append({})
                terminal.append(-1)
            node = nxt
            path.append(node)
        if terminal[node] >= 0:
            raise ValueError(
                f"build_symbol_trie: symbols {terminal[node]} and {symbol} have the same token sequence {seq}"
            )
        terminal[node] = symbol
        paths.append(path)
    paths = paths[1:]
    num_nodes = len(edges)
    children = np.full((num_nodes, len(used)), -1, np.int32)
    for node, out in enumerate(edges):
        for token, child in out.items():
            children[node, token] = child
    reachable = np.zeros((num_nodes, num_symbols), bool)
    for symbol, path in enumerate(paths):
        reachable[path, symbol] = True
    terminal_array = np.asarray(terminal, np.int32)
    is_leaf = (terminal_array >= 0) & (children < 0).all(axis=1)
    return SymbolTrie(
        token_ids=jnp.asarray(np.asarray(used, np.int32).reshape(-1)),
        children=jnp.asarray(children),
        terminal=jnp.asarray(terminal_array),
        reachable=jnp.asarray(reachable),
        is_leaf=jnp.asarray(is_leaf),
    )


def identity_token_table(grammar: Grammar) -> list[list[int] | None]:
    """Each symbol is the single token with its own id (a model whose vocabulary IS the
    grammar's symbols); `<pad>` and `<bos>` are never emitted."""
    return [None if s in (grammar.pad_id, grammar.bos_id) else [s] for s in range(grammar.vocab_size)]


def tokenizer_token_table(
    grammar: Grammar,
    encode: Callable[[str], Sequence[int]],
    eos_id: int,
    decode: Callable[[Sequence[int]], str] | None = None,
) -> list[list[int] | None]:
    """Token ids of every grammar symbol under an LM tokenizer: `encode(symbol)` on its own,
    `<eos>` -> [eos_id], `<pad>`/`<bos>` -> None.

    With `decode`, each symbol's tokens must decode back to the symbol's text (ValueError
    naming the symbol otherwise), so a sampled token sequence detokenizes to the text of
    its symbols. No symbol may contain `eos_id`.
    """
    table: list[list[int] | None] = []
    for symbol_id, symbol in enumerate(grammar.symbols):
        if symbol_id in (grammar.pad_id, grammar.bos_id):
            table.append(None)
            continue
        if symbol_id == grammar.eos_id:
            table.append([int(eos_id)])
            continue
        ids = [int(t) for t in encode(symbol)]
        if not ids:
            raise ValueError(f"tokenizer_token_table: the tokenizer encodes symbol {symbol!r} to no tokens")
        if int(eos_id) in ids:
            raise ValueError(f"tokenizer_token_table: symbol {symbol!r} encodes to {ids}, which contains eos id {eos_id}")
        if decode is not None and decode(ids) != symbol:
            raise ValueError(
                f"tokenizer_token_table: symbol {symbol!r} encodes to {ids}, which decodes to {decode(ids)!r}"
            )
        table.append(ids)
    return table


def _is_operand_symbol(symbol: str) -> bool:
    """A primitive `g<n>` or the progress variable `u`: symbols that complete an operand."""
    return symbol == "u" or (symbol.startswith("g") and symbol[1:].isdigit())


def check_unambiguous(grammar: Grammar, trie: SymbolTrie) -> None:
    """Raise ValueError when continuation-wins could misread a sampled token sequence
    (module docstring), naming the two symbols involved."""
    symbols = grammar.symbols
    children, terminal, reachable = (np.asarray(a) for a in (trie.children, trie.terminal, trie.reachable))
    token_ids = np.asarray(trie.token_ids)
    for node in range(trie.num_nodes):
        shorter = int(terminal[node])
        if shorter < 0:
            continue
        for compact in np.flatnonzero((children[node] >= 0) & (children[ROOT] >= 0)):
            started = np.flatnonzero(reachable[children[ROOT, compact]])
            safe = _is_operand_symbol(symbols[shorter]) and all(symbols[s] in G.DIGIT_SYMBOLS for s in started)
            if not safe:
                longer = np.flatnonzero(reachable[children[node, compact]])
                raise ValueError(
                    f"ambiguous symbol tokenization: {symbols[shorter]!r} is a token prefix of "
                    f"{symbols[int(longer[0])]!r}, and its next token {int(token_ids[compact])} also starts "
                    f"{symbols[int(started[0])]!r}, which the grammar may allow after {symbols[shorter]!r}"
                )


@struct.dataclass
class TrieState:
    """Per-row decoding state: grammar: GrammarState with leading axis B; node: i32[B]."""

    grammar: GrammarState
    node: jax.Array


def _rows_where(condition: jax.Array, new, old):
    """Per row: `new` where condition (bool[B]) else `old`, for pytrees with leading axis B."""

    def pick(a, b):
        return jnp.where(condition.reshape(condition.shape + (1,) * (a.ndim - 1)), a, b)

    return jax.tree_util.tree_map(pick, new, old)


@struct.dataclass
class TokenTrieConstraint:
    """`derl_jax.models.sampling.Constraint` for the grammar over an LM vocabulary of
    `vocab_size` tokens (module docstring). A pytree, so it passes through `jax.jit`.
    Build it with `make_trie_constraint`. has_pending: some node completes a symbol and has
    children (else the completion branch is compiled out)."""

    grammar: Grammar
    trie: SymbolTrie
    vocab_size: int = struct.field(pytree_node=False)
    has_pending: bool = struct.field(pytree_node=False, default=True)

    @property
    def token_ids(self) -> jax.Array:
        """i32[M]: the token ids that can ever be allowed (compact index order)."""
        return self.trie.token_ids

    def init(self, batch_size: int) -> TrieState:
        one = G.init(self.grammar)
        states = jax.tree_util.tree_map(lambda leaf: jnp.broadcast_to(leaf, (batch_size,) + leaf.shape), one)
        return TrieState(grammar=states, node=jnp.zeros((batch_size,), jnp.int32))

    def _grammar_allowed(self, states: GrammarState) -> jax.Array:
        return jax.vmap(lambda s: G.allowed(self.grammar, s))(states)

    def _grammar_advance(self, states: GrammarState, symbols: jax.Array) -> GrammarState:
        return jax.vmap(lambda s, x: G.advance(self.grammar, s, x))(states, symbols)

    def allowed_compact(self, state: TrieState) -> jax.Array:
        """bool[B, M]: which of `token_ids` may come next."""
        trie = self.trie
        symbol_ok = self._grammar_allowed(state.grammar)  # [B, S]
        child = trie.children[state.node]  # [B, M]
        leads = trie.reachable[jnp.maximum(child, 0)]  # [B, M, S]
        continuation = (child >= 0) & jnp.any(leads & symbol_ok[:, None, :], axis=-1)
        if not self.has_pending:
            return continuation

        pending = trie.terminal[state.node]  # [B]
        pending_ok = (pending >= 0) & jnp.take_along_axis(symbol_ok, jnp.maximum(pending, 0)[:, None], axis=1)[:, 0]
        after = self._grammar_advance(state.grammar, jnp.maximum(pending, 0))
        after_ok = self._grammar_allowed(after)  # [B, S]
        root_child = trie.children[ROOT]  # [M]
        root_leads = trie.reachable[jnp.maximum(root_child, 0)]  # [M, S]
        starts = (root_child >= 0)[None, :] & jnp.any(root_leads[None] & after_ok[:, None, :], axis=-1)
        completion = pending_ok[:, None] & (child < 0) & starts
        return continuation | completion

    def allowed(self, state: TrieState) -> jax.Array:
        """bool[B, V]: `allowed_compact` scattered into the full vocabulary."""
        compact = self.allowed_compact(state)
        full = jnp.zeros((compact.shape[0], self.vocab_size), bool)
        return full.at[:, self.trie.token_ids].set(compact)

    def compact_index(self, tokens: jax.Array) -> jax.Array:
        """i32[...]: position of each token in `token_ids`, -1 for tokens no symbol uses."""
        ids = self.trie.token_ids
        position = jnp.clip(jnp.searchsorted(ids, tokens), 0, ids.shape[0] - 1)
        return jnp.where(ids[position] == tokens, position, -1).astype(jnp.int32)

    def advance(self, state: TrieState, tokens: jax.Array) -> TrieState:
        """Consume tokens i32[B]; tokens no symbol uses (padding) leave a row unchanged."""
        trie = self.trie
        compact = self.compact_index(tokens.astype(jnp.int32))
        index = jnp.maximum(compact, 0)
        child = trie.children[state.node, index]
        if not self.has_pending:  # every allowed token continues from the current node
            child = jnp.maximum(child, 0)
            leaf = trie.is_leaf[child]
            completed = self._grammar_advance(state.grammar, jnp.maximum(trie.terminal[child], 0))
            new = TrieState(grammar=_rows_where(leaf, completed, state.grammar), node=jnp.where(leaf, ROOT, child))
            return _rows_where(compact >= 0, new, state)
        continues = child >= 0
        finished = self._grammar_advance(state.grammar, jnp.maximum(trie.terminal[state.node], 0))
        grammar_mid = _rows_where(continues, state.grammar, finished)
        node_mid = jnp.where(continues, child, trie.children[ROOT, index])
        node_mid = jnp.maximum(node_mid, 0)
        leaf = trie.is_leaf[node_mid]
        completed = self._grammar_advance(grammar_mid, jnp.maximum(trie.terminal[node_mid], 0))
        new = TrieState(grammar=_rows_where(leaf, completed, grammar_mid), node=jnp.where(leaf, ROOT, node_mid))
        return _rows_where(compact >= 0, new, state)

    def replay(self, tokens: jax.Array) -> jax.Array:
        """bool[B, T, M]: `allowed_compact` before each of `tokens` (i32[B, T]), stepped as in sampling."""

        def step(state, column):
            return self.advance(state, column), self.allowed_compact(state)

        _, masks = jax.lax.scan(step, self.init(tokens.shape[0]), tokens.T.astype(jnp.int32))
        return jnp.swapaxes(masks, 0, 1)


def make_trie_constraint(grammar: Grammar, token_table: TokenTable, vocab_size: int) -> TokenTrieConstraint:
    """The constraint for `grammar` whose symbols are written as `token_table` (see
    `tokenizer_token_table`, `identity_token_table`) in a vocabulary of `vocab_size` tokens."""
    if len(token_table) != grammar.vocab_size:
        raise ValueError(
            f"make_trie_constraint: token_table has {len(token_table)} entries, the grammar {grammar.vocab_size} symbols"
        )
    trie = build_symbol_trie(token_table)
    largest = int(np.max(np.asarray(trie.token_ids)))
    if largest >= vocab_size:
        raise ValueError(f"make_trie_constraint: token id {largest} is outside the vocabulary of {vocab_size} tokens")
    check_unambiguous(grammar, trie)
    terminal, is_leaf = np.asarray(trie.terminal), np.asarray(trie.is_leaf)
    has_pending = bool(np.any((terminal >= 0) & ~is_leaf))
    return TokenTrieConstraint(grammar=grammar, trie=trie, vocab_size=int(vocab_size), has_pending=has_pending)


def max_completion_tokens(grammar: Grammar, trie: SymbolTrie) -> int:
    """Tokens that always hold a complete sample: `<eos>` plus max_length - 1 symbols of at
    most `trie.depth` tokens each."""
    return (grammar.max_length - 1) * trie.depth + 1


def symbols_of_tokens(trie: SymbolTrie, tokens: Sequence[int]) -> list[int]:
    """The symbol ids a token sequence stands for, read as the constraint reads it
    (continuation wins; tokens outside the trie are skipped). ValueError on a token that
    fits neither a continuation nor a new symbol."""
    token_ids = np.asarray(trie.token_ids)
    children, terminal, is_leaf = (np.asarray(a) for a in (trie.children, trie.terminal, trie.is_leaf))
    lookup = {int(t): i for i, t in enumerate(token_ids)}
    symbols, node = [], ROOT
    for position, token in enumerate(int(t) for t in tokens):
        compact = lookup.get(token)
        if compact is None:
            continue
        child = int(children[node, compact])
        if child < 0:
            if terminal[node] < 0 or children[ROOT, compact] < 0:
                raise ValueError(f"symbols_of_tokens: token {token} at position {position} continues no symbol")
            symbols.append(int(terminal[node]))
            child = int(children[ROOT, compact])
        node = child
        if is_leaf[node]:
            symbols.append(int(terminal[node]))
            node = ROOT
    if node != ROOT:
        if terminal[node] < 0:
            raise ValueError("symbols_of_tokens: the tokens end inside a symbol")
        symbols.append(int(terminal[node]))
    return symbols
