"""The primitive registry.

A primitive scores one aspect of a policy's output and returns `f32[N]`, one value per
rollout. Register one with the decorator in any module of the `primitives` package (a new
file there is found by package discovery, no list to edit), or in a module of your own
named in the config entry `primitives.modules` (imported by `import_modules`):

    from primitives.registry import register_primitive

    @register_primitive("ends_with_period", kind="host", domain="math")
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
import importlib
from typing import Any, Callable, Sequence

from derl_jax.config import ConfigError, config_value, has_field, register_check
from derl_jax.registry import Registry

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


PRIMITIVES = Registry("primitive", ("primitives",), skip=("registry",), same=lambda a, b: a.fn is b.fn)


def register_primitive(name: str, *, kind: str, domain: str, aliases: Sequence[str] = ()):
    """Decorator registering `fn` as primitive `name` of `domain`."""
    if kind not in KINDS:
        raise ValueError(f"primitive {name!r}: kind must be one of {KINDS}, got {kind!r}")

    def register(fn: Callable) -> Callable:
        entry = Primitive(name, fn, kind, domain, tuple(aliases), (fn.__doc__ or "").strip())
        known = PRIMITIVES.registered().get((domain, name))
        if known is not None and known.fn is not fn:
            raise ValueError(f"primitive {name!r} is already registered for domain {domain!r}")
        PRIMITIVES.add((domain, name), entry)
        return fn

    return register


def get(domain: str, name: str) -> Primitive:
    """The primitive `name` of `domain`; a clear error lists what is registered."""
    found = PRIMITIVES.find((domain, name))
    if found is None:
        known = sorted(n for d, n in PRIMITIVES.entries() if d == domain)
        raise KeyError(f"no primitive {name!r} in domain {domain!r}; registered: {known}")
    return found


def resolve(domain: str, names: Sequence[str]) -> tuple[Primitive, ...]:
    """Primitives of `domain` in the order given (that order defines g1, g2, ...)."""
    return tuple(get(domain, n) for n in names)


def registered(domain: str | None = None) -> tuple[Primitive, ...]:
    """Every registered primitive (of `domain` when given), sorted by (domain, name)."""
    return tuple(p for (d, _), p in PRIMITIVES.entries().items() if domain in (None, d))


def symbol_table(prims: Sequence[Primitive]) -> dict[str, int]:
    """Every name an expression may use for these primitives: `g1`..`gk`, names, aliases."""
    table: dict[str, int] = {}
    for i, p in enumerate(prims):
        for symbol in (f"g{i + 1}", p.name, *p.aliases):
            if symbol in table and table[symbol] != i:
                raise ValueError(f"primitive symbol {symbol!r} names both g{table[symbol] + 1} and g{i + 1}")
            table[symbol] = i
    return table


def expression_symbols(domain: str, names: Sequence[str]) -> dict[str, int]:
    """`symbol_table` of the run's primitives `names` of `domain` (g1.., names, aliases); a name
    not registered for `domain` stands for itself only."""
    found = PRIMITIVES.entries()
    prims = [found.get((domain, n)) or Primitive(n, lambda *a: None, "host", domain) for n in names]
    return symbol_table(prims)


def with_names(expression: str, domain: str, names: Sequence[str]) -> str:
    """`expression` with each alias replaced by its primitive's name (`outcome+format` ->
    `correct+boxed` in arith); other text unchanged."""
    import re

    table = expression_symbols(domain, names)
    aliases = {symbol: names[i] for symbol, i in table.items() if symbol not in names and not re.fullmatch(r"g\d+", symbol)}
    return re.sub(r"[A-Za-z_][A-Za-z0-9_]*", lambda m: aliases.get(m.group(0), m.group(0)), expression)


def missing_hint(domain: str, names: Sequence[str], unknown: str) -> str:
    """"" or how to add `unknown` to the run: it is registered for `domain` (by name or alias) but
    is not one of the run's primitives `names`."""
    for p in registered(domain):
        if unknown in (p.name, *p.aliases) and p.name not in names:
            return (f"; {unknown!r} is a registered {domain} primitive not in this run: add it with "
                    f"--config.primitives.extra=\"('{p.name}',)\"")
    return ""


def discovered_modules() -> tuple[str, ...]:
    """Every module of the `primitives` package but this one (sorted): the primitive families."""
    return PRIMITIVES.modules()


def import_modules(modules: Sequence[str]) -> None:
    """Import primitive modules by dotted name (the config entry `primitives.modules`) so they register.

    A module that cannot be found raises ModuleNotFoundError naming it.
    """
    if isinstance(modules, str):
        raise TypeError(f"import_modules: expected a sequence of module names, got the string {modules!r}")
    for module in modules:
        importlib.import_module(module)


def configured(cfg: Any, field: str) -> tuple[str, ...]:
    """`config.primitives.<field>` ("modules" or "extra"); () when the config has none."""
    path = f"primitives.{field}"
    return tuple(config_value(cfg, path)) if has_field(cfg, path) else ()


def check_primitives_block(cfg: Any) -> None:
    """`primitives.modules` import, and each name of `primitives.extra` is a registered primitive
    of the run's domain."""
    for field, what in (("modules", "module names"), ("extra", "primitive names")):
        if has_field(cfg, f"primitives.{field}"):
            names = config_value(cfg, f"primitives.{field}")
            if isinstance(names, str) or not isinstance(names, Sequence) or not all(isinstance(n, str) and n for n in names):
                raise ConfigError(f"config.primitives.{field} must be a tuple of {what}, got {names!r}")
    try:
        import_modules(configured(cfg, "modules"))
    except ModuleNotFoundError as err:
        raise ConfigError(f"config.primitives.modules: no module named {err.name!r}") from None
    for name in configured(cfg, "extra"):
        try:
            get(config_value(cfg, "domain.kind"), name)
        except KeyError as err:
            raise ConfigError(f"config.primitives.extra: {err.args[0]}") from None


register_check("primitives", check_primitives_block)
