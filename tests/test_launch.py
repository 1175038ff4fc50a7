"""launch/run.py and `derl_jax.experiment.run`: flag parsing, config overrides and validation, the modes.

The CLI is driven in-process with absl's flag parser; the domain is the real arith domain
(from the registry), the inner loop and the Meta-Optimizer are the fakes of test_search
(`derl_jax.experiment.build.build_inner` replaced, and `run`'s `optimizer_factory`). One test
runs the real script in a subprocess; tests/test_cli_errors.py runs every user error through it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from absl import flags

from derl_jax.config import ConfigError
from derl_jax.experiment import build, compare, runtime
from derl_jax.experiment import run as experiment_run
from derl_jax.parallel import HOST_DEVICE_FLAG, host_cores
from derl_jax.rl.config import inner_config
from derl_jax.rl.placement import auto_data_size
from test_search import BASE_PARAMS, REPO_ROOT, FakeEvaluator, FakeMetaOptimizer, get_config, reference_quality
from test_protocol import expected_accuracy

SCRIPT = os.path.join(REPO_ROOT, "launch", "run.py")
SMOKE = os.path.join(REPO_ROOT, "configs", "arith.py") + ":smoke"


def load_launcher():
    """launch/run.py as a module (once per process: it defines absl flags)."""
    if "derl_launch_run" not in sys.modules:
        spec = importlib.util.spec_from_file_location("derl_launch_run", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["derl_launch_run"] = module
        spec.loader.exec_module(module)
    return sys.modules["derl_launch_run"]


def use_fakes(monkeypatch, evaluator, domain_name: str = "arith") -> None:
    """The fake inner loop and Meta-Optimizer of test_search in every run of this process."""
    def fake_inner(domain, cfg, workdir, host_cores=None):
        assert domain.name == domain_name and os.path.isfile(os.path.join(workdir, "run.lock"))  # built under the lock
        return BASE_PARAMS, evaluator

    real_run = experiment_run.run
    monkeypatch.setattr(build, "build_inner", fake_inner)
    monkeypatch.setattr(experiment_run, "run",
                        lambda *args, **kwargs: real_run(*args, **kwargs, optimizer_factory=FakeMetaOptimizer))
    monkeypatch.setattr(compare, "compare_workers", lambda cfg: 1)  # the fakes live in this process only


@pytest.fixture
def launcher(monkeypatch):
    module = load_launcher()
    module.fake_evaluator = FakeEvaluator()
    use_fakes(monkeypatch, module.fake_evaluator)
    yield module
    flags.FLAGS.unparse_flags()


def invoke(module, *args: str, config: str = SMOKE) -> None:
    """Parse `args` like the command line would (with --config=`config`), then run `main`."""
    argv = ["run.py", f"--config={config}", "--noprogress", *(["--config.meta.max_symbols=24"] if config == SMOKE else []),
            *args]
    saved_argv = sys.argv
    sys.argv = argv  # config_flags reads the overrides from sys.argv, as under app.run
    try:
        for name in [n for n in flags.FLAGS if n.startswith("config.")]:
            delattr(flags.FLAGS, name)  # override flags are defined anew by each parse of --config
        flags.FLAGS.unparse_flags()
        flags.FLAGS(argv)
        module.main(["run.py"])
    finally:
        sys.argv = saved_argv


@pytest.mark.slow
def test_cli_rejects_a_bad_config_value_naming_the_field(tmp_path):
    completed = subprocess.run(
        [sys.executable, SCRIPT, f"--config={SMOKE}", "--config.outer.num_candidates=1", f"--workdir={tmp_path}"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=120,
    )
    assert completed.returncode == 2
    assert completed.stderr.strip() == "launch/run.py: error: config.outer.num_candidates must be >= 2, got 1"
    assert not os.listdir(tmp_path)  # nothing was built or written


def test_search_mode_applies_overrides(launcher, tmp_path, capsys):
    invoke(launcher, "--mode=search", f"--workdir={tmp_path}", "--config.outer.iterations=3",
           "--config.outer.strategy=evolution", "--config.outer.num_candidates=3")
    history = [json.loads(line) for line in open(tmp_path / "history.jsonl")]
    assert [(r["iteration"], r["index"]) for r in history] == [(i, j) for i in range(3) for j in range(3)]
    assert {r["method"] for r in history} == {"evolution"}
    saved = json.load(open(tmp_path / "config.json"))
    assert saved["outer"]["iterations"] == 3 and saved["outer"]["num_candidates"] == 3
    out = capsys.readouterr().out
    assert "iter    2 |" in out and "search finished" in out


def test_final_mode_uses_the_search_result_or_the_given_expression(launcher, tmp_path):
    invoke(launcher, "--mode=search", f"--workdir={tmp_path}")
    best = json.load(open(tmp_path / "search_result.json"))["incumbent"]["text"]
    invoke(launcher, "--mode=final", f"--workdir={tmp_path}")
    final = json.load(open(tmp_path / "final_result.json"))
    rows = launcher.fake_evaluator.rows
    assert final["expression"] == best
    assert final["test"] == pytest.approx(expected_accuracy(2.0 * reference_quality(best, rows)), abs=1e-5)
    assert launcher.fake_evaluator.final_calls[-1]["train"] == 40  # the full training split

    invoke(launcher, "--mode=final", f"--workdir={tmp_path}", "--expression=g1+g2")
    final = json.load(open(tmp_path / "final_result.json"))
    assert final["expression"] == "g1+g2" and final["canonical"] == "g1 + g2"
    assert not os.path.exists(tmp_path / "run.lock")  # released when the run ends


def test_user_errors_exit_with_status_2_and_one_line(launcher, tmp_path, capsys):
    cases = [
        (("--mode=final", f"--workdir={tmp_path}", "--expression=g1+"),
         "launch/run.py: error: --expression='g1+': parse error at 3: expression ends where an operand is expected"),
        (("--mode=final", f"--workdir={tmp_path / 'empty'}"),
         f"launch/run.py: error: --mode=final needs --expression or a finished search in --workdir={tmp_path / 'empty'} "
         "(no search_result.json there)"),
        (("--mode=compare", f"--workdir={tmp_path}", "--expression=g1"),
         "launch/run.py: error: --expression applies to --mode=final only; --mode=compare finds its own expressions"),
    ]
    for args, message in cases:
        with pytest.raises(SystemExit) as info:
            invoke(launcher, *args)
        assert info.value.code == 2
        assert capsys.readouterr().err.strip() == message
    assert launcher.fake_evaluator.final_calls == []  # nothing was trained


def test_compare_mode_writes_the_report(launcher, tmp_path, capsys):
    invoke(launcher, "--mode=compare", f"--workdir={tmp_path}", "--config.compare.seeds=(0, 1)")
    saved = json.load(open(tmp_path / "results.json"))
    assert saved["methods"] == ["derl", "outcome"]
    assert [r["seed"] for r in saved["per_seed"]["derl"]] == [0, 1]
    assert os.path.exists(tmp_path / "derl" / "seed_1" / "history.jsonl")
    assert "| outcome |" in capsys.readouterr().out


def test_defaults_and_domain_kind(tmp_path):
    cfg = get_config("smoke")
    assert experiment_run.default_workdir(cfg) == os.path.join("runs", "arith_smoke")
    domain = build.build_domain(cfg)
    assert domain.primitive_names == ("correct", "boxed", "steps", "gold_anywhere") and domain.train.size == 40
    cfg.domain.kind = "chess"
    with pytest.raises(ConfigError, match=r"^config.domain.kind must be one of \(.*'arith'.*'math'.*\), got 'chess'$"):
        build.build_domain(cfg)
    with pytest.raises(ConfigError, match="got 'chess'"):
        experiment_run.check_inputs(cfg, str(tmp_path / "w"), "search")
    assert not os.path.exists(tmp_path / "w")  # the config is checked before the run directory is made


def test_compile_cache_directory_resolution():
    resolve = runtime.compile_cache_dir
    env = {"JAX_COMPILATION_CACHE_DIR": "/cache/env"}
    assert resolve(None, "runs/x", {}, 1) == os.path.join("runs/x", "compile_cache")
    assert resolve(None, "runs/x", env, 1) == "/cache/env"
    assert resolve(None, "runs/x", {}, 2) is None           # multi-process: only process 0 writes runs/x
    assert resolve(None, "runs/x", env, 2) == "/cache/env"
    assert resolve("/cache/flag", "runs/x", env, 2) == "/cache/flag"
    assert resolve("", "runs/x", env, 1) is None            # --compile_cache= turns it off
    assert resolve("  ", "runs/x", {}, 1) is None


@pytest.mark.slow
def test_a_run_fills_its_compile_cache_and_a_run_reading_it_gives_the_same_result(tmp_path):
    """Also: with no host device count in XLA_FLAGS the launcher makes one host device per core
    and the automatic 'data' axis splits the steps over them (tests/test_host_cores.py)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_PERSISTENT_CACHE")}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split() if not f.startswith(HOST_DEVICE_FLAG))
    args = [sys.executable, SCRIPT, f"--config={SMOKE}", "--mode=final", "--expression=g1", "--noprogress"]
    cold, warm = tmp_path / "cold", tmp_path / "warm"
    subprocess.run([*args, f"--workdir={cold}"], check=True, capture_output=True, cwd=REPO_ROOT, env=env, timeout=300)
    cache = cold / "compile_cache"
    entries = set(os.listdir(cache))
    assert len(entries) >= 5   # the inner loop, the evaluation and the small programs around them
    subprocess.run([*args, f"--workdir={warm}", f"--compile_cache={cache}"], check=True, capture_output=True,
                   cwd=REPO_ROOT, env=env, timeout=300)
    assert not (warm / "compile_cache").exists()
    assert set(os.listdir(cache)) == entries        # every program was found: nothing compiled anew
    assert json.load(open(warm / "final_result.json")) == json.load(open(cold / "final_result.json"))
    cores = host_cores()
    expected = auto_data_size(get_config("smoke"), inner_config(get_config("smoke"), 16), 0, cores=cores,
                              backend="cpu", process_count=1, num_devices=cores)
    assert json.load(open(cold / "domain.json"))["mesh"] == {"cand": 1, "data": expected, "model": 1}
