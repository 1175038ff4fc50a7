"""The embedded arithmetic domain: procedurally generated integer expressions.

Problems are expressions over small non-negative integers with `+`, `-`, `*` (usual
precedence: `*` first, then left to right). Every intermediate value and the answer lie in
[0, 999], so no sign ever appears in a solution.

Levels (`LEVELS`):
  1: one operation, operands 0-9            `7*8`
  2: two operations, operands 0-9           `3+4*2`
  3: two operations, operands 0-99, at least one of them two-digit
  4: three operations, operands 0-99, at least one of them two-digit
Level 1 has only 255 distinct problems; when a level runs out, the others fill the count.

Text format (all characters are in `ARITH_ALPHABET`, one token each):
  prompt      `3+4*2=`
  solution    `1:4*2=8;2:3+8=11;[11]`
  `k:` starts step k (one operation per step, in evaluation order), `;` ends a step, and
  `[digits]` is the box holding the final answer. The tokenizer's EOS follows the solution;
  it is a token, not a character.

Badly formatted reference styles (`REFERENCE_STYLES`) feed the supervised warm start:
  steps       `1:4*2=8;2:3+8=11;[11]`  (the well-formatted one)
  no_steps    `[11]`
  no_box      `1:4*2=8;2:3+8=11;11`
  wrong_step  `1:4*2=9;2:3+9=12;[12]`  (one step off; the error propagates to the answer)
  plain       `11`

Config fields (`default_arith_config()`):
  seed            problem generation and train/test split
  num_train       training problems (the outer loop cuts its validation split from these)
  num_test        held-out test problems, disjoint from train by problem text
  levels          tuple of difficulty levels, cycled over the generated problems
  max_new_tokens  generation budget T per completion; must hold the longest well-formatted
                  solution plus EOS
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import types
from typing import Any, Mapping, NamedTuple, Sequence

import jax.numpy as jnp
import ml_collections
import numpy as np

from derl_jax.config import int_at_least, int_tuple
from derl_jax.domains.base import Domain, TokenDataset
from derl_jax.domains.registry import register_domain
from derl_jax.models.tokenizers import CharTokenizer
from primitives import registry
from primitives.arith import (ARITH_ALPHABET, ARITH_PRIMITIVES, BOX_CLOSE, BOX_OPEN, STEP_END, STEP_MARK,  # noqa: F401
                              arith_tokenizer)

OPERATORS = "+-*"
MAX_VALUE = 999
ANSWER_WIDTH = len(str(MAX_VALUE))

REFERENCE_STYLES = ("steps", "no_steps", "no_box", "wrong_step", "plain")
DEFAULT_SFT_MIX = types.MappingProxyType(
    {"steps": 0.4, "no_steps": 0.15, "no_box": 0.15, "wrong_step": 0.15, "plain": 0.15}
)

_MAX_ATTEMPTS_PER_PROBLEM = 20_000
_ENUMERATE_UP_TO = 50_000


# ----------------------------------------------------------------------------- problems


@dataclasses.dataclass(frozen=True)
class LevelSpec:
    """num_ops operations over operands in [0, max_operand]; two_digit: at least one operand >= 10."""

    num_ops: int
    max_operand: int
    two_digit: bool


LEVELS = {
    1: LevelSpec(num_ops=1, max_operand=9, two_digit=False),
    2: LevelSpec(num_ops=2, max_operand=9, two_digit=False),
    3: LevelSpec(num_ops=2, max_operand=99, two_digit=True),
    4: LevelSpec(num_ops=3, max_operand=99, two_digit=True),
}


class Step(NamedTuple):
    """One solution step `left op right = result`."""

    left: int
    op: str
    right: int
    result: int


@dataclasses.dataclass(frozen=True)
class Problem:
    """An expression `operands[0] operators[0] operands[1] ...` and its step-by-step solution."""

    level: int
    operands: tuple[int, ...]
    operators: tuple[str, ...]
    steps: tuple[Step, ...]

    @property
    def text(self) -> str:
        parts = [str(self.operands[0])]
        for op, value in zip(self.operators, self.operands[1:]):
            parts += [op, str(value)]
        return "".join(parts)

    @property
    def prompt(self) -> str:
        return self.text + "="

    @property
    def answer(self) -> int:
        return self.steps[-1].result


def _apply(left: int, op: str, right: int) -> int:
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    raise ValueError(f"arith: unknown operator {op!r}; expected one of {OPERATORS!r}")


def solve_steps(
    operands: Sequence[int], operators: Sequence[str], *, corrupt: tuple[int, int] | None = None
) -> tuple[Step, ...]:
    """The steps that evaluate the expression: `*` left to right, then `+`/`-` left to right.

    corrupt: (step index, delta) adds `delta` to that step's result; later steps use the
    wrong value (the `wrong_step` style).
    """
    if len(operands) != len(operators) + 1:
        raise ValueError(f"solve_steps: {len(operands)} operands do not fit {len(operators)} operators")
    values, ops, steps = list(operands), list(operators), []
    while ops:
        where = ops.index("*") if "*" in ops else 0
        left, op, right = values[where], ops[where], values[where + 1]
        result = _apply(left, op, right)
        if corrupt is not None and corrupt[0] == len(steps):
            result += corrupt[1]
        steps.append(Step(left, op, right, result))
        values[where : where + 2] = [result]
        del ops[where]
    return tuple(steps)


def _in_range(steps: Sequence[Step]) -> bool:
    return all(0 <= s.result <= MAX_VALUE for s in steps)


def _candidate(level: int, operands: Sequence[int], operators: Sequence[str]) -> Problem | None:
    """The problem, or None when it breaks the level's rules or leaves [0, MAX_VALUE]."""
    if LEVELS[level].two_digit and max(operands) < 10:
        return None
    steps = solve_steps(operands, operators)
    return Problem(level, tuple(operands), tuple(operators), steps) if _in_range(steps) else None


