"""Evolutionary operators on expression trees: determinism, limits, crossover, selection."""

import json
import math

import jax
import numpy as np
import pytest

from derl_jax.expr.ast import Binary, Call, Num, Prim, Unary, Var, depth, node_count, primitive_indices, walk
from derl_jax.methods.evolution import operators as evo
from derl_jax.methods.evolution.operators import (
    MAX_DEPTH,
    MAX_NODES,
    crossover,
    mutate,
    node_paths,
    random_expr,
    replace_subtree_at,
    subtree_at,
)
from derl_jax.methods.evolution.population import (
    EvolutionState,
    expr_from_data,
    expr_to_data,
    next_generation,
    tournament_select,
)

G = [Prim(i, f"g{i + 1}") for i in range(6)]


def assert_well_formed(expr, num_primitives):
    """Grammar rules every produced tree must keep, checked node by node."""
    for node in walk(expr):
        if isinstance(node, Num):
            assert math.isfinite(node.value) and node.value >= 0
        elif isinstance(node, Prim):
            assert 0 <= node.index < num_primitives and node.name == f"g{node.index + 1}"
        elif isinstance(node, Var):
            assert node.name == "u"
        elif isinstance(node, Unary):
            assert node.op == "neg"
        elif isinstance(node, Binary):
            assert node.op in ("+", "-", "*", "/", "**")
            if node.op == "**":
                assert not any(isinstance(n, (Prim, Var)) for n in walk(node.right))
        else:
            assert isinstance(node, Call)
            assert len(node.args) == {"min": 2, "max": 2, "abs": 1, "clip": 3}[node.fn]
    assert node_count(expr) <= MAX_NODES and depth(expr) <= MAX_DEPTH


def test_random_expr_is_deterministic_and_respects_depth():
    a = [random_expr(np.random.default_rng(5), 4, max_depth=5) for _ in range(2)]
    assert a[0] == a[1]
    assert random_expr(5, 4, 5) == a[0]  # an int seed means default_rng(seed)
    key = jax.random.key(3)
    assert random_expr(key, 4, 5) == random_expr(jax.random.key(3), 4, 5)
    rng = np.random.default_rng(0)
    trees = [random_expr(rng, 3, max_depth=d) for d in (1, 2, 4, 8, 32) for _ in range(40)]
    for tree in trees:
        assert_well_formed(tree, 3)
    assert all(depth(t) <= 4 for t in trees[80:120])
    assert all(node_count(t) == 1 for t in trees[:40])
    assert len(set(trees)) > 100  # genuinely random


def test_random_expr_node_budget():
    rng = np.random.default_rng(1)
    for _ in range(50):
        tree = random_expr(rng, 4, max_depth=32, max_nodes=20)
        assert node_count(tree) <= 20 and depth(tree) <= 32
    with pytest.raises(ValueError, match="max_depth must be an int in 1..32"):
        random_expr(rng, 4, max_depth=33)
    with pytest.raises(ValueError, match="num_primitives must be an int >= 1"):
        random_expr(rng, 0)


def test_paths_replace_and_lookup():
    tree = Binary("+", G[0], Call("clip", (Binary("*", Num(0.5), G[1]), Num(0.0), Num(1.0))))
    assert node_paths(tree) == [(), (0,), (1,), (1, 0), (1, 0, 0), (1, 0, 1), (1, 1), (1, 2)]
    assert subtree_at(tree, (1, 0, 1)) == G[1]
    replaced = replace_subtree_at(tree, (1, 0, 1), Var())
    assert replaced == Binary("+", G[0], Call("clip", (Binary("*", Num(0.5), Var()), Num(0.0), Num(1.0))))
    assert subtree_at(tree, (1, 0, 1)) == G[1]  # the original is untouched
    with pytest.raises(IndexError, match="leaves the tree"):
        subtree_at(tree, (0, 0))


def test_mutation_is_deterministic_given_seed():
    tree = Binary("+", Binary("*", Num(0.5), G[0]), Binary("**", G[1], Num(2.0)))

    def chain(seed):
        rng = np.random.default_rng(seed)
        return [mutate(tree, rng, 4) for _ in range(20)]

    assert chain(11) == chain(11)
    assert chain(11) != chain(12)


def test_one_thousand_chained_mutations_respect_limits_and_grammar():
    rng = np.random.default_rng(7)
    tree = random_expr(rng, 5, max_depth=4)
    kinds_seen = set()
    for _ in range(1000):
        child = mutate(tree, rng, 5)
        assert child != tree
        assert_well_formed(child, 5)
        kinds_seen.add(type(child).__name__)
        tree = child
    assert {"Binary", "Call"} <= kinds_seen


