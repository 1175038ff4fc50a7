"""The README's "Adding a domain" example: one new domain file plus one config file, nothing else.

The two files below are the README's text. The domain file goes where `derl_jax/domains/echo.py`
would be (a directory added to the domains package path), the config file where
`configs/echo.py` would be; the launcher finds the domain by `config.domain.kind` alone and
trains it with the real inner loop.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import derl_jax.domains
from derl_jax.config import ConfigError
from derl_jax.domains import registry
from derl_jax.domains.registry import get_domain
from primitives import registry as primitive_registry

DOMAIN_FILE = '''\
"""Echo: the policy repeats a number. A whole domain in one file (see README, "Adding a domain")."""

import functools

import jax.numpy as jnp
import numpy as np

from derl_jax.config import ConfigError, int_at_least
from derl_jax.domains.base import Domain, TokenDataset
from derl_jax.domains.registry import DomainSpec, register_domain
from derl_jax.models.tokenizers import CharTokenizer
from primitives.registry import register_primitive, resolve

TOKENIZER = CharTokenizer("0123456789=")
DIGITS = 2
PRIMITIVES = ("correct", "first_digit")


@register_primitive("correct", kind="device", domain="echo")
def correct(rollout, context):
    """1 when the output is exactly the number, then EOS.  tokens i32[N, T], answer i32[N, DIGITS]."""
    tokens = rollout["tokens"]
    digits_ok = jnp.all(tokens[:, :DIGITS] == context["answer"], axis=-1)
    return (digits_ok & (tokens[:, DIGITS] == TOKENIZER.eos_id)).astype(jnp.float32)


@register_primitive("first_digit", kind="device", domain="echo")
def first_digit(rollout, context):
    """1 when the first output token is the number's first digit."""
    return (rollout["tokens"][:, 0] == context["answer"][:, 0]).astype(jnp.float32)


def dataset(numbers) -> TokenDataset:
    texts = [f"{n:0{DIGITS}d}" for n in numbers]
    prompts, mask = TOKENIZER.encode_batch([t + "=" for t in texts], DIGITS + 2, left_pad=True, add_bos=True)
    answer, _ = TOKENIZER.encode_batch(texts, DIGITS, left_pad=False)
    return TokenDataset(jnp.asarray(prompts), jnp.asarray(mask), {"answer": jnp.asarray(answer)})


def corpus(numbers, seed, holdout_rows, options):
    """(prompt, completion) texts for the warm-start policy: every training row but the held-out ones."""
    held_out = set(np.asarray(holdout_rows).tolist())
    return [(f"{n:0{DIGITS}d}=", f"{n:0{DIGITS}d}") for row, n in enumerate(numbers) if row not in held_out]


def build(cfg) -> Domain:
    numbers = np.random.default_rng(cfg.domain.seed).permutation(10**DIGITS)
    train, test = numbers[: cfg.domain.num_train], numbers[cfg.domain.num_train:][: cfg.domain.num_test]
    return Domain(name="echo", primitives=resolve("echo", PRIMITIVES), outcome_index=0, train=dataset(train),
                  test=dataset(test), tokenizer=TOKENIZER, max_new_tokens=DIGITS + 1, eos_id=TOKENIZER.eos_id,
                  pad_id=TOKENIZER.pad_id, corpus=functools.partial(corpus, train))


def validate(cfg) -> None:
    int_at_least(cfg, "domain.seed", 0)
    train = int_at_least(cfg, "domain.num_train", 5)
    int_at_least(cfg, "domain.num_test", 1)
    if train + cfg.domain.num_test > 10**DIGITS:
        raise ConfigError(f"config.domain.num_test: num_train + num_test must be <= {10**DIGITS}")


register_domain(DomainSpec(name="echo", build=build, primitive_names=lambda cfg: PRIMITIVES, validate=validate))
'''

CONFIG_FILE = '''\
"""Echo: the policy repeats a two-digit number (the README's "Adding a domain" example).

      python launch/run.py --config=configs/echo.py --mode=final --expression="correct+0.5*first_digit"

Rough time: under a minute on a 2-core CPU.
"""