class _LevelSource:
    """Distinct problems of one level in random order; `next()` gives None once none is left.

    Small levels are enumerated and shuffled (exact, and exhaustion is certain); large ones
    are drawn uniformly by rejection, and count as exhausted after _MAX_ATTEMPTS_PER_PROBLEM
    draws without a new problem.
    """

    def __init__(self, level: int, rng: np.random.Generator):
        self.level, self.rng, self.seen = level, rng, set()
        spec = LEVELS[level]
        space = (spec.max_operand + 1) ** (spec.num_ops + 1) * len(OPERATORS) ** spec.num_ops
        self.pool = None
        if space <= _ENUMERATE_UP_TO:
            values = range(spec.max_operand + 1)
            every = (
                _candidate(level, operands, operators)
                for operands in itertools.product(values, repeat=spec.num_ops + 1)
                for operators in itertools.product(OPERATORS, repeat=spec.num_ops)
            )
            valid = [p for p in every if p is not None]
            self.pool = [valid[i] for i in rng.permutation(len(valid))][::-1]

    def next(self) -> Problem | None:
        if self.pool is not None:
            return self.pool.pop() if self.pool else None
        spec = LEVELS[self.level]
        for _ in range(_MAX_ATTEMPTS_PER_PROBLEM):
            operands = [int(v) for v in self.rng.integers(0, spec.max_operand + 1, size=spec.num_ops + 1)]
            operators = [OPERATORS[i] for i in self.rng.integers(0, len(OPERATORS), size=spec.num_ops)]
            problem = _candidate(self.level, operands, operators)
            if problem is not None and problem.text not in self.seen:
                self.seen.add(problem.text)
                return problem
        return None


def check_levels(levels: Sequence[int], where: str) -> tuple[int, ...]:
    levels = tuple(int(level) for level in levels)
    if not levels:
        raise ValueError(f"{where}: levels is empty; choose from {sorted(LEVELS)}")
    unknown = [level for level in levels if level not in LEVELS]
    if unknown:
        raise ValueError(f"{where}: unknown levels {unknown}; choose from {sorted(LEVELS)}")
    return levels


