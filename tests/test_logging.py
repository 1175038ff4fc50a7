"""RunLogger and JSONL helpers: round trips, torn lines, NaN -> null, TensorBoard scalars."""

import glob
import io
import json
import math
import os
import struct

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from derl_jax.logging import (
    RunLogger,
    append_jsonl,
    progress_bar,
    read_jsonl,
    read_jsonl_lenient,
    rewrite_jsonl,
    summary_line,
    to_jsonable,
    truncate_history,
)


def read_tfrecords(path):
    """Records of a TFRecord file, with both CRCs checked (the on-disk format TensorBoard reads)."""
    records = []
    with open(path, "rb") as handle:
        while header := handle.read(8):
            (length,) = struct.unpack("<Q", header)
            (header_crc,) = struct.unpack("<I", handle.read(4))
            assert header_crc == masked_crc32c(header)
            data = handle.read(length)
            (data_crc,) = struct.unpack("<I", handle.read(4))
            assert data_crc == masked_crc32c(data)
            records.append(data)
    return records


def tensorboard_scalars(logdir):
    """{tag: [(step, value), ...]} from every event file under `logdir`."""
    scalars = {}
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for data in read_tfrecords(path):
            event = event_pb2.Event.FromString(data)
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_config_and_metrics_round_trip_with_nan_to_null(tmp_path):
    logger = RunLogger(tmp_path)
    logger.write_config({"outer": {"iterations": 3, "lr": 1e-5}, "name": "arith"})
    assert json.loads((tmp_path / "config.json").read_text()) == {
        "outer": {"iterations": 3, "lr": 1e-5},
        "name": "arith",
    }
    logger.log_metrics(0, {"val_mean": jnp.float32(0.25), "valid": np.int64(3), "loss": float("nan")}, scope="outer")
    logger.log_metrics(1, {"val_mean": np.array([0.5]), "loss": jnp.array(jnp.inf)}, scope="outer")
    logger.close()
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1]
    assert records[0]["val_mean"] == 0.25 and records[0]["valid"] == 3.0 and records[0]["loss"] is None
    assert records[1]["val_mean"] == 0.5 and records[1]["loss"] is None
    assert all(r["scope"] == "outer" for r in records)
    assert "NaN" not in (tmp_path / "metrics.jsonl").read_text()


def test_tensorboard_event_file_holds_the_scalars(tmp_path):
    with RunLogger(tmp_path) as logger:
        for step, value in enumerate([0.125, 0.5, 0.75]):
            logger.log_metrics(step, {"accuracy": value, "skip": float("nan")}, scope="val")
    scalars = tensorboard_scalars(tmp_path / "tb")
    assert scalars["val/accuracy"] == [(0, 0.125), (1, 0.5), (2, 0.75)]
    assert "val/skip" not in scalars


def test_resumed_logger_tells_tensorboard_to_purge_later_steps(tmp_path):
    with RunLogger(tmp_path) as first:
        for step in range(4):
            first.log_metrics(step, {"loss": float(step)}, scope="outer")
    with RunLogger(tmp_path, purge_step=2) as resumed:
        resumed.log_metrics(2, {"loss": 20.0}, scope="outer")
    purge_markers = []
    for path in sorted(glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))):
        for data in read_tfrecords(path):
            event = event_pb2.Event.FromString(data)
            if event.HasField("session_log") and event.session_log.status == event_pb2.SessionLog.START:
                purge_markers.append(event.step)
    assert purge_markers == [2]  # TensorBoard drops earlier events with step >= 2 when it sees this
    assert tensorboard_scalars(tmp_path / "tb")["outer/loss"][-1] == (2, 20.0)


def test_metrics_reject_non_scalars_and_reserved_names(tmp_path):
    logger = RunLogger(tmp_path, tensorboard=False)
    with pytest.raises(TypeError, match="metric outer/vec: a metric must be one real number"):
        logger.log_metrics(0, {"vec": jnp.ones(3)}, scope="outer")
    with pytest.raises(TypeError, match="metric outer/name: a metric must be a number"):
        logger.log_metrics(0, {"name": "x"}, scope="outer")
    with pytest.raises(ValueError, match="'step' is reserved"):
        logger.log_metrics(0, {"step": 1.0}, scope="outer")