from configs import common


def get_config(arg=None):
    domain = {"kind": "echo", "seed": 0, "num_train": 40, "num_test": 20}
    policy = {**common.TOY_MODEL, "head_dim": 8, "sft_steps": 20, "sft_lr": 3e-3, "sft_batch_size": 16}
    cfg = common.toy_search(common.base("echo", domain, policy))
    cfg.inner.update(prompts_per_step=4, group_size=2)
    return cfg
'''


@pytest.fixture
def echo(tmp_path, monkeypatch):
    """(config module) with derl_jax/domains/echo.py and configs/echo.py written, as a user would."""
    domains = tmp_path / "domains"
    domains.mkdir()
    (domains / "echo.py").write_text(DOMAIN_FILE)
    (tmp_path / "echo_config.py").write_text(CONFIG_FILE)
    monkeypatch.setattr(derl_jax.domains, "__path__", [*derl_jax.domains.__path__, str(domains)])
    spec = importlib.util.spec_from_file_location("echo_config", tmp_path / "echo_config.py")  # as --config= loads it
    config = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(config)
    yield config
    sys.modules.pop("derl_jax.domains.echo", None)
    registry._DOMAINS.pop("echo", None)
    for name in ("correct", "first_digit"):
        primitive_registry.PRIMITIVES.remove(("echo", name))


def test_the_new_domain_is_registered_built_and_scored(echo):
    cfg = echo.get_config()
    spec = get_domain("echo")
    spec.validate(cfg)
    cfg.domain.num_test = 61
    with pytest.raises(ConfigError, match=r"^config.domain.num_test: num_train \+ num_test must be <= 100$"):
        spec.validate(cfg)
    cfg = echo.get_config()
    domain = spec.build(cfg)
    assert domain.primitive_names == ("correct", "first_digit") and spec.primitive_names(cfg) == domain.primitive_names
    assert domain.train.prompts.shape == (40, 4) and domain.test.prompts.shape == (20, 4)
    tokenizer = domain.tokenizer
    first = tokenizer.decode(np.asarray(domain.train.prompts[0]))
    answer = first.strip("=")[-2:]
    assert tokenizer.decode(np.asarray(domain.train.context["answer"][0])) == answer
    outputs = [answer, answer[0] + "x", answer + answer[1]]  # right; right first digit only; right digits, no EOS
    tokens = np.full((3, 3), tokenizer.pad_id, np.int32)
    for row, text in enumerate(outputs):
        ids = [tokenizer.id_of(c) if c != "x" else tokenizer.eos_id for c in text][:3]
        if len(ids) < 3:
            ids.append(tokenizer.eos_id)
        tokens[row] = ids
    context = {"answer": jnp.repeat(domain.train.context["answer"][:1], 3, axis=0)}
    rollout = {"tokens": jnp.asarray(tokens), "mask": jnp.ones((3, 3), bool)}
    values = np.stack([np.asarray(p.fn(rollout, context)) for p in domain.primitives], axis=-1)
    np.testing.assert_array_equal(values, [[1, 1], [0, 1], [0, 1]])
    corpus = domain.corpus(0, [0, 1], {})
    assert len(corpus) == 38 and all(p == c + "=" for p, c in corpus)


def test_the_launcher_trains_the_new_domain_end_to_end(echo, tmp_path):
    from derl_jax.experiment.run import run

    cfg = echo.get_config()
    final = run(cfg, str(tmp_path / "run"), "final", "correct+0.5*first_digit", progress=False)
    saved = json.loads((tmp_path / "run" / "final_result.json").read_text())
    assert saved["expression"] == "correct+0.5*first_digit" and saved["test"] == final.test
    assert round(final.test * 20) == pytest.approx(final.test * 20, abs=1e-6)  # a pass rate over the 20 test numbers
    assert len(saved["curves"]["reward_mean"]) == cfg.final.steps
    assert len(saved["curves"]["primitive/first_digit"]) == cfg.final.steps
    assert not (tmp_path / "run" / "run.lock").exists()
