"""Results pages generated from kept runs (`derl_jax.experiment.pages`, launch/results_pages.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from absl import flags

from derl_jax.checkpoint import atomic_write_json
from derl_jax.experiment import curve, pages, stats
from derl_jax.experiment.report import write_report
from test_claims import compare  # noqa: F401  (the fixture: a compare with a known 20-point gap)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join("launch", "results_pages.py")
PAGE = """# Results

Some prose a person wrote.

<!-- generated: unit_run -->
stale text
<!-- end generated -->

More prose.
"""


@pytest.fixture
def kept(compare, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    write_report(str(run_dir), compare)
    info = {"command": "python launch/run.py --config=configs/arith.py --mode=compare", "commit": "abc123",
            "started": "2026-12-02T00:00:00+00:00", "cpu": "unit cpu", "cores": 2, "backend": "cpu",
            "jax": "0.0", "wall_s": 754.0}
    (run_dir / "run_info.json").write_text(json.dumps(info))
    results = tmp_path / "results"
    results.mkdir()
    (results / "page.md").write_text(PAGE)
    pages.collect(str(run_dir), str(results / "runs"), "unit_run")
    return results


def test_a_page_block_is_rendered_from_its_kept_run_and_prose_is_kept(kept):
    assert pages.regenerate_all(str(kept)) == [str(kept / "page.md")]
    text = (kept / "page.md").read_text()
    assert text.startswith("# Results\n\nSome prose a person wrote.\n") and text.endswith("More prose.\n")
    assert "stale text" not in text
    assert "python launch/run.py --config=configs/arith.py --mode=compare" in text
    assert "commit `abc123`" in text and "wall time 12 min 34 s" in text and "Seeds 0, 1, 2" in text
    assert "| DERL > outcome-only | derl − outcome, test, paired over 3 seeds x 100 items | +20.00 |" in text
    assert "| derl | outcome | +20.0 |" in text
    assert "![outer_curves](runs/unit_run/outer_curves.png)" in text
    assert os.path.isfile(kept / "runs" / "unit_run" / "outer_curves.png")
    assert pages.regenerate_all(str(kept)) == []  # regenerating again changes nothing


def test_a_changed_run_changes_its_page(kept):
    pages.regenerate_all(str(kept))
    results_json = kept / "runs" / "unit_run" / "results.json"
    payload = json.loads(results_json.read_text())
    payload["test"]["derl"]["mean"] = 0.995   # results.json keeps fractions; the page shows %
    results_json.write_text(json.dumps(payload))
    assert pages.regenerate_all(str(kept)) == [str(kept / "page.md")]
    assert "| derl | 3 | 99.50 ±" in (kept / "page.md").read_text()


def test_collect_refuses_an_unfinished_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="is the compare finished"):
        pages.collect(str(tmp_path), str(tmp_path / "runs"), "x")
    with pytest.raises(ValueError, match="letters, digits"):
        pages.collect(str(tmp_path), str(tmp_path / "runs"), "../x")


def results_pages_launcher():
    """launch/results_pages.py as a module (once per process: it defines absl flags)."""
    if "derl_results_pages" not in sys.modules:
        spec = importlib.util.spec_from_file_location("derl_results_pages", os.path.join(REPO_ROOT, SCRIPT))
        module = importlib.util.module_from_spec(spec)
        sys.modules["derl_results_pages"] = module
        spec.loader.exec_module(module)
    return sys.modules["derl_results_pages"]


def test_the_command_line_regenerates_the_pages(kept, capsys):
    """The launcher's flags and main in this process; the launcher as a process (exit status,
    one error line) is test_a_page_naming_a_run_that_is_not_kept_gets_one_line's."""
    page = kept / "page.md"
    launcher = results_pages_launcher()
    try:
        flags.FLAGS.unparse_flags()
        flags.FLAGS([SCRIPT, f"--results_dir={kept}"])
        launcher.main([SCRIPT])
    finally:
        flags.FLAGS.unparse_flags()
    assert f"regenerated {page}" in capsys.readouterr().out.splitlines()
    assert "stale text" not in page.read_text()