def make_problems(seed: int, count: int, levels: Sequence[int]) -> list[Problem]:
    """`count` distinct problems (by text), deterministic in `seed`.

    Levels take turns in the order given. A level that runs out of distinct problems (level
    1 has 255) leaves the rotation and the other levels fill the rest of `count`.
    """
    levels = check_levels(levels, "make_problems")
    if count < 0:
        raise ValueError(f"make_problems: count must be >= 0, got {count}")
    rng = np.random.default_rng(seed)
    sources = {level: _LevelSource(level, rng) for level in dict.fromkeys(levels)}
    rotation, turn, problems = list(levels), 0, []
    while len(problems) < count:
        if not rotation:
            raise ValueError(
                f"make_problems: levels {levels} hold only {len(problems)} distinct problems, {count} asked for"
            )
        level = rotation[turn % len(rotation)]
        problem = sources[level].next()
        if problem is None:
            rotation = [other for other in rotation if other != level]
            continue
        problems.append(problem)
        turn += 1
    return problems


def make_splits(seed: int, num_train: int, num_test: int, levels: Sequence[int]) -> tuple[list[Problem], list[Problem]]:
    """(train, test): distinct problems shuffled with `seed` and cut; no text is in both."""
    problems = make_problems(seed, num_train + num_test, levels)
    order = np.random.default_rng([seed, 1]).permutation(len(problems))
    shuffled = [problems[i] for i in order]
    return shuffled[num_test:], shuffled[:num_test]


# ----------------------------------------------------------------------------- solutions


def format_steps(steps: Sequence[Step]) -> str:
    """`1:4*2=8;2:3+8=11;` (each step ends with `;`)."""
    return "".join(f"{k}{STEP_MARK}{s.left}{s.op}{s.right}={s.result}{STEP_END}" for k, s in enumerate(steps, 1))


def boxed(value: int) -> str:
    return f"{BOX_OPEN}{value}{BOX_CLOSE}"


def _wrong_steps(problem: Problem, rng: np.random.Generator | None) -> tuple[Step, ...]:
    """The problem's steps with one result off by a small delta, every value still in range,
    and the final answer wrong. Without `rng` the first valid choice in a fixed order is taken.
    Moving the last result by +1 or -1 always qualifies, so a choice always exists."""
    candidates = [(i, d) for i in range(len(problem.steps)) for d in (1, -1, 2, -2, 10, -10)]
    if rng is not None:
        candidates = [candidates[i] for i in rng.permutation(len(candidates))]
    for corrupt in candidates:
        steps = solve_steps(problem.operands, problem.operators, corrupt=corrupt)
        if _in_range(steps) and steps[-1].result != problem.answer:
            return steps
    raise ValueError(f"reference_solution: no in-range wrong step exists for {problem.text!r}")


def reference_solution(problem: Problem, style: str = "steps", rng: np.random.Generator | None = None) -> str:
    """A completion of `problem.prompt` in `style` (see REFERENCE_STYLES); `rng` varies wrong_step."""
    if style == "steps":
        return format_steps(problem.steps) + boxed(problem.answer)
    if style == "no_steps":
        return boxed(problem.answer)
    if style == "no_box":
        return format_steps(problem.steps) + str(problem.answer)
    if style == "wrong_step":
        steps = _wrong_steps(problem, rng)
        return format_steps(steps) + boxed(steps[-1].result)
    if style == "plain":
        return str(problem.answer)
    raise ValueError(f"reference_solution: unknown style {style!r}; choose from {REFERENCE_STYLES}")