def test_mutation_near_the_node_limit_stays_within_it():
    def balanced(levels, index=0):
        return G[index % 2] if levels == 1 else Binary("+", balanced(levels - 1, index), balanced(levels - 1, index + 1))

    big = balanced(7)
    assert node_count(big) == 127 and depth(big) == 7
    rng = np.random.default_rng(0)
    for _ in range(200):
        child = mutate(big, rng, 2)
        assert node_count(child) <= MAX_NODES and depth(child) <= MAX_DEPTH


def test_mutation_operators_do_what_they_say():
    rng = np.random.default_rng(3)
    scaled = Binary("*", Num(0.5), G[0])
    for _ in range(30):
        out = evo.perturb_constant(scaled, rng, 4)
        assert 0.25 <= out.left.value <= 1.0 and out.right == G[0]
    power = Binary("**", G[0], Num(2.0))
    assert evo.perturb_constant(power, rng, 4).right.value in (0.5, 3.0)
    swapped = evo.swap_leaf(G[2], rng, 4)
    assert swapped != G[2] and isinstance(swapped, (Prim, Var))
    sum_ = Binary("+", G[0], G[1])
    assert evo.change_operator(sum_, rng, 4).op in ("-", "*", "/")  # '**' needs a constant right side
    assert evo.change_operator(Call("min", (G[0], G[1])), rng, 4) == Call("max", (G[0], G[1]))
    wrapped = evo.wrap_in_bound(G[0], rng, 4)
    assert isinstance(wrapped, Call) and wrapped.fn in ("min", "max", "clip") and wrapped.args[0] == G[0]
    promoted = evo.promote_child(Binary("-", G[0], G[1]), rng, 4)
    assert promoted in (G[0], G[1])
    assert evo.promote_child(power, rng, 4) == Binary("**", G[0], Num(2.0)).left
    assert evo.perturb_constant(G[0], rng, 4) is None


def is_graft_of(child, receiver, donor):
    """True if `child` is `receiver` with one non-root subtree replaced by a subtree of `donor`."""
    donor_subtrees = set(walk(donor))
    for path in node_paths(receiver):
        if not path or not has_path(child, path):
            continue
        if subtree_at(child, path) in donor_subtrees and replace_subtree_at(child, path, subtree_at(receiver, path)) == receiver:
            return True
    return False


def has_path(tree, path):
    try:
        subtree_at(tree, path)
        return True
    except IndexError:
        return False


def test_crossover_grafts_a_subtree_of_b_into_a():
    rng = np.random.default_rng(0)
    grafted = 0
    for _ in range(200):
        a = random_expr(rng, 3, max_depth=4)  # g1..g3
        b = replace_leaves(random_expr(rng, 3, max_depth=4), offset=3)  # g4..g6
        if node_count(a) < 2:
            continue
        child = crossover(a, b, rng)
        assert_well_formed(child, 6)
        if child == a:
            continue  # allowed fallback when no graft differs from a
        assert child != b and is_graft_of(child, a, b), (a, b, child)
        grafted += 1
    assert grafted > 100


def replace_leaves(tree, offset):
    """The same tree with primitive i renamed to i + offset (so parents use disjoint primitives)."""
    for path in node_paths(tree):
        node = subtree_at(tree, path)
        if isinstance(node, Prim):
            tree = replace_subtree_at(tree, path, G[node.index + offset])
    return tree


def test_crossover_children_contain_primitives_of_both_parents():
    a = Binary("+", Binary("*", Num(0.5), G[0]), G[1])
    b = Binary("-", Binary("/", G[3], Num(2.0)), Binary("*", G[4], G[5]))
    rng = np.random.default_rng(4)
    children = [crossover(a, b, rng) for _ in range(100)]
    from_both = [c for c in children if primitive_indices(c) & {0, 1} and primitive_indices(c) & {3, 4, 5}]
    assert len(from_both) >= 60
    assert [crossover(a, b, np.random.default_rng(9)) for _ in range(3)] == [crossover(a, b, np.random.default_rng(9)) for _ in range(3)]
    assert crossover(G[0], G[3], rng) in (Binary("+", G[0], G[3]), Binary("*", G[0], G[3]))


def test_crossover_never_puts_a_primitive_into_an_exponent():
    a = Binary("**", Binary("+", G[0], G[1]), Num(2.0))
    b = Binary("*", G[2], G[3])
    rng = np.random.default_rng(2)
    for _ in range(100):
        assert_well_formed(crossover(a, b, rng), 4)


