"""benchmarks/bench_inner.py: the ratio against TRL uses ours timed on both sides of TRL, and
TRL's paired steps each with ours timed just before it."""

import argparse

import numpy as np
import pytest

from benchmarks.bench_inner import time_again_after, trial_summary


def test_the_ratio_uses_the_mean_of_ours_before_and_after_trl():
    rows = [{"K": 1, "mode": "loop", "step_ms_per_candidate": 60.0},
            {"K": 1, "mode": "loop_data", "step_ms_per_candidate": 50.0},
            {"K": 1, "mode": "trl_grpo_trainer", "step_ms_per_candidate": 300.0}]
    seconds_after = {"loop": 0.64, "loop_data": 0.56}   # 8 steps: 80 ms and 70 ms a step
    time_again_after([(row, lambda m=row["mode"]: seconds_after[m]) for row in rows[:2]], steps=8)
    assert rows[0]["step_ms_after_trl"] == 80.0 and rows[0]["step_ms_bracketed"] == 70.0
    assert rows[1]["step_ms_after_trl"] == 70.0 and rows[1]["step_ms_bracketed"] == 60.0
    summary = trial_summary(argparse.Namespace(candidates=(1,)), rows)
    assert summary["ours_step_ms_k1"] == 60.0
    assert summary["speedup_vs_trl_per_step"] == 5.0
    assert summary["speedup_vs_trl_per_candidate_step_best_mode"] == 5.0
    del rows[0]["step_ms_bracketed"], rows[1]["step_ms_bracketed"]   # TRL skipped: the one timing
    assert trial_summary(argparse.Namespace(candidates=(1,)), rows)["ours_step_ms_k1"] == 50.0


def test_step_clock_times_warm_up_then_steps_then_pairs_each_trl_step_with_ours_before_it():
    from benchmarks.bench_inner import StepClock

    now = [0.0]
    # warm-up, 2 timed steps, then 4 pairs of an untimed step after ours and a timed one
    trl_steps = [5.0, 0.10, 0.12, 0.9, 0.11, 0.8, 0.30, 0.7, 0.14, 0.6, 0.15]
    ours = iter([0.020, 0.025, 0.030, 0.022])

    def run_ours():
        took = next(ours)
        now[0] += 8 * took   # 8 steps of ours
        return 1e3 * took

    clock = StepClock(timed_steps=2, pairs=4, ours_before_step=run_ours, clock=lambda: now[0])
    assert clock.steps_needed() == len(trl_steps)
    for step in trl_steps:
        now[0] += step
        clock.step_ended()
    np.testing.assert_allclose(clock.timed_steps_s(), [0.10, 0.12])
    np.testing.assert_allclose(clock.paired_ours_ms, [20.0, 25.0, 30.0, 22.0])
    # each paired TRL step excludes ours and the untimed step between them
    np.testing.assert_allclose(clock.paired_trl_ms, [110.0, 300.0, 140.0, 150.0])
    no_pairs = StepClock(timed_steps=2)
    for step in trl_steps[:3]:
        now[0] += step
        no_pairs.step_ended()
    assert no_pairs.paired_trl_ms == [] and len(no_pairs.timed_steps_s()) == 2


def test_paired_speedup_is_the_median_of_per_pair_ratios_with_a_bootstrap_interval():
    from benchmarks.bench_inner import paired_speedup

    # both sides slow down together over the run: per pair the ratio stays near 5
    trl = np.array([[100.0, 200.0, 150.0, 180.0], [120.0, 240.0, 130.0, 160.0]])
    ours = np.array([[20.0, 41.0, 30.0, 36.0], [25.0, 47.0, 26.0, 33.0]])
    result = paired_speedup(trl, ours)
    ratios = trl / ours
    assert result["paired_speedup_median"] == round(float(np.median(ratios)), 2)
    assert result["paired_speedup_trials"] == [round(float(np.median(r)), 2) for r in ratios]
    assert result["paired_count"] == 8
    assert result["paired_speedup_median"] == 5.0 != round(float(np.median(trl) / np.median(ours)), 2)
    low, high = result["paired_speedup_ci95"]
    assert ratios.min() <= low <= result["paired_speedup_median"] <= high <= ratios.max()
    by_trl = ratios.ravel()[np.argsort(trl.ravel())]   # TRL steps 100, 120, 130, 150 | 160, 180, 200, 240
    assert result["paired_speedup_by_trl_quartile"] == [round(float(np.median(by_trl[i:i + 2])), 2)
                                                        for i in (0, 2, 4, 6)]
    assert paired_speedup(trl, ours) == result   # a fixed bootstrap seed
    constant = paired_speedup(np.full((3, 5), 150.0), np.full((3, 5), 30.0))
    assert constant["paired_speedup_median"] == 5.0 and constant["paired_speedup_ci95"] == [5.0, 5.0]
    with pytest.raises(ValueError, match="paired_speedup: trl_ms and ours_ms must be the same"):
        paired_speedup(trl, ours[:, :3])


def test_pairs_are_refused_without_trl_and_when_negative(capsys):
    from benchmarks.bench_inner import main

    for argv, message in ((["--k1", "--pairs", "-1"], "--pairs must be 0 or a positive integer, got -1"),
                          (["--k1", "--no-trl", "--pairs", "4"], "cannot be used with --no-trl")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
