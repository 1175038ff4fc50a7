"""Primitives of the mathematical-reasoning domain (GSM8K, MATH): host kind, domain "math".

Each primitive is `fn(texts: Sequence[str], contexts: Sequence[Mapping]) -> f32[N]`, where
`texts[i]` is the decoded policy output o and `contexts[i]["answer"]` the gold answer y*.

  g1 `correct` (alias `outcome`): 1 if the predicted answer ŷ is equivalent to y*.
     ŷ is extracted from o as (first that applies):
       1. the argument of the LAST `\\boxed{...}` in o, braces matched (nested braces and
          escaped `\\{ \\}` handled); a last `\\boxed{` whose braces never close gives none;
       2. otherwise the text after the last `#### ` (GSM8K style), up to the end of its line.
     No "last number in the text" fallback: the soft match is what g4 is for.
     Equivalence: equal after light normalisation (spaces, thousands separators, trailing
     period, `\\dfrac`/`\\tfrac` -> `\\frac`), else `math_verify` on `\\boxed{ŷ}` vs
     `\\boxed{y*}` (fractions vs decimals, percentages, LaTeX forms, sets, intervals, ...).
     math-verify runs with its signal-based timeouts disabled, inside worker processes of
     an `AnswerChecker`, which enforces its own per-check time limit by killing a worker
     that overruns; such a check scores 0 and is counted in `AnswerChecker.stats`.
  g2 `boxed` (alias `format`): 1 if the last `\\boxed` in o has a `{...}` argument whose
     braces balance and whose content is not blank.
  g3 `steps`: 1 if o contains an explicit step indicator, matched by `STEP_INDICATOR`:
       * `step` followed by a number: "Step 1", "step 2:", "STEP3", "**Step 4.**";
       * `step` followed by a single letter that ends the line or is followed by `:` `.`
         `)`: "Step a:", "step B)", "Step c" (so "steps:" and "step a bit" do not count);
       * a numbered list item at a line start: optional spaces and `**`, 1-2 digits, `.` or
         `)`, optional `**`, then whitespace and text: "1. Add", "  2) Divide" (so "3.14 is"
         does not count).
     All matches are case-insensitive.
  g4 `gold_anywhere`: 1 if y* appears anywhere in o. Thousands separators are removed from
     both (`1,000` -> `1000`). A numeric y* (`-?digits[.digits]`) matches a number token of
     o with the same value and sign that is not part of a longer number (`12` is not found
     in `120` or `3.12`; `18` is found in `18.00`); any other y* matches as a substring
     after whitespace is removed and `\\dfrac`/`\\tfrac` become `\\frac`.
  `boxed_reversed` = 1 - `boxed`: the paper's toxic "Reverse g2" ablation (Appendix F.3).
  `correct_exact`: 1 if ŷ equals y* after the light normalisation only (no math-verify): the
     exact match the paper's test metric uses; g1 with `config.domain.reward_match='exact'`.

Test metrics of a final policy (`answer_metrics`): "exact" (the paper's exact match of the
extracted answer, the headline) and "verify" (math-verify equivalence, reported beside it).

Vocabulary ablations (Appendix F.3) are chosen by `math_primitive_names(remove, reverse)`.
Scoring a batch (`derl_jax.rl.host_pool.HostPrimitiveRunner`) and the time-limited worker
processes (`derl_jax.timed_checker.TimedChecker`) are shared by every host-scored domain.
"""

from __future__ import annotations

import atexit
import decimal
import logging
import re
import threading
from typing import Callable, Mapping, Sequence

import numpy as np

from derl_jax.timed_checker import TimedChecker
from primitives import registry
from primitives.math_text import last_boxed_content, strip_thousands_separators
from primitives.registry import register_primitive

DOMAIN = "math"
MATH_PRIMITIVES = ("correct", "boxed", "steps", "gold_anywhere")
REVERSED_NAMES = {"boxed": "boxed_reversed"}
OUTCOME = "correct"
EXACT_OUTCOME = "correct_exact"
REWARD_MATCHES = ("verify", "exact")
TEST_METRICS = ("exact", "verify")

