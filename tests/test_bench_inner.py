"""benchmarks/bench_inner.py: the ratio against TRL uses ours timed on both sides of TRL."""

import argparse

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