def test_tournament_prefers_higher_scores():
    scores = [0.1, 0.9, 0.5, float("nan"), 0.3]
    rng = np.random.default_rng(0)
    picks = np.bincount([tournament_select(scores, rng, 2) for _ in range(5000)], minlength=5)
    # P(member wins a 2-tournament) = P(drawn) * P(partner is worse) = 2/5 * (#worse)/4
    expected = np.array([2 / 5 * 1 / 4, 2 / 5, 2 / 5 * 3 / 4, 0.0, 2 / 5 * 2 / 4])
    np.testing.assert_allclose(picks / 5000, expected, atol=0.02)
    assert picks[3] == 0  # NaN (invalid) never wins against a real score


def test_next_generation_keeps_elites_and_is_deterministic():
    population = [G[i] if i < 6 else Binary("+", G[i % 6], Num(float(i))) for i in range(10)]
    scores = [0.05 * i for i in range(10)]  # later members are better
    rng = np.random.default_rng(0)
    generation = next_generation(population, scores, rng, 40, num_primitives=6, elite=2, tournament=3, mutation_rate=1.0)
    assert generation[:2] == [population[9], population[8]]
    assert len(generation) == 40 and len(set(generation)) >= 35
    again = next_generation(population, scores, np.random.default_rng(0), 40, num_primitives=6, elite=2, tournament=3, mutation_rate=1.0)
    assert again == generation
    for tree in generation:
        assert_well_formed(tree, 6)


def test_selection_pressure_statistically():
    """Over many generations from a fixed seed, children descend mostly from high scorers."""
    marker_population = [Binary("+", G[i], Num(1.0)) for i in range(6)]
    scores = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]  # members using g4..g6 are good
    rng = np.random.default_rng(123)
    children = next_generation(marker_population, scores, rng, 300, num_primitives=6, elite=0, tournament=3, mutation_rate=1.0)
    good = sum(bool(primitive_indices(c) & {3, 4, 5}) for c in children)
    bad = sum(bool(primitive_indices(c) & {0, 1, 2}) and not primitive_indices(c) & {3, 4, 5} for c in children)
    # P(best of 3 distinct is a good member) = 1 - C(3,3)/C(6,3) = 0.95; mutations blur it a little
    assert good / len(children) > 0.8 and bad / len(children) < 0.2


def test_next_generation_rejects_bad_input():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="2 scores for 1 members"):
        next_generation([G[0]], [0.1, 0.2], rng, 3, num_primitives=2)
    with pytest.raises(ValueError, match="member 0: node at path \\(\\) is primitive 5"):
        next_generation([G[5]], [0.1], rng, 3, num_primitives=2)
    with pytest.raises(ValueError, match="exponent of '\\*\\*' must be constant"):
        mutate(Binary("**", G[0], G[1]), rng, 2)
    with pytest.raises(ValueError, match="constants must be finite and >= 0"):
        mutate(Num(-1.0), rng, 2)


def test_accept_predicate_is_honoured():
    rng = np.random.default_rng(0)
    short = lambda e: node_count(e) <= 5
    tree = Binary("+", G[0], G[1])
    for _ in range(200):
        tree = mutate(tree, rng, 3, accept=short)
        assert node_count(tree) <= 5


def test_evolution_state_update_propose_and_json():
    state = EvolutionState(capacity=3)
    rng = np.random.default_rng(0)
    first = state.propose(rng, 5, num_primitives=3)
    assert len(first) == 5 and all(node_count(t) >= 1 for t in first)
    state = state.update(first, [0.2, None, 0.9, float("nan"), 0.5])
    assert state.scores == [0.9, 0.5, 0.2] and state.population == [first[2], first[4], first[0]]
    assert state.best == (first[2], 0.9)
    state = state.update([first[0]], [0.95])  # re-scored: keeps the higher score
    assert state.best == (first[0], 0.95) and len(state.members) == 3
    children = state.propose(rng, 6, num_primitives=3)
    assert len(children) == 6
    restored = EvolutionState.from_json(json.loads(json.dumps(state.to_json())))
    assert restored == state
    with pytest.raises(ValueError, match="malformed"):
        EvolutionState.from_json({"members": [[["bogus"], 1.0]], "capacity": 2})


def test_expr_data_round_trip():
    rng = np.random.default_rng(8)
    for _ in range(100):
        tree = random_expr(rng, 4, max_depth=6)
        assert expr_from_data(json.loads(json.dumps(expr_to_data(tree)))) == tree
