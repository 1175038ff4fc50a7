"""The symbols domain: reverse a short letter string. A known-answer domain for the outer loop.

Task: the prompt is a string s of `min_len`..`max_len` letters from the first `alphabet_size`
letters of `LETTERS`, then `=`; the answer is s reversed, then EOS. Strings are distinct and
never palindromes, so copying s is always wrong.

Text format (all characters are in `SYMBOLS_ALPHABET`, one token each):
  prompt      `cabd=`
  answer      `dbac`

Primitives (`primitives/symbols.py`, g1..g5): exact (task success), position (aligned share,
the dense aligned signal), bag (letters present anywhere), length, marker (the decoy symbol
`#` present). Copying s earns bag and length in full; `#` earns marker; only the reverse earns
exact and position in full.

The warm-start corpus (`REFERENCE_STYLES`) makes a base policy that mostly copies:
  reverse  `dbac`   (the answer)
  copy     `cabd`   (the wrong transform)
  mixed    `dabd`   each position independently: the reversed letter with probability
                    `sft_reverse_rate`, else the copied one
  marked   `da#d`   a mixed answer with one position replaced by `#`
With `sft_reverse_rate` below 1/2 the base policy's most likely letter at every position is the
copied one, so greedy decoding copies (exact match near 0) while sampling reverses each position
now and then: a whole reversed string is rare (sparse `exact`) and single reversed positions are
common (dense `position`).

Config fields (`config.domain`):
  seed            string generation and the train/test split
  num_train       training strings (the outer loop cuts its validation split from these)
  num_test        held-out test strings, disjoint from train
  alphabet_size   letters in use (2..len(LETTERS))
  min_len         shortest string (>= 2)
  max_len         longest string (>= min_len)
  max_new_tokens  generation budget T per completion (>= max_len + 1: the answer and EOS)
  base_policy_band  {primitive: (low, high)}: the declared sampled means of the base policy
                  (`Domain.base_policy_band`, checked by `derl_jax.rl.base_band`); absent: none
Warm-start corpus options (`config.policy`, read by `supervised_corpus`):
  sft_mix            style -> weight (default `DEFAULT_SFT_MIX`)
  sft_reverse_rate   the mixed style's chance of the reversed letter (default 0.2)
  sft_extra_strings  fresh strings (in neither split) added to the corpus (default 0)
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any, Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from derl_jax.config import ConfigError, config_value, int_at_least, is_number
from derl_jax.domains.base import Domain, TokenDataset
from derl_jax.domains import symbols_classes
from derl_jax.domains.registry import register_domain
from derl_jax.models.tokenizers import CharTokenizer
from primitives import registry
from primitives.symbols import LETTERS, MARKER, SEPARATOR, SYMBOLS_PRIMITIVES, symbols_tokenizer

REFERENCE_STYLES = ("reverse", "copy", "mixed", "marked")
DEFAULT_SFT_MIX = types.MappingProxyType({"mixed": 0.85, "marked": 0.15})
DEFAULT_REVERSE_RATE = 0.2

_MAX_DRAWS_PER_STRING = 1000


# ----------------------------------------------------------------------------- strings


@dataclasses.dataclass(frozen=True)
class StringSpec:
    """Strings of min_len..max_len letters over the first alphabet_size letters of LETTERS."""

    alphabet_size: int
    min_len: int
    max_len: int

    def __post_init__(self):
        if not 2 <= self.alphabet_size <= len(LETTERS):
            raise ValueError(f"StringSpec: alphabet_size must be in [2, {len(LETTERS)}], got {self.alphabet_size}")
        if not 2 <= self.min_len <= self.max_len:
            raise ValueError(f"StringSpec: need 2 <= min_len <= max_len, got {self.min_len} and {self.max_len}")

    @property
    def letters(self) -> str:
        return LETTERS[: self.alphabet_size]

    def count(self, length: int) -> int:
        """Distinct non-palindromes of `length` letters: a^L - a^ceil(L/2)."""
        a = self.alphabet_size
        return a**length - a ** ((length + 1) // 2)


def answer_of(text: str) -> str:
    """The task's answer: `text` reversed."""
    return text[::-1]


