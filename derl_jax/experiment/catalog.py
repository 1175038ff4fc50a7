"""What is registered: every domain, search method and primitive, in one listing.

    python launch/run.py --list
    from derl_jax.experiment.catalog import catalog; catalog()["methods"]

Each registry discovers its package first (`derl_jax.registry.Registry`), so a new file in
`derl_jax/domains/`, `derl_jax/methods/` or `primitives/` shows up here with nothing else edited.
"""

from __future__ import annotations

from primitives.registry import registered as registered_primitives
from derl_jax.domains.registry import DOMAINS
from derl_jax.outer.registry import STRATEGIES, strategy_names


def _first_line(obj) -> str:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    return doc.splitlines()[0] if doc else ""


def catalog() -> dict[str, dict[str, str]]:
    """{"domains": name -> module, "methods": name -> summary, "primitives": "domain/name" -> kind: summary}."""
    domains = {name: spec.build.__module__ for name, spec in DOMAINS.entries().items()}
    entries = STRATEGIES.entries()
    methods = {name: _first_line(entries[name.split(":", 1)[0]]) for name in strategy_names()}
    primitives = {f"{p.domain}/{p.name}": f"{p.kind}: {p.doc.splitlines()[0] if p.doc else ''}".rstrip(": ")
                  for p in registered_primitives()}
    return {"domains": domains, "methods": methods, "primitives": primitives}


def describe() -> str:
    """`catalog()` as text, one block per registry."""
    lines = []
    for block, entries in catalog().items():
        lines.append(f"{block} ({len(entries)}):")
        width = max((len(name) for name in entries), default=0)
        lines.extend(f"  {name:<{width}}  {text}".rstrip() for name, text in entries.items())
    return "\n".join(lines)
