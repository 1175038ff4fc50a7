"""derl_jax.workdir: the run directory is write-probed and held by one run at a time."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

from derl_jax import workdir as run_dir
from derl_jax.config import InputError
from derl_jax.workdir import LOCK_FILE, WorkdirLocked, check_writable, exclusive

HOLDER = textwrap.dedent("""
    import sys, time
    from derl_jax.workdir import exclusive
    with exclusive(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(3600)  # until killed
""")


def unwritable_dir(tmp_path) -> str:
    """An existing directory this process cannot create files in (root ignores mode bits)."""
    if os.geteuid() == 0:
        return "/proc/self"
    path = tmp_path / "read_only"
    path.mkdir()
    path.chmod(0o555)
    return str(path)


@pytest.fixture
def holder(tmp_path):
    """A second process holding the lock of tmp_path/run (killed at the end)."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(workdir)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "locked"
    yield workdir, process
    process.kill()
    process.wait()


def test_check_writable_creates_probes_and_names_the_flag(tmp_path):
    nested = tmp_path / "a" / "b"
    assert check_writable(nested) == str(nested)
    assert nested.is_dir() and os.listdir(nested) == []  # the probe leaves nothing behind
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(InputError, match=rf"^--workdir={a_file} is a file, not a directory$"):
        check_writable(a_file)
    with pytest.raises(InputError, match=rf"^--workdir={a_file}/sub cannot be created: "):
        check_writable(a_file / "sub")
    blocked = unwritable_dir(tmp_path)
    with pytest.raises(InputError, match=rf"^--out={blocked} is not writable: "):
        check_writable(blocked, flag="--out")


def test_the_lock_is_held_for_the_block_and_removed_after(tmp_path):
    lock = tmp_path / LOCK_FILE
    with exclusive(tmp_path):
        holder = json.loads(lock.read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
        with pytest.raises(WorkdirLocked, match=rf"is in use by pid {os.getpid()} on host "):
            with exclusive(tmp_path):  # a second holder, even in this process, is refused
                pass
    assert not lock.exists()
    with pytest.raises(RuntimeError, match="inside"):
        with exclusive(tmp_path):
            raise RuntimeError("inside")
    assert not lock.exists()  # released on errors too


def test_a_second_run_fails_at_once_naming_the_first(holder):
    workdir, process = holder
    with pytest.raises(WorkdirLocked) as info:
        with exclusive(workdir):
            pytest.fail("the lock of a live run was taken")
    message = str(info.value)
    assert f"{workdir} is in use by pid {process.pid} on host {socket.gethostname()}" in message
    assert isinstance(info.value, InputError)
    assert json.loads((workdir / LOCK_FILE).read_text())["pid"] == process.pid  # the holder's record is kept


def test_a_stale_lock_is_taken_over_with_a_warning(holder, caplog):
    workdir, process = holder
    process.send_signal(signal.SIGKILL)  # dies without cleaning up: its lock file stays
    process.wait()
    assert json.loads((workdir / LOCK_FILE).read_text())["pid"] == process.pid
    with caplog.at_level(logging.WARNING, logger=run_dir.__name__):
        with exclusive(workdir):
            assert json.loads((workdir / LOCK_FILE).read_text())["pid"] == os.getpid()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"stale lock of pid {process.pid} on host {socket.gethostname()}" in warnings[0]
    assert "no longer running" in warnings[0]


def test_a_lock_left_by_another_host_is_not_taken_over(tmp_path):
    record = {"pid": 4242, "host": "elsewhere.example", "started": "2026-01-01 00:00:00"}
    (tmp_path / LOCK_FILE).write_text(json.dumps(record))
    with pytest.raises(WorkdirLocked, match=rf"was locked by pid 4242 on host elsewhere.example, started 2026-01-01 "
                                            rf"00:00:00; if that run has ended, delete {tmp_path}/{LOCK_FILE}"):
        with exclusive(tmp_path):
            pass
    assert json.loads((tmp_path / LOCK_FILE).read_text()) == record