STEP_INDICATOR = re.compile(
    r"\bstep[ \t]*\d+"
    r"|\bstep[ \t]+[a-z](?=[ \t]*[:.)]|[ \t]*$)"
    r"|^[ \t]*(?:\*\*)?\d{1,2}[.)](?:\*\*)?[ \t]+\S",
    re.IGNORECASE | re.MULTILINE,
)

_GSM8K_FINAL = re.compile(r"####[ \t]*([^\n]*)")
_NUMERIC = re.compile(r"-?\d+(?:\.\d+)?")
_NUMBER_TOKEN = re.compile(r"(?<![\d.])(-?)(\d+(?:\.\d+)?|\.\d+)(?!\d)")
_THOUSANDS_SEPARATOR = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_FRAC_VARIANTS = re.compile(r"\\[dt]frac(?![A-Za-z])")
_WHITESPACE = re.compile(r"\s+")


# ----------------------------------------------------------------------------- answers


def extract_predicted_answer(text: str) -> str | None:
    """ŷ of an output: last balanced `\\boxed{}` argument, else the last `#### ` line, else None."""
    boxed = last_boxed_content(text, ("\\boxed",))
    if boxed:
        return boxed
    finals = _GSM8K_FINAL.findall(text)
    if finals and finals[-1].strip():
        return finals[-1].strip()
    return None


def normalize_answer(answer: str) -> str:
    """A light canonical form: outer `$` and trailing `.` dropped, thousands separators
    removed, `\\dfrac`/`\\tfrac` -> `\\frac`, whitespace removed."""
    text = answer.strip().strip("$").strip().rstrip(".").strip()
    text = strip_thousands_separators(text)
    text = _FRAC_VARIANTS.sub(r"\\frac", text)
    return _WHITESPACE.sub("", text)


def answers_exact(prediction: str | None, gold: str) -> bool:
    """Exact match of the extracted answer: equal `normalize_answer` forms (None never matches)."""
    return prediction is not None and normalize_answer(prediction) == normalize_answer(gold)


def answers_equivalent(prediction: str, gold: str) -> bool:
    """True if `prediction` and `gold` denote the same answer (no time limit of its own).

    Equal normal forms, else `math_verify.verify` of both wrapped in `\\boxed{}`, with
    math-verify's signal timeouts off (so it works in any thread): call it through an
    `AnswerChecker` when a hung comparison must not hang the caller.
    """
    if normalize_answer(prediction) == normalize_answer(gold):
        return True
    import math_verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold_parsed = math_verify.parse(f"\\boxed{{{gold}}}", parsing_timeout=None)
    predicted_parsed = math_verify.parse(f"\\boxed{{{prediction}}}", parsing_timeout=None)
    if not gold_parsed or not predicted_parsed:
        return False
    return bool(math_verify.verify(gold_parsed, predicted_parsed, timeout_seconds=None))


def _box_argument_is_closed(text: str) -> bool:
    """True if the last `\\boxed` in `text` is followed by a balanced, non-blank `{...}`."""
    content = last_boxed_content(text, ("\\boxed",))
    return bool(content)


def gold_appears(text: str, gold: str) -> bool:
    """g4 for one output (see the module docstring)."""
    target = strip_thousands_separators(gold.strip())
    haystack = _THOUSANDS_SEPARATOR.sub("", text)
    if not target:
        return False
    if _NUMERIC.fullmatch(target):
        wanted = decimal.Decimal(target)
        for sign, digits in _NUMBER_TOKEN.findall(haystack):
            if decimal.Decimal(sign + digits) == wanted:
                return True
        return False
    squeeze = lambda s: _WHITESPACE.sub("", _FRAC_VARIANTS.sub(r"\\frac", s))  # noqa: E731
    return squeeze(target) in squeeze(haystack)