def make_strings(seed: int | Sequence[int], count: int, spec: StringSpec) -> list[str]:
    """`count` distinct non-palindromes, deterministic in `seed` (an int or a tuple of ints).

    Each string draws its length uniformly from min_len..max_len and then its letters uniformly;
    asking for more than 3/4 of the non-palindromes of some length is an error naming it (so a
    new string takes a few draws at most).
    """
    if count < 0:
        raise ValueError(f"make_strings: count must be >= 0, got {count}")
    rng = np.random.default_rng(list(seed) if isinstance(seed, Sequence) else seed)
    lengths = rng.integers(spec.min_len, spec.max_len + 1, size=count)
    for length in range(spec.min_len, spec.max_len + 1):
        wanted = int(np.sum(lengths == length))
        if 4 * wanted > 3 * spec.count(length):
            raise ValueError(f"make_strings: {wanted} strings of length {length} asked for, but only "
                             f"{spec.count(length)} non-palindromes of {spec.alphabet_size} letters exist; "
                             f"raise alphabet_size or max_len, or ask for fewer")
    letters, seen, strings = np.array(list(spec.letters)), set(), []
    for length in lengths:
        for _ in range(_MAX_DRAWS_PER_STRING):
            text = "".join(letters[rng.integers(0, spec.alphabet_size, size=int(length))])
            if text not in seen and text != answer_of(text):
                break
        else:
            raise ValueError(f"make_strings: no new string of length {length} found in {_MAX_DRAWS_PER_STRING} draws")
        seen.add(text)
        strings.append(text)
    return strings


def make_splits(seed: int, num_train: int, num_test: int, spec: StringSpec) -> tuple[list[str], list[str]]:
    """(train, test): distinct strings cut in two; no string is in both."""
    strings = make_strings(seed, num_train + num_test, spec)
    return strings[num_test:], strings[:num_test]


# ----------------------------------------------------------------------------- the warm-start corpus


def reference_answer(text: str, style: str, rng: np.random.Generator, reverse_rate: float = DEFAULT_REVERSE_RATE
                     ) -> str:
    """A completion of `text + "="` in `style` (see REFERENCE_STYLES); `rng` draws mixed/marked choices."""
    if style == "reverse":
        return answer_of(text)
    if style == "copy":
        return text
    if style in ("mixed", "marked"):
        reverse = rng.random(len(text)) < reverse_rate
        chars = [r if flip else c for c, r, flip in zip(text, answer_of(text), reverse)]
        if style == "marked":
            chars[int(rng.integers(0, len(chars)))] = MARKER
        return "".join(chars)
    raise ValueError(f"reference_answer: unknown style {style!r}; choose from {REFERENCE_STYLES}")


def sft_corpus(strings: Sequence[str], seed: int, mix: Mapping[str, float] = DEFAULT_SFT_MIX,
               reverse_rate: float = DEFAULT_REVERSE_RATE) -> list[tuple[str, str]]:
    """(prompt, completion) pairs, one per string, each in a style drawn with weights `mix`.

    Completions carry no EOS character; the encoder appends the tokenizer's eos id.
    """
    unknown = sorted(set(mix) - set(REFERENCE_STYLES))
    if unknown:
        raise ValueError(f"sft_corpus: mix names unknown styles {unknown}; choose from {REFERENCE_STYLES}")
    styles = list(mix)
    weights = np.array([mix[s] for s in styles], np.float64)
    if not styles or np.any(weights < 0) or weights.sum() <= 0:
        raise ValueError(f"sft_corpus: mix weights must be >= 0 with a positive sum, got {dict(mix)}")
    if not 0.0 <= reverse_rate <= 1.0:
        raise ValueError(f"sft_corpus: reverse_rate must be in [0, 1], got {reverse_rate}")
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(styles), size=len(strings), p=weights / weights.sum())
    return [(s + SEPARATOR, reference_answer(s, styles[k], rng, reverse_rate)) for s, k in zip(strings, picks)]


