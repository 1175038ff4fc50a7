"""Domains by name: a module of the `derl_jax.domains` package registers its builder.

    # derl_jax/domains/coins.py
    from derl_jax.domains.registry import register_domain

    @register_domain("coins", primitive_names=lambda cfg: ("correct", "boxed"), validate=check_coins_config)
    def build_coins(cfg) -> Domain: ...

`config.domain.kind` names the domain. `get_domain("coins")` imports `derl_jax.domains.coins`
(a module or a package) on first use, and every module of the package when the name is not
found there, so a new domain is one new module and nothing else lists it. The check of the
`domain` block (`config.validate`) is the domain's own `validate`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from derl_jax import config
from derl_jax.config import ConfigError
from derl_jax.registry import Registry

DOMAIN_PACKAGE = "derl_jax.domains"
# Modules of the domains package that hold shared code, not a domain.
SHARED_MODULES = frozenset({"base", "registry", "env", "math_data", "selfguide"})


def _no_checks(cfg: Any) -> None:
    del cfg


@dataclasses.dataclass(frozen=True)
class DomainSpec:
    """How a run builds one domain.

    build:            config -> the Domain (data, primitives, tokenizer; no model).
    primitive_names:  config -> the ordered primitive names (g1, g2, ...); cheap, loads no data.
    validate:         config -> None; raises `derl_jax.config.ConfigError` naming the bad field.
    """

    name: str
    build: Callable[[Any], Any]
    primitive_names: Callable[[Any], tuple[str, ...]]
    validate: Callable[[Any], None] = _no_checks


def _same_spec(a: DomainSpec, b: DomainSpec) -> bool:
    """A module imported twice registers functions of the same names from the same module."""
    same_function = lambda f, g: f is g or (getattr(f, "__module__", None), getattr(f, "__qualname__", None)) == (  # noqa: E731
        getattr(g, "__module__", None), getattr(g, "__qualname__", None))
    return a == b or all(same_function(getattr(a, f), getattr(b, f)) for f in ("build", "primitive_names", "validate"))


DOMAINS = Registry("domain", (DOMAIN_PACKAGE,), skip=SHARED_MODULES, same=_same_spec)


def register_domain(name: str, *, primitive_names: Callable[[Any], tuple[str, ...]],
                    validate: Callable[[Any], None] = _no_checks) -> Callable[[Callable], Callable]:
    """Decorator registering the builder `config -> Domain` as domain `name` (a Python identifier)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"register_domain: the name must be a Python identifier, got {name!r}")

    def register(build: Callable[[Any], Any]) -> Callable[[Any], Any]:
        DOMAINS.add(name, DomainSpec(name, build, primitive_names, validate))
        return build

    return register


def get_domain(name: str) -> DomainSpec:
    """The spec of domain `name`; ConfigError naming `config.domain.kind` and the known domains."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"config.domain.kind must name a domain, one of {available_domains()}, got {name!r}")
    spec = DOMAINS.find(name, f"{DOMAIN_PACKAGE}.{name}")
    if spec is None:
        raise ConfigError(f"config.domain.kind must be one of {available_domains()}, got {name!r}")
    return spec


def available_domains() -> tuple[str, ...]:
    """Every registered domain name, after discovery (sorted)."""
    return tuple(sorted(DOMAINS.entries()))


def check_domain_block(cfg: Any) -> None:
    """`config.domain.kind` names a registered domain, whose own checks pass."""
    kind = config.config_value(cfg, "domain.kind")
    if not isinstance(kind, str) or not kind:
        raise ConfigError(f"config.domain.kind must name a domain, got {kind!r}")
    get_domain(kind).validate(cfg)


config.register_check("domain", check_domain_block)
