"""Primitive aliases work wherever a primitive's name does; a registered primitive left out of the
run is named with the way to add it; every mode writes config.json.

The launcher runs in process with the fake inner loop of test_launch (the real arith domain)."""

from __future__ import annotations

import json
import os

import pytest

from derl_jax.config import InputError
from derl_jax.expr.canonical import canonical
from derl_jax.expr.parse import parse
from derl_jax.experiment.run import check_expression
from primitives import registry
from test_launch import invoke, launcher  # noqa: F401  (the fixture)

ARITH = ("correct", "boxed", "steps")


def test_the_symbols_of_a_run_are_indices_names_and_aliases():
    table = registry.expression_symbols("arith", ARITH + ("not_registered",))
    assert table == {"g1": 0, "correct": 0, "outcome": 0, "g2": 1, "boxed": 1, "format": 1, "g3": 2, "steps": 2,
                     "g4": 3, "not_registered": 3}
    aliased = "outcome + 0.5*format*(1-u) + g3/format_x"
    assert registry.with_names(aliased, "arith", ARITH) == "correct + 0.5*boxed*(1-u) + g3/format_x"
    text = "outcome+0.25*max(format, steps)"
    assert canonical(parse(registry.with_names(text, "arith", ARITH), ARITH)) == canonical(parse(text, table))
    assert canonical(parse(text, table)) == canonical(parse("g1+0.25*max(g2, g3)", ARITH))


def test_check_expression_reads_aliases_and_suggests_the_extra_primitive():
    assert check_expression("outcome+format", ARITH, domain="arith") == "correct+boxed"
    assert check_expression("g1+0.5*g2", ARITH, domain="arith") == "g1+0.5*g2"
    with pytest.raises(InputError) as info:
        check_expression("correct+gold_anywhere", ARITH, domain="arith")
    assert str(info.value) == ("--expression='correct+gold_anywhere': parse error at 8: unknown name 'gold_anywhere'; "
                               "'gold_anywhere' is a registered arith primitive not in this run: add it with "
                               "--config.primitives.extra=\"('gold_anywhere',)\"")
    with pytest.raises(InputError) as info:
        check_expression("correct+nothing_like_it", ARITH, domain="arith")
    assert "unknown name 'nothing_like_it'" in str(info.value) and "primitives.extra" not in str(info.value)
    with pytest.raises(InputError, match="unknown name 'outcome'"):
        check_expression("outcome", ARITH)      # without the domain no alias is known
    with pytest.raises(InputError, match="^--expression='format\\+outcome\\+': parse error at 15: "):
        check_expression("format+outcome+", ARITH, domain="arith")   # positions in the text as written


@pytest.fixture
def left_out():
    """A primitive registered for arith that the arith runs do not add (removed afterwards)."""
    @registry.register_primitive("ends_early", kind="device", domain="arith", aliases=("early",))
    def ends_early(rollout, context):
        return rollout["mask"].sum(-1) < 4

    yield "ends_early"
    registry.PRIMITIVES.remove(("arith", "ends_early"))


def test_final_mode_with_aliases_trains_the_named_primitives(launcher, tmp_path, capsys, left_out):  # noqa: F811
    # the real script's final mode: test_launch's subprocess runs; here its flags, aliases included
    invoke(launcher, "--mode=final", f"--workdir={tmp_path / 'alias'}", "--expression=outcome+format",
           "--config.final.steps=2")
    invoke(launcher, "--mode=final", f"--workdir={tmp_path / 'names'}", "--expression=correct+boxed")
    aliased = json.load(open(tmp_path / "alias" / "final_result.json"))
    named = json.load(open(tmp_path / "names" / "final_result.json"))
    assert aliased["expression"] == "correct+boxed" and aliased["canonical"] == named["canonical"] == "g1 + g2"
    assert aliased["test"] == named["test"]
    saved = json.load(open(tmp_path / "alias" / "config.json"))     # final mode writes config.json too
    assert saved["final"]["steps"] == 2
    assert saved["domain"]["kind"] == "arith" and saved["name"] == json.load(open(tmp_path / "names" / "config.json"))["name"]
    with pytest.raises(SystemExit) as info:
        invoke(launcher, "--mode=final", f"--workdir={tmp_path / 'missing'}", "--expression=outcome+early")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("launch/run.py: error: --expression='outcome+early': parse error at 8: unknown name 'early'")
    assert err.endswith("add it with --config.primitives.extra=\"('ends_early',)\"") and "\n" not in err
    assert not os.path.exists(tmp_path / "missing" / "config.json")   # nothing written for a rejected input


