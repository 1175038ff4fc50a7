"""Domains by name: each domain module registers a `DomainSpec` when it is imported.

    # derl_jax/domains/coins.py
    from derl_jax.domains.registry import DomainSpec, register_domain

    register_domain(DomainSpec(name="coins", build=make_coins_domain,
                               primitive_names=lambda cfg: ("correct", "boxed"),
                               validate=check_coins_config))

`config.domain.kind` names the domain. `get_domain("coins")` imports `derl_jax.domains.coins`
on first use, so a new domain is one new module and nothing else lists it.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable

from derl_jax.config import ConfigError

DOMAIN_PACKAGE = "derl_jax.domains"
# Modules of the domains package that hold shared code, not a domain (left out of error messages).
SHARED_MODULES = frozenset({"base", "registry", "env", "math_data"})


def _no_checks(cfg: Any) -> None:
    del cfg


@dataclasses.dataclass(frozen=True)
class DomainSpec:
    """How the launcher builds one domain.

    build:            config -> the Domain (data, primitives, tokenizer; no model).
    primitive_names:  config -> the ordered primitive names (g1, g2, ...); cheap, loads no data.
    validate:         config -> None; raises `derl_jax.config.ConfigError` naming the bad field.
    """

    name: str
    build: Callable[[Any], Any]
    primitive_names: Callable[[Any], tuple[str, ...]]
    validate: Callable[[Any], None] = _no_checks


_DOMAINS: dict[str, DomainSpec] = {}


def register_domain(spec: DomainSpec) -> DomainSpec:
    """Register `spec` under `spec.name`; registering another spec under a taken name is an error."""
    if not isinstance(spec.name, str) or not spec.name.isidentifier():
        raise ValueError(f"register_domain: the name must be a Python identifier, got {spec.name!r}")
    existing = _DOMAINS.get(spec.name)
    if existing is not None and existing != spec:
        raise ValueError(f"register_domain: a domain named {spec.name!r} is already registered")
    _DOMAINS[spec.name] = spec
    return spec


def get_domain(name: str) -> DomainSpec:
    """The spec of domain `name`, importing `derl_jax.domains.<name>` when it is not registered yet.

    An unknown name raises ConfigError naming `config.domain.kind` and the known domains.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(f"config.domain.kind must name a domain, one of {available_domains()}, got {name!r}")
    if name not in _DOMAINS:
        module = f"{DOMAIN_PACKAGE}.{name}"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise
    if name not in _DOMAINS:
        raise ConfigError(f"config.domain.kind must be one of {available_domains()}, got {name!r}")
    return _DOMAINS[name]


def registered_domains() -> tuple[str, ...]:
    """Names registered so far in this process (sorted); see `available_domains` for all."""
    return tuple(sorted(_DOMAINS))


def available_domains() -> tuple[str, ...]:
    """Registered names plus the modules of the domains package that may register one (sorted)."""
    package = importlib.import_module(DOMAIN_PACKAGE)
    modules = {m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")}
    return tuple(sorted(set(_DOMAINS) | (modules - SHARED_MODULES)))
