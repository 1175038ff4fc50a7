"""The results pages (`docs/results/*.md`), generated from the runs that made them.

    python launch/results_pages.py --collect runs/arith --name arith_default   # keep a finished run
    python launch/results_pages.py                                            # regenerate every page

A kept run is a folder `docs/results/runs/<name>/` holding the run's `results.json`,
`run_info.json` (the command, commit, date, machine and wall time, written by
`derl_jax.experiment.run.launch`), `results_levels.json` when the compare ran several levels,
its plots, and each search's history without its per-step curves
(`histories/<method>/seed_<s>.jsonl`, `keep_histories`; runs kept before this have none). A kept set of learning curves (launch/learning_curve.py, one subfolder per
curve with its `curve.json` and `run_info.json`) renders as one table, the paired differences
of each curve against the first (`curve.compare_curves`) and one figure of all of them; the
order is `curves.json`'s, written by `collect` (`first`: the curve to put first).

A page marks where a run's tables go:

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

import numpy as np

from derl_jax.checkpoint import atomic_write_text
from derl_jax.experiment import claims, curve, endpoints, plots, stats
from derl_jax.experiment.curve import CURVE_JSON
from derl_jax.experiment.report import RESULTS_JSON, protocol_lines, summary_percent
from derl_jax.experiment.runtime import RUN_INFO_FILE
from derl_jax.logging import HISTORY_FILE, read_jsonl

RUNS_DIR = "runs"
LEVELS_JSON = "results_levels.json"
CURVE_SET_JSON = "curves.json"
CURVE_SET_PLOT = "curves.png"
HISTORIES_DIR = "histories"
BLOCK = re.compile(r"(<!-- generated: ([\w.-]+) -->\n).*?(<!-- end generated -->)", re.S)


def collect(run_dir: str, runs_root: str, name: str, first: str | None = None) -> str:
    """Copy a finished compare's results.json, run_info.json, results_levels.json and plots into
    `<runs_root>/<name>/` (a level's subfolder too, for a compare over levels); returns that folder.
    A folder of learning curves (subfolders with curve.json) is kept curve by curve, with
    `curves.json` (their order: `first`, then the others by name) and `curves.png`."""
    if not re.fullmatch(r"[\w.-]+", name):
        raise ValueError(f"collect: a kept run's name is letters, digits, '_', '.', '-'; got {name!r}")
    curves = sorted(os.path.basename(d) for d in glob.glob(os.path.join(run_dir, "*"))
                    if os.path.isfile(os.path.join(d, CURVE_JSON)))
    if curves and not os.path.isfile(os.path.join(run_dir, RESULTS_JSON)):
        return _collect_curves(run_dir, os.path.join(runs_root, name), curves, first)
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
        keep_histories(source, target)
    return dest


def keep_histories(run_dir: str, dest: str) -> list[str]:
    """Each search's `<method>/seed_<s>/history.jsonl` of a compare in `run_dir`, as
    `<dest>/histories/<method>/seed_<s>.jsonl` without the per-step curves (every other field:
    iteration, index, text, canonical, valid, score, structure, the curves' last values), so
    analyses of the proposals (structure shares, reward classes, endpoint E3) can be rerun on a
    kept run. Returns the files written."""
    written = []
    for path in sorted(glob.glob(os.path.join(run_dir, "*", "seed_*", HISTORY_FILE))):
        seed_dir = os.path.dirname(path)
        method = os.path.basename(os.path.dirname(seed_dir))
        target = os.path.join(dest, HISTORIES_DIR, method, os.path.basename(seed_dir) + ".jsonl")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        records = [{k: v for k, v in record.items() if k != "curves"} for record in read_jsonl(path)]
        atomic_write_text(target, "".join(json.dumps(record) + "\n" for record in records))
        written.append(target)
    return written


def kept_histories(folder: str) -> dict[str, dict[int, list[dict]]]:
    """{method: {seed: records}} of the histories `keep_histories` kept in `folder` ({} when none)."""
    found: dict[str, dict[int, list[dict]]] = {}
    for path in sorted(glob.glob(os.path.join(folder, HISTORIES_DIR, "*", "seed_*.jsonl"))):
        method, name = os.path.basename(os.path.dirname(path)), os.path.basename(path)
        found.setdefault(method, {})[int(name[len("seed_"):-len(".jsonl")])] = read_jsonl(path)
    return found


def _collect_curves(run_dir: str, dest: str, curves: list[str], first: str | None) -> str:
    if first is not None:
        if first not in curves:
            raise ValueError(f"collect: --first={first!r} is not one of the curves in {run_dir}: {curves}")
        curves = [first] + [c for c in curves if c != first]
    payloads = []
    for label in curves:
        os.makedirs(os.path.join(dest, label), exist_ok=True)
        for file in (CURVE_JSON, RUN_INFO_FILE):
            if os.path.isfile(os.path.join(run_dir, label, file)):
                shutil.copy2(os.path.join(run_dir, label, file), os.path.join(dest, label, file))
        payloads.append(_load(os.path.join(dest, label, CURVE_JSON)))
    atomic_write_text(os.path.join(dest, CURVE_SET_JSON), json.dumps({"curves": curves}, indent=2) + "\n")
    plots.plot_outer_curves({label: np.asarray(p["test"], np.float64).T for label, p in zip(curves, payloads)},
                            os.path.join(dest, CURVE_SET_PLOT), x=payloads[0]["steps"],
                            xlabel="inner GRPO steps", ylabel="greedy test success")
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
    paired, claim_rows = claims.refresh(payload)   # the current statistics, from the kept per-item scores
    if claim_rows:
        lines += ["The paper's claims on this compare (verdict: the 95% Student-t interval over seeds; Holm: "
                  "p-values adjusted over the claims):", "", claims.claims_table(claim_rows)]
    if payload.get("endpoints"):
        lines += ["Endpoints fixed before the runs (DERL − random search; the shuffled-feedback control against both):", "",
                  endpoints.endpoints_table(payload["endpoints"])]
    lines += protocol_lines(payload)
    rows = [f"| {m} | {s['n']} | {stats.format_summary(summary_percent(s, payload))} |"
            for m, s in payload["test"].items()]
    lines += ["Headline test accuracy (%), mean ± std [95% t-interval] over seeds:", "",
              "| method | seeds | test accuracy (%) |", "|---|---:|---|", *rows, ""]
    if payload.get("base_policy_test") is not None:
        lines += [f"Base policy (before RL): {100 * payload['base_policy_test']:.2f}%.", ""]
    if paired:
        lines += ["Paired differences (same seeds, base policy and test items; verdict: Student-t over the per-seed "
                  "differences; two-way bootstrap over seeds and items beside it; Holm over the table's rows):", "",
                  stats.difference_table(paired)]
    for name, path in (payload.get("plots") or {}).items():
        lines += [f"![{name}]({link_prefix}/{path})", ""]
    return lines


def render_curves(folder: str, link_prefix: str) -> list[str]:
    """A kept set of learning curves: provenance of each, the table of means, the paired
    differences against the first curve, the figure."""
    order = _load(os.path.join(folder, CURVE_SET_JSON))["curves"]
    payloads = [_load(os.path.join(folder, label, CURVE_JSON)) for label in order]
    lines = []
    for label, payload in zip(order, payloads):
        info = _load(os.path.join(folder, label, RUN_INFO_FILE))
        lines += [f"`{label}`:", ""] + provenance_lines(info, payload["seeds"])
    steps = payloads[0]["steps"]
    items = len(payloads[0]["test_items"][0][0]) if payloads[0].get("test_items") else None
    lines += [f"Greedy test success (%){f' on {items} test items' if items else ''} after each number of inner "
              f"steps, mean [95% t-interval] over seeds {', '.join(map(str, payloads[0]['seeds']))}:", "",
              "| inner steps | " + " | ".join(order) + " |", "|---:|" + "---|" * len(order)]
    for count in steps:
        cells = []
        for payload in payloads:
            at = payload["steps"].index(count) if count in payload["steps"] else None
            cells.append("" if at is None else f"{100 * payload['mean'][at]:.2f} "
                         f"[{100 * payload['ci95_low'][at]:.2f}, {100 * payload['ci95_high'][at]:.2f}]")
        lines.append(f"| {count} | " + " | ".join(cells) + " |")
    lines.append("")
    differences = curve.compare_curves(payloads) if all(p.get("test_items") for p in payloads) else []
    if differences:
        lines += [f"Paired differences against `{order[0]}` (same seeds, base policy and test items; verdict: "
                  "Student-t over the per-seed differences; two-way bootstrap beside it):", "",
                  stats.difference_table([(f"{d['label']} @ {d['steps']}", f"{d['baseline']} @ {d['steps']}", d)
                                          for d in differences])]
    lines += [f"![curves]({link_prefix}/{CURVE_SET_PLOT})", ""]
    return lines


def render(runs_root: str, name: str, page_dir: str) -> str:
    """The generated block of kept run `name`: provenance, then each compare's tables (or the
    curves of a kept set of learning curves)."""
    folder = os.path.join(runs_root, name)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"no kept run {name!r} in {runs_root}: keep it first with "
                                f"launch/results_pages.py --collect=<workdir> --name={name}")
    link = os.path.relpath(folder, page_dir)
    if os.path.isfile(os.path.join(folder, CURVE_SET_JSON)):
        return "\n".join(render_curves(folder, link)).rstrip() + "\n"
    info = _load(os.path.join(folder, RUN_INFO_FILE))
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
    try:
        new = BLOCK.sub(lambda m: m.group(1) + render(runs_root, m.group(2), page_dir) + m.group(3), text)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{page}: {err}") from err
    if new != text:
        atomic_write_text(page, new)
    return new != text


def regenerate_all(results_dir: str) -> list[str]:
    """Regenerate every page of `results_dir` from `results_dir/runs`; returns the pages that changed."""
    runs_root = os.path.join(results_dir, RUNS_DIR)
    return [page for page in sorted(glob.glob(os.path.join(results_dir, "*.md"))) if regenerate(page, runs_root)]
