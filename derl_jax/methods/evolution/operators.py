"""Evolutionary operators on reward expression trees (the evolution baseline, REvolve-like).

Everything works on `derl_jax.expr.ast` trees and draws randomness only from a
`numpy.random.Generator`, so the same seed gives the same trees. Results always respect
the tree limits (`MAX_NODES` nodes, `MAX_DEPTH` levels) and the grammar's rules: constants
are non-negative `Num`s (a negative constant is `Unary("neg", Num(c))`), the exponent of
`**` stays a constant, and `Call`s have their exact arity.

    rng = np.random.default_rng(0)
    tree = random_expr(rng, num_primitives=4, max_depth=4)
    child = mutate(tree, rng, num_primitives=4)
    mixed = crossover(tree, child, rng)

Under the "paper" operator set (`operators="paper"`, `derl_jax.expr.parse.OPERATOR_SETS`) the
random trees and every mutation stay inside `+ - * /`, unary minus, primitives and constants:
no `u`, `**` or function is drawn, and the `wrap` mutation does not apply; crossover only
recombines its parents' subtrees, so paper parents give paper children.

Selection, generations and the population state are in `derl_jax.methods.evolution.population`.

Nodes are addressed by paths: tuples of child indices from the root (`()` is the root;
`(1, 0)` is the first child of the root's second child), in `ast.children` order.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from derl_jax.expr.ast import (BINARY_OPS, FUNCTIONS, PROGRESS_VAR, Binary, Call, Expr, Num, Prim, Unary, Var,
                               children, depth, node_count)

MAX_NODES = 128
MAX_DEPTH = 32
EXPONENTS = (0.5, 2.0, 3.0)
CONSTANT_LOG10_RANGE = (-1.0, 1.0)  # random constants are log-uniform in [0.1, 10]
CONSTANT_DIGITS = 2  # significant digits of random constants, to keep texts short
FACTOR_RANGE = (0.5, 2.0)  # a perturbed constant is multiplied by a log-uniform factor in here
REPLACEMENT_DEPTH = 3  # depth of random subtrees put in by mutation
MUTATIONS = ("perturb_constant", "swap_leaf", "change_operator", "replace_subtree", "wrap", "promote_child")
PAPER_KINDS = ("+", "-", "*", "/", "neg")  # inner nodes of the "paper" operator set

Path = tuple[int, ...]
Accept = Callable[[Expr], bool]


# --------------------------------------------------------------------------- randomness


def as_generator(key_or_rng: Any) -> np.random.Generator:
    """A NumPy Generator from a Generator (used as is), an int seed, or a JAX PRNG key."""
    if isinstance(key_or_rng, np.random.Generator):
        return key_or_rng
    if isinstance(key_or_rng, (int, np.integer)) and not isinstance(key_or_rng, bool):
        return np.random.default_rng(int(key_or_rng))
    try:
        import jax

        if isinstance(key_or_rng, jax.Array):
            data = jax.random.key_data(key_or_rng) if jax.dtypes.issubdtype(key_or_rng.dtype, jax.dtypes.prng_key) else key_or_rng
            return np.random.default_rng(np.asarray(data, np.uint32).ravel().tolist())
    except ImportError:  # pragma: no cover - jax is a core dependency
        pass
    raise TypeError(f"expected a numpy Generator, an int seed or a JAX PRNG key, got {type(key_or_rng).__name__}")


def random_constant(rng: np.random.Generator) -> float:
    """Log-uniform in [0.1, 10], rounded to `CONSTANT_DIGITS` significant digits."""
    return _round_constant(10.0 ** rng.uniform(*CONSTANT_LOG10_RANGE))


def _round_constant(value: float) -> float:
    return float(f"{value:.{CONSTANT_DIGITS}g}")


# --------------------------------------------------------------------------- paths


def node_paths(expr: Expr) -> list[Path]:
    """Paths of all nodes of `expr` in pre-order (the same order as `ast.walk`)."""
    paths: list[Path] = []

    def visit(node: Expr, path: Path) -> None:
        paths.append(path)
        for i, child in enumerate(children(node)):
            visit(child, path + (i,))

    visit(expr, ())
    return paths


def subtree_at(expr: Expr, path: Path) -> Expr:
    node = expr
    for step, index in enumerate(path):
        kids = children(node)
        if not 0 <= index < len(kids):
            raise IndexError(f"subtree_at: path {path} leaves the tree at step {step} ({type(node).__name__})")
        node = kids[index]
    return node


def replace_subtree_at(expr: Expr, path: Path, new: Expr) -> Expr:
    """`expr` with the node at `path` replaced by `new` (a new tree; `expr` is unchanged)."""
    if not path:
        return new
    kids = list(children(expr))
    if not 0 <= path[0] < len(kids):
        raise IndexError(f"replace_subtree_at: path {path} leaves the tree at a {type(expr).__name__}")
    kids[path[0]] = replace_subtree_at(kids[path[0]], path[1:], new)
    return _with_children(expr, kids)


def _with_children(expr: Expr, kids: Sequence[Expr]) -> Expr:
    if isinstance(expr, Unary):
        return Unary(expr.op, kids[0])
    if isinstance(expr, Binary):
        return Binary(expr.op, kids[0], kids[1])
    if isinstance(expr, Call):
        return Call(expr.fn, tuple(kids))
    return expr


def in_exponent(expr: Expr, path: Path) -> bool:
    """Whether `path` is inside the (constant) right operand of a `**`."""
    node = expr
    for index in path:
        if isinstance(node, Binary) and node.op == "**" and index == 1:
            return True
        node = children(node)[index]
    return False


def editable_paths(expr: Expr) -> list[Path]:
    """Paths whose subtree may be replaced freely: every node outside `**` exponents."""
    return [p for p in node_paths(expr) if not in_exponent(expr, p)]


# --------------------------------------------------------------------------- validation


def check_expr(expr: Expr, num_primitives: int, *, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH, where: str = "expr") -> None:
    """Raise ValueError if `expr` is not a well-formed tree within the limits."""
    _check_num_primitives(num_primitives, where)
    for path in node_paths(expr):
        node = subtree_at(expr, path)
        problem = _node_problem(node, num_primitives)
        if problem:
            raise ValueError(f"{where}: node at path {path} {problem}")
        if isinstance(node, Binary) and node.op == "**" and not is_constant(node.right):
            raise ValueError(f"{where}: node at path {path}: the exponent of '**' must be constant")
    count, levels = node_count(expr), depth(expr)
    if count > max_nodes or levels > max_depth:
        raise ValueError(f"{where}: {count} nodes / depth {levels} exceeds the limits {max_nodes} / {max_depth}")


def _node_problem(node: Any, num_primitives: int) -> str | None:
    if isinstance(node, Num):
        ok = isinstance(node.value, (int, float)) and math.isfinite(node.value) and node.value >= 0
        return None if ok else f"is Num({node.value!r}); constants must be finite and >= 0"
    if isinstance(node, Var):
        return None if node.name == PROGRESS_VAR else f"is Var({node.name!r}); only {PROGRESS_VAR!r} exists"
    if isinstance(node, Prim):
        return None if 0 <= node.index < num_primitives else f"is primitive {node.index}, outside 0..{num_primitives - 1}"
    if isinstance(node, Unary):
        return None if node.op == "neg" else f"has unknown unary op {node.op!r}"
    if isinstance(node, Binary):
        return None if node.op in BINARY_OPS else f"has unknown binary op {node.op!r}"
    if isinstance(node, Call):
        if FUNCTIONS.get(node.fn) != len(node.args):
            return f"calls {node.fn!r} with {len(node.args)} arguments"
        return None
    return f"is a {type(node).__name__}, not an Expr node"


def is_constant(expr: Expr) -> bool:
    return not any(isinstance(node, (Prim, Var)) for node in _walk(expr))


def _walk(expr: Expr) -> Iterator[Expr]:
    yield expr
    for child in children(expr):
        yield from _walk(child)


def within_limits(expr: Expr, max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH) -> bool:
    return node_count(expr) <= max_nodes and depth(expr) <= max_depth


def _check_num_primitives(num_primitives: int, where: str) -> None:
    if isinstance(num_primitives, bool) or not isinstance(num_primitives, (int, np.integer)) or num_primitives < 1:
        raise ValueError(f"{where}: num_primitives must be an int >= 1, got {num_primitives!r}")


# --------------------------------------------------------------------------- random trees


def random_leaf(rng: np.random.Generator, num_primitives: int, operators: str = "extended") -> Expr:
    """A primitive (60%), a constant (25%) or the progress variable `u` (15%); under
    operators="paper" a primitive (70%) or a constant (30%)."""
    draw = rng.random()
    if operators == "paper":
        return Num(random_constant(rng)) if draw >= 0.7 else _random_primitive(rng, num_primitives)
    if draw < 0.6:
        index = int(rng.integers(num_primitives))
        return Prim(index, f"g{index + 1}")
    if draw < 0.85:
        return Num(random_constant(rng))
    return Var(PROGRESS_VAR)


def _random_primitive(rng: np.random.Generator, num_primitives: int) -> Prim:
    index = int(rng.integers(num_primitives))
    return Prim(index, f"g{index + 1}")


def uses_only(expr: Expr, operators: str) -> bool:
    """Whether `expr` keeps to the operator set `operators` (always True for "extended")."""
    if operators != "paper":
        return True
    return not any(isinstance(node, (Var, Call)) or (isinstance(node, Binary) and node.op == "**") for node in _walk(expr))


# (kind, weight): kinds of inner node random_expr draws, by how often.
_INNER_KINDS = (("+", 4.0), ("-", 1.5), ("*", 3.0), ("/", 1.5), ("**", 0.4), ("neg", 0.6), ("min", 0.7), ("max", 0.7), ("abs", 0.3), ("clip", 0.5))
_INNER_ARITY = {"+": 2, "-": 2, "*": 2, "/": 2, "**": 2, "neg": 1, "min": 2, "max": 2, "abs": 1, "clip": 3}
# nodes a kind may need at least: the node and one per argument; clip's lower bound can be -1 (2 nodes)
_INNER_MIN_NODES = {**{kind: 1 + arity for kind, arity in _INNER_ARITY.items()}, "clip": 5}


def random_expr(key_or_rng: Any, num_primitives: int, max_depth: int = 4, *, max_nodes: int = MAX_NODES,
                operators: str = "extended") -> Expr:
    """A random tree of at most `max_depth` levels and `max_nodes` nodes ("grow" method) in the
    operator set `operators` (module docstring).

    key_or_rng: a numpy Generator, an int seed or a JAX key (see `as_generator`).
    """
    _check_num_primitives(num_primitives, "random_expr")
    if isinstance(max_depth, bool) or not isinstance(max_depth, (int, np.integer)) or not 1 <= max_depth <= MAX_DEPTH:
        raise ValueError(f"random_expr: max_depth must be an int in 1..{MAX_DEPTH}, got {max_depth!r}")
    if not 1 <= max_nodes <= MAX_NODES:
        raise ValueError(f"random_expr: max_nodes must be in 1..{MAX_NODES}, got {max_nodes!r}")
    rng = as_generator(key_or_rng)
    return _grow(rng, num_primitives, max_depth, max_nodes, is_root=True, operators=operators)


def _grow(rng: np.random.Generator, num_primitives: int, levels: int, budget: int, is_root: bool = False,
          operators: str = "extended") -> Expr:
    leaf_probability = 0.05 if is_root else 0.35
    kinds = [(k, w) for k, w in _INNER_KINDS if _INNER_MIN_NODES[k] <= budget
             and (operators != "paper" or k in PAPER_KINDS)]
    if levels <= 1 or not kinds or rng.random() < leaf_probability:
        return random_leaf(rng, num_primitives, operators)
    weights = np.array([w for _, w in kinds])
    kind = kinds[int(rng.choice(len(kinds), p=weights / weights.sum()))][0]
    remaining = budget - 1
    if kind == "**":
        base = _grow(rng, num_primitives, levels - 1, remaining - 1)
        return Binary("**", base, Num(float(rng.choice(EXPONENTS))))
    if kind == "clip":
        low, high = _random_bounds(rng, allow_negative=levels >= 3)
        bounded = _grow(rng, num_primitives, levels - 1, remaining - node_count(low) - node_count(high))
        return Call("clip", (bounded, low, high))
    args = []
    arity = _INNER_ARITY[kind]
    for i in range(arity):
        still_needed = arity - i - 1
        child = _grow(rng, num_primitives, levels - 1, remaining - still_needed, operators=operators)
        remaining -= node_count(child)
        args.append(child)
    if kind == "neg":
        return Unary("neg", args[0])
    if kind in BINARY_OPS:
        return Binary(kind, args[0], args[1])
    return Call(kind, tuple(args))


def _random_bounds(rng: np.random.Generator, allow_negative: bool = True) -> tuple[Expr, Expr]:
    """Constant bounds `low < high` for `clip`: low in {0, -1} (-1 is two nodes deep), high in {0.5, 1, 2}."""
    high = Num(float(rng.choice((0.5, 1.0, 2.0))))
    negative = rng.random() >= 0.7
    low: Expr = Unary("neg", Num(1.0)) if negative and allow_negative else Num(0.0)
    return low, high


# --------------------------------------------------------------------------- mutation


def mutate(
    expr: Expr,
    rng: np.random.Generator,
    num_primitives: int,
    *,
    max_nodes: int = MAX_NODES,
    max_depth: int = MAX_DEPTH,
    accept: Accept | None = None,
    attempts: int = 32,
    operators: str = "extended",
) -> Expr:
    """One random point mutation of `expr` (a different tree within the limits).

    Draws one of `MUTATIONS` that applies and retries (up to `attempts`) when the result
    breaks a limit, equals `expr`, or fails `accept` (an extra predicate, e.g. a text length
    check). If no attempt succeeds, `expr` is returned unchanged. Under operators="paper"
    `wrap` is never drawn and the others draw only paper nodes (module docstring).
    """
    rng = as_generator(rng)
    check_expr(expr, num_primitives, max_nodes=max_nodes, max_depth=max_depth, where="mutate")
    names = tuple(m for m in MUTATIONS if operators != "paper" or m != "wrap")
    for _ in range(attempts):
        name = names[int(rng.integers(len(names)))]
        candidate = _MUTATION_FNS[name](expr, rng, num_primitives, operators=operators)
        if candidate is None or candidate == expr:
            continue
        if within_limits(candidate, max_nodes, max_depth) and (accept is None or accept(candidate)):
            return candidate
    return expr


def _pick(rng: np.random.Generator, items: Sequence[Any]) -> Any:
    return items[int(rng.integers(len(items)))]


def perturb_constant(expr: Expr, rng: np.random.Generator, num_primitives: int, operators: str = "extended") -> Expr | None:
    """Multiply a constant by a log-uniform factor in `FACTOR_RANGE`; an exponent becomes another of `EXPONENTS`."""
    paths = [p for p in node_paths(expr) if isinstance(subtree_at(expr, p), Num)]
    if not paths:
        return None
    path = _pick(rng, paths)
    value = subtree_at(expr, path).value
    if in_exponent(expr, path):
        new_value = float(_pick(rng, [e for e in EXPONENTS if e != value]))
    elif value == 0:
        new_value = random_constant(rng)
    else:
        factor = math.exp(rng.uniform(math.log(FACTOR_RANGE[0]), math.log(FACTOR_RANGE[1])))
        new_value = _round_constant(value * factor)
    return replace_subtree_at(expr, path, Num(new_value))


def swap_leaf(expr: Expr, rng: np.random.Generator, num_primitives: int, operators: str = "extended") -> Expr | None:
    """Turn a primitive or `u` into a different primitive or `u` (a primitive under "paper")."""
    paths = [p for p in node_paths(expr) if isinstance(subtree_at(expr, p), (Prim, Var))]
    if not paths:
        return None
    path = _pick(rng, paths)
    current = subtree_at(expr, path)
    options: list[Expr] = [Prim(i, f"g{i + 1}") for i in range(num_primitives)]
    options += [Var(PROGRESS_VAR)] if operators != "paper" else []
    options = [o for o in options if o != current]
    if not options:
        return None
    return replace_subtree_at(expr, path, _pick(rng, options))


def change_operator(expr: Expr, rng: np.random.Generator, num_primitives: int, operators: str = "extended") -> Expr | None:
    """Change a binary operator, or `min` <-> `max`. `**` is only chosen over a constant right
    operand, and never under "paper"."""
    paths = []
    for p in editable_paths(expr):
        node = subtree_at(expr, p)
        if isinstance(node, Binary) or (isinstance(node, Call) and node.fn in ("min", "max")):
            paths.append(p)
    if not paths:
        return None
    path = _pick(rng, paths)
    node = subtree_at(expr, path)
    if isinstance(node, Call):
        return replace_subtree_at(expr, path, Call("max" if node.fn == "min" else "min", node.args))
    options = [op for op in BINARY_OPS if op != node.op and (op != "**" or (is_constant(node.right) and operators != "paper"))]
    return replace_subtree_at(expr, path, Binary(_pick(rng, options), node.left, node.right))


def replace_with_random_subtree(expr: Expr, rng: np.random.Generator, num_primitives: int,
                                operators: str = "extended") -> Expr | None:
    """Replace a subtree outside exponents by a fresh random one of depth <= `REPLACEMENT_DEPTH`."""
    path = _pick(rng, editable_paths(expr))
    new = random_expr(rng, num_primitives, max_depth=REPLACEMENT_DEPTH, max_nodes=16, operators=operators)
    return replace_subtree_at(expr, path, new)


def wrap_in_bound(expr: Expr, rng: np.random.Generator, num_primitives: int, operators: str = "extended") -> Expr | None:
    """Wrap a subtree in `min(., c)`, `max(., c)` or `clip(., low, high)`."""
    path = _pick(rng, editable_paths(expr))
    node = subtree_at(expr, path)
    kind = _pick(rng, ("min", "max", "clip"))
    if kind == "clip":
        low, high = _random_bounds(rng)
        wrapped = Call("clip", (node, low, high))
    else:
        wrapped = Call(kind, (node, Num(random_constant(rng) if kind == "min" else 0.0)))
    return replace_subtree_at(expr, path, wrapped)


def promote_child(expr: Expr, rng: np.random.Generator, num_primitives: int, operators: str = "extended") -> Expr | None:
    """Delete an inner node by putting one of its (non-exponent) children in its place."""
    paths = [p for p in editable_paths(expr) if children(subtree_at(expr, p))]
    if not paths:
        return None
    path = _pick(rng, paths)
    node = subtree_at(expr, path)
    kids = [node.left] if isinstance(node, Binary) and node.op == "**" else list(children(node))
    return replace_subtree_at(expr, path, _pick(rng, kids))


_MUTATION_FNS: dict[str, Callable[..., Expr | None]] = {
    "perturb_constant": perturb_constant,
    "swap_leaf": swap_leaf,
    "change_operator": change_operator,
    "replace_subtree": replace_with_random_subtree,
    "wrap": wrap_in_bound,
    "promote_child": promote_child,
}


# --------------------------------------------------------------------------- crossover


def crossover(
    a: Expr,
    b: Expr,
    rng: np.random.Generator,
    *,
    max_nodes: int = MAX_NODES,
    max_depth: int = MAX_DEPTH,
    accept: Accept | None = None,
    attempts: int = 32,
) -> Expr:
    """A child holding material of both parents: a random subtree of one parent put in place
    of a random non-root subtree of the other (outside `**` exponents).

    The receiving parent is `a` unless `a` is a single node; two single nodes are joined
    by `+` or `*`. Retries (up to `attempts`) when the child breaks a limit, equals a
    parent, or fails `accept`; falls back to `a`.
    """
    rng = as_generator(rng)
    for where, parent in (("crossover parent a", a), ("crossover parent b", b)):
        _check_tree_shape(parent, where, max_nodes, max_depth)
    receiver, donor = (a, b) if node_count(a) > 1 else (b, a)
    if node_count(receiver) == 1:
        child = Binary(_pick(rng, ("+", "*")), a, b)
        return child if within_limits(child, max_nodes, max_depth) and (accept is None or accept(child)) else a
    receiver_paths = [p for p in editable_paths(receiver) if p]
    donor_paths = editable_paths(donor)
    for _ in range(attempts):
        target = _pick(rng, receiver_paths)
        graft = subtree_at(donor, _pick(rng, donor_paths))
        child = replace_subtree_at(receiver, target, graft)
        if child in (a, b) or not within_limits(child, max_nodes, max_depth):
            continue
        if accept is None or accept(child):
            return child
    return a


def _check_tree_shape(expr: Expr, where: str, max_nodes: int, max_depth: int) -> None:
    for node in _walk(expr):
        if not isinstance(node, (Num, Var, Prim, Unary, Binary, Call)):
            raise ValueError(f"{where}: contains a {type(node).__name__}, not an Expr node")
    if not within_limits(expr, max_nodes, max_depth):
        raise ValueError(f"{where}: {node_count(expr)} nodes / depth {depth(expr)} exceeds {max_nodes} / {max_depth}")