# ----------------------------------------------------------------------------- token arrays


def prompt_length(spec: StringSpec) -> int:
    """Tokens of the longest prompt: BOS, max_len letters, `=`."""
    return spec.max_len + 2


def make_dataset(tokenizer: CharTokenizer, strings: Sequence[str], spec: StringSpec) -> TokenDataset:
    """prompts i32[M, max_len + 2] (BOS + s + `=`, left padded); context: answer i32[M, max_len]
    (the reversed string's ids, pad-filled) and answer_len i32[M]."""
    prompts, prompt_mask = tokenizer.encode_batch([s + SEPARATOR for s in strings], prompt_length(spec),
                                                  left_pad=True, add_bos=True)
    answer, answer_mask = tokenizer.encode_batch([answer_of(s) for s in strings], spec.max_len, left_pad=False)
    context = {"answer": jnp.asarray(answer), "answer_len": jnp.asarray(answer_mask.sum(axis=1).astype(np.int32))}
    return TokenDataset(prompts=jnp.asarray(prompts), prompt_mask=jnp.asarray(prompt_mask), context=context)


# ----------------------------------------------------------------------------- domain


def _field(cfg: Any, name: str) -> Any:
    try:
        return cfg[name] if isinstance(cfg, Mapping) else getattr(cfg, name)
    except (KeyError, AttributeError):
        raise ValueError(f"make_symbols_domain: config has no field {name!r}") from None


def make_symbols_domain(cfg: Any) -> Domain:
    """The symbols Domain from a ConfigDict, dict or dataclass with the documented fields
    (a run config's `domain` block)."""
    spec = StringSpec(int(_field(cfg, "alphabet_size")), int(_field(cfg, "min_len")), int(_field(cfg, "max_len")))
    seed, num_train, num_test = int(_field(cfg, "seed")), int(_field(cfg, "num_train")), int(_field(cfg, "num_test"))
    max_new_tokens = int(_field(cfg, "max_new_tokens"))
    if num_train < 1 or num_test < 1:
        raise ValueError(f"make_symbols_domain: num_train={num_train} and num_test={num_test} must both be >= 1")
    if max_new_tokens < spec.max_len + 1:
        raise ValueError(f"make_symbols_domain: max_new_tokens={max_new_tokens} cannot hold the longest answer "
                         f"({spec.max_len} letters) plus EOS")
    train, test = make_splits(seed, num_train, num_test, spec)
    tokenizer = symbols_tokenizer()
    domain = Domain(
        name="symbols",
        primitives=registry.resolve("symbols", SYMBOLS_PRIMITIVES),
        outcome_index=0,
        aligned_indices=(SYMBOLS_PRIMITIVES.index("position"),),   # the dense aligned share (Fig. 4 rule)
        train=make_dataset(tokenizer, train, spec),
        test=make_dataset(tokenizer, test, spec),
        tokenizer=tokenizer,
        max_new_tokens=max_new_tokens,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        # the strings are NumPy arrays, which domain.json leaves out (it records only JSON values)
        info={"task": "reverse", "letters": spec.letters, "min_len": spec.min_len, "max_len": spec.max_len,
              "prompt_length": prompt_length(spec), "train_strings": np.asarray(train), "test_strings": np.asarray(test)},
    )
    domain = dataclasses.replace(domain, corpus=functools.partial(supervised_corpus, domain, spec, seed),
                                 base_policy_band=configured_band(cfg))
    return symbols_classes.with_reward_class(domain, functools.partial(symbols_classes.reward_class, SYMBOLS_PRIMITIVES))


