"""The arith smoke search as two JAX processes on this machine (the multi-host path, for real).

`launch/multiprocess.sh 2 ...` starts two processes that form one JAX job over the CPU
backend's cross-process collectives; the mesh's 'cand' axis has one device in each. Checked
against a one-process run with two (fake) CPU devices and the same config:

* the search history, metrics and result are the same (wall-clock fields aside), and the
  Meta-Optimizer's steps run on the mesh that spans both processes, as in the one-process run;
* process 1 writes nothing in the run directory: an audit hook in it records every file
  opened for writing, created, renamed or removed there, and no file of its making
  (orbax's per-process `process_1` parts) appears;
* killing process 1, and later process 0, mid-run stops the whole job with a non-zero
  status, and rerunning the command resumes and ends with the same history: process 1 is
  killed once the warm start is on disk (before the first checkpoint: the rerun starts the
  search again on that warm start), process 0, the one that writes, once the first
  iteration's checkpoint is on disk (the last rerun resumes from it).

The three two-process launches are one chain (kill, kill, finish) to keep start-ups few; two
outer iterations are enough for a resumed iteration and a Meta-Optimizer step after it.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow  # the whole module: each test rides on a long module fixture

from derl_jax.logging import read_jsonl
from derl_jax.outer.search import SEARCH_RESULT_FILE, strip_wall_clock

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(REPO, "launch", "multiprocess.sh")
RUN_ARGS = [
    "launch/run.py", "--config=configs/arith.py:smoke", "--mode=search", "--config.mesh.cand=2",
    "--config.outer.iterations=2",
]
TIMEOUT_S = 600

# Runs the given script with an audit hook that records, on processes other than 0, every
# change it makes under $AUDIT_WORKDIR into $AUDIT_LOG (one JSON line per event).
AUDIT_WRAPPER = r'''
import json, os, runpy, sys

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
CHANGES = ("os.rename", "os.remove", "os.rmdir", "shutil.rmtree", "os.truncate", "os.link", "os.symlink",
           "os.chmod", "os.utime")
workdir = os.path.realpath(os.environ["AUDIT_WORKDIR"])
log_fd = os.open(os.environ["AUDIT_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def inside(path):
    if not isinstance(path, (str, bytes, os.PathLike)):
        return False
    path = os.path.realpath(os.fsdecode(path))
    return path == workdir or path.startswith(workdir + os.sep)


def note(event, path):
    line = json.dumps({"process": os.environ.get("JAX_PROCESS_ID"), "event": event, "path": os.fsdecode(path)})
    os.write(log_fd, (line + "\n").encode())


def hook(event, args):
    if event == "open" and len(args) >= 3 and isinstance(args[2], int) and args[2] & WRITE_FLAGS and inside(args[0]):
        note(event, args[0])
    elif event == "os.mkdir" and inside(args[0]) and not os.path.exists(args[0]):
        note(event, args[0])
    elif event in CHANGES and args and inside(args[0]):
        note(event, args[0])


if os.environ.get("JAX_PROCESS_ID", "0") != "0":
    sys.addaudithook(hook)
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
'''


# The launches of this module compile the same programs: a persistent compilation cache shared
# by their processes saves most of the compile time of every launch after the first.
COMPILE_CACHE = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def _compile_flags() -> str:
    """The session's XLA flags (its compile settings, tests/conftest.py) without the device count:
    each launch has its own."""
    return " ".join(flag for flag in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in flag)


def _env(**extra) -> dict:
    env = dict(os.environ)
    for name in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "DERL_DISTRIBUTED"):
        env.pop(name, None)
    env.update({"JAX_PLATFORMS": "cpu", "XLA_FLAGS": _compile_flags(), **COMPILE_CACHE, **extra})
    return env


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(entry))
    return found


def _process_pid(launcher_pid: int, process_id: int) -> int | None:
    """The pid of JAX process `process_id` among the launcher's children."""
    for child in _children(launcher_pid):
        try:
            with open(f"/proc/{child}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue
        if f"JAX_PROCESS_ID={process_id}".encode() in environ:
            return child
    return None


WARM_START_WRITTEN = os.path.join("base_policy", "base_policy_*.json")   # after its arrays
FIRST_CHECKPOINT = os.path.join("checkpoints", "1")


def _two_processes(wrapper: str, workdir: str, audit_log: str, kill: tuple[int, str] | None = None):
    """Run the search as 2 processes; `kill=(process_id, pattern)` SIGKILLs that process once a
    path matching the glob `pattern` (inside the run directory) is on disk. Returns (launcher
    status, output)."""
    command = [LAUNCHER, "2", sys.executable, wrapper, *RUN_ARGS, f"--workdir={workdir}"]
    launcher = subprocess.Popen(command, cwd=REPO, env=_env(AUDIT_WORKDIR=workdir, AUDIT_LOG=audit_log),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = None
    if kill is not None:
        process_id, pattern = kill
        deadline = time.time() + TIMEOUT_S
        while killed is None and launcher.poll() is None and time.time() < deadline:
            if glob.glob(os.path.join(workdir, pattern)):
                killed = _process_pid(launcher.pid, process_id)
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.1)
    try:
        output, _ = launcher.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        launcher.kill()
        output, _ = launcher.communicate()
    if kill is not None:
        assert killed is not None, f"{kill[1]} never appeared:\n{output[-3000:]}"
    return launcher.returncode, output


def _search_files(workdir: str) -> dict:
    with open(os.path.join(workdir, SEARCH_RESULT_FILE), encoding="utf-8") as handle:
        result = json.load(handle)
    metrics = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
    return {
        "history": strip_wall_clock(read_jsonl(os.path.join(workdir, "history.jsonl"))),
        "metrics": [{k: v for k, v in r.items() if k not in ("time", "iteration_seconds")} for r in metrics],
        "incumbent": result["incumbent"],
        "budget": result["budget"],
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("multiprocess")
    COMPILE_CACHE["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path_factory.mktemp("compile_cache"))
    wrapper = str(root / "audited.py")
    with open(wrapper, "w", encoding="utf-8") as handle:
        handle.write(AUDIT_WRAPPER)
    single_dir, multi_dir, audit_log = str(root / "single"), str(root / "multi"), str(root / "audit.jsonl")
    # the one-process run first: the launches after it start from the programs it compiled
    single = subprocess.run(
        [sys.executable, *RUN_ARGS, f"--workdir={single_dir}"], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S,
        env=_env(XLA_FLAGS=f"--xla_force_host_platform_device_count=2 {_compile_flags()}"))
    assert single.returncode == 0, single.stdout[-3000:]
    chain = [_two_processes(wrapper, multi_dir, audit_log, kill=(1, WARM_START_WRITTEN))]
    assert not os.path.exists(os.path.join(multi_dir, FIRST_CHECKPOINT)), "the first launch passed its first checkpoint"
    chain.append(_two_processes(wrapper, multi_dir, audit_log, kill=(0, FIRST_CHECKPOINT)))
    chain.append(_two_processes(wrapper, multi_dir, audit_log))
    return {"single_dir": single_dir, "multi_dir": multi_dir, "audit_log": audit_log, "chain": chain}


def test_a_killed_process_stops_the_job(runs):
    for status, output in runs["chain"][:2]:
        assert status != 0, output[-3000:]
        assert "stopping the others" in output, output[-3000:]


def test_two_processes_resume_to_the_single_process_history(runs):
    status, output = runs["chain"][2]
    assert status == 0, output[-3000:]
    single, multi = _search_files(runs["single_dir"]), _search_files(runs["multi_dir"])
    assert len(multi["history"]) == 2 * 2  # iterations x candidates
    # scores, expressions, curves and budget exactly; the Meta-Optimizer's update metrics to float
    # rounding (each process compiles its own copy of that step, and unoptimised compilations of
    # the same update have been seen to differ in an entropy's 7th digit)
    multi_metrics, single_metrics = multi.pop("metrics"), single.pop("metrics")
    assert multi == single
    # the Meta-Optimizer's parameters live on the whole mesh: one device in each process
    assert [r["strategy/devices"] for r in multi_metrics] == [2.0] * 2
    assert [sorted(r) for r in multi_metrics] == [sorted(r) for r in single_metrics]
    for got, want in zip(multi_metrics, single_metrics):
        numbers = [k for k, v in want.items() if isinstance(v, float)]
        assert {k: v for k, v in got.items() if k not in numbers} == {k: v for k, v in want.items() if k not in numbers}
        assert [got[k] for k in numbers] == pytest.approx([want[k] for k in numbers], rel=1e-6, abs=1e-7)


def test_only_process_zero_writes_the_run_directory(runs):
    events = read_jsonl(runs["audit_log"]) if os.path.exists(runs["audit_log"]) else []
    assert events == []
    made_by_others = [os.path.join(d, name) for d, dirs, files in os.walk(runs["multi_dir"])
                      for name in dirs + files if "process_1" in name]
    assert made_by_others == []
    with open(os.path.join(runs["multi_dir"], "domain.json"), encoding="utf-8") as handle:
        assert json.load(handle)["mesh"] == {"cand": 2, "data": 1, "model": 1}


def test_the_audit_hook_sees_changes(tmp_path):
    """The hook the check above relies on records what a non-zero process changes in the run
    directory (a write, a new directory, a rename, a removal) and nothing outside it or on process 0."""
    wrapper, script = tmp_path / "audited.py", tmp_path / "writes.py"
    wrapper.write_text(AUDIT_WRAPPER, encoding="utf-8")
    script.write_text(
        "import os, sys\n"
        "run = sys.argv[1]\n"
        "open(os.path.join(run, 'a.txt'), 'w').close()\n"
        "os.makedirs(os.path.join(run, 'sub'), exist_ok=True)\n"
        "os.makedirs(os.path.join(run, 'sub'), exist_ok=True)\n"
        "os.replace(os.path.join(run, 'a.txt'), os.path.join(run, 'b.txt'))\n"
        "open(os.path.join(run, 'b.txt')).read()\n"
        "os.remove(os.path.join(run, 'b.txt'))\n"
        "open(os.path.join(run, '..', 'outside.txt'), 'w').close()\n", encoding="utf-8")
    for process_id in ("0", "1"):
        log, workdir = tmp_path / f"audit_{process_id}.jsonl", tmp_path / f"run_{process_id}"
        workdir.mkdir()
        env = _env(AUDIT_WORKDIR=str(workdir), AUDIT_LOG=str(log), JAX_PROCESS_ID=process_id)
        subprocess.run([sys.executable, str(wrapper), str(script), str(workdir)], check=True, env=env, timeout=60)
        events = [(e["event"], os.path.basename(e["path"])) for e in read_jsonl(str(log))] if log.exists() else []
        expected = [("open", "a.txt"), ("os.mkdir", "sub"), ("os.rename", "a.txt"), ("os.remove", "b.txt")]
        assert events == (expected if process_id == "1" else [])