def test_the_repository_pages_are_up_to_date():
    """Every generated block in docs/results equals what its kept run renders now."""
    results_dir = os.path.join(REPO_ROOT, "docs", "results")
    runs_root = os.path.join(results_dir, pages.RUNS_DIR)
    for name in sorted(os.listdir(results_dir)):
        if name.endswith(".md"):
            text = open(os.path.join(results_dir, name), encoding="utf-8").read()
            for match in pages.BLOCK.finditer(text):
                assert match.group(0) == match.group(1) + pages.render(runs_root, match.group(2), results_dir) + \
                    match.group(3), f"docs/results/{name}: block {match.group(2)} is stale; run launch/results_pages.py"


def write_curve(workdir, label, items_by_step):
    """A finished learning curve from per-item scores {steps: f[seeds, items]} (seeds 0, 1, ...)."""
    seeds = list(range(len(next(iter(items_by_step.values())))))
    for count, items in items_by_step.items():
        for seed in seeds:
            atomic_write_json(curve.point_path(str(workdir), count, seed),
                              {"steps": count, "seed": seed, "test": float(np.mean(items[seed])),
                               "test_items": [float(v) for v in items[seed]]})
    return curve.summarize_curve(str(workdir), "g1", sorted(items_by_step), seeds, label=label)


def test_a_set_of_learning_curves_renders_its_means_and_paired_differences(tmp_path):
    rng = np.random.default_rng(0)
    base = (rng.random((1, 200)) < 0.3).astype(float).repeat(3, axis=0)
    trained = (rng.random((3, 200)) < 0.4).astype(float)
    better = trained.copy()
    for seed in range(3):   # 20 failures of each seed turned into successes: +10 points, item by item
        better[seed, np.flatnonzero(better[seed] == 0)[:20]] = 1.0
    runs = tmp_path / "curves"
    write_curve(runs / "plain", "plain", {0: base, 10: trained})
    write_curve(runs / "better", "better", {0: base, 10: better})
    results = tmp_path / "results"
    results.mkdir()
    (results / "page.md").write_text("# Curves\n\n<!-- generated: unit_curves -->\n<!-- end generated -->\n")
    kept = pages.collect(str(runs), str(results / "runs"), "unit_curves", first="plain")
    assert json.load(open(os.path.join(kept, "curves.json"))) == {"curves": ["plain", "better"]}
    assert os.path.isfile(os.path.join(kept, "curves.png")) and os.path.isfile(os.path.join(kept, "plain", "curve.json"))
    assert pages.regenerate_all(str(results)) == [str(results / "page.md")]
    text = (results / "page.md").read_text()
    assert "| inner steps | plain | better |" in text
    low, high = stats.summarize(100 * trained.mean(axis=1))["ci95_low"], stats.summarize(100 * trained.mean(axis=1))["ci95_high"]
    assert f"| 10 | {100 * trained.mean():.2f} [{low:.2f}, {high:.2f}] |" in text
    assert "| better @ 10 | plain @ 10 | +10.0 |" in text and "separated" in text
    assert "@ 0 |" not in text   # the base policy is not compared with itself
    assert "![curves](runs/unit_curves/curves.png)" in text
    assert pages.regenerate_all(str(results)) == []
    with pytest.raises(ValueError, match="'nope' is not one of the curves"):
        pages.collect(str(runs), str(results / "runs"), "other", first="nope")


def test_curves_of_different_seeds_are_not_compared(tmp_path):
    items = np.ones((2, 10))
    a = write_curve(tmp_path / "a", "a", {5: items})
    b = write_curve(tmp_path / "b", "b", {5: np.ones((3, 10))})
    with pytest.raises(ValueError, match="the same seeds"):
        curve.compare_curves([a, b])


def test_a_page_naming_a_run_that_is_not_kept_gets_one_line(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "page.md").write_text("<!-- generated: missing_run -->\n<!-- end generated -->\n")
    with pytest.raises(FileNotFoundError, match="page.md: no kept run 'missing_run'"):
        pages.regenerate_all(str(results))
    completed = subprocess.run([sys.executable, SCRIPT, f"--results_dir={results}"],
                               capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert completed.returncode == 1 and "Traceback" not in completed.stderr
    assert completed.stderr.strip().splitlines()[-1].endswith("--name=missing_run")
