"""What a run builds from its config: the domain, then the base policy and the inner loop."""

from __future__ import annotations

import dataclasses
from typing import Any

from primitives import registry as primitive_registry
from derl_jax.config import InputError
from derl_jax.domains.registry import get_domain


def build_domain(cfg: Any):
    """The domain named by `config.domain.kind` (data, primitives, tokenizer; no model), with the
    primitives of `config.primitives.extra` after its own."""
    try:
        domain = get_domain(cfg.domain.kind).build(cfg)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as err:
        raise InputError(str(err)) from err  # a data file the config names
    extra = primitive_registry.configured(cfg, "extra")
    if not extra:
        return domain
    return dataclasses.replace(domain, primitives=tuple(domain.primitives) + primitive_registry.resolve(domain.name, extra))


def build_inner(domain: Any, cfg: Any, workdir: str, host_cores: int | None = None):
    """(base_params, evaluator): the base policy and the one inner-loop evaluator (on a mesh
    whose automatic 'data' axis takes at most `host_cores` CPU cores)."""
    from derl_jax.rl.setup import build_inner as build

    return build(domain, cfg, workdir, host_cores=host_cores)


def primitive_names(cfg: Any) -> tuple[str, ...]:
    """The run's primitives in order (g1, g2, ...): the domain's, then `config.primitives.extra`; no data loaded."""
    return tuple(get_domain(cfg.domain.kind).primitive_names(cfg)) + primitive_registry.configured(cfg, "extra")
