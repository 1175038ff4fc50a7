"""The documentation against the code: config fields, the README's front page, links, commands.

* every field of every preset of every `configs/*.py` has a row in docs/configs.md;
* README.md stays a front page (at most `README_MAX_LINES` lines) and its first bash block
  holds the install command and the test command CI runs;
* every relative link of README.md and docs/**/*.md names a file that exists (and a heading
  of it, when the link has an anchor);
* every `--config=configs/<name>.py[:<preset>]` in the docs names a config file and a preset
  that exist (or a config file one of the worked examples of docs/extending.md creates);
* every repository path written in backticks in the docs exists.

Each check is a function returning what is wrong, and a test feeds it a broken text too, so a
check that can no longer fail is caught. `docs_example(path)` is how the example tests
(test_registry_primitives, test_registry_new_domain, test_adding_a_strategy) read the worked
examples of docs/extending.md, so the docs cannot drift from what is tested.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
CONFIGS_DOC = DOCS / "configs.md"
EXTENDING_DOC = DOCS / "extending.md"
README_MAX_LINES = 350
INSTALL_COMMAND = 'pip install -e ".[test]"'
TEST_COMMAND = "python -m pytest -q -n 2 tests"
DICT_FIELDS = ("policy.sft_mix",)  # dict-valued fields documented as one field
REPO_TOPS = ("derl_jax", "primitives", "configs", "launch", "benchmarks", "tests", "docs", "notebooks")


# --------------------------------------------------------------------------- worked examples


def fenced_blocks(text: str, language: str | None = None) -> list[str]:
    """The contents of the fenced blocks of `text` (of `language` when given), in order."""
    blocks = []
    for match in re.finditer(r"^```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)^```", text, re.S | re.M):
        if language is None or match.group(1) == language:
            blocks.append(match.group(2))
    return blocks


def docs_example(path: str, doc: Path = EXTENDING_DOC) -> str:
    """The text of the ```python block of `doc` whose first line is `# file: <path>`."""
    found = [block for block in fenced_blocks(doc.read_text(encoding="utf-8"), "python")
             if block.splitlines() and block.splitlines()[0].strip() == f"# file: {path}"]
    assert len(found) == 1, f"{doc.name} has {len(found)} python blocks starting '# file: {path}', expected 1"
    return found[0]


def example_paths(doc: Path = EXTENDING_DOC) -> set[str]:
    """The paths the worked examples of `doc` create (`# file: <path>`)."""
    paths = set()
    for block in fenced_blocks(doc.read_text(encoding="utf-8"), "python"):
        first = block.splitlines()[0].strip() if block.strip() else ""
        if first.startswith("# file: "):
            paths.add(first.removeprefix("# file: ").strip())
    return paths


# --------------------------------------------------------------------------- config fields


def flatten(block: dict, prefix: str = "") -> dict[str, object]:
    """`block.field` -> value, nested blocks joined with dots; `DICT_FIELDS` stay one field."""
    fields = {}
    for name, value in block.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and key not in DICT_FIELDS:
            fields.update(flatten(value, key + "."))
        else:
            fields[key] = value
    return fields


def config_modules() -> list[str]:
    """The experiment files `configs/<name>.py` (not `common.py` or `__init__.py`)."""
    return sorted(p.stem for p in (REPO_ROOT / "configs").glob("*.py") if p.stem not in ("__init__", "common"))


@functools.cache
def presets_of(module_name: str) -> tuple[str, ...]:
    """The presets of `configs/<module_name>.py`, as its `get_config` names them for an unknown one."""
    module = importlib.import_module(f"configs.{module_name}")
    try:
        module.get_config("__no_such_preset__")
    except ValueError as err:
        found = re.search(r"expected one of (\(.*\))", str(err))
        assert found, f"configs/{module_name}.py: an unknown preset must name the known ones, got {err}"
        return tuple(ast.literal_eval(found.group(1)))
    raise AssertionError(f"configs/{module_name}.py: get_config accepted an unknown preset")


def every_field() -> dict[str, set[str]]:
    """`block.field` -> the `<config>:<preset>`s that have it, over every preset of every config file."""
    fields: dict[str, set[str]] = {}
    for module_name in config_modules():
        module = importlib.import_module(f"configs.{module_name}")
        for preset in presets_of(module_name):
            for field in flatten(module.get_config(preset).to_dict()):
                fields.setdefault(field, set()).add(f"{module_name}:{preset}")
    return fields


