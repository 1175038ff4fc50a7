"""benchmarks/device_check.sh at tiny shapes on CPU: the JSON it writes has every section,
and its figures agree with each other and with the planner."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import device_check
from derl_jax.plan import analytic
from derl_jax.plan.analytic import RunShape

pytestmark = pytest.mark.slow  # the whole module rides on one long script run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEAK = 1e12


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("device_check") / "check.json"
    # one host device, and XLA:CPU's cheapest code generation: this checks the script, not speed
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHON=sys.executable,
               XLA_FLAGS="--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")
    done = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "device_check.sh"), str(out), "--tiny",
                           f"--peak-flops={PEAK}"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def check_sections_and_device(result):
    assert {"tiny", "device", "machine", "memory", "mfu", "candidates", "wall_s", "complete"} <= set(result)
    assert result["tiny"] is True and result["complete"] is True
    assert result["device"] == {"platform": "cpu", "kind": result["device"]["kind"], "peak_flops": PEAK}


def check_mfu_rows_use_the_planner_flops(result):
    settings = device_check.settings(tiny=True)
    assert [row["shape"] for row in result["mfu"]] == list(settings["mfu_models"])
    for row, model in zip(result["mfu"], settings["mfu_models"].values()):
        shape = RunShape(model, **settings["mfu"])
        assert row["sample_flops"] == analytic.sampling_flops(shape)
        assert row["grpo_step_flops"] == analytic.update_step_flops(shape)
        assert row["params"] == analytic.param_count(model)
        for piece, seconds in (("sample", row["sample_s"]), ("grpo", row["grpo_step_s"])):
            assert 0 < seconds < 60
            flops = row["sample_flops"] if piece == "sample" else row["grpo_step_flops"]
            assert row[f"{piece}_mfu"] == pytest.approx(flops / seconds / PEAK)
            assert 0 < row[f"{piece}_mfu"] < 1
        assert row["sample_tokens_per_s"] == pytest.approx(row["rows"] * row["new_tokens"] / row["sample_s"])


def check_candidate_rows(result):
    rows = result["candidates"]
    assert [row["K"] for row in rows] == list(device_check.settings(tiny=True)["candidates"])
    for row in rows:
        assert row["batched_ms_per_candidate_step"] > 0 and row["loop_ms_per_candidate_step"] > 0
        assert row["batched_speedup"] == pytest.approx(row["loop_ms_per_candidate_step"]
                                                       / row["batched_ms_per_candidate_step"])


def check_memory_prediction_matches_what_was_allocated(result):
    memory = result["memory"]
    assert memory["loss_finite"]
    assert set(memory["predicted"]) == {"sample", "update"}
    for piece in memory["predicted"].values():
        assert piece["peak_bytes"] == (piece["argument_bytes"] + piece["output_bytes"] + piece["temp_bytes"]
                                       - piece["alias_bytes"])
    assert memory["predicted_peak_bytes"] == max(p["peak_bytes"] for p in memory["predicted"].values())
    # the update holds the parameters, two Adam moments and the gradients at least
    model = device_check.settings(tiny=True)["memory_model"]
    assert memory["predicted"]["update"]["peak_bytes"] >= 4 * analytic.param_bytes(model)
    assert memory["measured_source"] == "live_arrays"  # CPU keeps no allocator statistics
    assert memory["measured_over_predicted"] == pytest.approx(1.0, abs=0.01)


def test_the_tiny_check_writes_every_section_and_its_figures_agree(result):
    """One test on the one script run: split over pytest-xdist's workers, each worker would run
    the script again."""
    check_sections_and_device(result)
    check_mfu_rows_use_the_planner_flops(result)
    check_candidate_rows(result)
    check_memory_prediction_matches_what_was_allocated(result)
