"""The results pages (`docs/results/*.md`), generated from the runs that made them.

    python launch/results_pages.py --collect runs/arith --name arith_default   # keep a finished run
    python launch/results_pages.py                                            # regenerate every page

A kept run is a folder `docs/results/runs/<name>/` holding the run's `results.json`,
`run_info.json` (the command, commit, date, machine and wall time, written by
`derl_jax.experiment.run.launch`), `results_levels.json` when the compare ran several levels,
and its plots. A page marks where a run's tables go:

    <!-- generated: arith_default -->
    ...            (replaced by `render(<name>)` each time the pages are regenerated)
    <!-- end generated -->

so a table on a page cannot drift from the run that made it: edit the run, not the page.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
from typing import Any, Mapping

from derl_jax.checkpoint import atomic_write_text
from derl_jax.experiment import claims, stats
from derl_jax.experiment.report import RESULTS_JSON
from derl_jax.experiment.runtime import RUN_INFO_FILE

RUNS_DIR = "runs"
LEVELS_JSON = "results_levels.json"
BLOCK = re.compile(r"(<!-- generated: ([\w.-]+) -->\n).*?(<!-- end generated -->)", re.S)


def collect(run_dir: str, runs_root: str, name: str) -> str:
    """Copy a finished compare's results.json, run_info.json, results_levels.json and plots into
    `<runs_root>/<name>/` (a level's subfolder too, for a compare over levels); returns that folder."""
    if not re.fullmatch(r"[\w.-]+", name):
        raise ValueError(f"collect: a kept run's name is letters, digits, '_', '.', '-'; got {name!r}")
    sources = [run_dir] + sorted(d for d in glob.glob(os.path.join(run_dir, "*"))
                                 if os.path.isfile(os.path.join(d, RESULTS_JSON)))
    if not any(os.path.isfile(os.path.join(d, RESULTS_JSON)) for d in sources):
        raise FileNotFoundError(f"collect: no {RESULTS_JSON} in {run_dir} or its level folders: is the compare finished?")
    dest = os.path.join(runs_root, name)
    for source in sources:
        target = dest if source == run_dir else os.path.join(dest, os.path.basename(source))
        os.makedirs(target, exist_ok=True)
        for pattern in (RESULTS_JSON, RUN_INFO_FILE, LEVELS_JSON, "*.png"):
            for path in glob.glob(os.path.join(source, pattern)):
                shutil.copy2(path, os.path.join(target, os.path.basename(path)))
    return dest


def _load(path: str) -> dict | None:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def provenance_lines(info: Mapping[str, Any] | None, seeds: list[int]) -> list[str]:
    """How the run was made: command, seeds, commit, date, machine, wall time."""
    if info is None:
        return ["*No run_info.json was kept with this run: its command is not recorded.*", ""]
    minutes, seconds = divmod(int(round(float(info.get("wall_s", 0.0)))), 60)
    return ["```bash", info["command"], "```", "",
            f"Seeds {', '.join(map(str, seeds))}; commit `{info.get('commit')}`; started {info.get('started')}; "
            f"{info.get('cpu')} ({info.get('cores')} cores, {info.get('backend')}); jax {info.get('jax')}; "
            f"wall time {minutes} min {seconds:02d} s.", ""]


def render_compare(folder: str, link_prefix: str, title: str | None = None) -> list[str]:
    """The tables of one compare's results.json in `folder` (plots linked through `link_prefix`)."""
    payload = _load(os.path.join(folder, RESULTS_JSON))
    if payload is None:
        raise FileNotFoundError(f"render: no {RESULTS_JSON} in {folder}")
    lines = [f"#### {title}", ""] if title else []
    if payload.get("claims"):
        lines += ["The paper's claims on this compare:", "", claims.claims_table(payload["claims"])]
    rows = [f"| {m} | {s['n']} | {stats.format_summary(s)} |" for m, s in payload["test"].items()]  # already in %
    lines += ["Headline test accuracy (%), mean ± std [95% t-interval] over seeds:", "",
              "| method | seeds | test accuracy (%) |", "|---|---:|---|", *rows, ""]
    if payload.get("base_policy_test") is not None:
        lines += [f"Base policy (before RL): {100 * payload['base_policy_test']:.2f}%.", ""]
    if payload.get("paired"):
        paired = [(p["method"], p["baseline"], p) for p in payload["paired"]]
        lines += ["Paired differences (same seeds, base policy and test items; bootstrap over seeds and items):", "",
                  stats.difference_table(paired)]
    for name, path in (payload.get("plots") or {}).items():
        lines += [f"![{name}]({link_prefix}/{path})", ""]
    return lines


def render(runs_root: str, name: str, page_dir: str) -> str:
    """The generated block of kept run `name`: provenance, then each compare's tables."""
    folder = os.path.join(runs_root, name)
    info = _load(os.path.join(folder, RUN_INFO_FILE))
    link = os.path.relpath(folder, page_dir)
    levels = _load(os.path.join(folder, LEVELS_JSON))
    compares = [(level, os.path.join(folder, level)) for level in levels["levels"]] if levels else [(None, folder)]
    seeds = sorted({row["seed"] for _, f in compares for rows in _load(os.path.join(f, RESULTS_JSON))["per_seed"].values()
                    for row in rows})
    lines = provenance_lines(info, seeds)
    for level, path in compares:
        lines += render_compare(path, os.path.join(link, level) if level else link,
                                f"Level {level}" if level else None)
    return "\n".join(lines).rstrip() + "\n"


def regenerate(page: str, runs_root: str) -> bool:
    """Rewrite every generated block of `page`; returns whether the page changed."""
    with open(page, encoding="utf-8") as handle:
        text = handle.read()
    page_dir = os.path.dirname(os.path.abspath(page))
    new = BLOCK.sub(lambda m: m.group(1) + render(runs_root, m.group(2), page_dir) + m.group(3), text)
    if new != text:
        atomic_write_text(page, new)
    return new != text


def regenerate_all(results_dir: str) -> list[str]:
    """Regenerate every page of `results_dir` from `results_dir/runs`; returns the pages that changed."""
    runs_root = os.path.join(results_dir, RUNS_DIR)
    return [page for page in sorted(glob.glob(os.path.join(results_dir, "*.md"))) if regenerate(page, runs_root)]
