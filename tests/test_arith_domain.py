"""The arithmetic domain: tokenizer, problem generator, reference solutions, device primitives."""

import ast
import dataclasses
import itertools
import os
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import primitives.arith as arith_prims
from derl_jax.domains import arith
from derl_jax.models.tokenizers import CharTokenizer
from primitives import registry

TOK = arith.arith_tokenizer()
T = 48  # the longest level-4 solution (3 steps) fits with EOS


# ----------------------------------------------------------------------------- tokenizer


def test_tokenizer_vocabulary_and_special_ids():
    assert TOK.vocab_size == len(arith.ARITH_ALPHABET) + 3 < 40
    assert (TOK.pad_id, TOK.bos_id, TOK.eos_id) == (0, 1, 2)
    assert TOK.encode("0+") == [3, 3 + 10]
    assert TOK.encode("7", add_bos=True, add_eos=True) == [1, 10, 2]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=arith.ARITH_ALPHABET, max_size=30))
def test_tokenizer_round_trip(text):
    ids = TOK.encode(text)
    assert len(ids) == len(text)
    assert TOK.decode(ids) == text
    assert TOK.decode([TOK.bos_id, TOK.pad_id] + ids + [TOK.eos_id] + TOK.encode("123")) == text


def test_tokenizer_errors_name_the_problem():
    with pytest.raises(ValueError, match=re.escape("character 'x' at position 2 of '1+x'")):
        TOK.encode("1+x")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        TOK.decode([3, 99])
    with pytest.raises(ValueError, match="repeats characters \\['a'\\]"):
        CharTokenizer("aba")
    with pytest.raises(ValueError, match="needs 4 tokens, more than length=3"):
        TOK.encode_batch(["1234"], 3, left_pad=True)


def test_encode_batch_padding_sides():
    ids, mask = TOK.encode_batch(["12", "3"], 4, left_pad=True, add_bos=True)
    np.testing.assert_array_equal(ids, [[0, 1, 4, 5], [0, 0, 1, 6]])
    np.testing.assert_array_equal(mask, [[False, True, True, True], [False, False, True, True]])
    ids, mask = TOK.encode_batch(["12", "3"], 4, left_pad=False, add_eos=True)
    np.testing.assert_array_equal(ids, [[4, 5, 2, 0], [6, 2, 0, 0]])
    np.testing.assert_array_equal(mask, [[True, True, True, False], [True, True, False, False]])
    assert ids.dtype == np.int32 and mask.dtype == bool


# ----------------------------------------------------------------------------- problems


def python_value(text):
    """Evaluate an integer + - * expression with Python's own parser (an independent reference)."""
    ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b}

    def walk(node):
        if isinstance(node, ast.BinOp):
            return ops[type(node.op)](walk(node.left), walk(node.right))
        assert isinstance(node, ast.Constant) and isinstance(node.value, int)
        return node.value

    return walk(ast.parse(text, mode="eval").body)


def test_problems_are_deterministic_per_seed():
    first = arith.make_problems(3, 60, (1, 2, 3, 4))
    again = arith.make_problems(3, 60, (1, 2, 3, 4))
    other = arith.make_problems(4, 60, (1, 2, 3, 4))
    assert [p.text for p in first] == [p.text for p in again]
    assert [p.text for p in first] != [p.text for p in other]


@pytest.mark.parametrize("level", sorted(arith.LEVELS))
def test_levels_have_advertised_shape_and_correct_answers(level):
    spec = arith.LEVELS[level]
    problems = arith.make_problems(level, 150, (level,))
    assert len({p.text for p in problems}) == 150
    for p in problems:
        numbers = [int(n) for n in re.findall(r"[0-9]+", p.text)]
        operators = re.findall(r"[-+*]", p.text)
        assert p.level == level
        assert len(operators) == spec.num_ops == len(p.steps)
        assert all(0 <= n <= spec.max_operand for n in numbers)
        if spec.two_digit:
            assert max(numbers) >= 10
        assert p.answer == python_value(p.text)
        assert 0 <= p.answer <= arith.MAX_VALUE
        for step in p.steps:
            assert 0 <= step.result <= arith.MAX_VALUE
            assert python_value(f"{step.left}{step.op}{step.right}") == step.result
    assert {op for p in problems for op in p.operators} == set(arith.OPERATORS)


