"""derl_jax.domains.registry: a domain module registers itself and is imported on first use."""

from __future__ import annotations

import sys
import textwrap

import pytest

import derl_jax.domains
from derl_jax.config import ConfigError
from derl_jax.domains import registry
from derl_jax.domains.registry import DOMAINS, DomainSpec, get_domain, register_domain

COINS_MODULE = '''
from derl_jax.config import ConfigError, int_at_least
from derl_jax.domains.registry import register_domain

IMPORTS = []
IMPORTS.append(1)


def check(cfg):
    int_at_least(cfg, "domain.coins", 1)


@register_domain("{name}", primitive_names=lambda cfg: ("heads", "tails"), validate=check)
def build(cfg):
    return ("built", cfg["domain"]["coins"])
'''


@pytest.fixture
def domain_dir(tmp_path, monkeypatch):
    """A directory on the domains package path, so a file put there is `derl_jax.domains.<name>`."""
    monkeypatch.setattr(derl_jax.domains, "__path__", [*derl_jax.domains.__path__, str(tmp_path)])
    added = []

    def write(name: str, text: str) -> None:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
        added.append(name)

    yield write
    for name in added:
        sys.modules.pop(f"derl_jax.domains.{name}", None)
        DOMAINS.remove(name)


def test_a_new_domain_module_is_found_by_name_alone(domain_dir):
    domain_dir("coins_a", COINS_MODULE.format(name="coins_a"))
    assert "coins_a" not in DOMAINS.registered()
    spec = get_domain("coins_a")
    assert "coins_a" in DOMAINS.registered()
    assert spec.name == "coins_a"
    assert spec.primitive_names({}) == ("heads", "tails")
    assert spec.build({"domain": {"coins": 3}}) == ("built", 3)
    assert get_domain("coins_a") is spec
    assert sys.modules["derl_jax.domains.coins_a"].IMPORTS == [1]  # imported once
    spec.validate({"domain": {"coins": 1}})
    with pytest.raises(ConfigError, match=r"^config\.domain\.coins must be >= 1, got 0$"):
        spec.validate({"domain": {"coins": 0}})


def test_unknown_domain_lists_the_known_ones(domain_dir):
    domain_dir("coins_b", COINS_MODULE.format(name="coins_b"))
    with pytest.raises(ConfigError) as info:
        get_domain("chess")
    message = str(info.value)
    assert message.startswith("config.domain.kind must be one of (")
    assert message.endswith("got 'chess'")
    for name in ("arith", "math", "coins_b"):
        assert f"'{name}'" in message
    for shared in ("base", "registry", "math_data"):
        assert f"'{shared}'" not in message
    with pytest.raises(ConfigError, match="config.domain.kind must name a domain"):
        get_domain("../etc")


def test_a_module_that_registers_nothing_is_not_a_domain(domain_dir):
    domain_dir("helpers_only", "VALUE = 1\n")
    with pytest.raises(ConfigError, match="got 'helpers_only'"):
        get_domain("helpers_only")


def test_an_import_error_inside_a_domain_module_is_not_hidden(domain_dir):
    domain_dir("broken", "import a_module_that_does_not_exist_anywhere\n")
    with pytest.raises(ModuleNotFoundError, match="a_module_that_does_not_exist_anywhere"):
        get_domain("broken")


def test_register_refuses_a_second_builder_under_a_taken_name():
    def build(cfg):
        return None

    def other(cfg):
        return 1

    names = lambda cfg: ()  # noqa: E731
    try:
        assert register_domain("twice", primitive_names=names)(build) is build
        assert register_domain("twice", primitive_names=names)(build) is build  # a module re-imported is fine
        with pytest.raises(ValueError, match="'twice' is already registered"):
            register_domain("twice", primitive_names=names)(other)
    finally:
        DOMAINS.remove("twice")
    with pytest.raises(ValueError, match="must be a Python identifier"):
        register_domain("two words", primitive_names=names)
    assert DomainSpec("x", build, names).validate({}) is None  # the default validate accepts anything