def documented_fields(text: str) -> set[str]:
    """Fields with a table row of their own: a row whose first cell is exactly `` `field` ``."""
    return set(re.findall(r"^\|\s*`([A-Za-z_][A-Za-z0-9_.]*)`\s*\|", text, re.M))


def missing_fields(fields, text: str) -> list[str]:
    return sorted(set(fields) - documented_fields(text))


# --------------------------------------------------------------------------- README


def readme_problems(text: str) -> list[str]:
    problems = []
    lines = text.splitlines()
    if len(lines) > README_MAX_LINES:
        problems.append(f"README.md has {len(lines)} lines, more than {README_MAX_LINES}")
    bash = fenced_blocks(text, "bash")
    if not bash:
        problems.append("README.md has no ```bash block")
    else:
        commands = [line.split("#", 1)[0].strip() for line in bash[0].splitlines()]
        for wanted in (INSTALL_COMMAND, TEST_COMMAND):
            if wanted not in commands:
                problems.append(f"README.md's first bash block does not run {wanted!r}")
    return problems


# --------------------------------------------------------------------------- links and paths


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def without_code(text: str) -> str:
    """`text` without fenced blocks and inline code (links are not read inside code)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def broken_links(path: Path, text: str) -> list[str]:
    """Relative links and images of the markdown file `path` whose target does not exist."""
    broken = []
    for target in re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", without_code(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (http:, mailto:, ...) or an anchor in the same page
        file_part = target.split("#", 1)[0]
        if not (path.parent / file_part).exists():
            broken.append(f"{path.relative_to(REPO_ROOT)}: {target}")
    return broken


def heading_anchors(text: str) -> set[str]:
    """The anchors of the headings of a markdown text, as GitHub writes them (lower case,
    punctuation but `-` and `_` dropped, spaces as `-`)."""
    body = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*$", body, re.M)}


def broken_anchors(path: Path, text: str) -> list[str]:
    """Links `file.md#anchor` (or `#anchor`) of the markdown file `path` whose anchor is no heading there."""
    broken = []
    for target in re.findall(r"\[[^\]]*\]\(\s*<?([^)\s>]*#[^)\s>]+)>?\s*\)", without_code(text)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue
        file_part, anchor = target.split("#", 1)
        linked = (path.parent / file_part) if file_part else path
        if linked.suffix == ".md" and linked.exists():
            if anchor not in heading_anchors(linked.read_text(encoding="utf-8")):
                broken.append(f"{path.relative_to(REPO_ROOT)}: {target}")
    return broken


def missing_paths(path: Path, text: str, created: set[str]) -> list[str]:
    """Repository paths written in backticks (`derl_jax/rl/loop.py`, `configs/`) that do not exist."""
    missing = []
    pattern = r"`((?:%s)/[A-Za-z0-9_./-]*)" % "|".join(REPO_TOPS)
    for found in re.findall(pattern, text):
        candidate = found.rstrip(".")
        if candidate in created or not re.search(r"(\.(py|md|sh|ipynb|png|json)|/)$", candidate):
            continue
        if not (REPO_ROOT / candidate).exists():
            missing.append(f"{path.relative_to(REPO_ROOT)}: {candidate}")
    return missing


# --------------------------------------------------------------------------- preset commands


def config_commands(text: str) -> list[tuple[str, str | None]]:
    """(config name, preset or None) of every `--config=configs/<name>.py[:<preset>]` in `text`."""
    return [(name, preset or None)
            for name, preset in re.findall(r"--config[= ]configs/([A-Za-z0-9_]+)\.py(?::([A-Za-z0-9_]+))?", text)]


def bad_config_commands(text: str, created: set[str]) -> list[str]:
    bad = []
    for name, preset in config_commands(text):
        if f"configs/{name}.py" in created:
            continue
        if not (REPO_ROOT / "configs" / f"{name}.py").is_file():
            bad.append(f"configs/{name}.py does not exist")
        elif preset is not None and preset not in presets_of(name):
            bad.append(f"configs/{name}.py has no preset {preset!r} (presets: {presets_of(name)})")
    return bad


# --------------------------------------------------------------------------- tests


def test_every_config_field_has_a_row_in_configs_md():
    fields = every_field()
    assert "policy.sft_mix" in fields and "arbo.agent.url" in fields and "seed" in fields
    assert missing_fields(fields, CONFIGS_DOC.read_text(encoding="utf-8")) == []


def test_the_field_check_sees_a_removed_row():
    text = CONFIGS_DOC.read_text(encoding="utf-8")
    fields = every_field()
    for field in ("inner.group_size", "arbo.agent.max_turns", "seed"):
        without = "\n".join(line for line in text.splitlines() if not line.startswith(f"| `{field}`"))
        assert missing_fields(fields, without) == [field]
    assert missing_fields({"inner.no_such_field": {"x:default"}}, text) == ["inner.no_such_field"]


def test_readme_is_a_front_page_that_opens_with_install_and_tests():
    assert readme_problems(README.read_text(encoding="utf-8")) == []


def test_the_readme_check_sees_a_long_readme_and_a_missing_command():
    text = README.read_text(encoding="utf-8")
    assert readme_problems(text + "\n" * README_MAX_LINES)
    assert readme_problems(text.replace(TEST_COMMAND, "python -m pytest -q tests", 1))
    assert readme_problems("# x\n\n```bash\necho hi\n```\n")


def test_every_relative_link_in_the_docs_exists():
    broken = [b for path in markdown_files() for b in broken_links(path, path.read_text(encoding="utf-8"))]
    assert broken == []


def test_the_link_check_sees_a_broken_link():
    assert broken_links(DOCS / "x.md", "see [a](results/nothing_here.md) and ![b](../nope.png)") == [
        "docs/x.md: results/nothing_here.md", "docs/x.md: ../nope.png"]
    assert broken_links(DOCS / "x.md", "[c](design.md#layers) [d](https://example.org) `[e](nope.md)`") == []


def test_every_link_to_a_heading_finds_it():
    broken = [b for path in markdown_files() for b in broken_anchors(path, path.read_text(encoding="utf-8"))]
    assert broken == []


def test_the_anchor_check_sees_a_missing_heading():
    assert "inner-the-inner-grpo-loop" in heading_anchors(CONFIGS_DOC.read_text(encoding="utf-8"))
    assert broken_anchors(DOCS / "x.md", "[a](configs.md#no-such-heading) [b](configs.md#outer-the-search)") == [
        "docs/x.md: configs.md#no-such-heading"]


def test_every_backticked_repository_path_exists():
    created = example_paths()
    missing = [m for path in markdown_files() for m in missing_paths(path, path.read_text(encoding="utf-8"), created)]
    assert missing == []


def test_the_path_check_sees_a_missing_path():
    assert missing_paths(README, "`derl_jax/meta/search.py` and `derl_jax/outer/`", set()) == [
        "README.md: derl_jax/meta/search.py"]


def test_every_preset_command_names_an_existing_config_and_preset():
    created = example_paths()
    commands = [c for path in markdown_files() for c in config_commands(path.read_text(encoding="utf-8"))]
    assert ("arith", None) in commands and ("household", "self_guide") in commands
    bad = [b for path in markdown_files() for b in bad_config_commands(path.read_text(encoding="utf-8"), created)]
    assert bad == []


def test_the_preset_check_sees_a_missing_config_and_preset():
    assert bad_config_commands("--config=configs/arith.py:no_such --config=configs/nope.py", set()) == [
        "configs/arith.py has no preset 'no_such' (presets: ('default', 'smoke'))", "configs/nope.py does not exist"]
    assert bad_config_commands("--config=configs/echo.py", {"configs/echo.py"}) == []


def test_the_worked_examples_are_found_once_each():
    assert example_paths() >= {"primitives/my_prims.py", "derl_jax/domains/echo.py", "configs/echo.py",
                               "derl_jax/methods/hill_climb.py"}
    for path in example_paths():
        assert not (REPO_ROOT / path).exists(), f"{path}: a worked example must not shadow a real file"
        compile(docs_example(path), path, "exec")
    with pytest.raises(AssertionError, match="has 0 python blocks"):
        docs_example("primitives/no_such_example.py")


def test_the_layer_table_is_in_the_readme():
    text = README.read_text(encoding="utf-8")
    assert re.search(r"Layers, bottom to top[^\n]*\n+```\n1 ", text), "README.md: no layer table after 'Layers, bottom to top'"