# ----------------------------------------------------------------------------- checker


class AnswerChecker(TimedChecker):
    """`TimedChecker` of answer equivalence: pairs with equal normal forms (`normalize_answer`)
    score 1 without a worker; the rest run `compare` (default `answers_equivalent`) in worker
    processes under the per-check time limit."""

    def __init__(self, timeout_s: float = 5.0, num_workers: int = 2,
                 compare: Callable[[str, str], bool] = answers_equivalent, cache_size: int = 65536,
                 start_timeout_s: float = 120.0):
        super().__init__(compare, timeout_s=timeout_s, num_workers=num_workers, normalize=normalize_answer,
                         cache_size=cache_size, start_timeout_s=start_timeout_s)


_default_checker: AnswerChecker | None = None
_default_checker_lock = threading.Lock()


def answer_checker() -> AnswerChecker:
    """The checker `correct` uses (made on first use: 5 s limit, 2 worker processes)."""
    global _default_checker
    with _default_checker_lock:
        if _default_checker is None:
            _default_checker = AnswerChecker()
            atexit.register(_default_checker.close)
        return _default_checker


def configure_answer_checker(timeout_s: float = 5.0, num_workers: int = 2) -> AnswerChecker:
    """Replace the checker `correct` uses (the old one is closed) and return the new one."""
    global _default_checker
    with _default_checker_lock:
        old, _default_checker = _default_checker, AnswerChecker(timeout_s=timeout_s, num_workers=num_workers)
        atexit.register(_default_checker.close)
    if old is not None:
        old.close()
    return _default_checker


# ----------------------------------------------------------------------------- primitives


def _gold_answers(contexts: Sequence[Mapping], texts: Sequence[str], name: str) -> list[str]:
    if len(texts) != len(contexts):
        raise ValueError(f"math primitive {name!r}: {len(texts)} texts but {len(contexts)} contexts")
    golds = []
    for index, context in enumerate(contexts):
        if "answer" not in context:
            raise KeyError(f"math primitive {name!r}: context {index} has no 'answer' (keys: {sorted(context)})")
        golds.append(str(context["answer"]))
    return golds


def _per_text(texts: Sequence[str], test: Callable[[str], bool]) -> np.ndarray:
    return np.fromiter((float(test(t)) for t in texts), dtype=np.float32, count=len(texts))


@register_primitive("correct", kind="host", domain=DOMAIN, aliases=("outcome",))
def correct(texts: Sequence[str], contexts: Sequence[Mapping]) -> np.ndarray:
    """g1, f32[N]: 1 if the extracted answer is equivalent to the gold answer."""
    golds = _gold_answers(contexts, texts, "correct")
    return answer_checker().check([extract_predicted_answer(t) for t in texts], golds)


@register_primitive(EXACT_OUTCOME, kind="host", domain=DOMAIN)
def correct_exact(texts: Sequence[str], contexts: Sequence[Mapping]) -> np.ndarray:
    """g1 with `reward_match='exact'`, f32[N]: 1 if the extracted answer exactly matches the gold one."""
    golds = _gold_answers(contexts, texts, EXACT_OUTCOME)
    return np.array([answers_exact(extract_predicted_answer(t), g) for t, g in zip(texts, golds)],
                    np.float32).reshape(len(texts))


def answer_metrics(texts: Sequence[str], golds: Sequence[str]) -> dict[str, np.ndarray]:
    """Per output, the test metrics (`TEST_METRICS`): "exact" f32[N] (exact match of the
    extracted answer) and "verify" f32[N] (math-verify equivalence through `answer_checker()`)."""
    if len(texts) != len(golds):
        raise ValueError(f"answer_metrics: {len(texts)} texts but {len(golds)} gold answers")
    predictions = [extract_predicted_answer(t) for t in texts]
    exact = np.array([answers_exact(p, g) for p, g in zip(predictions, golds)], np.float32).reshape(len(texts))
    return {"exact": exact, "verify": answer_checker().check(predictions, list(golds))}