def test_level_one_is_enumerated_exactly():
    texts = (f"{a}{op}{b}" for a, b in itertools.product(range(10), repeat=2) for op in "+-*")
    expected = {text for text in texts if python_value(text) >= 0}
    problems = arith.make_problems(0, len(expected), (1,))
    assert {p.text for p in problems} == expected
    with pytest.raises(ValueError, match=f"hold only {len(expected)} distinct problems, {len(expected) + 1} asked for"):
        arith.make_problems(0, len(expected) + 1, (1,))


def test_exhausted_level_leaves_the_rotation():
    problems = arith.make_problems(1, 600, (1, 2))
    per_level = {lvl: sum(p.level == lvl for p in problems) for lvl in (1, 2)}
    assert per_level == {1: 255, 2: 345}
    assert [p.level for p in problems[:6]] == [1, 2, 1, 2, 1, 2]


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    num_train=st.integers(1, 150),
    num_test=st.integers(1, 80),
    levels=st.lists(st.sampled_from(sorted(arith.LEVELS)), min_size=1, max_size=3),
)
def test_train_and_test_are_disjoint(seed, num_train, num_test, levels):
    train, test = arith.make_splits(seed, num_train, num_test, levels)
    assert len(train) == num_train and len(test) == num_test
    train_texts, test_texts = {p.text for p in train}, {p.text for p in test}
    assert len(train_texts) == num_train and len(test_texts) == num_test
    assert not train_texts & test_texts


def test_level_errors():
    with pytest.raises(ValueError, match=r"unknown levels \[7\]"):
        arith.make_problems(0, 3, (1, 7))
    with pytest.raises(ValueError, match="levels is empty"):
        arith.make_problems(0, 3, ())


# ----------------------------------------------------------------------------- solutions

STEP_PATTERN = re.compile(r"([0-9]+):([0-9]+)([-+*])([0-9]+)=([0-9]+);")


def test_reference_styles_golden():
    problem = arith.Problem(2, (3, 4, 2), ("+", "*"), arith.solve_steps((3, 4, 2), ("+", "*")))
    assert problem.prompt == "3+4*2="
    assert arith.reference_solution(problem, "steps") == "1:4*2=8;2:3+8=11;[11]"
    assert arith.reference_solution(problem, "no_steps") == "[11]"
    assert arith.reference_solution(problem, "no_box") == "1:4*2=8;2:3+8=11;11"
    assert arith.reference_solution(problem, "wrong_step") == "1:4*2=9;2:3+9=12;[12]"
    assert arith.reference_solution(problem, "plain") == "11"
    with pytest.raises(ValueError, match="unknown style 'fancy'"):
        arith.reference_solution(problem, "fancy")


def test_step_solutions_are_valid_arithmetic_and_wrong_steps_are_wrong():
    rng = np.random.default_rng(0)
    for p in arith.make_problems(5, 200, (1, 2, 3, 4)):
        good = arith.reference_solution(p, "steps")
        steps = STEP_PATTERN.findall(good)
        assert [int(k) for k, *_ in steps] == list(range(1, len(p.steps) + 1))
        assert all(python_value(f"{a}{op}{b}") == int(r) for _, a, op, b, r in steps)
        assert re.fullmatch(rf"(?:{STEP_PATTERN.pattern})+\[{p.answer}\]", good)
        bad = arith.reference_solution(p, "wrong_step", rng)
        bad_steps = STEP_PATTERN.findall(bad)
        wrong = [python_value(f"{a}{op}{b}") != int(r) for _, a, op, b, r in bad_steps]
        assert sum(wrong) == 1
        assert bad.endswith(f";[{bad_steps[-1][-1]}]") and int(bad_steps[-1][-1]) != p.answer


