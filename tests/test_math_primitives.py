"""Math-domain host primitives, answer equivalence, the checker's time limit, the runner."""

import concurrent.futures
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fixtures_math as fx
from derl_jax.rl import host_pool
from primitives import math as pm
from primitives import registry


def ctx(*answers):
    return [{"answer": a} for a in answers]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Step 1 ... so \\boxed{\\dfrac{3}{4}}.", "\\dfrac{3}{4}"),
        ("\\boxed{1} no wait \\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
        ("work\n#### 72", "72"),
        ("#### 5\nthen \\boxed{6}", "6"),
        ("\\boxed{12", None),
        ("\\boxed{} and nothing else", None),
        ("the answer is 72", None),
        ("\\fbox{3}", None),
    ],
)
def test_extract_predicted_answer(text, expected):
    assert pm.extract_predicted_answer(text) == expected


@pytest.mark.parametrize(
    "prediction, gold, same",
    [
        ("\\frac{1}{2}", "0.5", True),
        ("0.5", "\\frac{1}{2}", True),
        ("\\dfrac{3}{4}", "0.75", True),
        ("50\\%", "50", True),
        ("1,000", "1000", True),
        ("1000", "1,000", True),
        ("72", "72", True),
        ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", True),
        ("\\{2, 1\\}", "\\{1, 2\\}", True),
        ("73", "72", False),
        ("\\frac{1}{3}", "0.5", False),
        ("x^2", "x^3", False),
    ],
)
def test_answers_equivalent(prediction, gold, same):
    assert pm.answers_equivalent(prediction, gold) is same


def test_correct_scores_a_batch_through_the_checker():
    texts = [
        "Step 1: half of it.\nSo the answer is \\boxed{\\frac{1}{2}}.",
        "It is 50 percent, \\boxed{50\\%}",
        "total \\boxed{1,000}",
        "Thus \\boxed{\\dfrac{3}{4}}",
        "Adding up gives 72.\n#### 72",
        "I think it is 72 but never box it",
        "\\boxed{73}",
        "\\boxed{\\frac{1}{2}",
    ]
    golds = ctx("0.5", "50", "1000", "0.75", "72", "72", "72", "\\frac{1}{2}")
    expected = np.array([1, 1, 1, 1, 1, 0, 0, 0], np.float32)
    np.testing.assert_array_equal(pm.correct(texts, golds), expected)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        from_thread = pool.submit(pm.correct, texts, golds).result()
    np.testing.assert_array_equal(from_thread, expected)
    assert pm.answer_checker().stats.timeouts == 0


@pytest.mark.parametrize(
    "text, expected",
    [
        ("so \\boxed{42}", 1.0),
        ("so \\boxed{\\frac{a}{b^{2}}}", 1.0),
        ("\\boxed {x}", 1.0),
        ("\\boxed{}", 0.0),
        ("\\boxed{   }", 0.0),
        ("\\boxed{\\frac{1}{2}", 0.0),
        ("\\boxed{1} and finally \\boxed{2", 0.0),
        ("the answer is 42", 0.0),
        ("\\fbox{42}", 0.0),
        ("#### 42", 0.0),
    ],
)
def test_boxed_and_its_reverse(text, expected):
    np.testing.assert_array_equal(pm.boxed([text], ctx("42")), [expected])
    np.testing.assert_array_equal(pm.boxed_reversed([text], ctx("42")), [1.0 - expected])


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Step 1: add.", 1.0),
        ("first, step 2: divide", 1.0),
        ("**Step 3.** done", 1.0),
        ("STEP4 done", 1.0),
        ("Step a: set up\nStep b: solve", 1.0),
        ("we do step b)", 1.0),
        ("1. Add the apples\n2. Count", 1.0),
        ("  2) Divide by two", 1.0),
        ("**1.** Start", 1.0),
        ("We take a step a bit further", 0.0),
        ("The steps: add then divide", 0.0),
        ("3.14 is close to pi", 0.0),
        ("the answer is 1. Done", 0.0),
        ("just the answer \\boxed{4}", 0.0),
    ],
)
def test_steps(text, expected):
    np.testing.assert_array_equal(pm.steps([text], ctx("4")), [expected])