def test_history_round_trip_and_truncated_last_line(tmp_path):
    logger = RunLogger(tmp_path, tensorboard=False)
    batch_one = [{"iteration": 0, "text": "g1", "score": 0.5}, {"iteration": 0, "text": "g1+g2", "score": np.float32(0.25)}]
    logger.append_history(batch_one)
    logger.append_history([{"iteration": 1, "text": "g2", "score": float("nan"), "probe": jnp.array([1.0, jnp.nan])}])
    expected = [
        {"iteration": 0, "text": "g1", "score": 0.5},
        {"iteration": 0, "text": "g1+g2", "score": 0.25},
        {"iteration": 1, "text": "g2", "score": None, "probe": [1.0, None]},
    ]
    assert logger.read_history() == expected
    # a run killed mid-write leaves half a record
    with open(tmp_path / "history.jsonl", "ab") as handle:
        handle.write(b'{"iteration": 2, "text": "g1*')
    with pytest.warns(RuntimeWarning, match="unterminated last line"):
        assert read_jsonl(tmp_path / "history.jsonl") == expected
    # the next append drops the torn tail first, so every line stays one record
    with pytest.warns(RuntimeWarning, match="torn last record"):
        logger.append_history([{"iteration": 2, "text": "g3", "score": 1.0}])
    assert read_jsonl(tmp_path / "history.jsonl") == expected + [{"iteration": 2, "text": "g3", "score": 1.0}]


def test_unreadable_last_line_is_ignored_but_middle_line_raises(tmp_path):
    path = tmp_path / "h.jsonl"
    path.write_bytes(b'{"iteration": 0}\n\x00\x00\x00\n')
    with pytest.warns(RuntimeWarning, match="unreadable last line"):
        assert read_jsonl(path) == [{"iteration": 0}]
    path.write_bytes(b'{"iteration": 0}\n{broken\n{"iteration": 1}\n')
    with pytest.raises(ValueError, match=r"h.jsonl:2: not a JSON record"):
        read_jsonl(path)
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_truncate_history_drops_records_after_the_checkpoint(tmp_path):
    path = tmp_path / "history.jsonl"
    records = [{"iteration": i // 2, "k": i} for i in range(8)]
    append_jsonl(path, records)
    assert truncate_history(path, keep_until_iteration=1) == 4
    assert read_jsonl(path) == records[:4]
    assert truncate_history(path, keep_until_iteration=5) == 0
    assert read_jsonl(path) == records[:4]
    append_jsonl(path, [{"k": 99}])
    with pytest.raises(ValueError, match="record 4 has no numeric 'iteration' field"):
        truncate_history(path, 1)
    metrics = tmp_path / "metrics.jsonl"
    append_jsonl(metrics, [{"step": s} for s in range(5)])
    assert truncate_history(metrics, 2, key="step") == 2


def test_to_jsonable_converts_nested_values():
    value = {1: (np.int32(2), jnp.array([[1.5, np.inf]])), "b": [True, None, "s", np.bool_(False)]}
    assert to_jsonable(value) == {"1": [2, [[1.5, None]]], "b": [True, None, "s", False]}
    with pytest.raises(TypeError, match=r"value\['x'\]: cannot be written as JSON"):
        to_jsonable({"x": object()})


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_is_quiet_off_a_tty_or_when_disabled():
    quiet = io.StringIO()
    assert sum(progress_bar(range(5), stream=quiet, desc="outer")) == 10
    assert quiet.getvalue() == ""
    terminal = FakeTerminal()
    assert list(progress_bar(range(3), stream=terminal, enabled=False)) == [0, 1, 2]
    assert terminal.getvalue() == ""
    assert list(progress_bar(range(3), stream=terminal, desc="outer")) == [0, 1, 2]
    assert "outer" in terminal.getvalue() and "3/3" in terminal.getvalue()


def test_summary_line():
    assert summary_line(3, 0.8125, 0.75, "g1 + 0.5*g2") == "iter    3 | best 0.8125 | valid  75.0% | g1 + 0.5*g2"
    assert summary_line(0, None, 0.0, None) == "iter    0 | best      - | valid   0.0% | (none)"
    assert summary_line(1, math.nan, 1.0, "g1\n+ g2") == "iter    1 | best      - | valid 100.0% | g1 + g2"
    long = summary_line(2, 1.0, 0.5, "g1+" * 40)
    assert "\n" not in long and long.endswith("…") and len(long.split(" | ")[-1]) == 80
    with pytest.raises(ValueError, match="validity_rate must be in"):
        summary_line(1, 0.5, 1.5, "g1")


def test_lenient_reader_keeps_every_readable_line_and_names_the_rest(tmp_path):
    path = tmp_path / "log.jsonl"
    records = [{"iteration": i, "score": 0.5 * i, "text": f"g{i}"} for i in range(4)]
    rewrite_jsonl(path, records)
    assert read_jsonl(path) == records
    lines = path.read_bytes().split(b"\n")
    damaged = [lines[0], b"\xff\xfe", lines[1], b"[1, 2]", lines[2], lines[3][:7]]
    path.write_bytes(b"\n".join(damaged))
    assert read_jsonl_lenient(path) == ([records[0], records[1], records[2]], [2, 4, 6])
    with pytest.raises(ValueError, match="log.jsonl:2: not a JSON record"):
        read_jsonl(path)  # the strict reader refuses a damaged line that is not the last
    assert read_jsonl_lenient(tmp_path / "missing.jsonl") == ([], [])