def test_sft_corpus_mix_and_determinism():
    problems = arith.make_problems(0, 400, (1, 2, 3))
    corpus = arith.sft_corpus(problems, seed=1)
    assert corpus == arith.sft_corpus(problems, seed=1)
    assert [prompt for prompt, _ in corpus] == [p.prompt for p in problems]
    styles = []
    for p, (_, completion) in zip(problems, corpus):
        exact = ("steps", "no_steps", "no_box", "plain")
        matching = [s for s in exact if arith.reference_solution(p, s) == completion]
        styles.append(matching[0] if matching else "wrong_step")
    counts = {s: styles.count(s) / len(styles) for s in arith.REFERENCE_STYLES}
    for style, weight in arith.DEFAULT_SFT_MIX.items():
        assert abs(counts[style] - weight) < 0.08, (style, counts)
    only_steps = arith.sft_corpus(problems[:20], seed=0, mix={"steps": 1.0, "plain": 0.0})
    assert all(c == arith.reference_solution(p, "steps") for p, (_, c) in zip(problems, only_steps))
    with pytest.raises(ValueError, match=r"unknown styles \['bold'\]"):
        arith.sft_corpus(problems, 0, {"bold": 1.0})
    with pytest.raises(ValueError, match="positive sum"):
        arith.sft_corpus(problems, 0, {"steps": 0.0})


# ----------------------------------------------------------------------------- primitives vs a string reference


def reference_output(tokens, mask):
    """(text, ended): the masked prefix before the first EOS; pad/bos shown as '?'."""
    chars = []
    for token, valid in zip(tokens.tolist(), mask.tolist()):
        if not valid:
            break
        if token == TOK.eos_id:
            return "".join(chars), True
        chars.append(TOK.alphabet[token - 3] if token >= 3 else "?")
    return "".join(chars), False


def reference_primitives(text, ended, gold):
    close = text.rfind("]")
    open_ = text.rfind("[", 0, close) if close >= 0 else -1
    return (
        float(close >= 0 and open_ >= 0 and text[open_ + 1 : close] == gold),
        float(ended and re.search(r"\[[0-9]+\]\Z", text) is not None),
        float(re.search(r"(?<![0-9])1:", text) is not None),
        float(re.search(rf"(?<![0-9]){gold}(?![0-9])", text) is not None),
    )


def mutate(text, rng):
    alphabet = arith.ARITH_ALPHABET
    kind = rng.integers(0, 7)
    if kind == 0 or not text:
        return "".join(rng.choice(list("0123456789[]:;1"), size=rng.integers(0, 45)))
    pos = int(rng.integers(0, len(text) + 1))
    if kind == 1:
        return text[:pos]
    if kind == 2:
        return text[:pos] + str(rng.choice(list(alphabet))) + text[pos + 1 :]
    if kind == 3:
        return text[:pos] + str(rng.choice(list(alphabet))) + text[pos:]
    if kind == 4:
        return text + "".join(rng.choice(list(alphabet), size=rng.integers(1, 6)))
    if kind == 5:
        return text[:pos] + str(rng.integers(0, 10)) + text[pos:]
    return text.replace("[", "[0", 1) if rng.random() < 0.5 else text.replace("]", "]1:", 1)


def random_rollouts(seed, count):
    rng = np.random.default_rng(seed)
    problems = arith.make_problems(seed, 300, (1, 2, 3, 4))
    picks = rng.integers(0, len(problems), size=count)
    texts = []
    for i in picks:
        text = arith.reference_solution(problems[i], str(rng.choice(arith.REFERENCE_STYLES)), rng)
        for _ in range(rng.integers(0, 3)):
            text = mutate(text, rng)
        texts.append(text)
    tokens, mask = arith.encode_completions(TOK, texts, T)
    for row in range(count):
        end = int(mask[row].sum())
        if rng.random() < 0.2 and tokens[row, end - 1] == TOK.eos_id:  # generation cut before EOS
            end -= 1
            tokens[row, end], mask[row, end] = TOK.pad_id, False
        if rng.random() < 0.3 and end < T:  # junk after the rollout must be ignored
            tokens[row, end:] = rng.integers(0, TOK.vocab_size, size=T - end)
        if rng.random() < 0.05 and end > 0:  # a stray pad/bos token inside the output
            tokens[row, rng.integers(0, end)] = rng.integers(0, 2)
    context = arith.answer_context(TOK, [problems[i] for i in picks])
    return {"tokens": tokens, "mask": mask}, context


PRIMITIVE_FNS = [registry.get("arith", name).fn for name in arith_prims.ARITH_PRIMITIVES]


def all_primitives(rollout, context):
    return jnp.stack([fn(rollout, context) for fn in PRIMITIVE_FNS], axis=-1)


