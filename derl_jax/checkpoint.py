"""Checkpoints and small atomic side files; the only module that talks to orbax.

A checkpoint is one outer-loop step: a pytree of arrays (policy and Meta-Optimizer
parameters, optimizer states, PRNG key data from `jax.random.key_data`) and a JSON dict of
metadata (iteration, incumbent expression, budget counters). Each step is written by orbax
into a temporary directory that is renamed into place when complete, so a process killed
mid-save leaves either the previous steps or a complete new one.

Files can still go bad afterwards (a disk error, a truncated copy, someone deleting files),
so every step also stores a CRC-32 of each array and of the metadata inside the same atomic
commit. `CheckpointStore.restore` checks the step's files and those checksums; a step that
fails is reported with a `CorruptCheckpointWarning` naming the step and the problem, moved
aside into `<directory>/corrupt/`, and the next older step is tried.

    store = CheckpointStore(workdir / "checkpoints", max_to_keep=3)
    store.save(7, arrays={"policy": params, "opt": opt_state}, meta={"iteration": 7})
    restored = store.restore(arrays_template={"policy": params, "opt": opt_state})
    if restored is not None:
        arrays, meta = restored
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
import zlib
from typing import Any, BinaryIO, Callable, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

ARRAYS_ITEM = "arrays"
META_ITEM = "meta"
INTEGRITY_ITEM = "integrity"
ITEM_NAMES = (ARRAYS_ITEM, META_ITEM, INTEGRITY_ITEM)
COMMIT_MARKER = "commit_success.txt"
CORRUPT_SUBDIR = "corrupt"
INTEGRITY_FORMAT = 1


class CorruptCheckpointWarning(UserWarning):
    """A checkpoint step could not be used and was skipped."""


class CheckpointError(RuntimeError):
    """A requested checkpoint step is missing or unusable."""


# --------------------------------------------------------------------------- side files


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Replace the file at `path` with what `write(handle)` writes, so readers see the old or the new file.

    Writes a temporary file in the same directory, fsyncs it, renames it over `path` and
    fsyncs the directory so the rename itself survives a crash. In a multi-process job only
    process 0 writes (the run directory is its alone); the call does nothing elsewhere.
    """
    if jax.process_index() != 0:
        return
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp_path = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        if os.path.exists(tmp_path):
            os.remove(tmp_path)
        raise
    fsync_directory(directory)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Replace the file at `path` with `text` atomically (see `atomic_write`)."""
    atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> None:
    """`atomic_write_text` of `obj` as JSON; NaN/inf are rejected (they are not JSON)."""
    try:
        text = json.dumps(obj, indent=indent, sort_keys=False, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"atomic_write_json({os.fspath(path)!r}): object is not JSON-serializable: {err}") from err
    atomic_write_text(path, text + "\n")


def fsync_directory(directory: str | os.PathLike) -> None:
    """Flush a directory entry (renames, new files) to disk; a no-op where not supported."""
    try:
        fd = os.open(os.fspath(directory), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(root: str | os.PathLike) -> None:
    """fsync every file and directory under `root` (a finished checkpoint step)."""
    for dirpath, _, filenames in os.walk(os.fspath(root)):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as handle:
                os.fsync(handle.fileno())
        fsync_directory(dirpath)


# --------------------------------------------------------------------------- integrity


def array_checksums(arrays: Any) -> dict[str, dict[str, Any]]:
    """Per-leaf `{"shape", "dtype", "crc32"}` keyed by `jax.tree_util.keystr` path.

    `crc32` is None for arrays not fully addressable from this process (multi-host
    shards), whose bytes this process cannot read.
    """
    checksums = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(arrays)[0]:
        name = jax.tree_util.keystr(path)
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            checksums[name] = {"shape": list(leaf.shape), "dtype": str(leaf.dtype), "crc32": None}
            continue
        host = np.asarray(leaf)
        checksums[name] = {
            "shape": list(host.shape),
            "dtype": str(host.dtype),
            "crc32": zlib.crc32(np.ascontiguousarray(host).reshape(-1).view(np.uint8)),
        }
    return checksums


def meta_checksum(meta: Mapping[str, Any]) -> int:
    """CRC-32 of the canonical JSON text of `meta` (sorted keys)."""
    return zlib.crc32(json.dumps(meta, sort_keys=True).encode("utf-8"))


def integrity_record(arrays: Any, meta: Mapping[str, Any]) -> dict[str, Any]:
    return {"format": INTEGRITY_FORMAT, "arrays": array_checksums(arrays), "meta_crc32": meta_checksum(meta)}


def template_problem(record: Any, arrays_template: Any) -> str | None:
    """Why `arrays_template` (arrays or ShapeDtypeStructs) does not match the saved leaves, or None.

    Leaf paths, shapes and dtypes must all agree; None also when `record` is malformed
    (`integrity_problem` reports that as damage).
    """
    saved = record.get("arrays") if isinstance(record, Mapping) else None
    if not isinstance(saved, Mapping):
        return None
    wanted = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(arrays_template)[0]:
        dtype = leaf.dtype if hasattr(leaf, "dtype") else np.asarray(leaf).dtype
        wanted[jax.tree_util.keystr(path)] = (list(np.shape(leaf)), str(np.dtype(dtype)))
    if set(wanted) != set(saved):
        missing, extra = sorted(set(saved) - set(wanted)), sorted(set(wanted) - set(saved))
        return f"leaves saved but not in the template: {missing}; in the template but not saved: {extra}"
    for name, (shape, dtype) in wanted.items():
        if saved[name].get("shape") != shape or saved[name].get("dtype") != dtype:
            return f"leaf {name}: saved {saved[name].get('dtype')}{saved[name].get('shape')}, template {dtype}{shape}"
    return None


def integrity_problem(record: Any, arrays: Any, meta: Mapping[str, Any]) -> str | None:
    """Why restored `arrays`/`meta` do not match the saved `record`, or None if they do."""
    if not isinstance(record, Mapping) or record.get("format") != INTEGRITY_FORMAT:
        return f"integrity record is malformed: {str(record)[:120]!r}"
    if record.get("meta_crc32") != meta_checksum(meta):
        return "metadata checksum mismatch"
    saved = record.get("arrays")
    restored = array_checksums(arrays)
    if not isinstance(saved, Mapping) or set(saved) != set(restored):
        expected = sorted(saved) if isinstance(saved, Mapping) else saved
        return f"array leaves differ from the saved ones: saved {expected}, restored {sorted(restored)}"
    for name, want in saved.items():
        got = restored[name]
        if want.get("shape") != got["shape"] or want.get("dtype") != got["dtype"]:
            return f"leaf {name}: saved {want.get('dtype')}{want.get('shape')}, restored {got['dtype']}{got['shape']}"
        if want.get("crc32") is not None and got["crc32"] is not None and want["crc32"] != got["crc32"]:
            return f"leaf {name}: checksum mismatch"
    return None


# --------------------------------------------------------------------------- store


class CheckpointStore:
    """Numbered checkpoints of `(arrays, meta)` under `directory`, newest `max_to_keep` kept.

    Every process of a multi-host run must call `save` and `restore` together (orbax
    coordinates the writes); file moves and fsyncs are done where the files are visible.
    """

    def __init__(self, directory: str | os.PathLike, max_to_keep: int = 3):
        if not isinstance(max_to_keep, int) or max_to_keep < 1:
            raise ValueError(f"CheckpointStore: max_to_keep must be a positive int, got {max_to_keep!r}")
        self.directory = epath.Path(directory).absolute() if _is_local(directory) else epath.Path(directory)
        self.max_to_keep = max_to_keep
        self.restored_step: int | None = None
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            create=True,
            cleanup_tmp_directories=True,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEM_NAMES)

    # ------------------------------------------------------------------ queries

    def all_steps(self) -> list[int]:
        """Finalized steps on disk, ascending (not yet checked for corruption)."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        """Newest finalized step on disk, or None. `restore` is what checks it is usable."""
        return self._manager.latest_step()

    # ------------------------------------------------------------------ save

    def save(self, step: int, *, arrays: Any, meta: Mapping[str, Any]) -> None:
        """Write step `step`; when this returns the checkpoint is complete and on disk.

        arrays: any pytree of `jax.Array`/`np.ndarray`/scalars (PRNG keys as key data).
        meta: a JSON-serializable dict.
        """
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"CheckpointStore.save: step must be a non-negative int, got {step!r}")
        step = int(step)
        if not isinstance(meta, Mapping):
            raise TypeError(f"CheckpointStore.save(step={step}): meta must be a dict, got {type(meta).__name__}")
        meta = dict(meta)
        try:
            json.dumps(meta, sort_keys=True)
        except (TypeError, ValueError) as err:
            raise ValueError(f"CheckpointStore.save(step={step}): meta is not JSON-serializable: {err}") from err
        latest = self.latest_step()
        if latest is not None and step <= latest:
            raise ValueError(
                f"CheckpointStore.save: step {step} is not after the latest step {latest} in {self.directory}"
            )
        if jax.process_count() > 1:
            # orbax writes a NumPy leaf once (process 0) but a process-local jax.Array from every
            # process into the same place; arrays spread over the processes stay as they are
            arrays = jax.tree_util.tree_map(
                lambda x: np.asarray(x) if isinstance(x, jax.Array) and x.is_fully_addressable else x, arrays)
        record = integrity_record(arrays, meta)
        saved = self._manager.save(
            step,
            args=ocp.args.Composite(
                **{
                    ARRAYS_ITEM: ocp.args.StandardSave(arrays),
                    META_ITEM: ocp.args.JsonSave(meta),
                    INTEGRITY_ITEM: ocp.args.JsonSave(record),
                }
            ),
            force=True,
        )
        self._manager.wait_until_finished()
        if not saved:
            raise CheckpointError(f"orbax declined to save step {step} in {self.directory}")
        step_dir = self.directory / str(step)
        if _is_local(step_dir):
            fsync_tree(step_dir)
            fsync_directory(self.directory)

    # ------------------------------------------------------------------ restore

    def restore(self, step: int | None = None, *, arrays_template: Any) -> tuple[Any, dict] | None:
        """`(arrays, meta)` of `step`, or of the newest usable step when `step` is None.

        arrays_template: a pytree with the saved structure whose leaves are arrays or
            `jax.ShapeDtypeStruct`s; their dtypes/shapes/shardings decide how arrays come back.

        With `step=None`, steps whose files are damaged are warned about
        (`CorruptCheckpointWarning`), moved into `<directory>/corrupt/`, and older ones
        tried; None when no step is usable. An explicitly requested `step` that is missing
        or damaged raises `CheckpointError`, and so does a template whose leaf paths, shapes
        or dtypes differ from the saved ones (a code/config change, not damage).
        Sets `self.restored_step` to the step returned (None when nothing was restored).
        """
        self.restored_step = None
        if step is not None:
            if step not in self.all_steps():
                raise CheckpointError(f"no checkpoint step {step} in {self.directory}; have {self.all_steps()}")
            result, problem = self._try_restore(step, arrays_template)
            if problem is not None:
                raise CheckpointError(f"checkpoint step {step} in {self.directory} is unusable: {problem}")
            self.restored_step = step
            return result
        for candidate in reversed(self.all_steps()):
            result, problem = self._try_restore(candidate, arrays_template)
            if problem is None:
                self.restored_step = candidate
                return result
            warnings.warn(
                f"checkpoint step {candidate} in {self.directory} is unusable ({problem}); "
                f"moving it to {CORRUPT_SUBDIR}/ and trying an older step",
                CorruptCheckpointWarning,
                stacklevel=2,
            )
            self._quarantine(candidate)
        return None

    def close(self) -> None:
        self._manager.close()

    def __enter__(self) -> "CheckpointStore":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _missing_files(self, step: int) -> str | None:
        step_dir = self.directory / str(step)
        if not (step_dir / COMMIT_MARKER).exists():
            return f"missing commit marker {COMMIT_MARKER}"
        for item in ITEM_NAMES:
            if not (step_dir / item).is_dir():
                return f"missing item directory {item}/"
        return None

    def _try_restore(self, step: int, arrays_template: Any) -> tuple[tuple[Any, dict] | None, str | None]:
        """((arrays, meta), None) or (None, why the step's files are unusable).

        A template that does not fit the step raises `CheckpointError` instead: older
        steps would not fit either, and the files are not at fault.
        """
        problem = self._missing_files(step)
        if problem is not None:
            return None, problem
        try:
            record = self._manager.restore(step, args=ocp.args.Composite(**{INTEGRITY_ITEM: ocp.args.JsonRestore()}))[
                INTEGRITY_ITEM
            ]
        except Exception as err:  # orbax raises many types for damaged files
            return None, f"integrity record unreadable: {type(err).__name__}: {_first_line(err)}"
        mismatch = template_problem(record, arrays_template)
        if mismatch is not None:
            raise CheckpointError(f"arrays_template does not fit checkpoint step {step} in {self.directory}: {mismatch}")
        try:
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    **{
                        ARRAYS_ITEM: ocp.args.StandardRestore(arrays_template),
                        META_ITEM: ocp.args.JsonRestore(),
                    }
                ),
            )
        except Exception as err:  # orbax/tensorstore raise many types for damaged files
            return None, f"{type(err).__name__}: {_first_line(err)}"
        arrays, meta = restored[ARRAYS_ITEM], restored[META_ITEM]
        if not isinstance(meta, dict):
            return None, f"metadata is a {type(meta).__name__}, not a dict"
        problem = integrity_problem(record, arrays, meta)
        if problem is not None:
            return None, problem
        return (arrays, meta), None

    def _quarantine(self, step: int) -> None:
        if jax.process_index() == 0:
            source = self.directory / str(step)
            target_dir = self.directory / CORRUPT_SUBDIR
            target_dir.mkdir(parents=True, exist_ok=True)
            target = target_dir / f"{step}-{time.time_ns()}"
            if source.exists():
                source.rename(target)
        self._manager.reload()


def _is_local(path: str | os.PathLike) -> bool:
    return "://" not in os.fspath(path)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else ""