@pytest.mark.parametrize(
    "text, gold, expected",
    [
        ("so we get 1,000 apples", "1000", 1.0),
        ("so we get 1000 apples", "1,000", 1.0),
        ("it costs 18.00 dollars", "18", 1.0),
        ("x = -3 degrees", "-3", 1.0),
        ("it is 120 in total", "12", 0.0),
        ("it is 3.12", "12", 0.0),
        ("it is 12.5", "12", 0.0),
        ("we get 12.", "12", 1.0),
        ("10-5 = 5", "-5", 0.0),
        ("the answer is \\dfrac{1}{2}", "\\frac{1}{2}", 1.0),
        ("the answer is \\frac{1} {2}", "\\frac{1}{2}", 1.0),
        ("the answer is \\frac{1}{3}", "\\frac{1}{2}", 0.0),
        ("#### 72", "72", 1.0),
        ("nothing", "72", 0.0),
    ],
)
def test_gold_anywhere(text, gold, expected):
    np.testing.assert_array_equal(pm.gold_anywhere([text], ctx(gold)), [expected])


@settings(max_examples=300, deadline=None)
@given(number=st.integers(1, 10**9), extra_digit=st.integers(0, 9))
def test_gold_anywhere_numbers_property(number, extra_digit):
    gold = str(number)
    assert pm.gold_anywhere([f"we get {number:,} apples"], ctx(gold))[0] == 1.0
    assert pm.gold_anywhere([f"we get {number}{extra_digit} apples"], ctx(gold))[0] == 0.0
    assert pm.gold_anywhere([f"we get {extra_digit}.{number} apples"], ctx(gold))[0] == 0.0


def test_missing_answer_in_context_is_a_clear_error():
    with pytest.raises(KeyError, match="context 1 has no 'answer'"):
        pm.gold_anywhere(["a", "b"], [{"answer": "1"}, {"gold": "2"}])
    with pytest.raises(ValueError, match="2 texts but 1 contexts"):
        pm.correct(["a", "b"], ctx("1"))


def test_vocabulary_ablations():
    assert pm.math_primitive_names() == ("correct", "boxed", "steps", "gold_anywhere")
    assert pm.math_primitive_names(remove=["g2"]) == ("correct", "steps", "gold_anywhere")
    assert pm.math_primitive_names(remove=["steps"]) == ("correct", "boxed", "gold_anywhere")
    assert pm.math_primitive_names(remove=["g4"]) == ("correct", "boxed", "steps")
    assert pm.math_primitive_names(reverse=["format"]) == ("correct", "boxed_reversed", "steps", "gold_anywhere")
    with pytest.raises(ValueError, match="outcome"):
        pm.math_primitive_names(remove=["g1"])
    with pytest.raises(ValueError, match="no reversed version"):
        pm.math_primitive_names(reverse=["steps"])
    with pytest.raises(ValueError, match="both removed and reversed"):
        pm.math_primitive_names(remove=["boxed"], reverse=["g2"])
    with pytest.raises(ValueError, match="unknown primitive 'g5'"):
        pm.math_primitive_names(remove=["g5"])
    prims = registry.resolve("math", pm.math_primitive_names(reverse=["g2"]))
    assert all(p.kind == "host" for p in prims)
    table = registry.symbol_table(prims)
    assert (table["outcome"], table["boxed_reversed"], table["g4"], table["gold_anywhere"]) == (0, 1, 3, 3)
    assert "format" not in table


@pytest.fixture(scope="module")
def reversing_checker():
    with pm.AnswerChecker(timeout_s=1.0, num_workers=2, compare=fx.reversed_compare) as checker:
        checker.check(["ab", "ba"], ["ba", "ab"])  # start the workers outside the timed checks
        yield checker


