"""`meta.operators`: the paper's reward language ("paper": + - * / with parentheses and numbers)
and ours ("extended": also u, **, min, max, abs, clip), applied alike to the grammar automaton,
the Meta-Optimizer's prompt, its cold-start corpus, the validity check, evolution's trees and
the config check."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import alfworld, arith, common, gsm8k, household, scienceworld, symbols
from configs import math as math_config
from derl_jax.config import ConfigError
from derl_jax.experiment.checks import validate_config
from derl_jax.experiment.protocol import meta_grammar
from derl_jax.expr import ast, examine
from derl_jax.expr import grammar as G
from derl_jax.expr.parse import ExpressionError, parse
from derl_jax.methods.derl.corpus import cold_start_corpus
from derl_jax.methods.derl.model import meta_prompt
from derl_jax.methods.derl.settings import MetaConfig
from derl_jax.methods.evolution.operators import crossover, mutate, random_expr, uses_only
from derl_jax.methods.evolution.population import EvolutionState
from derl_jax.outer.checks import operator_set

NAMES = ("outcome", "phase_first", "phase_middle", "phase_last")
EXTENDED_ONLY = ("u", "**", "min(", "max(", "abs(", "clip(")
# Table 3's complete rewards and the examples of the paper's text (tests/test_paper_expressions.py has all rows).
PAPER_TEXTS = (
    "g1*(g2-1)/2+(g3+1)*(g4-1)*2/3", "-(g1+0.5*(g2+0.3*(g3-0.2*(g4+0.1*1)))+0.1*1)/1.2",
    "g1+0.01+0.0001*(g2)+0.000001*(g3)+0.00000001*(g4)", "g1*(g2+(g3*(g4/2)))+(g1-(g2+(g3*(g4/2))))*0.5",
    "g1+0.5*(g2+0.5*(g3+0.5*(g4+0.5)))", "g1/(g2+1)", "-(g1+0.5*g2)",
)
# (text, the parser's reason under "paper", its position)
REFUSED = (
    ("g1+0.5*u*g2", "u (training progress) is not in the paper operator set", 7),
    ("g1+0.5*g2**2", "the power '**' is not in the paper operator set", 9),
    ("min(g1,g2)", "the function min() is not in the paper operator set", 0),
    ("g1-0.2*abs(g2-g3)", "the function abs() is not in the paper operator set", 7),
    ("clip(g1+g2,0,1)", "the function clip() is not in the paper operator set", 0),
)


def _sample(grammar, key, batch):
    """`batch` sequences drawn uniformly among the allowed symbols: ids i32[B, T] and the
    allowed sets seen before each symbol, bool[T, B, V]."""
    states = jax.vmap(lambda _: G.init(grammar))(jnp.arange(batch))

    def step(states, step_key):
        masks = jax.vmap(G.allowed, in_axes=(None, 0))(grammar, states)
        symbols = jax.random.categorical(step_key, jnp.where(masks, 0.0, -jnp.inf))
        return jax.vmap(G.advance, in_axes=(None, 0, 0))(grammar, states, symbols), (symbols, masks)

    _, (ids, masks) = jax.lax.scan(step, states, jax.random.split(key, grammar.max_length))
    return ids.T, masks


@pytest.fixture(scope="module")
def paper_samples():
    grammar = G.make_grammar(4, 32, max_depth=4, operators="paper")
    ids, masks = jax.jit(_sample, static_argnums=(0, 2))(grammar, jax.random.key(0), 2000)
    return grammar, np.asarray(ids), np.asarray(masks)


def test_the_paper_automaton_never_allows_u_powers_or_functions(paper_samples):
    grammar, _, masks = paper_samples
    banned = [grammar.symbol_id(s) for s in EXTENDED_ONLY]
    assert not masks[..., banned].any()
    assert not masks[..., grammar.symbol_id(",")].any()   # only calls have argument lists
    # the rest of the language stays reachable: every other symbol but <bos> is allowed somewhere
    others = [i for i, s in enumerate(grammar.symbols) if s not in EXTENDED_ONLY + (",", G.BOS)]
    assert masks[..., others].any(axis=(0, 1)).all()
    # after the same prefix the extended set allows them: the operator set, not the state, removes them
    extended = G.make_grammar(4, 32, max_depth=4)
    for prefix, symbol in (("", "u"), ("g1+", "u"), ("", "clip("), ("g1*", "max("), ("g1", "**"), ("(g2)", "**")):
        assert extended.decode(extended.encode_prefix(prefix + symbol)) == prefix + symbol
        with pytest.raises(ValueError, match="paper operator set"):
            grammar.encode_prefix(prefix + symbol)


def test_paper_samples_are_valid_paper_expressions(paper_samples):
    grammar, ids, _ = paper_samples
    texts = [grammar.decode(row) for row in ids]
    assert len(set(texts)) > 1000
    for text in texts:
        assert not any(s in text for s in EXTENDED_ONLY), text
        tree = parse(text, NAMES, operators="paper")
        assert not any(isinstance(n, (ast.Var, ast.Call)) or (isinstance(n, ast.Binary) and n.op == "**")
                       for n in ast.walk(tree)), text


@pytest.mark.parametrize("text", PAPER_TEXTS)
def test_the_papers_rewards_are_valid_under_paper(text):
    candidate = examine(text, NAMES, operators="paper")
    assert candidate.valid, candidate.reason
    grammar = G.make_grammar(4, 64, max_depth=12, max_decimals=8, operators="paper")
    assert grammar.decode(grammar.encode(text)) == text


@pytest.mark.parametrize("text, reason, position", REFUSED)
def test_an_extended_only_text_is_refused_under_paper_with_its_reason(text, reason, position):
    assert examine(text, NAMES).valid   # the extended set takes it
    candidate = examine(text, NAMES, operators="paper")
    assert not candidate.valid and candidate.structure == "invalid"
    assert candidate.reason.startswith(f"parse error at {position}: {reason}")
    assert "allows + - * /, parentheses, numbers and the primitives" in candidate.reason
    with pytest.raises(ExpressionError) as caught:
        parse(text, NAMES, operators="paper")
    assert caught.value.position == position
    grammar = G.make_grammar(4, 32, max_depth=4, operators="paper")
    with pytest.raises(ValueError, match=f"at character {position} is not allowed .*paper operator set"):
        grammar.encode(text)


def test_the_prompt_under_paper_names_only_the_paper_operators():
    paper = meta_prompt(4, common.AGENT_PRIMITIVE_DESCRIPTIONS, "a task", operators="paper")[1]["content"]
    extended = meta_prompt(4, common.AGENT_PRIMITIVE_DESCRIPTIONS, "a task")[1]["content"]
    for word in ("**", "min(", "max(", "abs(", "clip(", "u,", "fraction of training"):
        assert word not in paper and word in extended, word
    assert "+ - * / and parentheses only" in paper
    with pytest.raises(ValueError, match="operators must be one of"):
        meta_prompt(4, operators="full")


@pytest.mark.parametrize("max_symbols, max_depth, decimals", [(64, 12, 8), (16, 3, 3)])
def test_the_cold_start_corpus_under_paper_has_no_extended_operator(max_symbols, max_depth, decimals):
    grammar = G.make_grammar(4, max_symbols, max_depth=max_depth, max_decimals=decimals, operators="paper")
    corpus = cold_start_corpus(4, 32, 0, grammar=grammar)
    assert len(corpus) == 32 and len(set(corpus)) == 32
    for text in corpus:
        assert not any(s in text for s in EXTENDED_ONLY), text
        assert examine(text, NAMES, operators="paper").valid
        grammar.encode(text)
    extended = cold_start_corpus(4, 32, 0, grammar=G.make_grammar(4, max_symbols, max_depth, decimals))
    assert any(s in text for text in extended for s in EXTENDED_ONLY)
    with pytest.raises(ValueError, match="operators='extended' but the grammar has 'paper'"):
        cold_start_corpus(4, 8, 0, grammar=grammar, operators="extended")


def test_evolution_under_paper_stays_in_the_paper_set():
    rng = np.random.default_rng(0)
    trees = [random_expr(rng, 4, 4, operators="paper") for _ in range(200)]
    children = [mutate(t, rng, 4, operators="paper") for t in trees]
    children += [crossover(a, b, rng) for a, b in zip(trees, children)]
    state = EvolutionState(capacity=8).update(trees[:8], [0.1 * (i + 1) for i in range(8)])
    children += state.propose(rng, 64, num_primitives=4, operators="paper")
    assert all(uses_only(t, "paper") for t in trees + children)
    assert any(not uses_only(random_expr(rng, 4, 4), "paper") for _ in range(50))   # the extended set draws them


def test_preset_operator_sets_and_temperatures():
    for module, preset in ((math_config, None), (math_config, "mixture"), (gsm8k, None), (alfworld, None),
                           (alfworld, "derl_pop"), (scienceworld, None), (scienceworld, "derl_pop")):
        cfg = module.get_config(preset)
        assert cfg.meta.operators == "paper" and cfg.meta.temperature == 0.7, (module.__name__, preset)
        assert meta_grammar(cfg, 4).operators == "paper"
    for module in (arith, symbols, household):
        cfg = module.get_config()
        assert cfg.meta.operators == "extended" and cfg.meta.temperature == 1.0, module.__name__
        assert meta_grammar(cfg, 4).operators == "extended"


def test_meta_config_checks_the_operators():
    with pytest.raises(ValueError, match=r"MetaConfig.operators='full': must be one of \('extended', 'paper'\)"):
        MetaConfig(operators="full")
    with pytest.raises(ValueError, match="MetaConfig.operators='extended' but the grammar has operators='paper'"):
        MetaConfig(operators="extended").check_grammar(G.make_grammar(4, 16, 3, operators="paper"))
    with pytest.raises(ValueError, match="make_grammar: operators must be one of"):
        G.make_grammar(4, 16, 3, operators="full")


def test_a_bad_operator_set_is_one_config_error():
    cfg = arith.get_config("smoke")
    assert operator_set(cfg) == "extended"
    cfg.meta.operators = "full"
    with pytest.raises(ConfigError, match=r"^config.meta.operators must be one of \('extended', 'paper'\), got 'full'$"):
        validate_config(cfg)


@pytest.mark.slow
def test_the_launcher_refuses_a_bad_operator_set_in_one_line(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    workdir = tmp_path / "run"
    done = subprocess.run([sys.executable, os.path.join("launch", "run.py"), "--noprogress",
                           "--config=configs/arith.py:smoke", "--config.meta.operators=paper+", "--mode=search",
                           f"--workdir={workdir}"], capture_output=True, text=True, cwd=root, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == ["launch/run.py: error: config.meta.operators must be one of ('extended', 'paper'), got 'paper+'"]
    assert not workdir.exists() or not any(workdir.iterdir())
