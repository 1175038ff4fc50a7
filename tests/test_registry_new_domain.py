"""The "Adding a domain" example of docs/extending.md: one new domain file plus one config file, nothing else.

The two files are read from docs/extending.md. The domain file goes where `derl_jax/domains/echo.py`
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
from test_docs import docs_example

# The two files of the "Adding a domain" example of docs/extending.md, as written there.
DOMAIN_FILE = docs_example("derl_jax/domains/echo.py")
CONFIG_FILE = docs_example("configs/echo.py")


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
    registry.DOMAINS.remove("echo")
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


@pytest.mark.slow
def test_the_launcher_trains_the_new_domain_end_to_end(echo, tmp_path):
    """`--mode=final` on the new domain. The daily tier has its pieces: the domain found, built and
    scored (test_the_new_domain_is_registered_built_and_scored) and a registered domain's final
    training from its config (tests/test_curve.py)."""
    from derl_jax.experiment.run import run

    cfg = echo.get_config()
    final = run(cfg, str(tmp_path / "run"), "final", "correct+0.5*first_digit", progress=False)
    saved = json.loads((tmp_path / "run" / "final_result.json").read_text())
    assert saved["expression"] == "correct+0.5*first_digit" and saved["test"] == final.test
    assert round(final.test * 20) == pytest.approx(final.test * 20, abs=1e-6)  # a pass rate over the 20 test numbers
    assert len(saved["curves"]["reward_mean"]) == cfg.final.steps
    assert len(saved["curves"]["primitive/first_digit"]) == cfg.final.steps
    assert not (tmp_path / "run" / "run.lock").exists()
