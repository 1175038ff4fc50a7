"""The cold-start corpus: valid reward expressions the Meta-Optimizer is fine-tuned on first.

The paper starts its Meta-Optimizer with a brief SFT stage on valid reward-expression
examples (about 200) so that it writes the output grammar from its first sample. The corpus
here is generated from a handful of families that mirror the paper's Appendix A/E examples:

    weighted sums      g1+0.5*g2           g1+0.5*g2+0.1*(g3+g4)     0.3*g1+0.2*g2
    nested             g1+0.5*(g2+0.5*g3)  g1+0.5*(g2+0.5*(g3+0.5*g4))
    normalisations     g1/(g2+1)           (g1+g2)/2                 g1+g2/3
    products           g1*(g2+0.2)         g1+g2*(g3/2)-g4/3
    min / max / clip   min(g1,g2)          g1+0.5*max(g2,g3)         clip(g1+g2,0,1)   abs(g1-g2)
    progress u         g1+0.5*u*g2         g1*(1-u)+u*g2             g1+0.2*g2*(1-u)
    powers             g1+0.5*g2**2        g1**0.5+0.1*g2
    single terms       g1                  0.5*g1                    g1+0.1

Under the "paper" operator set (`derl_jax.expr.parse.OPERATOR_SETS`) only the families
written with `+ - * /` and parentheses are drawn (`PAPER_FAMILIES`: weighted sums, nested,
normalisations, products, single terms), so the corpus teaches no `u`, `**` or function.

Primitives are drawn at random from g1..gk for every template, weights and offsets from
short fixed lists. A candidate enters the corpus only if it parses, passes `check` (finite,
bounded, not constant on the probe set) and, when a grammar is given, `Grammar.encode`
accepts it (fits `max_length` symbols and `max_depth` nesting). Distinct texts are preferred;
when the grammar is so tight that fewer distinct valid texts exist than requested, the
distinct ones found are repeated in order to fill the corpus.
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np

from derl_jax.expr.check import check_text
from derl_jax.expr.grammar import Grammar
from derl_jax.expr.parse import check_operators

WEIGHTS = ("0.5", "0.1", "0.2", "0.25", "0.3", "0.05", "0.01", "2", "3", "1.5")
OFFSETS = ("1", "0.5", "0.1", "0.2", "2")
DIVISORS = ("2", "3", "4")
EXPONENTS = ("2", "3", "0.5")
ATTEMPTS_PER_EXPRESSION = 50

Template = Callable[[np.random.Generator, int], str]


def _pick(rng: np.random.Generator, options: tuple[str, ...]) -> str:
    return options[int(rng.integers(len(options)))]


def _prims(rng: np.random.Generator, num_primitives: int, count: int) -> list[str]:
    """`count` primitive names, distinct while there are enough primitives."""
    replace = count > num_primitives
    indices = rng.choice(num_primitives, size=count, replace=replace)
    return [f"g{int(i) + 1}" for i in indices]


def _weighted_sum(rng, k):
    terms = int(rng.integers(2, 5))
    names = _prims(rng, k, terms)
    text = names[0] if rng.random() < 0.6 else f"{_pick(rng, WEIGHTS)}*{names[0]}"
    for name in names[1:]:
        sign = "-" if rng.random() < 0.2 else "+"
        text += f"{sign}{_pick(rng, WEIGHTS)}*{name}"
    if terms >= 3 and rng.random() < 0.3:
        a, b = _prims(rng, k, 2)
        text += f"+{_pick(rng, WEIGHTS)}*({a}+{b})"
    return text


def _nested(rng, k):
    depth = int(rng.integers(2, 5))
    names = _prims(rng, k, depth)
    weights = [_pick(rng, WEIGHTS) for _ in names[1:]]
    inner = names[-1]
    if rng.random() < 0.3:
        inner += f"+{_pick(rng, OFFSETS)}"
    for name, weight in zip(reversed(names[:-1]), reversed(weights)):
        operand = f"({inner})" if "+" in inner else inner
        inner = f"{name}+{weight}*{operand}"
    return inner


def _power(rng, k):
    a, b = _prims(rng, k, 2)
    if rng.random() < 0.5:
        return f"{a}+{_pick(rng, WEIGHTS)}*{b}**{_pick(rng, EXPONENTS)}"
    return f"{a}**{_pick(rng, EXPONENTS)}+{_pick(rng, WEIGHTS)}*{b}"



# Forms of the templated families: {a}..{d} are distinct primitives, {fn} is min or max, and
# each {W} / {O} / {D} draws a weight / offset / divisor, left to right.
_FORMS = {
    "normalisation": (3, ("{a}/({b}+{O})", "({a}+{b})/{D}", "{a}+{b}/{D}", "({a}+{W}*{b})/({c}+{O})")),
    "product": (4, ("{a}*({b}+{O})", "{a}*{b}+{W}*{c}", "{a}+{b}*({c}/{D})-{d}/{D}", "{a}*({b}+{W}*{c})")),
    "min_max_clip": (3, ("{fn}({a},{b})", "{a}+{W}*{fn}({b},{c})", "clip({a}+{W}*{b},0,1)", "{a}-{W}*abs({b}-{c})",
                         "{fn}({a},{W}*{b})")),
    "progress": (2, ("{a}+{W}*u*{b}", "{a}*(1-u)+u*{b}", "{a}+{W}*{b}*(1-u)", "{a}+({W}-{W}*u)*{b}")),
    "single": (1, ("{a}", "{W}*{a}", "{a}+{O}")),
}


def _templated(family: str) -> Template:
    """The template drawing one of `_FORMS[family]`: primitives, then min/max where the
    family uses it, then the form, then its constants in order."""
    count, forms = _FORMS[family]
    constants = {"W": WEIGHTS, "O": OFFSETS, "D": DIVISORS}

    def template(rng, k):
        names = dict(zip("abcd", _prims(rng, k, count)))
        fn = _pick(rng, ("min", "max")) if family == "min_max_clip" else ""
        form = forms[int(rng.integers(len(forms)))]
        filled = re.sub(r"\{([WOD])\}", lambda m: _pick(rng, constants[m.group(1)]), form)
        return filled.format(fn=fn, **names)

    return template


FAMILIES: dict[str, tuple[Template, float]] = {
    "weighted_sum": (_weighted_sum, 0.22),
    "nested": (_nested, 0.16),
    "normalisation": (_templated("normalisation"), 0.12),
    "product": (_templated("product"), 0.12),
    "min_max_clip": (_templated("min_max_clip"), 0.14),
    "progress": (_templated("progress"), 0.10),
    "power": (_power, 0.06),
    "single": (_templated("single"), 0.08),
}


# The families of the "paper" operator set (+ - * / and parentheses).
PAPER_FAMILIES = ("weighted_sum", "nested", "normalisation", "product", "single")


def _is_usable(text: str, num_primitives: int, grammar: Grammar | None, operators: str) -> bool:
    names = [f"g{i + 1}" for i in range(num_primitives)]
    _, validity = check_text(text, names, operators=operators)
    if not validity.ok:
        return False
    if grammar is not None:
        try:
            grammar.encode(text)
        except ValueError:
            return False
    return True


def cold_start_corpus(num_primitives: int, size: int, seed: int, *, grammar: Grammar | None = None,
                      operators: str | None = None) -> list[str]:
    """`size` valid reward expressions over g1..g{num_primitives}, deterministic in `seed`.

    Every text parses, passes `check` and, with `grammar`, is encodable by it (so the cold
    start never teaches a sequence the sampling mask forbids). `operators`: the operator set
    (None: the grammar's, "extended" without a grammar). Raises ValueError naming the
    argument when the arguments are bad, or when no valid expression fits `grammar`.
    """
    if operators is None:
        operators = "extended" if grammar is None else grammar.operators
    check_operators(operators, "cold_start_corpus: operators")
    if grammar is not None and grammar.operators != operators:
        raise ValueError(f"cold_start_corpus: operators={operators!r} but the grammar has {grammar.operators!r}")
    if not isinstance(num_primitives, (int, np.integer)) or num_primitives < 1:
        raise ValueError(f"cold_start_corpus: num_primitives must be a positive int, got {num_primitives!r}")
    if not isinstance(size, (int, np.integer)) or size < 1:
        raise ValueError(f"cold_start_corpus: size must be a positive int, got {size!r}")
    if grammar is not None and grammar.num_primitives != num_primitives:
        raise ValueError(
            f"cold_start_corpus: the grammar has {grammar.num_primitives} primitives, num_primitives={num_primitives}"
        )
    rng = np.random.default_rng(int(seed))
    families = [FAMILIES[name] for name in (PAPER_FAMILIES if operators == "paper" else FAMILIES)]
    templates = [template for template, _ in families]
    weights = np.asarray([weight for _, weight in families])
    weights = weights / weights.sum()
    found: dict[str, None] = {}
    verdicts: dict[str, bool] = {}
    for _ in range(ATTEMPTS_PER_EXPRESSION * int(size)):
        if len(found) == size:
            break
        text = templates[int(rng.choice(len(templates), p=weights))](rng, int(num_primitives))
        if text not in verdicts:
            verdicts[text] = _is_usable(text, int(num_primitives), grammar, operators)
        if verdicts[text]:
            found.setdefault(text)
    distinct = list(found)
    if not distinct:
        limits = "" if grammar is None else f" within max_length={grammar.max_length}, max_depth={grammar.max_depth}"
        raise ValueError(f"cold_start_corpus: no valid expression over {num_primitives} primitives fits{limits}")
    return [distinct[i % len(distinct)] for i in range(int(size))]

