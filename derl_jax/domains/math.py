"""GSM8K / MATH with a Qwen2.5 policy: the mathematical-reasoning domain (host primitives).

    domain = make_math_domain(cfg)                   # data, prompts, primitives (registered as "math")
    base_params, evaluator = derl_jax.rl.setup.build_inner(domain, cfg, workdir)   # policy and inner loop

Data (`config.data`): `train` and `test` are data specs of `derl_jax.domains.math_data`
(`math:/data/MATH/train.jsonl`, `gsm8k:/data/gsm8k/test.parquet`, `tfds:gsm8k:train`, ...).
In `train`, several specs separated by commas form a mixture (the paper's MATH+GSM8K training
set of Table 1(b)), shuffled with `config.domain.seed`. The outer loop cuts its validation
split out of `train` (8:2); on a mixture the validation score is the accuracy over all its
rows, i.e. the example-weighted mean of the GSM8K and MATH validation accuracies. In `test`,
commas separate *named test sets* (`[name=]spec`; the name defaults to the spec's `gsm8k:` /
`math:` prefix, else the file name): every final policy is tested on each of them, as Table
1(b) reports every row on both GSM8K and MATH (`domain.test_sets`; `domain.test` holds all
their rows). `test` is only read by the final evaluation. `config.domain.levels` keeps
MATH problems of those difficulty levels (GSM8K problems have no level and are always kept;
a MATH problem whose level cannot be read is kept only when all five levels are selected);
`config.domain.num_train` / `num_test` then keep at most that many problems (in file order,
or mixture order; `num_test` per test set). Everything is loaded and checked before any model is touched: a missing
file, an empty split or a malformed record stops the run with a message naming the config
field and the record.

Prompts: `math_prompt(question)` (step-by-step reasoning, final answer in `\\boxed{}`), put
through the tokenizer's chat template (the Qwen2.5 ChatML template when the tokenizer has
none), tokenised offline from `config.policy.tokenizer` (default: the checkpoint directory).
Each split is LEFT padded to the smallest of `config.domain.bucket_sizes` that holds its
longest prompt; the inner loop trims every batch further to the smallest bucket that holds
the batch (so few prompt shapes ever compile). A prompt longer than
`config.domain.max_prompt_tokens` is dropped (`overlong_prompts="drop"`, counted in
`domain.info`) or is an error (`"error"`).

Rows of a split carry `context["example"]` (i32[M]), a global index into `domain.answers`
(train examples first, then test), so row subsets made by `TokenDataset.take` / `split`
still find their gold answers: `domain.contexts(dataset)` -> `[{"answer": ...}, ...]`.

Primitives: `primitives/math.py` host primitives, `g1..g4` = correct, boxed, steps,
gold_anywhere, with the Appendix F.3 ablations from `config.domain.remove_primitives` /
`reverse_primitives`; g1 is the validation metric. `config.domain.reward_match` picks g1:
"verify" (default: `correct`, math-verify equivalence) or "exact" (`correct_exact`).
Test metrics (`MathDomain.test_metrics`): "exact" (exact match of the extracted answer, the
paper's test metric and the headline) and "verify" (math-verify equivalence), whatever g1 is. Answer equivalence runs in the
`AnswerChecker` worker processes with `config.domain.answer_timeout_s` per check.

Policy (`config.policy`) and devices (`config.mesh`) are built by `derl_jax.rl.setup` as
for every domain: `checkpoint` is a local Hugging Face Qwen2/Qwen2.5 directory; when it is
empty a random policy of the `policy.*` sizes is drawn (benchmarks and smoke runs without a
checkpoint). See `derl_jax.rl.host_loop` for how the mesh axes are used.

Tiny assets for a CPU smoke run (`configs/math.py:tiny`):

    python -m derl_jax.domains.math --write_tiny_data=/tmp/derl_math_tiny
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import warnings
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from derl_jax.config import ConfigError
from derl_jax.domains.base import Domain, TokenDataset, check_primitive_kinds
from derl_jax.domains.registry import register_domain
from derl_jax.domains.math_data import MathDataError, MathExample, load_mixture
from derl_jax.models.hf_tokenizer import HFTokenizer, math_prompt
from primitives import registry
from primitives.math import DOMAIN as MATH_PRIMITIVE_DOMAIN
from primitives.math import (EXACT_OUTCOME, OUTCOME, REWARD_MATCHES, TEST_METRICS, answer_metrics,
                             configure_answer_checker, math_primitive_names)
from primitives.registry import Primitive

MATH_DOMAIN_KIND = "math"
MATH_LEVELS = (1, 2, 3, 4, 5)
OVERLONG_CHOICES = ("drop", "error")
_LEVEL_NUMBER = re.compile(r"level\s*(\d+)", re.IGNORECASE)


class MathConfigError(ConfigError):
    """A config value of the math domain is missing or out of range; the message names it."""


# ----------------------------------------------------------------------------- the domain


@dataclasses.dataclass(frozen=True)
class MathDomain(Domain):
    """The math Domain (rollout kind "host": primitives of decoded text).

    train, test: TokenDatasets (prompts i32[M, Tp] left padded, prompt_mask bool[M, Tp],
      context {"example": i32[M]} indices into `answers`).
    answers: gold answer of every loaded example (train first, then test).
    questions: the problem text of every loaded example, in the same order.
    test_sets: name -> TokenDataset of each configured test set (rows of `test`), in config order.
    """

    answers: tuple[str, ...] = ()
    questions: tuple[str, ...] = ()
    test_sets: Mapping[str, TokenDataset] = dataclasses.field(default_factory=dict)
    test_metric_names: tuple[str, ...] = TEST_METRICS

    def example_indices(self, dataset: TokenDataset) -> np.ndarray:
        """i64[M]: the global example index of every row of `dataset`."""
        if "example" not in dataset.context:
            raise KeyError(f"math domain: dataset context has no 'example' index (keys: {sorted(dataset.context)})")
        indices = np.asarray(jax.device_get(dataset.context["example"])).astype(np.int64).reshape(-1)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self.answers)):
            raise IndexError(f"math domain: example indices outside 0..{len(self.answers) - 1}")
        return indices

    def contexts(self, dataset: TokenDataset) -> list[dict[str, str]]:
        """Per row of `dataset`, the context host primitives read: {"answer": gold answer}."""
        return [{"answer": self.answers[i]} for i in self.example_indices(dataset)]

    def test_metrics(self, texts: Sequence[str], dataset: TokenDataset) -> dict[str, float]:
        """Accuracy of the greedy outputs `texts` (one per row of `dataset`) by each test metric:
        {"exact": exact match of the extracted answer, "verify": math-verify equivalence}."""
        golds = [self.answers[i] for i in self.example_indices(dataset)]
        if len(texts) != len(golds):
            raise ValueError(f"math domain: {len(texts)} outputs for a test set of {len(golds)} rows")
        return {name: float(np.mean(values)) for name, values in answer_metrics(texts, golds).items()}


# ----------------------------------------------------------------------------- config


def _field(cfg: Any, path: str) -> Any:
    node = cfg
    for part in path.split("."):
        try:
            node = node[part] if isinstance(node, Mapping) else getattr(node, part)
        except (KeyError, AttributeError):
            raise MathConfigError(f"config.{path} is missing") from None
    return node


def _meta_field(cfg: Any, name: str, default: Any) -> Any:
    try:
        return _field(cfg, f"meta.{name}")
    except MathConfigError:
        return default


def _positive_int(cfg: Any, path: str, minimum: int = 1) -> int:
    value = _field(cfg, path)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise MathConfigError(f"config.{path} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def data_specs(value: Any, path: str) -> list[str]:
    """A data spec string (commas separate the parts of a mixture) or a sequence of specs -> list."""
    if isinstance(value, str):
        specs = [part.strip() for part in value.split(",")]
    elif isinstance(value, Sequence):
        specs = [str(part).strip() for part in value]
    else:
        raise MathConfigError(f"config.{path} must be a data spec string or a tuple of them, got {value!r}")
    if not specs or any(not s for s in specs):
        raise MathConfigError(
            f"config.{path} must name the data, e.g. 'math:/data/MATH/train.jsonl' or "
            f"'math:/data/MATH/train.jsonl,gsm8k:/data/gsm8k/train.jsonl'; got {value!r}"
        )
    return specs


def test_set_specs(value: Any, path: str = "data.test") -> list[tuple[str, str]]:
    """[(name, spec)] of the named test sets of `config.data.test` (`[name=]spec`, comma separated)."""
    named = []
    for part in data_specs(value, path):
        name, sep, spec = part.partition("=")
        if not sep:
            name, spec = "", part
        name, spec = name.strip(), spec.strip()
        if not spec:
            raise MathConfigError(f"config.{path}: test set {part!r} names no data")
        if not name:
            prefix = spec.split(":", 1)[0]
            name = prefix if prefix in ("gsm8k", "math") else os.path.splitext(os.path.basename(spec))[0] or spec
        named.append((name, spec))
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        raise MathConfigError(f"config.{path}: test set names must differ, got {names}; name them as 'name=spec'")
    return named


def reward_match(cfg: Any) -> str:
    """`config.domain.reward_match` ("verify" when absent): how g1 compares answers."""
    try:
        value = _field(cfg, "domain.reward_match")
    except MathConfigError:
        return "verify"
    if value not in REWARD_MATCHES:
        raise MathConfigError(f"config.domain.reward_match must be one of {REWARD_MATCHES}, got {value!r}")
    return value


def check_levels(value: Any, path: str = "domain.levels") -> tuple[int, ...]:
    """MATH difficulty levels to keep, a non-empty tuple of distinct values in 1..5."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise MathConfigError(f"config.{path} must be a non-empty tuple of MATH levels in {MATH_LEVELS}, got {value!r}")
    levels = []
    for level in value:
        if isinstance(level, bool) or not isinstance(level, (int, np.integer)) or level not in MATH_LEVELS:
            raise MathConfigError(f"config.{path} must hold MATH levels in {MATH_LEVELS}, got {value!r}")
        levels.append(int(level))
    if len(set(levels)) != len(levels):
        raise MathConfigError(f"config.{path} must not repeat a level, got {value!r}")
    return tuple(levels)


