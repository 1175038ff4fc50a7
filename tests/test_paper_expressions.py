"""Every reward expression the DERL paper prints can be written under the paper presets' grammar.

Transcribed from the paper: Table 3 (Appendix E: the Meta-Rewards of four outer iterations on
ALFWorld L2, with the validation score each got), the examples of Appendix A.2 and of §4.2.
Three kinds of rows:

* complete expressions: they parse, pass the check (`derl_jax.expr.examine`) and the grammar
  automaton of every paper preset encodes them (`Grammar.encode`: every symbol allowed in turn);
* expressions the table prints cut off with "...": the printed beginning is one the automaton
  can write (`Grammar.encode_prefix`: every symbol allowed, room left to finish), except the
  one row that writes a power of constants (`0.5**2*...+0.25**`, scored 0): the paper presets'
  operator set ("paper": + - * / and parentheses, Eq. 3) has no `**`, so their automaton
  refuses it at the `**`, and the same grammar with the "extended" set writes it;
* expressions with one ")" too many (the table scores them 0, the score of an expression that
  does not execute): the parser and the automaton both refuse them.

The scratch presets' grammar (3 decimals) cannot write them all, which is why the paper presets
carry their own (configs/common.py PAPER_GRAMMAR).
"""

from __future__ import annotations

import pytest

from configs import alfworld, common, gsm8k, scienceworld
from configs import arith
from configs import math as math_config
from derl_jax.experiment.protocol import meta_grammar
from derl_jax.expr import examine
from derl_jax.expr.grammar import make_grammar

NAMES = ("outcome", "phase_first", "phase_middle", "phase_last")

# (expression, the validation score Table 3 gives it; None: an example of the text)
COMPLETE = [
    # Table 3, step 0
    ("g1*(g2-1)/2+(g3+1)*(g4-1)*2/3", 0.0),
    ("g1*(g2+(g3-1.0)*(g4-0.0))", 0.0234),
    ("g1+0.5*(g2+0.5*(g3+0.5*(g4+0.5)))", 0.8848),
    ("g1*(g2+2*(g3/3))+(g4-4*(g2-1))-2.0", 0.8945),
    # step 1
    ("-(g1+0.5*(g2+0.3*(g3-0.2*(g4+0.1*1)))+0.1*1)/1.2", 0.0020),
    ("g1+(g2*(g3/2))-(g4/3)", 0.8594),
    ("g1*(g2+0.5)+0.2*(g3*0.3+0.1)-0.1*(g4*0.2+0.5)", 0.8477),
    ("g1+2*(g2+3*(g3-2))*0.1+4*0.3-5*(g4+1)", 0.8984),
    ("g1*(g2-1)/2+(g3-1)/3+(g4-1)/4+3.0", 0.0098),
    # step 2
    ("g1+(g2*(g3/2))-(g4/4)", 0.8438),
    ("g1+0.01+0.0001*(g2)+0.000001*(g3)+0.00000001*(g4)", 0.8652),
    ("g1*(g2+(g3*(g4/2)))+(g1-(g2+(g3*(g4/2))))*0.5", 0.8867),
    ("g1+0.5*(g2-0.5)+0.2*(g3-0.5)+0.1*(g4-0.5)", 0.8906),
    # step 3
    ("g1+(g2/2.0)-(g3*0.1)+(g4*0.05)", 0.8438),
    ("g1+0.5*(g2+0.5*(g3+0.5*(g4+0.5)))", 0.875),
    ("g1+0.05*(g2+0.05*(g3+0.05*(g4+0.05)))", 0.8242),
    ("g1+0.5*(g2/2.0)+0.1*(g3*2.0)+0.25*(g4/4.0)", 0.8632),
    ("g1+0.5*(g2+0.4*(g3+0.2*(g4+0.1)))", 0.8496),
    ("g1+0.5*(g2+0.5*(g3+0.5*(g4+0.5)))", 0.8926),
    ("g1+0.5*(g2+0.5*(g3+0.5*(g4+0.5)))", 0.8789),
    ("g1+(g2*(g3/2))-(g4/3)", 0.8984),
    # Appendix A.2 (agent, math) and §4.2 (stable, unstable and invalid structures)
    ("g1+(g2*(g3/2))-(g4/3)", None),
    ("g1+0.5*g2+0.1*(g3+g4)", None),
    ("0.5*g1+0.8*g2", None),
    ("g1/(g2+1)", None),
    ("g1*(g2+0.2)*g3", None),
    ("-(g1+0.5*g2)", None),
]
# Table 3's cut-off rows: the text up to the "..."
CUT_OFF = [
    ("g1+0.5*(g2+0.5*(g3+0.5*(g4))))-0.5*(g2+0.5*(g3+", 0.0),                       # step 0; a ")" too many
    ("g1+0.01*(g2-0.001)+0.0001*(g3-0.0001)+0.000005*(g4-", 0.8496),                 # step 0
    ("g1*0.5+0.2*(g2+0.1)-0.3/2+0.4*(g3*0.1)+0.1*(g4*", 0.8789),                     # step 0
    ("(0.5*(g1-0.1))+(0.5*(g2-0.1))+(0.5*(g3-0.1))+(0.5*", 0.7793),                  # step 1
    ("g1*(g2+(g3*(g4-(g2+(g3*(g4-(g3*(g4-(g3*(g4-(g3*", 0.0),                      # step 1
    ("g1*(g2-1)*(1-0.5)+0.5**2*(g3-1)*(1-0.25)+0.25**", 0.0),                      # step 1
    ("g1+0.5*(g2-0.5)+0.3*(g3-0.05)+0.2*(g4+0.05)-0.2*", 0.0),                     # step 2
    ("g1*0.99+0.01*(g2+0.99)+0.005*(g3+0.99)+0.0005*(g4+", 0.8477),                 # step 2
]
UNBALANCED = [
    "g1+0.5*(g2+0.5*(g3+0.5*(g4))))",           # step 2, score 0 (and the beginning of a cut-off row of step 0)
    "g1+0.5*(g2+0.2*(g3+0.1*(g4+0.05))))",      # step 0, score 0
    "g1+0.5*(g2+0.5*(g3+0.5*(g4-1))))",         # step 2, score 0
]
WRITABLE_CUT_OFF = [text for text, _ in CUT_OFF if not text.startswith(UNBALANCED[0]) and "**" not in text]
POWER_CUT_OFF = [text for text, _ in CUT_OFF if "**" in text]