def sft_corpus(
    problems: Sequence[Problem], seed: int, mix: Mapping[str, float] = DEFAULT_SFT_MIX
) -> list[tuple[str, str]]:
    """(prompt, completion) pairs, one per problem, each in a style drawn with weights `mix`.

    Completions carry no EOS character; append the tokenizer's eos id when encoding
    (`encode_completions` does).
    """
    unknown = sorted(set(mix) - set(REFERENCE_STYLES))
    if unknown:
        raise ValueError(f"sft_corpus: mix names unknown styles {unknown}; choose from {REFERENCE_STYLES}")
    styles = list(mix)
    weights = np.array([mix[s] for s in styles], np.float64)
    if np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError(f"sft_corpus: mix weights must be >= 0 with a positive sum, got {dict(mix)}")
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(styles), size=len(problems), p=weights / weights.sum())
    return [(p.prompt, reference_solution(p, styles[k], rng)) for p, k in zip(problems, picks)]


# ----------------------------------------------------------------------------- token arrays


def prompt_length(levels: Sequence[int]) -> int:
    """Tokens of the longest possible prompt over `levels`, BOS included."""
    def longest(spec: LevelSpec) -> int:
        return 1 + spec.num_ops + (spec.num_ops + 1) * len(str(spec.max_operand)) + 1

    return max(longest(LEVELS[level]) for level in check_levels(levels, "prompt_length"))


def encode_prompts(tokenizer: CharTokenizer, prompts: Sequence[str], length: int) -> tuple[np.ndarray, np.ndarray]:
    """(i32[M, length], bool[M, length]): BOS + prompt characters, left padded."""
    return tokenizer.encode_batch(prompts, length, left_pad=True, add_bos=True)


def encode_completions(
    tokenizer: CharTokenizer, completions: Sequence[str], length: int
) -> tuple[np.ndarray, np.ndarray]:
    """Rollout arrays (tokens i32[N, length], mask bool[N, length]) for completion texts.

    EOS follows each completion when it fits; a longer completion is cut at `length`
    characters without EOS (a truncated generation). mask is True up to and including EOS.
    """
    tokens = np.full((len(completions), length), tokenizer.pad_id, np.int32)
    mask = np.zeros((len(completions), length), bool)
    for row, text in enumerate(completions):
        ids = tokenizer.encode(text, add_eos=True)[:length]
        tokens[row, : len(ids)] = ids
        mask[row, : len(ids)] = True
    return tokens, mask


def answer_context(tokenizer: CharTokenizer, problems: Sequence[Problem]) -> dict[str, np.ndarray]:
    """answer i32[M, ANSWER_WIDTH] (gold digits as ids, pad-filled), answer_len i32[M],
    answer_value i32[M], level i32[M]."""
    answer, answer_len = tokenizer.encode_batch([str(p.answer) for p in problems], ANSWER_WIDTH, left_pad=False)
    return {
        "answer": answer,
        "answer_len": answer_len.sum(axis=1).astype(np.int32),
        "answer_value": np.array([p.answer for p in problems], np.int32),
        "level": np.array([p.level for p in problems], np.int32),
    }


def make_dataset(tokenizer: CharTokenizer, problems: Sequence[Problem], length: int) -> TokenDataset:
    prompts, prompt_mask = encode_prompts(tokenizer, [p.prompt for p in problems], length)
    context = {k: jnp.asarray(v) for k, v in answer_context(tokenizer, problems).items()}
    return TokenDataset(prompts=jnp.asarray(prompts), prompt_mask=jnp.asarray(prompt_mask), context=context)


# ----------------------------------------------------------------------------- domain


def default_arith_config() -> ml_collections.ConfigDict:
    """Fields documented at the top of this module."""
    return ml_collections.ConfigDict(
        {"seed": 0, "num_train": 2000, "num_test": 500, "levels": (1, 2, 3), "max_new_tokens": 40}
    )


def _field(cfg: Any, name: str) -> Any:
    try:
        return cfg[name] if isinstance(cfg, Mapping) else getattr(cfg, name)
    except (KeyError, AttributeError):
        raise ValueError(f"make_arith_domain: config has no field {name!r}") from None


