"""docs/design.md's layout names every module of the tree, and docs/configs.md's preset table
every config file and each of its presets. Both read the tree as it is now, so a module or a
preset added without its line fails here; each check also gets a broken text, so it can fail."""

from __future__ import annotations

import re
from pathlib import Path

from test_docs import REPO_ROOT, presets_of

DESIGN = REPO_ROOT / "docs" / "design.md"
CONFIGS_DOC = REPO_ROOT / "docs" / "configs.md"
TREES = ("derl_jax", "primitives", "configs", "launch", "benchmarks")
SUFFIXES = (".py", ".sh")


def modules(root: Path = REPO_ROOT) -> list[str]:
    """Every .py / .sh file below `TREES` (package `__init__.py` files left out), relative, sorted."""
    found = []
    for tree in TREES:
        for path in (root / tree).rglob("*"):
            if path.suffix in SUFFIXES and path.name != "__init__.py" and "__pycache__" not in path.parts:
                found.append(path.relative_to(root).as_posix())
    return sorted(found)


def layout_sections(text: str) -> dict[str, str]:
    """The code block under `## Layout` as {first word of a line: that line and its indented continuations}."""
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    sections: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if line and not line[0].isspace():
            words = line.split()
            current = words[0].rstrip(",")
            sections[current] = line[len(words[0]):]
            for extra in words[1:]:   # `derl_jax/checkpoint.py, logging.py ...`: several files on one line
                if extra.endswith(",") or extra.endswith(".py"):
                    sections.setdefault(current.rsplit("/", 1)[0] + "/" + extra.rstrip(","), "")
                else:
                    break
        elif current is not None:
            sections[current] += "\n" + line
    return sections


def missing_from_layout(text: str, paths) -> list[str]:
    """The module paths the layout does not name: a file of a listed folder by its file name
    (`vm.py`; `device_check.sh`), a file of a subfolder by the subfolder (`household/`)."""
    sections = layout_sections(text)
    missing = []
    for path in paths:
        if path in sections:
            continue
        owners = [key for key in sections if key.endswith("/") and path.startswith(key)]
        if not owners:
            missing.append(path)
            continue
        owner = max(owners, key=len)
        rest = path[len(owner):]
        name = rest.split("/")[0] + "/" if "/" in rest else rest
        if not re.search(rf"(?<![\w/.]){re.escape(name)}(?![\w])", sections[owner]):
            missing.append(path)
    return missing


def missing_presets(text: str, configs: dict[str, tuple[str, ...]]) -> list[str]:
    """`configs/<name>.py` files or presets the config reference's preset table does not list."""
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `configs/(\w+)\.py` \|([^\n]*)$", text, re.MULTILINE)}
    missing = []
    for name, presets in configs.items():
        if name not in rows:
            missing.append(f"configs/{name}.py")
            continue
        missing += [f"configs/{name}.py:{p}" for p in presets if f"`{p}`" not in rows[name]]
    return missing


def config_presets() -> dict[str, tuple[str, ...]]:
    """{experiment config name: its presets} for every configs/*.py but the shared ones."""
    names = sorted(p.stem for p in (REPO_ROOT / "configs").glob("*.py") if p.stem not in ("__init__", "common"))
    return {name: presets_of(name) for name in names}


def test_the_design_layout_names_every_module():
    assert missing_from_layout(DESIGN.read_text(encoding="utf-8"), modules()) == []


def test_the_preset_table_lists_every_config_and_preset():
    assert missing_presets(CONFIGS_DOC.read_text(encoding="utf-8"), config_presets()) == []


def test_the_checks_catch_what_is_missing():
    layout = ("# Design\n\n## Layout\n\n```\nderl_jax/config.py, registry.py   checkers\n"
              "derl_jax/expr/     ast.py  parse.py (text)\n                   vm.py\n"
              "derl_jax/domains/  arith.py  household/ (rules)\nbenchmarks/  device_check.sh + .py\n```\n")
    paths = ["derl_jax/config.py", "derl_jax/registry.py", "derl_jax/expr/vm.py", "derl_jax/expr/grammar.py",
             "derl_jax/domains/household/env.py", "derl_jax/domains/alfworld/engine.py", "derl_jax/expr/ast.py",
             "derl_jax/workdir.py", "benchmarks/device_check.sh", "benchmarks/device_check.py",
             "derl_jax/expr/parse_more.py"]
    assert missing_from_layout(layout, paths) == ["derl_jax/expr/grammar.py", "derl_jax/domains/alfworld/engine.py",
                                                   "derl_jax/workdir.py", "benchmarks/device_check.py",
                                                   "derl_jax/expr/parse_more.py"]
    table = "| config file | presets |\n|---|---|\n| `configs/arith.py` | `default`, `smoke` |\n"
    assert missing_presets(table, {"arith": ("default", "smoke", "big"), "new": ("default",)}) == [
        "configs/arith.py:big", "configs/new.py"]
    assert "derl_jax/outer/search.py" in modules() and "benchmarks/device_check.sh" in modules()
    assert "tests/test_docs.py" not in modules() and not any(p.endswith("__init__.py") for p in modules())