PAPER_PRESETS = [(module, preset) for module, presets in (
    (math_config, ("default", "mixture")), (gsm8k, ("default", "mixture")),
    (alfworld, ("default", "derl_pop")), (scienceworld, ("default", "derl_pop"))) for preset in presets]


def paper_grammars():
    """{"config:preset": the Meta-Optimizer's grammar} of every paper preset."""
    return {f"{module.__name__.split('.')[-1]}:{preset}": meta_grammar(module.get_config(preset), len(NAMES))
            for module, preset in PAPER_PRESETS}


@pytest.fixture(scope="module")
def grammar():
    """The one grammar every paper preset shares (tested below)."""
    return next(iter(paper_grammars().values()))


def test_every_paper_preset_has_the_paper_grammar():
    grammars = paper_grammars()
    for name, cfg in ((n, m.get_config(p)) for (m, p), n in zip(PAPER_PRESETS, grammars)):
        assert {k: cfg.meta[k] for k in common.PAPER_GRAMMAR} == common.PAPER_GRAMMAR, name
    assert len(set(grammars.values())) == 1
    only = next(iter(grammars.values()))
    assert (only.max_length, only.max_depth, only.max_decimals, only.operators) == (64, 12, 8, "paper")


def test_the_transcription_is_the_whole_table():
    scored = [score for _, score in COMPLETE if score is not None] + [score for _, score in CUT_OFF]
    assert len(scored) + len(UNBALANCED) == 32   # 4 iterations x 8 candidates
    assert sum(score == 0 for score in scored) + len(UNBALANCED) == 8   # the rows the table scores 0


@pytest.mark.parametrize("text", sorted({text for text, _ in COMPLETE}))
def test_complete_expressions_parse_pass_the_check_and_are_written_by_the_automaton(text, grammar):
    candidate = examine(text, NAMES, operators="paper")
    assert candidate.valid, candidate.reason
    ids = grammar.encode(text)
    assert grammar.decode(ids) == text and ids[-1] == grammar.eos_id


@pytest.mark.parametrize("text", WRITABLE_CUT_OFF)
def test_the_beginnings_of_cut_off_expressions_are_written_by_the_automaton(text, grammar):
    ids = grammar.encode_prefix(text)
    assert grammar.decode(ids) == text and grammar.eos_id not in ids
    assert not examine(text, NAMES).valid   # cut off, they are not yet expressions


def test_the_cut_off_row_with_a_power_is_outside_the_paper_operator_set(grammar):
    assert len(POWER_CUT_OFF) == 1 and grammar.operators == "paper"
    text = POWER_CUT_OFF[0]
    with pytest.raises(ValueError, match=r"symbol '\*\*' at character 21 is not allowed .*paper operator set"):
        grammar.encode_prefix(text)
    extended = make_grammar(grammar.num_primitives, grammar.max_length, grammar.max_depth, grammar.max_decimals)
    assert extended.decode(extended.encode_prefix(text)) == text


@pytest.mark.parametrize("text", UNBALANCED + [CUT_OFF[0][0]])
def test_expressions_with_a_parenthesis_too_many_are_refused(text, grammar):
    candidate = examine(text, NAMES)
    assert not candidate.valid and "unbalanced ')'" in candidate.reason
    with pytest.raises(ValueError, match=r"symbol '\)' at character \d+ is not allowed after a complete operand"):
        grammar.encode_prefix(text)


def test_the_scratch_grammar_cannot_write_them_all():
    cfg = arith.get_config()
    scratch = meta_grammar(cfg, len(NAMES))
    assert (scratch.max_length, scratch.max_depth, scratch.max_decimals) == (32, 4, 3)
    with pytest.raises(ValueError, match=r"symbol '1' at character 8 is not allowed inside the decimal part"):
        scratch.encode("g1+0.0001*g2")   # Table 3 writes 0.0001, 0.000005 and 0.00000001
    with pytest.raises(ValueError, match="more than max_length=32"):
        scratch.encode("-(g1+0.5*(g2+0.3*(g3-0.2*(g4+0.1*1)))+0.1*1)/1.2")
    deep = make_grammar(4, 64, max_depth=4, max_decimals=8)
    deep.encode_prefix("g1*(g2+(g3*(g4-(g2+")   # 4 contexts open
    with pytest.raises(ValueError, match=r"symbol '\(' at character 19 is not allowed"):
        deep.encode_prefix("g1*(g2+(g3*(g4-(g2+(g3*")   # Table 3 opens 11
