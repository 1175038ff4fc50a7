"""Every user error of launch/run.py through the real command line: one line on stderr naming
the flag, field or file, exit status 2, no traceback, nothing trained.

All cases stop before a model is built; they run once, as concurrent subprocesses (one
module-scoped fixture read by one test), so the file costs one launch per case and no more.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join("launch", "run.py")
SMOKE = "--config=configs/arith.py:smoke"
TINY_MATH = "--config=configs/math.py:tiny"
PREFIX = "launch/run.py: error: "
HOLDER = textwrap.dedent("""
    import sys, time
    from derl_jax.workdir import exclusive
    with exclusive(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(3600)  # until killed
""")


def launch(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, "--noprogress", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=300, env={**os.environ, **(env or {})})


def start_holder(workdir) -> subprocess.Popen:
    """A process holding the lock of `workdir`, as a running search would."""
    os.makedirs(workdir, exist_ok=True)
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(workdir)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "locked"
    return process


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """name -> (CompletedProcess, expected stderr line or prefix, workdir that must stay empty or None)."""
    root = tmp_path_factory.mktemp("cli")
    a_file = root / "a_file"
    a_file.write_text("not a directory")
    latin1 = root / "latin1.jsonl"
    latin1.write_bytes(b'{"question": "a", "answer": "#### 1"}\n\n{"question": "caf\xe9", "answer": "#### 2"}\n')
    modules = root / "modules"
    modules.mkdir()
    (modules / "exploding_primitives.py").write_text("raise RuntimeError('exploding primitives at import')\n")
    unwritable = "/proc/self" if os.geteuid() == 0 else str(root / "read_only")
    if os.geteuid() != 0:
        os.mkdir(unwritable, 0o555)
    locked, stale = root / "locked", root / "stale"
    holder, dead = start_holder(locked), start_holder(stale)
    dead.send_signal(signal.SIGKILL)  # leaves its lock file behind
    dead.wait()
    host = socket.gethostname()
    w = lambda name: f"--workdir={root / name}"  # noqa: E731
    specs = {
        "config_missing": (("--config=configs/nope.py", w("e1")), "--config=configs/nope.py: no such config file 'configs/nope.py'"),
        "config_flag_missing": ((w("e2"),), "--config is required, e.g. --config=configs/arith.py:smoke"),
        "unknown_preset": (("--config=configs/arith.py:huge", w("e3")),
                           "--config=configs/arith.py:huge: ValueError: configs/arith.py: unknown preset 'huge'; "
                           "expected one of ('default', 'smoke')"),
        "unknown_field": ((SMOKE, "--config.nope=1", w("e4")), "--config.nope: config has no field 'nope'"),
        "bad_value": ((SMOKE, "--config.outer.iterations=-1", w("e7")), "config.outer.iterations must be >= 1, got -1"),
        "unknown_strategy": ((SMOKE, "--config.outer.strategy=grid", w("e8")), "config.outer.strategy must be one of ("),
        "unknown_flag": ((SMOKE, "--iterations=3", w("e10")), "Unknown command line flag 'iterations'"),
        "unknown_mode": ((SMOKE, "--mode=fast", w("e11")), "--mode=fast: value should be one of <search|final|compare|plan|export>"),
        "stray_argument": ((SMOKE, w("e12"), "final"), "unexpected arguments ['final']; flags take the form --name=value"),
        "expression_with_search": ((SMOKE, "--mode=search", "--expression=g1", w("e13")),
                                   "--expression applies to --mode=final only; --mode=search finds its own expressions"),
        "final_without_search": ((SMOKE, "--mode=final", w("e14")),
                                 f"--mode=final needs --expression or a finished search in --workdir={root / 'e14'} "
                                 "(no search_result.json there)"),
        "expression_syntax": ((SMOKE, "--mode=final", "--expression=g1+*2", w("e15")),
                              "--expression='g1+*2': parse error at 3: "),
        "expression_unknown_primitive": ((SMOKE, "--mode=final", "--expression=g1+g7", w("e16")),
                                         "--expression='g1+g7': parse error at 3: unknown primitive 'g7': only g1..g4 exist"),
        "workdir_is_a_file": ((SMOKE, "--mode=final", "--expression=g1", f"--workdir={a_file}"),
                              f"--workdir={a_file} is a file, not a directory"),
        "workdir_unwritable": ((SMOKE, "--mode=final", "--expression=g1", f"--workdir={unwritable}"),
                               f"--workdir={unwritable} is not writable: "),
        "primitive_module_missing": ((SMOKE, "--config.primitives.modules=('no_such_family',)", w("e18")),
                                     "config.primitives.modules: no module named 'no_such_family'"),
        "policy_checkpoint_missing": ((TINY_MATH, "--config.policy.checkpoint=/no/such/Qwen2.5-3B", "--mode=final",
                                       "--expression=g1", w("e22")),
                                      "config.policy.checkpoint='/no/such/Qwen2.5-3B': no such directory"),
        "workdir_in_use": ((SMOKE, "--mode=final", "--expression=g1", f"--workdir={locked}"),
                           f"{locked} is in use by pid {holder.pid} on host {host}, started "),
        "data_not_utf8": ((TINY_MATH, f"--config.data.train=gsm8k:{latin1}", f"--config.data.test=gsm8k:{latin1}",
                           "--mode=final", "--expression=g1", w("e19")), f"config.data.train: {latin1}:3: not UTF-8 text (byte 0xe9)"),
        "data_missing": ((TINY_MATH, f"--config.data.train=gsm8k:{root / 'absent.jsonl'}", "--mode=final",
                          "--expression=g1", f"--workdir={stale}"), "config.data.train: "),
        "debug_shows_the_traceback": ((SMOKE, "--mode=final", "--expression=g1+", w("e20"), "--debug"),
                                      "--expression='g1+': parse error at 3: "),
        "internal_error": ((SMOKE, "--config.primitives.modules=('exploding_primitives',)", w("e21")), None),
    }
    env = {"PYTHONPATH": os.pathsep.join([str(modules), os.environ.get("PYTHONPATH", "")])}
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            futures = {name: pool.submit(launch, *args, env=env) for name, (args, _) in specs.items()}
            results = {name: (future.result(), specs[name][1]) for name, future in futures.items()}
    finally:
        holder.kill()
        holder.wait()
    results["_root"] = root
    results["_stale_pid"] = dead.pid
    return results


USER_ERRORS = [
    "config_missing", "config_flag_missing", "unknown_preset", "unknown_field",
    "bad_value", "unknown_strategy", "unknown_flag", "unknown_mode", "stray_argument",
    "expression_with_search", "final_without_search", "expression_syntax", "expression_unknown_primitive",
    "workdir_is_a_file", "workdir_unwritable", "primitive_module_missing", "policy_checkpoint_missing", "workdir_in_use",
    "data_not_utf8", "data_missing",
]


def user_error_problems(completed: subprocess.CompletedProcess, expected: str) -> list[str]:
    """What is wrong with `completed` as a user error whose one line starts with `expected` (empty: nothing)."""
    lines = completed.stderr.strip().splitlines()
    errors = [line for line in lines if "error" in line.lower()]
    checks = {
        f"status {completed.returncode}, not 2": completed.returncode == 2,
        "a traceback": "Traceback" not in completed.stderr,
        f"the last line is not {PREFIX + expected!r}...": bool(lines) and lines[-1].startswith(PREFIX + expected),
        "more than one error line (usage text or other noise)": bool(lines) and errors == [lines[-1]],
        "output on stdout": completed.stdout == "",
    }
    return [problem for problem, fine in checks.items() if not fine]


# One test reads the module's launches: under pytest-xdist every worker that runs a test of this
# fixture would launch all of them again.
@pytest.mark.slow
def test_every_user_error_and_its_aftermath(cases):
    """Each user error: one line naming the input, status 2, no traceback, nothing on stdout. Then:
    nothing is written where the checks fail, a stale lock is taken over with a warning, --debug adds
    the traceback and keeps status 2, and an internal error keeps its traceback (status 1)."""
    problems = {name: user_error_problems(cases[name][0], cases[name][1]) for name in USER_ERRORS}
    problems = {name: found for name, found in problems.items() if found}
    assert not problems, "\n".join(f"{name}: {', '.join(found)}\n{cases[name][0].stderr}" for name, found in problems.items())

    root = cases["_root"]
    for index in [*range(1, 19), 22]:  # the workdirs of the config, flag, expression and policy errors
        assert not (root / f"e{index}").exists(), index
    assert sorted(os.listdir(root / "e19")) == []  # the data error released the lock and left nothing

    completed, _ = cases["data_missing"]  # ran in the workdir of a killed run, then stopped at its data
    assert f"stale lock of pid {cases['_stale_pid']} on host {socket.gethostname()}" in completed.stderr
    assert not os.path.exists(root / "stale" / "run.lock")

    completed, expected = cases["debug_shows_the_traceback"]
    assert completed.returncode == 2
    assert "Traceback (most recent call last)" in completed.stderr
    assert completed.stderr.strip().splitlines()[-1].startswith(PREFIX + expected)

    completed, _ = cases["internal_error"]
    assert completed.returncode == 1
    assert "Traceback (most recent call last)" in completed.stderr
    assert "RuntimeError: exploding primitives at import" in completed.stderr
    assert PREFIX not in completed.stderr


def test_help_is_absl_help_not_an_error():
    completed = launch("--help")
    assert "Modes:" in completed.stdout and "--workdir" in completed.stdout and "--debug" in completed.stdout
    assert PREFIX not in completed.stderr and "Traceback" not in completed.stderr


@pytest.mark.slow
def test_two_real_runs_on_one_workdir(tmp_path):
    """The second of two launcher runs on one workdir stops at once naming the first; the first goes on."""
    import json
    import time

    workdir = tmp_path / "shared"
    args = [sys.executable, SCRIPT, "--noprogress", SMOKE, "--mode=final", "--expression=g1", f"--workdir={workdir}",
            "--config.final.steps=100000"]  # long enough to still hold the lock when the second run starts
    first = subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lock = workdir / "run.lock"
        deadline = time.monotonic() + 240
        while not (lock.exists() and lock.read_text()) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert json.loads(lock.read_text())["pid"] == first.pid, first.stderr.read() if first.poll() is not None else ""
        second = launch(SMOKE, "--mode=final", "--expression=g1", f"--workdir={workdir}")
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert second.stderr.strip() == (f"{PREFIX}{workdir} is in use by pid {first.pid} on host {socket.gethostname()}, "
                                         f"started {json.loads(lock.read_text())['started']} (lock file {lock})")
        assert first.poll() is None  # the first run is unaffected
    finally:
        first.kill()
        first.wait()