def make_arith_domain(cfg: Any) -> Domain:
    """The arithmetic Domain from a ConfigDict, dict or dataclass with the documented fields
    (a run config's `domain` block)."""
    seed, num_train, num_test = int(_field(cfg, "seed")), int(_field(cfg, "num_train")), int(_field(cfg, "num_test"))
    levels = check_levels(_field(cfg, "levels"), "make_arith_domain")
    max_new_tokens = int(_field(cfg, "max_new_tokens"))
    if num_train < 1 or num_test < 1:
        raise ValueError(f"make_arith_domain: num_train={num_train} and num_test={num_test} must both be >= 1")
    train, test = make_splits(seed, num_train, num_test, levels)
    longest = max(len(reference_solution(p, "steps")) for p in train + test)
    if max_new_tokens < longest + 1:
        raise ValueError(
            f"make_arith_domain: max_new_tokens={max_new_tokens} cannot hold the longest solution "
            f"({longest} characters) plus EOS for levels {levels}"
        )
    tokenizer = arith_tokenizer()
    length = prompt_length(levels)
    domain = Domain(
        name="arith",
        primitives=registry.resolve("arith", ARITH_PRIMITIVES),
        outcome_index=0,
        train=make_dataset(tokenizer, train, length),
        test=make_dataset(tokenizer, test, length),
        tokenizer=tokenizer,
        max_new_tokens=max_new_tokens,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        info={
            "levels": levels,
            "prompt_length": length,
            "longest_solution": longest,
            "train_problems": tuple(train),
            "test_problems": tuple(test),
        },
    )
    return dataclasses.replace(domain, corpus=functools.partial(supervised_corpus, domain))


def supervised_corpus(domain: Domain, seed: int, holdout_rows: Sequence[int] = (), options: Any = None
                      ) -> list[tuple[str, str]]:
    """(prompt, completion) texts of the warm-start corpus (the domain's `corpus`).

    The problems are the training split's rows except `holdout_rows` (the validation rows),
    followed by `options.sft_extra_problems` (default 0) fresh problems of the domain's levels
    whose texts are in neither the training nor the test split (drawn with `seed`).
    `options.sft_mix`: style weights of the completions (default `DEFAULT_SFT_MIX`).
    """
    options = {} if options is None else options
    extra = int(options.get("sft_extra_problems", 0))
    mix = options.get("sft_mix", None)
    train, test = domain.info["train_problems"], domain.info["test_problems"]
    held_out = {int(row) for row in np.asarray(holdout_rows, np.int64).reshape(-1)}
    outside = sorted(row for row in held_out if not 0 <= row < len(train))
    if outside:
        raise ValueError(f"arith corpus: holdout_rows {outside[:5]} are outside the {len(train)} training rows")
    if extra < 0:
        raise ValueError(f"config.policy.sft_extra_problems must be >= 0, got {extra}")
    problems = [problem for row, problem in enumerate(train) if row not in held_out]
    if extra:
        taken = {problem.text for problem in (*train, *test)}
        try:
            pool = make_problems(seed + 1, extra + len(taken), domain.info["levels"])
        except ValueError as err:
            raise ValueError(
                f"config.policy.sft_extra_problems={extra}: that many fresh problems do not exist besides the "
                f"{len(taken)} train/test problems of levels {domain.info['levels']}: {err}") from None
        problems += [problem for problem in pool if problem.text not in taken][:extra]
    if not problems:
        raise ValueError("arith corpus: no problems are left for the supervised corpus")
    return sft_corpus(problems, seed, DEFAULT_SFT_MIX if mix is None else dict(mix))


def validate_arith_config(cfg: Any) -> None:
    """Raise ConfigError naming the first bad field of `config.domain` for arithmetic."""
    int_at_least(cfg, "domain.seed", 0)
    int_at_least(cfg, "domain.num_train", 5)
    int_at_least(cfg, "domain.num_test", 1)
    int_tuple(cfg, "domain.levels", minimum=1, allowed=sorted(LEVELS))
    int_at_least(cfg, "domain.max_new_tokens", 2)


@register_domain("arith", primitive_names=lambda cfg: ARITH_PRIMITIVES, validate=validate_arith_config)
def build_arith_domain(cfg: Any) -> Domain:
    return make_arith_domain(cfg.domain)