@pytest.mark.slow
def test_primitives_match_string_reference_jit_and_eager():
    rollout, context = random_rollouts(0, 1500)
    jitted = np.asarray(jax.jit(all_primitives)(rollout, context))
    eager = np.asarray(all_primitives(rollout, context))
    np.testing.assert_array_equal(jitted, eager)
    expected = np.array(
        [
            reference_primitives(*reference_output(tokens, mask), TOK.decode(answer))
            for tokens, mask, answer in zip(rollout["tokens"], rollout["mask"], context["answer"])
        ]
    )
    mismatch = np.nonzero(np.any(jitted != expected, axis=1))[0]
    examples = [
        (reference_output(rollout["tokens"][i], rollout["mask"][i]), TOK.decode(context["answer"][i]), jitted[i])
        for i in mismatch[:5]
    ]
    assert mismatch.size == 0, examples
    # the random set reaches both values of every primitive often enough to mean something
    assert np.all(expected.mean(axis=0) > 0.1) and np.all(expected.mean(axis=0) < 0.9)
    assert jitted.dtype == np.float32


RANDOM_PRIMITIVES = jax.jit(all_primitives)


@settings(max_examples=300, deadline=None)
@given(
    body=st.lists(st.integers(0, TOK.vocab_size - 1), max_size=T),
    masked=st.integers(0, T),
    gold=st.integers(0, arith.MAX_VALUE),
)
def test_primitives_on_arbitrary_token_sequences(body, masked, gold):
    tokens = np.zeros((1, T), np.int32)
    tokens[0, : len(body)] = body
    mask = np.zeros((1, T), bool)
    mask[0, :masked] = True
    answer, answer_mask = TOK.encode_batch([str(gold)], arith.ANSWER_WIDTH, left_pad=False)
    context = {"answer": answer, "answer_len": answer_mask.sum(1).astype(np.int32)}
    got = np.asarray(RANDOM_PRIMITIVES({"tokens": tokens, "mask": mask}, context))[0]
    expected = reference_primitives(*reference_output(tokens[0], mask[0]), str(gold))
    np.testing.assert_array_equal(got, expected)


def test_reference_styles_score_as_designed():
    problems = arith.make_problems(2, 40, (1, 2, 3, 4))
    expected = {
        "steps": (1, 1, 1, 1),
        "no_steps": (1, 1, 0, 1),
        "no_box": (0, 0, 1, 1),
        "plain": (0, 0, 0, 1),
    }
    context = arith.answer_context(TOK, problems)
    for style, values in expected.items():
        tokens, mask = arith.encode_completions(TOK, [arith.reference_solution(p, style) for p in problems], T)
        got = np.asarray(RANDOM_PRIMITIVES({"tokens": tokens, "mask": mask}, context))
        np.testing.assert_array_equal(got, np.broadcast_to(values, got.shape), err_msg=style)
    tokens, mask = arith.encode_completions(TOK, [arith.reference_solution(p, "wrong_step") for p in problems], T)
    got = np.asarray(RANDOM_PRIMITIVES({"tokens": tokens, "mask": mask}, context))
    np.testing.assert_array_equal(got[:, :3], np.broadcast_to((0, 1, 1), (len(problems), 3)))


def test_truncated_box_is_not_boxed_but_can_be_correct():
    problem = arith.Problem(1, (2, 3), ("+",), arith.solve_steps((2, 3), ("+",)))
    context = arith.answer_context(TOK, [problem, problem])
    text = "1:2+3=5;[5]"
    tokens, mask = arith.encode_completions(TOK, [text, text], len(text) + 1)
    tokens, mask = tokens[:, : len(text)], mask[:, : len(text)]  # row 0: cut before EOS
    tokens[1, -1], mask[1, -1] = TOK.eos_id, True  # row 1: EOS replaces the closing bracket
    got = np.asarray(RANDOM_PRIMITIVES({"tokens": tokens, "mask": mask}, context))
    np.testing.assert_array_equal(got, [[1, 0, 1, 1], [0, 0, 1, 1]])


# ----------------------------------------------------------------------------- the domain