@pytest.fixture
def token_example():
    """docs/extending.md's token-level primitive, registered from the page's own text."""
    from test_docs import docs_example

    code = docs_example("primitives/my_token_prims.py")
    namespace = {"__name__": "primitives.my_token_prims"}
    exec(compile(code, "primitives/my_token_prims.py", "exec"), namespace)
    yield namespace["answer_after_equals"]
    registry.PRIMITIVES.remove(("arith", "answer_after_equals"))


def _reference(output: str, answer: str) -> float:
    """The example's definition on the decoded output string."""
    at = output.rfind("=")
    return float(at >= 0 and at + 1 < len(output) and output[at + 1] == answer[0])


def test_the_token_level_example_of_the_docs(token_example):
    import jax.numpy as jnp
    import numpy as np

    from primitives.arith import EOS_ID, arith_tokenizer
    from primitives.spans import CONTEXT_KEYS

    tokenizer = arith_tokenizer()
    # (generated text, with "$" for EOS, answer): the output stops at the first EOS
    cases = [("1+2=3[3]$", "3"), ("1+2=4[4]$", "3"), ("[12]$", "12"), ("7=1;2=12$", "12"), ("5=", "5"),
             ("3=5$=3", "3"), ("=", "1")]
    width = 10
    tokens = np.zeros((len(cases), width), np.int32)
    mask = np.zeros((len(cases), width), bool)
    answer = np.zeros((len(cases), 3), np.int32)
    for i, (text, gold_text) in enumerate(cases):
        ids = [EOS_ID if c == "$" else tokenizer.id_of(c) for c in text]
        tokens[i, :len(ids)], mask[i, :len(ids)] = ids, True
        answer[i, :len(gold_text)] = [tokenizer.id_of(c) for c in gold_text]
    context = {"answer": jnp.asarray(answer), "answer_len": jnp.asarray([len(g) for _, g in cases], jnp.int32)}
    assert set(context) == set(CONTEXT_KEYS["arith"])
    got = token_example({"tokens": jnp.asarray(tokens), "mask": jnp.asarray(mask)}, context)
    expected = [_reference(text.split("$")[0], gold_text) for text, gold_text in cases]
    assert expected == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]   # "3=5$=3": what follows EOS is no output
    np.testing.assert_array_equal(np.asarray(got), expected)
    names = ("correct", "boxed", "steps", "gold_anywhere", "answer_after_equals")
    assert check_expression("outcome + 0.5*after_eq", names, domain="arith") == "correct + 0.5*answer_after_equals"
    assert registry.missing_hint("arith", names[:4], "after_eq").endswith("=\"('answer_after_equals',)\"")


def test_a_fixed_baseline_reads_aliases():
    from derl_jax.outer import make_strategy

    strategy = make_strategy("fixed:outcome+0.5*format", {"domain": {"kind": "arith"}}, None, ARITH)
    texts, _ = strategy.propose(strategy.init(None), None, 2)
    assert texts == ["correct+0.5*boxed"] * 2 and strategy.name == "fixed:outcome+0.5*format"


def test_the_llm_searchers_read_aliases_as_names():
    """An alias in what the agent submits or Eureka's model answers is its primitive's name."""
    import jax

    from arbo_fakes import ARITH as ARITH_CFG, Replay, completion
    from derl_jax.outer import make_strategy

    script = {"arbo": [completion(calls=[("submit_candidate", '{"expression": "outcome+0.5*format"}'),
                                         ("submit_candidate", '{"expression": "correct+0.5*boxed"}')])],
              "eureka": [completion(["```reward\noutcome*(1+format)\n```", "```reward\ng1+steps\n```"], n=2)]}
    expected = {"arbo": ["correct+0.5*boxed", "correct+0.5*boxed"], "eureka": ["correct*(1+boxed)", "g1+steps"]}
    for method, replies in script.items():
        with Replay(replies) as server:
            strategy = make_strategy(method, {**ARITH_CFG, "arbo": {"agent": {"url": server.url}}}, None, ARITH)
            texts, plan = strategy.propose(strategy.init(jax.random.key(0)), jax.random.key(1), 2)
        assert texts == expected[method], method
    assert [p.note for p in plan.proposals] == ["read from the code block"] * 2
