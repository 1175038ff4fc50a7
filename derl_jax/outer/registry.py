"""Search methods by name: name -> `Strategy` class; method modules are found without a list.

    @register_strategy("my_search")
    class MySearch(Strategy): ...

Every module below the `derl_jax.methods` package (a file, or a folder of them) is imported
the first time a name is looked up, so a new method is one new file there.
A name registered with `takes_argument=True` also answers `<name>:<argument>` (e.g.
`fixed:g1+g2`); the class reads the argument from the full name in `from_config`.
"""

from __future__ import annotations

from typing import Any, Sequence

from derl_jax.outer.strategy import OptimizerFactory, Strategy, StrategyContext
from derl_jax.registry import Registry

# The methods a comparison runs by default (`config.compare.methods`), in report order.
ALL_METHODS = ("derl", "derl_pop", "random", "evolution", "outcome", "outcome_format", "average")

METHODS_PACKAGE = "derl_jax.methods"
STRATEGIES = Registry("strategy", (METHODS_PACKAGE,), same=lambda a, b: _qualified(a) == _qualified(b))
_TAKES_ARGUMENT: set[str] = set()


def register_strategy(name: str, *, takes_argument: bool = False):
    """Class decorator: register a `Strategy` subclass under `name` (and `name:<arg>` when
    `takes_argument`). Registering a different class under a taken name is an error."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"register_strategy: the name must be a non-empty string without ':', got {name!r}")

    def decorate(cls: type[Strategy]) -> type[Strategy]:
        if not (isinstance(cls, type) and issubclass(cls, Strategy)):
            raise TypeError(f"register_strategy({name!r}): {cls!r} is not a Strategy subclass")
        known = STRATEGIES.registered().get(name)
        if known is not None and _qualified(known) != _qualified(cls):
            raise ValueError(f"register_strategy: {name!r} is already registered to {_qualified(known)}")
        STRATEGIES.add(name, cls)
        if takes_argument:
            _TAKES_ARGUMENT.add(name)
        return cls

    return decorate


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def strategy_names() -> tuple[str, ...]:
    """Registered names: `ALL_METHODS` first, in their order, then the rest sorted. A name that
    takes an argument is listed as `<name>:<arg>`."""
    registered = STRATEGIES.entries()
    names = [n for n in ALL_METHODS if n in registered] + sorted(n for n in registered if n not in ALL_METHODS)
    return tuple(f"{n}:<arg>" if n in _TAKES_ARGUMENT else n for n in names)


def _split(name: Any) -> str | None:
    """The registered name `name` refers to, or None."""
    if not isinstance(name, str):
        return None
    registered = STRATEGIES.entries()
    if name in registered and name not in _TAKES_ARGUMENT:
        return name
    head, sep, argument = name.partition(":")
    if sep and argument and head in _TAKES_ARGUMENT:
        return head
    return None


def is_known_strategy(name: Any) -> bool:
    return _split(name) is not None


def get_strategy(name: str) -> type[Strategy]:
    """The class registered for `name` (`fixed:<expr>` -> the `fixed` class); ValueError
    listing the known names otherwise."""
    registered = _split(name)
    if registered is None:
        raise ValueError(f"unknown strategy {name!r}; expected one of {strategy_names()}")
    return STRATEGIES.entries()[registered]


def make_strategy(
    name: str,
    cfg: Any,
    grammar: Any = None,
    primitive_names: Sequence[str] = (),
    *,
    outcome_index: int = 0,
    optimizer_factory: OptimizerFactory | None = None,
    mesh: Any = None,
    workdir: str | None = None,
) -> Strategy:
    """The strategy called `name` for a run configured by `cfg`.

    grammar: the Meta-Optimizer's grammar (needed by strategies that sample from it).
    optimizer_factory: `(cfg, grammar, mesh) -> MetaOptimizer`; defaults to
        `derl_jax.methods.derl.optimizer.MetaOptimizer`.
    mesh: the run's mesh, for the Meta-Optimizer's steps (`StrategyContext.mesh`).
    workdir: the run directory the strategy will search in (`StrategyContext.workdir`).
    """
    cls = get_strategy(name)
    context = StrategyContext(
        cfg=cfg,
        primitive_names=tuple(primitive_names),
        grammar=grammar,
        outcome_index=int(outcome_index),
        optimizer_factory=optimizer_factory,
        mesh=mesh,
        workdir=None if workdir is None else str(workdir),
    )
    strategy = cls.from_config(name, context)
    strategy.name = name
    return strategy
