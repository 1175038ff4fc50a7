"""The import graph: no module imports a layer above its own, and no modules import each other in a circle.

The layer order is the README's (the fenced block under "Layers, bottom to top" in its Design
section): a module may import its own layer and the layers below. Every import counts, also
one inside a function; an import inside `if TYPE_CHECKING:` too (it still ties the files).
"""

from __future__ import annotations

import ast
import os
import re

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP_LEVEL = ("derl_jax", "primitives", "configs", "launch", "benchmarks")


def layer_order() -> list[tuple[int, tuple[str, ...]]]:
    """[(layer number, module prefixes)] read from the README."""
    text = open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8").read()
    found = re.search(r"Layers, bottom to top[^\n]*\n+```\n(.*?)```", text, re.S)
    assert found, "README.md has no fenced block after 'Layers, bottom to top'"
    layers = []
    for line in found.group(1).splitlines():
        number, *names = line.split()
        layers.append((int(number), tuple(name.rstrip("/").replace("/", ".").removesuffix(".py") for name in names)))
    return layers


def module_name(path: str) -> str:
    relative = os.path.relpath(path, REPO_ROOT)[: -len(".py")].replace(os.sep, ".")
    return relative.removesuffix(".__init__")


def project_modules() -> dict[str, str]:
    """Dotted module name -> file, for every Python file of the project outside tests."""
    modules = {}
    for top in TOP_LEVEL:
        for folder, _, files in os.walk(os.path.join(REPO_ROOT, top)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    modules[module_name(path)] = path
    return modules


def imports_of(path: str, modules: dict[str, str]) -> set[str]:
    """The project modules that the file at `path` imports (the longest known prefix of each name)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from package import module` ties to the module; `from module import name` to the module
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                names.add(submodule if submodule in modules else node.module)
    found = set()
    for name in names:
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if candidate in modules:
                found.add(candidate)
                break
    return found - {module_name(path)}


def layer_of(module: str, layers) -> int | None:
    best = None
    for number, prefixes in layers:
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                if best is None or len(prefix) > best[1]:
                    best = (number, len(prefix))
    return None if best is None else best[0]


@pytest.fixture(scope="module")
def graph():
    modules = project_modules()
    return {module: imports_of(path, modules) for module, path in modules.items()}


def test_every_module_has_a_layer(graph):
    layers = layer_order()
    assert [number for number, _ in layers] == sorted(number for number, _ in layers)
    unplaced = sorted(m for m in graph if layer_of(m, layers) is None and m != "derl_jax" and not m.endswith("__init__"))
    assert unplaced == []


def test_no_module_imports_a_layer_above_its_own(graph):
    layers = layer_order()
    upward = []
    for module, targets in graph.items():
        own = layer_of(module, layers) or 0
        for target in targets:
            if (layer_of(target, layers) or 0) > own:
                upward.append(f"{module} (layer {own}) -> {target} (layer {layer_of(target, layers)})")
    assert sorted(upward) == []


def test_no_circles(graph):
    """Tarjan's strongly connected components over the module graph: every one is a single module."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    assert circles == []


def test_the_checker_sees_an_upward_import_and_a_circle(tmp_path):
    """The graph walker on a two-file example: it must find both faults, or the tests above prove nothing."""
    for name, text in {"low.py": "def f():\n    from high import g\n", "high.py": "import low\n"}.items():
        (tmp_path / name).write_text(text)
    modules = {"low": str(tmp_path / "low.py"), "high": str(tmp_path / "high.py")}
    assert imports_of(modules["low"], modules) == {"high"}
    assert imports_of(modules["high"], modules) == {"low"}
    assert layer_of("high.sub", [(1, ("low",)), (2, ("high",))]) == 2
