"""The composed symbols tasks `symbols_compose(m, D)`: known answers with a rarity knob.

The prompt is a string s of `min_len`..`max_len` letters from `abcdefgh` then `=` (the strings
of `derl_jax.domains.symbols`). The answer applies the first m aspects (`config.domain.aspects`)
of `primitives.symbols_compose.ASPECTS` to s, then EOS:
  m = 1  reverse                `cabd=` -> `dbac`
  m = 2  reverse, upper         `cabd=` -> `DBAC`
  m = 3  reverse, upper, end    `cabd=` -> `DBAC!`
The primitives are g1 = exact (task success), one aligned dense primitive per aspect (order,
case, end), then D decoys and neutral features (`config.domain.decoys`: marker, echo, bag,
length, ended, letters, start in that order), so a reward must cover every aspect to teach the whole answer: success multiplies over the
aspects, and the more primitives there are, the rarer a random expression that covers all the
aligned ones and none of the decoys (`derl_jax.domains.symbols_classes`, measured by
benchmarks/symbols_rarity.py).

The warm-start corpus is drawn per aspect and position, like the symbols corpus: each letter is
the reversed one with probability `sft_reverse_rate` (else the copied one), upper case with
probability `sft_upper_rate`, and `!` follows with probability `sft_end_rate` (each only when
its aspect is on); a `marked` completion has one position replaced by `#`. Every rate is below
1/2, so greedy decoding copies in lower case without `!` and sampling now and then gets one
aspect of one position right.

Config fields (`config.domain`): the symbols fields (seed, num_train, num_test, alphabet_size,
min_len, max_len, max_new_tokens >= max_len + 2), aspects (1..3), decoys (0..7). Corpus options
(`config.policy`): sft_mix ({"mixed", "marked"} -> weight), sft_reverse_rate, sft_upper_rate,
sft_end_rate, sft_extra_strings.
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
from derl_jax.domains.registry import register_domain
from derl_jax.domains.symbols import StringSpec, answer_of, configured_band, make_splits, make_strings, prompt_length
from derl_jax.domains import symbols_classes
from primitives import registry
from primitives.symbols_compose import (ASPECTS, DECOY_PRIMITIVES, MARKER, SEPARATOR, TERMINATOR,
                                        compose_primitive_names, compose_tokenizer, context_arrays)

STYLES = ("mixed", "marked")
DEFAULT_SFT_MIX = types.MappingProxyType({"mixed": 0.85, "marked": 0.15})   # the symbols corpus's mix
DEFAULT_RATES = types.MappingProxyType({"sft_reverse_rate": 0.2, "sft_upper_rate": 0.2, "sft_end_rate": 0.2})


def compose_answer(text: str, aspects: int) -> str:
    """The gold answer of string `text` under the first `aspects` aspects."""
    out = answer_of(text)
    if aspects >= 2:
        out = out.upper()
    if aspects >= 3:
        out += TERMINATOR
    return out


def corpus_answer(text: str, aspects: int, style: str, rng: np.random.Generator, rates: Mapping[str, float]) -> str:
    """A warm-start completion of `text + "="` in `style` ("mixed" or "marked"; module docstring)."""
    if style not in STYLES:
        raise ValueError(f"corpus_answer: unknown style {style!r}; choose from {STYLES}")
    flip = rng.random(len(text)) < rates["sft_reverse_rate"]
    upper = rng.random(len(text)) < (rates["sft_upper_rate"] if aspects >= 2 else 0.0)
    chars = [(r if f else c) for c, r, f in zip(text, answer_of(text), flip)]
    chars = [c.upper() if u else c for c, u in zip(chars, upper)]
    if style == "marked":
        chars[int(rng.integers(0, len(chars)))] = MARKER
    if aspects >= 3 and rng.random() < rates["sft_end_rate"]:
        chars.append(TERMINATOR)
    return "".join(chars)


def make_dataset(strings: Sequence[str], spec: StringSpec, aspects: int) -> TokenDataset:
    """prompts i32[M, max_len + 2] (BOS + s + `=`, left padded); context: answer i32[M, max_len + 1],
    answer_len i32[M], source i32[M, max_len] (s), source_len i32[M]."""
    tokenizer = compose_tokenizer()
    prompts, prompt_mask = tokenizer.encode_batch([s + SEPARATOR for s in strings], prompt_length(spec),
                                                  left_pad=True, add_bos=True)
    answer, answer_mask = tokenizer.encode_batch([compose_answer(s, aspects) for s in strings], spec.max_len + 1,
                                                 left_pad=False)
    source, source_mask = tokenizer.encode_batch(list(strings), spec.max_len, left_pad=False)
    context = context_arrays(answer, answer_mask.sum(axis=1), source, source_mask.sum(axis=1))
    return TokenDataset(prompts=jnp.asarray(prompts), prompt_mask=jnp.asarray(prompt_mask), context=context)


def _field(cfg: Any, name: str, default: Any = None) -> Any:
    value = cfg.get(name, default) if hasattr(cfg, "get") else getattr(cfg, name, default)
    if value is None:
        raise ValueError(f"make_compose_domain: config has no field {name!r}")
    return value


def make_compose_domain(cfg: Any) -> Domain:
    """The composed Domain from a run config's `domain` block (module docstring)."""
    spec = StringSpec(int(_field(cfg, "alphabet_size")), int(_field(cfg, "min_len")), int(_field(cfg, "max_len")))
    aspects, decoys = int(_field(cfg, "aspects")), int(_field(cfg, "decoys"))
    names = compose_primitive_names(aspects, decoys)
    seed = int(_field(cfg, "seed"))
    train, test = make_splits(seed, int(_field(cfg, "num_train")), int(_field(cfg, "num_test")), spec)
    tokenizer = compose_tokenizer()
    band = configured_band(cfg)
    domain = Domain(
        name="symbols_compose",
        primitives=registry.resolve("symbols_compose", names),
        outcome_index=0,
        train=make_dataset(train, spec, aspects),
        test=make_dataset(test, spec, aspects),
        tokenizer=tokenizer,
        max_new_tokens=int(_field(cfg, "max_new_tokens")),
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        info={"task": "+".join(ASPECTS[:aspects]), "aspects": aspects, "decoys": decoys, "letters": spec.letters,
              "min_len": spec.min_len, "max_len": spec.max_len, "prompt_length": prompt_length(spec),
              "train_strings": np.asarray(train), "test_strings": np.asarray(test)},
        base_policy_band=band,
    )
    domain = dataclasses.replace(domain, corpus=functools.partial(supervised_corpus, domain, spec, seed, aspects))
    return symbols_classes.with_reward_class(domain, functools.partial(symbols_classes.reward_class, names))