def configured_band(cfg: Any) -> dict[str, tuple[float, float]]:
    """The `base_policy_band` field of a domain config block ({} when absent): {primitive: (low, high)}."""
    band = cfg.get("base_policy_band", None) if hasattr(cfg, "get") else getattr(cfg, "base_policy_band", None)
    return {str(name): (float(low), float(high)) for name, (low, high) in dict(band or {}).items()}


def supervised_corpus(domain: Domain, spec: StringSpec, data_seed: int, seed: int, holdout_rows: Sequence[int] = (),
                      options: Any = None) -> list[tuple[str, str]]:
    """(prompt, completion) texts of the warm-start corpus (the domain's `corpus`).

    The strings are the training split's rows except `holdout_rows` (the validation rows),
    followed by `options.sft_extra_strings` (default 0) fresh strings in neither split (drawn
    with `seed` and the domain's `data_seed`). `options.sft_mix` and `options.sft_reverse_rate`
    shape the completions (`sft_corpus`).
    """
    options = {} if options is None else options
    extra = int(options.get("sft_extra_strings", 0))
    mix = options.get("sft_mix", None)
    rate = float(options.get("sft_reverse_rate", DEFAULT_REVERSE_RATE))
    train, test = domain.info["train_strings"].tolist(), domain.info["test_strings"].tolist()
    held_out = {int(row) for row in np.asarray(holdout_rows, np.int64).reshape(-1)}
    outside = sorted(row for row in held_out if not 0 <= row < len(train))
    if outside:
        raise ValueError(f"symbols corpus: holdout_rows {outside[:5]} are outside the {len(train)} training rows")
    if extra < 0:
        raise ValueError(f"config.policy.sft_extra_strings must be >= 0, got {extra}")
    strings = [text for row, text in enumerate(train) if row not in held_out]
    if extra:
        taken = set(train) | set(test)
        pool = make_strings((data_seed, seed, 1), extra + len(taken), spec)
        strings += [text for text in pool if text not in taken][:extra]
    if not strings:
        raise ValueError("symbols corpus: no strings are left for the supervised corpus")
    return sft_corpus(strings, seed, DEFAULT_SFT_MIX if mix is None else dict(mix), rate)


def validate_symbols_config(cfg: Any) -> None:
    """Raise ConfigError naming the first bad field of `config.domain` (and the corpus options of
    `config.policy`) for the symbols domain."""
    int_at_least(cfg, "domain.seed", 0)
    int_at_least(cfg, "domain.num_train", 5)
    int_at_least(cfg, "domain.num_test", 1)
    size = int_at_least(cfg, "domain.alphabet_size", 2)
    if size > len(LETTERS):
        raise ConfigError(f"config.domain.alphabet_size must be <= {len(LETTERS)}, got {size}")
    shortest = int_at_least(cfg, "domain.min_len", 2)
    longest = int_at_least(cfg, "domain.max_len", shortest)
    int_at_least(cfg, "domain.max_new_tokens", longest + 1)
    policy = config_value(cfg, "policy")
    if "sft_reverse_rate" in policy:
        rate = policy["sft_reverse_rate"]
        if not is_number(rate) or not 0.0 <= float(rate) <= 1.0:
            raise ConfigError(f"config.policy.sft_reverse_rate must be a number in [0, 1], got {rate!r}")
    if "sft_extra_strings" in policy:
        int_at_least(cfg, "policy.sft_extra_strings", 0)
    if "sft_mix" in policy:
        mix = dict(policy["sft_mix"])
        unknown = sorted(set(mix) - set(REFERENCE_STYLES))
        if unknown or not mix or any(not is_number(w) or w < 0 for w in mix.values()) or sum(mix.values()) <= 0:
            raise ConfigError(f"config.policy.sft_mix must map styles of {REFERENCE_STYLES} to weights >= 0 with a "
                              f"positive sum, got {mix!r}")


@register_domain("symbols", primitive_names=lambda cfg: SYMBOLS_PRIMITIVES, validate=validate_symbols_config)
def build_symbols_domain(cfg: Any) -> Domain:
    return make_symbols_domain(cfg.domain)
