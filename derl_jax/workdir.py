"""The run directory: checked before any work starts, and held by one run at a time.

    check_writable(workdir)            # creates it; InputError when it is a file or cannot be written
    with exclusive(workdir):           # WorkdirLocked at once when another run holds it
        ...                            # the whole run

The lock is `<workdir>/run.lock`, an advisory `flock` on a file that records the holder's
pid and host. The kernel drops the flock when its process ends, however it ends, so a lock
file whose flock is free is stale: on this host it is taken over with a warning naming the
run that left it. A lock file written by another host is never taken over (a shared file
system may not carry flocks between hosts); the message says which run to check and which
file to delete.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import tempfile
import time
from typing import Iterator

from derl_jax.config import InputError

LOCK_FILE = "run.lock"
_log = logging.getLogger(__name__)


class WorkdirLocked(InputError):
    """Another run holds the run directory."""


def check_writable(workdir: str | os.PathLike, flag: str = "--workdir") -> str:
    """Create `workdir` (and parents) and prove it takes a file; returns the path.

    InputError naming `flag` when the path is a file, cannot be created or cannot be written.
    """
    path = os.fspath(workdir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise InputError(f"{flag}={path} is a file, not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as err:
        raise InputError(f"{flag}={path} cannot be created: {err.strerror or err}") from None
    try:
        handle, probe = tempfile.mkstemp(prefix=".write_probe_", dir=path)
        try:
            os.write(handle, b"probe")
            os.fsync(handle)
        finally:
            os.close(handle)
            os.remove(probe)
    except OSError as err:
        raise InputError(f"{flag}={path} is not writable: {err.strerror or err}") from None
    return path


def _holder() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}


def _read_holder(handle) -> dict | None:
    handle.seek(0)
    try:
        data = json.loads(handle.read() or "null")
    except ValueError:
        return None
    return data if isinstance(data, dict) and "pid" in data and "host" in data else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True


def _describe(holder: dict) -> str:
    started = f", started {holder['started']}" if holder.get("started") else ""
    return f"pid {holder['pid']} on host {holder['host']}{started}"


def _open_locked(lock_path: str):
    """The open lock file with its flock held; WorkdirLocked when another process holds it."""
    while True:
        handle = open(lock_path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = _read_holder(handle)
            handle.close()
            if err.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                raise
            who = _describe(holder) if holder else "another run"
            raise WorkdirLocked(f"{os.path.dirname(lock_path)} is in use by {who} (lock file {lock_path})") from None
        try:
            same_file = os.path.samestat(os.fstat(handle.fileno()), os.stat(lock_path))
        except FileNotFoundError:
            same_file = False
        if same_file:
            return handle
        handle.close()  # the holder removed the file between our open and flock: try the new one


@contextlib.contextmanager
def exclusive(workdir: str | os.PathLike) -> Iterator[None]:
    """Hold `<workdir>/run.lock` for the block; the directory must exist.

    WorkdirLocked (an InputError) at once when another run holds it, naming that run's pid and
    host. A stale lock (its run has ended) left on this host is taken over with a warning.
    """
    lock_path = os.path.join(os.fspath(workdir), LOCK_FILE)
    handle = _open_locked(lock_path)
    try:
        previous = _read_holder(handle)
        me = _holder()
        if previous is not None and previous["host"] != me["host"]:
            raise WorkdirLocked(
                f"{os.fspath(workdir)} was locked by {_describe(previous)}; if that run has ended, "
                f"delete {lock_path}"
            )
        if previous is not None:
            state = "no longer running" if not _pid_alive(int(previous["pid"])) else "no longer holding it"
            _log.warning("taking over the stale lock of %s (%s): %s", _describe(previous), state, lock_path)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(me))
        handle.flush()
    except BaseException:
        handle.close()
        raise
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.remove(lock_path)
        handle.close()