def supervised_corpus(domain: Domain, spec: StringSpec, data_seed: int, aspects: int, seed: int,
                      holdout_rows: Sequence[int] = (), options: Any = None) -> list[tuple[str, str]]:
    """(prompt, completion) texts of the warm start: the training rows but `holdout_rows`, then
    `options.sft_extra_strings` fresh strings; styles drawn with `options.sft_mix`."""
    options = {} if options is None else options
    rates = {name: float(options.get(name, default)) for name, default in DEFAULT_RATES.items()}
    mix = dict(options.get("sft_mix", None) or DEFAULT_SFT_MIX)
    extra = int(options.get("sft_extra_strings", 0))
    train, test = domain.info["train_strings"].tolist(), domain.info["test_strings"].tolist()
    held_out = {int(row) for row in np.asarray(holdout_rows, np.int64).reshape(-1)}
    strings = [text for row, text in enumerate(train) if row not in held_out]
    if extra:
        taken = set(train) | set(test)
        pool = make_strings((data_seed, seed, 1), extra + len(taken), spec)
        strings += [text for text in pool if text not in taken][:extra]
    styles = list(mix)
    weights = np.array([mix[s] for s in styles], np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(styles), size=len(strings), p=weights / weights.sum())
    return [(s + SEPARATOR, corpus_answer(s, aspects, styles[k], rng, rates)) for s, k in zip(strings, picks)]


def validate_compose_config(cfg: Any) -> None:
    """ConfigError naming the first bad field of `config.domain` / the corpus options of `config.policy`."""
    int_at_least(cfg, "domain.seed", 0)
    int_at_least(cfg, "domain.num_train", 5)
    int_at_least(cfg, "domain.num_test", 1)
    size = int_at_least(cfg, "domain.alphabet_size", 2)
    if size > 8:
        raise ConfigError(f"config.domain.alphabet_size must be <= 8, got {size}")
    shortest = int_at_least(cfg, "domain.min_len", 2)
    longest = int_at_least(cfg, "domain.max_len", shortest)
    int_at_least(cfg, "domain.max_new_tokens", longest + 2)
    aspects = int_at_least(cfg, "domain.aspects", 1)
    if aspects > len(ASPECTS):
        raise ConfigError(f"config.domain.aspects must be in [1, {len(ASPECTS)}], got {aspects}")
    decoys = int_at_least(cfg, "domain.decoys", 0)
    if decoys > len(DECOY_PRIMITIVES):
        raise ConfigError(f"config.domain.decoys must be in [0, {len(DECOY_PRIMITIVES)}], got {decoys}")
    policy = config_value(cfg, "policy")
    for name in DEFAULT_RATES:
        if name in policy and (not is_number(policy[name]) or not 0.0 <= float(policy[name]) <= 1.0):
            raise ConfigError(f"config.policy.{name} must be a number in [0, 1], got {policy[name]!r}")
    if "sft_extra_strings" in policy:
        int_at_least(cfg, "policy.sft_extra_strings", 0)
    if "sft_mix" in policy:
        mix = dict(policy["sft_mix"])
        if (not mix or set(mix) - set(STYLES) or any(not is_number(w) or w < 0 for w in mix.values())
                or sum(mix.values()) <= 0):
            raise ConfigError(f"config.policy.sft_mix must map styles of {STYLES} to weights >= 0 with a positive "
                              f"sum, got {mix!r}")


def _names(cfg: Any) -> tuple[str, ...]:
    return compose_primitive_names(int(cfg.domain.aspects), int(cfg.domain.decoys))


@register_domain("symbols_compose", primitive_names=_names, validate=validate_compose_config)
def build_compose_domain(cfg: Any) -> Domain:
    return make_compose_domain(cfg.domain)