def check_bucket_sizes(value: Any, max_prompt_tokens: int, path: str = "domain.bucket_sizes") -> tuple[int, ...]:
    """Sorted prompt buckets, each in 1..max_prompt_tokens; max_prompt_tokens is always one of them."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise MathConfigError(f"config.{path} must be a non-empty tuple of prompt lengths, got {value!r}")
    sizes = set()
    for size in value:
        if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 1 <= size <= max_prompt_tokens:
            raise MathConfigError(
                f"config.{path} must hold lengths in 1..config.domain.max_prompt_tokens={max_prompt_tokens}, got {value!r}"
            )
        sizes.add(int(size))
    sizes.add(int(max_prompt_tokens))
    return tuple(sorted(sizes))


def validate_math_config(cfg: Any) -> None:
    """Raise MathConfigError naming the first bad math-domain field (data, domain, policy)."""
    kind = _field(cfg, "domain.kind")
    if kind != MATH_DOMAIN_KIND:
        raise MathConfigError(f"config.domain.kind must be {MATH_DOMAIN_KIND!r} for the math domain, got {kind!r}")
    data_specs(_field(cfg, "data.train"), "data.train")
    test_set_specs(_field(cfg, "data.test"))
    match = reward_match(cfg)
    _positive_int(cfg, "domain.seed", 0)
    _positive_int(cfg, "domain.num_train")
    _positive_int(cfg, "domain.num_test")
    check_levels(_field(cfg, "domain.levels"))
    _positive_int(cfg, "domain.max_new_tokens", 2)
    max_prompt = _positive_int(cfg, "domain.max_prompt_tokens")
    check_bucket_sizes(_field(cfg, "domain.bucket_sizes"), max_prompt)
    overlong = _field(cfg, "domain.overlong_prompts")
    if overlong not in OVERLONG_CHOICES:
        raise MathConfigError(f"config.domain.overlong_prompts must be one of {OVERLONG_CHOICES}, got {overlong!r}")
    timeout = _field(cfg, "domain.answer_timeout_s")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise MathConfigError(f"config.domain.answer_timeout_s must be a number > 0, got {timeout!r}")
    _positive_int(cfg, "domain.answer_workers")
    try:
        names = math_primitive_names(tuple(_field(cfg, "domain.remove_primitives")),
                                     tuple(_field(cfg, "domain.reverse_primitives")), match)
    except ValueError as err:
        raise MathConfigError(f"config.domain.remove_primitives / reverse_primitives: {err}") from None
    descriptions = tuple(_meta_field(cfg, "primitive_descriptions", ()))
    if descriptions and len(descriptions) != len(names):
        raise MathConfigError(
            f"config.meta.primitive_descriptions has {len(descriptions)} lines but the domain has {len(names)} "
            f"primitives {names}; give one line per primitive or ()"
        )
    checkpoint = str(_field(cfg, "policy.checkpoint")).strip()
    tokenizer = str(_field(cfg, "policy.tokenizer")).strip()
    if not checkpoint and not tokenizer:
        raise MathConfigError("config.policy.tokenizer must name a tokenizer directory when config.policy.checkpoint is empty")
    if _positive_int(cfg, "policy.sft_steps", 0) != 0:
        raise MathConfigError("config.policy.sft_steps must be 0: the math domain starts from the checkpoint (cold start)")


# ----------------------------------------------------------------------------- data


def example_level(example: MathExample) -> int | None:
    """The MATH difficulty level of `example` ("Level 3" -> 3), None if absent or unreadable."""
    if example.level is None:
        return None
    match = _LEVEL_NUMBER.search(example.level)
    return int(match.group(1)) if match else None


def keep_levels(examples: Sequence[MathExample], levels: Sequence[int]) -> list[MathExample]:
    """GSM8K problems, and MATH problems whose level is in `levels` (see the module docstring)."""
    wanted = set(levels)
    every_level = wanted >= set(MATH_LEVELS)
    kept = []
    for example in examples:
        if example.source != "math":
            kept.append(example)
            continue
        level = example_level(example)
        if (level is None and every_level) or (level is not None and level in wanted):
            kept.append(example)
    return kept


def load_split(cfg: Any, split: str, specs: Sequence[str] | None = None) -> list[MathExample]:
    """The examples of `config.data.<split>` (or of `specs`) after the level filter and the size cap."""
    path = f"data.{split}"
    specs = data_specs(_field(cfg, path), path) if specs is None else list(specs)
    seed = int(_field(cfg, "domain.seed")) if len(specs) > 1 else None
    try:
        examples = load_mixture(specs, seed=seed)
    except (FileNotFoundError, MathDataError) as err:
        raise type(err)(f"config.{path}: {err}") from None
    levels = check_levels(_field(cfg, "domain.levels"))
    kept = keep_levels(examples, levels)
    if not kept:
        raise MathDataError(
            f"config.{path}: none of the {len(examples)} problems of {specs} is at a level in config.domain.levels={levels}"
        )
    cap = _positive_int(cfg, f"domain.num_{split}")
    return kept[:cap]


def chat_prompt_texts(tokenizer: HFTokenizer, examples: Sequence[MathExample], system: str | None) -> list[str]:
    """The chat-formatted prompt text of every example (ending with the assistant header)."""
    return [tokenizer.apply_chat_template(math_prompt(e.question, system=system)) for e in examples]


def encode_split(
    tokenizer: HFTokenizer,
    examples: Sequence[MathExample],
    first_index: int,
    *,
    max_prompt_tokens: int,
    bucket_sizes: Sequence[int],
    overlong: str,
    system: str | None,
    where: str,
) -> tuple[TokenDataset, list[MathExample], int]:
    """(TokenDataset, the examples kept, how many were dropped as overlong) of one split.

    Row r's context["example"] is `first_index + r` (indices count kept examples only).
    """
    texts = chat_prompt_texts(tokenizer, examples, system)
    lengths = [len(ids) for ids in tokenizer.tokenizer(texts, add_special_tokens=False)["input_ids"]]
    too_long = [i for i, n in enumerate(lengths) if n > max_prompt_tokens]
    if too_long and overlong == "error":
        first = too_long[0]
        raise MathDataError(
            f"{where}: problem {examples[first].uid!r} has a {lengths[first]}-token prompt, more than "
            f"config.domain.max_prompt_tokens={max_prompt_tokens} ({len(too_long)} such problems); raise the limit "
            "or set config.domain.overlong_prompts='drop'"
        )
    keep = [i for i in range(len(examples)) if i not in set(too_long)]
    if not keep:
        raise MathDataError(f"{where}: every prompt is longer than config.domain.max_prompt_tokens={max_prompt_tokens}")
    ids, mask = tokenizer.encode_prompts([texts[i] for i in keep], bucket_sizes=bucket_sizes)
    index = np.arange(first_index, first_index + len(keep), dtype=np.int32)
    dataset = TokenDataset(prompts=ids, prompt_mask=mask, context={"example": index})
    return dataset, [examples[i] for i in keep], len(too_long)


def warn_on_overlap(train: Sequence[MathExample], test: Sequence[MathExample]) -> int:
    """Warn when test problems also occur (same question text) in the training data; returns the count."""
    seen = {e.question.strip() for e in train}
    shared = sum(e.question.strip() in seen for e in test)
    if shared:
        warnings.warn(
            f"math domain: {shared} of {len(test)} test problems also occur in the training data "
            "(config.data.train and config.data.test overlap)",
            RuntimeWarning,
            stacklevel=3,
        )
    return shared


def resolve_primitives(cfg: Any) -> tuple[Primitive, ...]:
    """The configured host primitives (ablations applied), in g1..gk order."""
    names = math_primitive_names(tuple(cfg.domain.remove_primitives), tuple(cfg.domain.reverse_primitives),
                                 reward_match(cfg))
    prims = registry.resolve(MATH_PRIMITIVE_DOMAIN, names)
    check_primitive_kinds(prims, "host", "math domain")
    return prims


def tokenizer_directory(cfg: Any) -> str:
    return str(cfg.policy.tokenizer).strip() or str(cfg.policy.checkpoint).strip()


def make_math_domain(cfg: Any, tokenizer: HFTokenizer | None = None) -> MathDomain:
    """The math domain of a full run config (module docstring); loads and checks all data."""
    validate_math_config(cfg)
    train_examples = load_split(cfg, "train")
    named_tests = [(name, load_split(cfg, "test", [spec])) for name, spec in test_set_specs(_field(cfg, "data.test"))]
    test_examples = [example for _, examples in named_tests for example in examples]
    overlap = warn_on_overlap(train_examples, test_examples)
    tokenizer = tokenizer or HFTokenizer.from_directory(tokenizer_directory(cfg))
    max_prompt = int(cfg.domain.max_prompt_tokens)
    buckets = check_bucket_sizes(tuple(cfg.domain.bucket_sizes), max_prompt)
    system = str(cfg.domain.system_prompt) or None
    common = dict(max_prompt_tokens=max_prompt, bucket_sizes=buckets, overlong=str(cfg.domain.overlong_prompts), system=system)
    train, train_kept, train_dropped = encode_split(tokenizer, train_examples, 0, where="config.data.train", **common)
    test, test_kept, test_dropped = encode_split(
        tokenizer, test_examples, len(train_kept), where="config.data.test", **common
    )
    owner = {id(example): name for name, examples in named_tests for example in examples}
    test_sets = {}
    for name, _ in named_tests:
        rows = np.asarray([r for r, e in enumerate(test_kept) if owner[id(e)] == name], np.int64)
        if rows.size == 0:
            raise MathDataError(f"config.data.test: test set {name!r} has no prompt within config.domain.max_prompt_tokens")
        test_sets[name] = test.take(rows)
    prims = resolve_primitives(cfg)
    configure_answer_checker(timeout_s=float(cfg.domain.answer_timeout_s), num_workers=int(cfg.domain.answer_workers))
    kept = train_kept + test_kept
    sources = {name: sum(e.source == name for e in train_kept) for name in ("gsm8k", "math")}
    info = {
        "train_size": len(train_kept),
        "test_size": len(test_kept),
        "test_sets": {name: int(ds.prompts.shape[0]) for name, ds in test_sets.items()},
        "train_sources": sources,
        "dropped_overlong": {"train": train_dropped, "test": test_dropped},
        "test_in_train": overlap,
        "train_prompt_length": int(train.prompts.shape[1]),
        "test_prompt_length": int(test.prompts.shape[1]),
    }
    return MathDomain(
        name=MATH_DOMAIN_KIND,
        primitives=prims,
        outcome_index=[p.name for p in prims].index(EXACT_OUTCOME if reward_match(cfg) == "exact" else OUTCOME),
        train=train,
        test=test,
        tokenizer=tokenizer,
        max_new_tokens=int(cfg.domain.max_new_tokens),
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        rollout="host",
        stop_ids=tuple(tokenizer.stop_ids),
        answers=tuple(e.answer for e in kept),
        questions=tuple(e.question for e in kept),
        bucket_sizes=buckets,
        test_sets=test_sets,
        info=info,
    )


def configured_primitive_names(cfg: Any) -> tuple[str, ...]:
    """The ordered primitive names of a math config (ablations applied; loads no data)."""
    domain = cfg.domain
    remove = tuple(domain.get("remove_primitives", ())) if hasattr(domain, "get") else ()
    reverse = tuple(domain.get("reverse_primitives", ())) if hasattr(domain, "get") else ()
    return math_primitive_names(remove, reverse, reward_match(cfg))


@register_domain(MATH_DOMAIN_KIND, primitive_names=configured_primitive_names, validate=validate_math_config)
def build_math_domain(cfg: Any) -> Domain:
    return make_math_domain(cfg)


# ----------------------------------------------------------------------------- tiny assets


_NAMES = ("Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana")
_THINGS = ("apples", "pens", "stamps", "shells", "cards", "marbles")


def tiny_problems(count: int, seed: int, label: str) -> tuple[list[dict], list[dict]]:
    """(gsm8k_records, math_records): `count` procedurally made problems of each format, each
    question tagged `(label-index)` so that different labels never share a question."""
    rng = np.random.default_rng(seed)
    gsm8k, maths = [], []
    for index in range(count):
        name, thing = _NAMES[rng.integers(len(_NAMES))], _THINGS[rng.integers(len(_THINGS))]
        first, second = int(rng.integers(2, 50)), int(rng.integers(2, 50))
        total = first + second
        gsm8k.append({
            "question": f"{name} has {first} {thing} and finds {second} more. How many {thing} does {name} have now? ({label}-{index})",
            "answer": f"{name} has {first} + {second} = <<{first}+{second}={total}>>{total} {thing}.\n#### {total}",
        })
        a, b = int(rng.integers(2, 12)), int(rng.integers(2, 12))
        maths.append({
            "problem": f"Compute ${a} \\times {b}$. ({label}-{index})",
            "solution": f"Multiplying gives $\\boxed{{{a * b}}}$.",
            "level": f"Level {1 + index % 5}",
            "type": "Prealgebra",
        })
    return gsm8k, maths


def write_tiny_data(directory: str, count: int = 12, seed: int = 0) -> dict[str, str]:
    """Write train/test JSONL files of both formats for the tiny preset; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for split, split_seed in (("train", seed), ("test", seed + 1)):
        gsm8k, maths = tiny_problems(count if split == "train" else max(count // 2, 2), split_seed, split)
        for name, records in (("gsm8k", gsm8k), ("math", maths)):
            path = os.path.join(directory, f"{name}_{split}.jsonl")
            with open(path, "w", encoding="utf-8") as handle:
                handle.write("".join(json.dumps(r) + "\n" for r in records))
            paths[f"{name}_{split}"] = path
    return paths


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write the tiny GSM8K/MATH-format files of configs/math.py:tiny.")
    parser.add_argument("--write_tiny_data", required=True, metavar="DIR")
    parser.add_argument("--count", type=int, default=12)
    args = parser.parse_args()
    for label, written in write_tiny_data(args.write_tiny_data, args.count).items():
        print(f"{label}: {written}")