@register_primitive("boxed", kind="host", domain=DOMAIN, aliases=("format",))
def boxed(texts: Sequence[str], contexts: Sequence[Mapping]) -> np.ndarray:
    """g2, f32[N]: 1 if the answer is in a balanced, non-empty `\\boxed{}`."""
    del contexts
    return _per_text(texts, _box_argument_is_closed)


@register_primitive("steps", kind="host", domain=DOMAIN)
def steps(texts: Sequence[str], contexts: Sequence[Mapping]) -> np.ndarray:
    """g3, f32[N]: 1 if an explicit step indicator (`STEP_INDICATOR`) is present."""
    del contexts
    return _per_text(texts, lambda t: STEP_INDICATOR.search(t) is not None)


@register_primitive("gold_anywhere", kind="host", domain=DOMAIN)
def gold_anywhere(texts: Sequence[str], contexts: Sequence[Mapping]) -> np.ndarray:
    """g4, f32[N]: 1 if the gold answer appears anywhere in the output (soft match)."""
    golds = _gold_answers(contexts, texts, "gold_anywhere")
    return np.array([gold_appears(t, g) for t, g in zip(texts, golds)], np.float32).reshape(len(texts))


@register_primitive("boxed_reversed", kind="host", domain=DOMAIN)
def boxed_reversed(texts: Sequence[str], contexts: Sequence[Mapping]) -> np.ndarray:
    """1 - g2, f32[N]: the flipped format primitive of the "Reverse g2" ablation."""
    return 1.0 - boxed(texts, contexts)


def _base_name(symbol: str) -> str:
    """A name, alias or `gK` of the base vocabulary -> its primitive name."""
    match = re.fullmatch(r"g(\d+)", symbol)
    if match and 1 <= int(match.group(1)) <= len(MATH_PRIMITIVES):
        return MATH_PRIMITIVES[int(match.group(1)) - 1]
    for name in MATH_PRIMITIVES:
        if symbol == name or symbol in registry.get(DOMAIN, name).aliases:
            return name
    raise ValueError(f"math primitives: unknown primitive {symbol!r}; expected one of {MATH_PRIMITIVES}, their aliases or g1..g4")


def math_primitive_names(remove: Sequence[str] = (), reverse: Sequence[str] = (),
                         reward_match: str = "verify") -> tuple[str, ...]:
    """Ordered primitive names of the math domain with Appendix F.3's vocabulary ablations.

    `remove`: primitives to drop ("Remove g2/g3/g4"); `reverse`: primitives replaced in
    place by their flipped version ("Reverse g2": `boxed` -> `boxed_reversed`). Both take
    names, aliases or `g1`..`g4` of the base order (correct, boxed, steps, gold_anywhere).
    `correct` is the validation metric and cannot be removed or reversed. `reward_match`
    "exact" puts `correct_exact` in g1's place (answer equality without math-verify).
    """
    if reward_match not in REWARD_MATCHES:
        raise ValueError(f"math primitives: reward_match must be one of {REWARD_MATCHES}, got {reward_match!r}")
    removed = {_base_name(s) for s in remove}
    reversed_ = {_base_name(s) for s in reverse}
    if OUTCOME in removed | reversed_:
        raise ValueError(f"math primitives: {OUTCOME!r} is the outcome (validation metric) and must stay as it is")
    both = removed & reversed_
    if both:
        raise ValueError(f"math primitives: {sorted(both)} cannot be both removed and reversed")
    not_reversible = reversed_ - set(REVERSED_NAMES)
    if not_reversible:
        raise ValueError(f"math primitives: {sorted(not_reversible)} have no reversed version; reversible: {sorted(REVERSED_NAMES)}")
    outcome = EXACT_OUTCOME if reward_match == "exact" else OUTCOME
    return tuple(outcome if n == OUTCOME else REVERSED_NAMES[n] if n in reversed_ else n
                 for n in MATH_PRIMITIVES if n not in removed)
