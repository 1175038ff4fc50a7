"""The one registry idiom: a decorator fills a `Registry`, package discovery finds the modules.

Domains, search methods and primitives are each a `Registry`:

    DOMAINS = Registry("domain", packages=("derl_jax.domains",))

    @DOMAINS.decorator(...)           # in practice: @register_domain("coins", ...)
    def build_coins(cfg): ...

A module only has to sit in one of the registry's packages (at any depth) to be found:
`discover()` imports every module below them once, so adding a domain, a method or a
primitive is one new file and no list to edit. `find(key, module)` imports the one module a
key names first (`derl_jax.domains.coins` for the domain `coins`), so a lookup does not have
to import every registered thing (and its dependencies) to find one.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable, Hashable, Iterable, Iterator, Sequence


class Registry:
    """Key -> registered object, with discovery of the modules that register.

    kind: what is registered ("domain", "method", "primitive"), for messages.
    packages: dotted names of the packages whose modules register on import.
    skip: module names (the last dotted part) that hold shared code, not entries.
    same: `same(a, b)` -> whether re-registering `b` under the key of `a` is the same entry
        (a module imported twice); anything else under a taken key is an error.
    """

    def __init__(self, kind: str, packages: Sequence[str], *, skip: Iterable[str] = (),
                 same: Callable[[Any, Any], bool] | None = None):
        self.kind = kind
        self.packages = tuple(packages)
        self.skip = frozenset(skip)
        self._same = same or (lambda a, b: a is b)
        self._entries: dict[Hashable, Any] = {}

    def add(self, key: Hashable, entry: Any) -> Any:
        """Register `entry` under `key`; ValueError when another entry holds the key."""
        known = self._entries.get(key)
        if known is not None and not self._same(known, entry):
            raise ValueError(f"register_{self.kind}: {_show(key)} is already registered")
        self._entries[key] = entry
        return entry

    def remove(self, key: Hashable) -> None:
        """Forget `key` (tests that register temporary entries)."""
        self._entries.pop(key, None)

    def modules(self) -> tuple[str, ...]:
        """Every module below the registry's packages (sorted), shared-code modules left out."""
        found = []
        for package_name in self.packages:
            package = importlib.import_module(package_name)
            for info in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}."):
                last = info.name.rsplit(".", 1)[-1]
                if not last.startswith("_") and last not in self.skip:
                    found.append(info.name)
        return tuple(sorted(found))

    def discover(self) -> None:
        """Import every module of `modules()` (a module imported before is not run again), so
        everything they define registers; a file added since the last call is found too."""
        for module in self.modules():
            importlib.import_module(module)

    def find(self, key: Hashable, module: str | None = None) -> Any | None:
        """The entry of `key` or None: after importing `module` (when given and it exists), then
        after discovering every module."""
        if key not in self._entries and module is not None:
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as err:
                if err.name != module:
                    raise
        if key not in self._entries:
            self.discover()
        return self._entries.get(key)

    def entries(self) -> dict[Hashable, Any]:
        """Every entry after discovery (key -> entry, sorted by key)."""
        self.discover()
        return dict(sorted(self._entries.items(), key=lambda item: _show(item[0])))

    def registered(self) -> dict[Hashable, Any]:
        """What is registered so far in this process, without discovering more."""
        return dict(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self.entries())


def _show(key: Hashable) -> str:
    return "/".join(map(str, key)) if isinstance(key, tuple) else repr(key)
