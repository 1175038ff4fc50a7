"""`compare.levels`: the whole compare once per generalisation level, then the methods x levels table."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from absl import flags

from derl_jax.experiment import build, levels, stats
from test_launch import invoke as launch_invoke
from test_launch import load_launcher, use_fakes
from test_search import BASE_PARAMS, REPO_ROOT, FakeEvaluator

HOUSEHOLD_SMOKE = os.path.join(REPO_ROOT, "configs", "household.py") + ":smoke"


@pytest.fixture
def launcher(monkeypatch):
    module = load_launcher()
    built = []

    def fake_inner(domain, cfg, workdir, host_cores=None):
        assert domain.name == "household" and os.path.basename(workdir) == cfg.domain.level
        evaluator = FakeEvaluator()
        built.append((cfg.domain.level, domain.info["test_kinds"], evaluator))
        return BASE_PARAMS, evaluator

    use_fakes(monkeypatch, None)
    monkeypatch.setattr(build, "build_inner", fake_inner)
    module.built = built
    yield module
    flags.FLAGS.unparse_flags()


def invoke(module, *args: str) -> None:
    launch_invoke(module, "--mode=compare", *args, config=HOUSEHOLD_SMOKE)


@pytest.mark.slow
def test_compare_runs_every_level_and_tabulates_methods_by_level(launcher, tmp_path, capsys):
    """L0, L1, L2 in turn. L1 trains on L0's tasks: it reuses L0's searches and final policies and
    only tests, on its own split, with the results of an L1 compare run on its own."""
    from derl_jax.outer.search import strip_wall_clock

    invoke(launcher, f"--workdir={tmp_path}", "--config.compare.levels=('L0', 'L1', 'L2')",
           "--config.compare.seeds=(0, 1)", "--config.compare.methods=('outcome', 'derl')")
    assert [level for level, *_ in launcher.built] == ["L0", "L1", "L2"]
    assert launcher.built[2][1] == ["cool", "pick_two"] and len(launcher.built[0][1]) == 6
    first, shared, last = (evaluator for *_, evaluator in launcher.built)
    # L1 trained nothing (searches, final policies and outcome's validation score were shared).
    assert len(first.calls) > 2 and shared.calls == [] and len(last.calls) == len(first.calls)
    assert shared.final_calls == [] and len(last.final_calls) == len(first.final_calls) == 4
    out = capsys.readouterr().out
    assert "level L1: 4 trainings shared with level L0" in out and out.count("trainings shared") == 1
    kept = lambda level: sorted(p.parent.name for p in (tmp_path / level).glob("*/seed_*/final_policy.npz"))  # noqa: E731
    assert kept("L0") == kept("L1") == ["seed_0", "seed_0", "seed_1", "seed_1"] and kept("L2") == []
    # The same numbers as L1 on its own, which trains everything itself.
    invoke(launcher, f"--workdir={tmp_path / 'alone' / 'L1'}", "--config.domain.level=L1", "--config.compare.seeds=(0, 1)",
           "--config.compare.methods=('outcome', 'derl')")
    assert launcher.built[-1][2].final_calls and not (tmp_path / "alone" / "L1" / "derl" / "seed_0" / "final_policy.npz").exists()
    for method in ("outcome", "derl"):
        for seed in (0, 1):
            row = lambda root: {k: v for k, v in json.load(open(root / method / f"seed_{seed}" / "method_result.json")).items()  # noqa: E731
                                if k != "wall_clock"}
            assert row(tmp_path / "L1") == row(tmp_path / "alone" / "L1"), (method, seed)
    table = json.load(open(tmp_path / "results_levels.json"))
    assert table["levels"] == ["L0", "L1", "L2"]
    markdown = open(tmp_path / "results_levels.md").read()
    for seed in (0, 1):
        read = lambda level: strip_wall_clock(  # noqa: E731
            [json.loads(line) for line in open(tmp_path / level / "derl" / f"seed_{seed}" / "history.jsonl")])
        assert read("L0") == read("L1")
    # The same policies, tested on each level's own test split (the fake accuracy depends on it).
    assert table["test"]["L0"]["derl"]["mean"] != table["test"]["L1"]["derl"]["mean"]
    for level in ("L0", "L1", "L2"):
        per_level = json.load(open(tmp_path / level / "results.json"))
        assert (tmp_path / level / "derl" / "seed_1" / "history.jsonl").exists()
        base = json.load(open(tmp_path / level / "base_policy_test.json"))["test"]
        assert table["base_policy_test"][level] == per_level["base_policy_test"] == pytest.approx(base)
        for method in ("outcome", "derl"):
            seeds = [100.0 * row["test"] for row in per_level["per_seed"][method]]
            expected = stats.summarize(seeds, clip=(0.0, 100.0))
            assert 100 * table["test"][level][method]["mean"] == pytest.approx(expected["mean"])
            assert stats.format_summary(expected) in markdown
        history = [json.loads(line) for line in open(tmp_path / level / "derl" / "seed_1" / "history.jsonl")]
        scores = [r["score"] if r["valid"] else 0.0 for r in sorted(history, key=lambda r: (r["iteration"], r["index"]))]
        curves = [np.maximum.accumulate([r["score"] if r["valid"] else 0.0 for r in sorted(
            (json.loads(line) for line in open(tmp_path / level / "derl" / f"seed_{s}" / "history.jsonl")),
            key=lambda r: (r["iteration"], r["index"]))]) for s in (0, 1)]
        np.testing.assert_allclose(per_level["best_so_far"]["derl"]["mean"], np.mean(curves, axis=0))
        np.testing.assert_allclose(per_level["best_so_far"]["derl"]["std"], np.std(curves, axis=0, ddof=1))
        assert len(scores) == 4 and "outcome" not in per_level["best_so_far"]
        assert (tmp_path / level / "best_so_far.png").exists()
    # The levels differ (different tasks, so a different fake accuracy): the table is not one level twice.
    assert table["base_policy_test"]["L0"] != table["base_policy_test"]["L2"]
    assert "| base policy (before RL) |" in markdown and "| derl |" in out


def test_a_bad_level_is_refused_before_anything_is_built(launcher, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        invoke(launcher, f"--workdir={tmp_path / 'w'}", "--config.compare.levels=('L0', 'L7')")
    assert info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("launch/run.py: error: config.compare.levels: level 'L7': config.domain.level")
    assert launcher.built == [] and not os.path.exists(tmp_path / "w")


def test_levels_share_cached_base_policies_without_overwriting(tmp_path):
    for level, names in (("L0", ("base_policy_a.npz", "base_policy_a.json")), ("L1", ("base_policy_b.npz",))):
        (tmp_path / level / "base_policy").mkdir(parents=True)
        for name in names:
            (tmp_path / level / "base_policy" / name).write_text(f"{level}/{name}")
    (tmp_path / "L2" / "base_policy").mkdir(parents=True)
    (tmp_path / "L2" / "base_policy" / "base_policy_b.npz").write_text("own")
    levels.share_base_policies([str(tmp_path / "L0"), str(tmp_path / "L1"), str(tmp_path / "missing")], str(tmp_path / "L2"))
    cache = tmp_path / "L2" / "base_policy"
    assert sorted(os.listdir(cache)) == ["base_policy_a.json", "base_policy_a.npz", "base_policy_b.npz"]
    assert (cache / "base_policy_a.npz").read_text() == "L0/base_policy_a.npz"
    assert (cache / "base_policy_b.npz").read_text() == "own"