def test_checker_times_out_a_hung_check_and_recovers(reversing_checker):
    checker = reversing_checker
    timeouts_before = checker.stats.timeouts
    started = time.monotonic()
    scores = checker.check(["cd", fx.SLOW_PREDICTION, "xy"], ["dc", "x", "zz"])
    elapsed = time.monotonic() - started
    np.testing.assert_array_equal(scores, [1.0, 0.0, 0.0])
    assert checker.stats.timeouts == timeouts_before + 1
    assert 1.0 <= elapsed < 1.0 + 3.0, f"batch took {elapsed:.2f} s; the hung check should end it at its 1 s limit"
    started = time.monotonic()
    np.testing.assert_array_equal(checker.check([fx.SLOW_PREDICTION, "ef"], ["x", "fe"]), [0.0, 1.0])
    assert time.monotonic() - started < 10.0
    assert checker.stats.timeouts == timeouts_before + 1, "a known timed-out pair is answered from the cache"


def test_checker_works_from_other_threads_and_caches(reversing_checker):
    checker = reversing_checker
    dispatched = checker.stats.dispatched
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(checker.check, ["gh", "ij", None], ["hg", "kk", "x"]) for _ in range(2)]
        for future in futures:
            np.testing.assert_array_equal(future.result(), [1.0, 0.0, 0.0])
    assert checker.stats.dispatched == dispatched + 2
    assert checker.stats.no_answer >= 2


def test_checker_scores_a_raising_compare_zero():
    with pm.AnswerChecker(timeout_s=20.0, num_workers=1, compare=fx.raising_compare) as checker:
        np.testing.assert_array_equal(checker.check(["boom", "ba"], ["x", "ab"]), [0.0, 1.0])
        assert checker.stats.errors == 1
    with pytest.raises(RuntimeError, match="after close"):
        checker.check(["ba"], ["ab"])


def test_checker_argument_errors():
    with pytest.raises(ValueError, match="timeout_s"):
        pm.AnswerChecker(timeout_s=0)
    with pytest.raises(ValueError, match="2 predictions but 1 gold"):
        pm.AnswerChecker().check(["a", "b"], ["a"])


def test_runner_equals_direct_calls_sync_and_async():
    prims = registry.resolve("math", pm.math_primitive_names(reverse=["g2"]))
    texts = ["Step 1: \\boxed{\\frac{1}{2}}", "1. x\n2. y\n#### 1,000", "it is 72", "\\boxed{7", "\\boxed{50\\%}"]
    contexts = ctx("0.5", "1000", "72", "7", "50")
    expected = np.stack([np.asarray(p.fn(texts, contexts)) for p in prims], axis=-1)
    np.testing.assert_array_equal(
        expected,
        [[1, 0, 1, 0], [1, 1, 1, 1], [0, 1, 0, 1], [0, 1, 0, 1], [1, 0, 0, 1]],
    )
    with host_pool.HostPrimitiveRunner(prims, num_workers=3) as runner:
        values = runner.run(texts, contexts)
        assert values.dtype == np.float32 and values.shape == (5, 4)
        np.testing.assert_array_equal(values, expected)
        future = runner.submit(texts, contexts)
        np.testing.assert_array_equal(future.result(timeout=60), expected)
        assert runner.batches == 2 and runner.total_seconds >= runner.last_seconds > 0
        assert set(runner.seconds_by_primitive) == {p.name for p in prims}
        assert runner.run([], []).shape == (0, 4)


def test_runner_rejects_bad_primitives():
    device = registry.Primitive("dev", lambda rollout, context: rollout, "device", "math")
    with pytest.raises(ValueError, match="not of kind 'host'"):
        host_pool.HostPrimitiveRunner([device])
    wrong_shape = registry.Primitive("pair", lambda texts, contexts: np.zeros((len(texts), 2)), "host", "math")
    with host_pool.HostPrimitiveRunner([wrong_shape], num_workers=1) as runner:
        with pytest.raises(ValueError, match="'pair' returned shape \\(3, 2\\), expected \\(3,\\)"):
            runner.run(["a", "b", "c"], ctx("1", "2", "3"))
