"""The read-only code in the searchers' prompts and workspace: the domain module and the primitives.

    files = source_files(cfg, primitive_names)
    # {"env/derl_jax/domains/arith.py": <the module that builds the domain>,
    #  "primitives/correct.py": "# g1 = correct ...\n<the function's source>", ...}

The domain is `config.domain.kind` (its builder's module, `inspect.getsource`); each primitive
is looked up in the primitive registry under that domain (after importing
`config.primitives.modules`) and shown as its function's source. Whatever cannot be found
(no domain in the config, a function without source) becomes a file saying so, so a search
never fails for want of sources.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

from derl_jax.config import ConfigError, config_value, has_field

ENV_DIR = "env"
PRIMITIVES_DIR = "primitives"


def module_path(module: Any) -> str:
    """`derl_jax.domains.arith` -> `derl_jax/domains/arith.py` (a package: its `__init__.py`)."""
    path = module.__name__.replace(".", "/")
    return f"{path}/__init__.py" if hasattr(module, "__path__") else f"{path}.py"


def _source(obj: Any) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError) as err:
        return f"(source not available: {err})\n"


def domain_kind(cfg: Any) -> str | None:
    """`config.domain.kind`, or None when the config names no domain."""
    kind = config_value(cfg, "domain.kind") if has_field(cfg, "domain.kind") else None
    return kind if isinstance(kind, str) and kind else None


def domain_source(cfg: Any) -> dict[str, str]:
    """{env/<module path>: source} of the module that builds the run's domain ({} without one)."""
    from derl_jax.domains.registry import get_domain

    kind = domain_kind(cfg)
    if kind is None:
        return {}
    try:
        build = get_domain(kind).build
    except ConfigError:
        return {}
    module = inspect.getmodule(build)
    if module is None:
        return {}
    return {f"{ENV_DIR}/{module_path(module)}": _source(module)}


def primitive_sources(cfg: Any, primitive_names: Sequence[str], outcome_index: int = 0) -> dict[str, str]:
    """{primitives/<name>.py: "# g<i> = <name> ...\\n" + the function's source}, one per primitive."""
    from primitives import registry

    kind = domain_kind(cfg)
    try:
        registry.import_modules(registry.configured(cfg, "modules"))
    except ModuleNotFoundError:
        pass  # the primitives check reports it
    files = {}
    for i, name in enumerate(primitive_names):
        role = " (the task outcome)" if i == outcome_index else ""
        head = f"# g{i + 1} = {name}{role}"
        try:
            entry = registry.get(kind, name) if kind is not None else None
        except KeyError:
            entry = None
        if entry is None:
            body = f"# (no registered primitive {name!r} for domain {kind!r}: source not available)\n"
        else:
            body = f"# kind {entry.kind}, domain {entry.domain}\n" + _source(entry.fn)
        files[f"{PRIMITIVES_DIR}/{name}.py"] = f"{head}\n{body}"
    return files


def source_files(cfg: Any, primitive_names: Sequence[str], outcome_index: int = 0) -> dict[str, str]:
    """The domain module's and the primitives' sources (module docstring)."""
    return {**domain_source(cfg), **primitive_sources(cfg, primitive_names, outcome_index)}
