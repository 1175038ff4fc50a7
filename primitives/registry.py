"""The primitive registry.

A primitive scores one aspect of a policy's output and returns `f32[N]`, one value per
rollout. Register one with the decorator in any module of the `primitives` package (a new
file there is found by package discovery, no list to edit), or in a module of your own
named in the config entry `primitives.modules` (imported by `import_modules`):

    from primitives.registry import primitive

    @primitive("ends_with_period", kind="host", domain="math")
    def ends_with_period(texts, contexts):
        return np.array([t.rstrip().endswith(".") for t in texts], np.float32)

Kinds:
  * ``device``: ``fn(rollout, context) -> f32[N]``, a pure jnp function of array pytrees
    (mappings of arrays with a leading batch axis N). It runs inside the jitted inner loop.
  * ``host``: ``fn(texts, contexts) -> f32[N]`` on decoded strings and per-example context
    dicts; it runs on the host between sampling and the update.

A domain declares its primitives in order; the i-th one is `g{i+1}` in reward expressions.
Aliases (`outcome`, `format`, ...) are extra names for the same index.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

KINDS = ("device", "host")


@dataclasses.dataclass(frozen=True)
class Primitive:
    """A registered primitive: `name` unique within `domain`, `fn` as described above."""

    name: str
    fn: Callable
    kind: str
    domain: str
    aliases: tuple[str, ...] = ()
    doc: str = ""


_REGISTRY: dict[tuple[str, str], Primitive] = {}


def primitive(name: str, *, kind: str, domain: str, aliases: Sequence[str] = ()):
    """Decorator registering `fn` as primitive `name` of `domain`."""
    if kind not in KINDS:
        raise ValueError(f"primitive {name!r}: kind must be one of {KINDS}, got {kind!r}")

    def register(fn: Callable) -> Callable:
        key = (domain, name)
        if key in _REGISTRY and _REGISTRY[key].fn is not fn:
            raise ValueError(f"primitive {name!r} is already registered for domain {domain!r}")
        _REGISTRY[key] = Primitive(name, fn, kind, domain, tuple(aliases), (fn.__doc__ or "").strip())
        return fn

    return register


def get(domain: str, name: str) -> Primitive:
    """The primitive `name` of `domain`; a clear error lists what is registered."""
    _import_builtin_modules()
    try:
        return _REGISTRY[(domain, name)]
    except KeyError:
        known = sorted(n for d, n in _REGISTRY if d == domain)
        raise KeyError(f"no primitive {name!r} in domain {domain!r}; registered: {known}") from None


def resolve(domain: str, names: Sequence[str]) -> tuple[Primitive, ...]:
    """Primitives of `domain` in the order given (that order defines g1, g2, ...)."""
    return tuple(get(domain, n) for n in names)


def registered(domain: str | None = None) -> tuple[Primitive, ...]:
    _import_builtin_modules()
    return tuple(p for (d, _), p in sorted(_REGISTRY.items()) if domain in (None, d))


def symbol_table(prims: Sequence[Primitive]) -> dict[str, int]:
    """Every name an expression may use for these primitives: `g1`..`gk`, names, aliases."""
    table: dict[str, int] = {}
    for i, p in enumerate(prims):
        for symbol in (f"g{i + 1}", p.name, *p.aliases):
            if symbol in table and table[symbol] != i:
                raise ValueError(f"primitive symbol {symbol!r} names both g{table[symbol] + 1} and g{i + 1}")
            table[symbol] = i
    return table


def discovered_modules() -> tuple[str, ...]:
    """Every module of the `primitives` package but this one (sorted): the primitive families."""
    import pkgutil

    import primitives

    names = (m.name for m in pkgutil.iter_modules(primitives.__path__) if not m.name.startswith("_"))
    return tuple(sorted(f"primitives.{name}" for name in names if name != "registry"))


def import_modules(modules: Sequence[str]) -> None:
    """Import primitive modules by dotted name (the config entry `primitives.modules`) so they register.

    A module that cannot be found raises ModuleNotFoundError naming it.
    """
    import importlib

    if isinstance(modules, str):
        raise TypeError(f"import_modules: expected a sequence of module names, got the string {modules!r}")
    for module in modules:
        importlib.import_module(module)


def _import_builtin_modules() -> None:
    """Import the modules of the `primitives` package so their primitives register."""
    import importlib

    for module in discovered_modules():
        importlib.import_module(module)