def test_make_arith_domain_arrays():
    cfg = arith.default_arith_config()
    cfg.num_train, cfg.num_test, cfg.levels, cfg.max_new_tokens = 120, 30, (1, 2, 4), 48
    domain = arith.make_arith_domain(cfg)
    assert domain.name == "arith" and domain.primitive_names == arith_prims.ARITH_PRIMITIVES
    assert domain.outcome_index == 0 and (domain.eos_id, domain.pad_id) == (TOK.eos_id, TOK.pad_id)
    length = domain.info["prompt_length"]
    assert length == 1 + 3 + 4 * 2 + 1  # BOS + level-4 prompt "99*99*99*99="
    splits = ((domain.train, domain.info["train_problems"]), (domain.test, domain.info["test_problems"]))
    for split, problems in splits:
        assert split.prompts.shape == (len(problems), length) and split.prompts.dtype == jnp.int32
        for row, p in enumerate(problems):
            ids = np.asarray(split.prompts[row])[np.asarray(split.prompt_mask[row])]
            assert ids[0] == TOK.bos_id and TOK.decode(ids) == p.prompt
            assert not np.asarray(split.prompt_mask[row])[: length - len(ids)].any()  # left padded
            answer_len = int(split.context["answer_len"][row])
            assert TOK.decode(np.asarray(split.context["answer"][row])[:answer_len]) == str(p.answer)
            assert int(split.context["answer_value"][row]) == p.answer
    assert not {p.text for p in domain.info["train_problems"]} & {p.text for p in domain.info["test_problems"]}
    table = registry.symbol_table(domain.primitives)
    assert table["outcome"] == table["g1"] == 0 and table["format"] == table["g2"] == 1


def test_domain_primitive_values_under_jit():
    cfg = {"seed": 1, "num_train": 16, "num_test": 4, "levels": (1, 2), "max_new_tokens": 32}
    domain = arith.make_arith_domain(cfg)
    problems = domain.info["train_problems"]
    styles = ["steps", "plain"] * (len(problems) // 2)
    completions = [arith.reference_solution(p, s) for p, s in zip(problems, styles)]
    tokens, mask = arith.encode_completions(TOK, completions, 32)
    rollout = {"tokens": jnp.asarray(tokens), "mask": jnp.asarray(mask)}
    values = jax.jit(domain.primitive_values)(rollout, domain.train.context)
    assert values.shape == (16, 4)
    np.testing.assert_array_equal(np.asarray(values[0::2]), np.ones((8, 4)))
    np.testing.assert_array_equal(np.asarray(values[1::2]), np.broadcast_to([0, 0, 0, 1], (8, 4)))
    np.testing.assert_array_equal(np.asarray(domain.success(rollout, domain.train.context)), np.asarray(values[:, 0]))


def test_domain_config_errors():
    @dataclasses.dataclass
    class Cfg:
        seed: int = 0
        num_train: int = 20
        num_test: int = 5
        levels: tuple = (3,)
        max_new_tokens: int = 12

    with pytest.raises(ValueError, match="max_new_tokens=12 cannot hold the longest solution"):
        arith.make_arith_domain(Cfg())
    assert arith.make_arith_domain(dataclasses.replace(Cfg(), max_new_tokens=40)).train.size == 20
    with pytest.raises(ValueError, match="no field 'levels'"):
        arith.make_arith_domain({"seed": 0, "num_train": 2, "num_test": 2, "max_new_tokens": 40})


def test_primitives_never_import_the_domains_package():
    """Domains import primitives, never the other way round (no cycle between the packages)."""
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "primitives")
    for name in sorted(os.listdir(root)):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(root, name), encoding="utf-8").read())
            imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module]
            imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
            assert not [m for m in imported if m.startswith("derl_jax.domains")], name


def test_arith_registers_itself_with_its_checks():
    from derl_jax.config import ConfigError
    from derl_jax.domains.registry import get_domain

    spec = get_domain("arith")
    cfg = ml_collections.ConfigDict({"domain": {"kind": "arith", "seed": 0, "num_train": 40, "num_test": 10,
                                                "levels": (1,), "max_new_tokens": 14}})
    spec.validate(cfg)
    assert spec.primitive_names(cfg) == arith.ARITH_PRIMITIVES
    domain = spec.build(cfg)
    assert domain.primitive_names == arith.ARITH_PRIMITIVES and domain.rollout == "device"
    assert domain.validation_metric == "correct" and domain.corpus is not None
    cfg.domain.levels = (1, 9)
    with pytest.raises(ConfigError, match="config.domain.levels"):
        spec.validate(cfg)
