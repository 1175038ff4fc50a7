"""CheckpointStore and atomic side files: round trips, corruption fallback, kill mid-save."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from derl_jax.checkpoint import (
    CheckpointError,
    CheckpointStore,
    CorruptCheckpointWarning,
    atomic_write_json,
    atomic_write_text,
)


def make_state(seed: int):
    """A params-like nested dict, an Adam state for it and PRNG key data."""
    rng = np.random.default_rng(seed)
    params = {
        "embed": jnp.asarray(rng.normal(size=(64, 32)), jnp.float32),
        "layers": [
            {"w": jnp.asarray(rng.normal(size=(4, 4)), jnp.float32), "b": jnp.asarray(rng.normal(size=4), jnp.bfloat16)},
            {"w": jnp.asarray(rng.normal(size=(4, 4)), jnp.float32), "b": jnp.zeros(4, jnp.bfloat16)},
        ],
        "steps": jnp.asarray(seed, jnp.int32),
    }
    optimizer = optax.adam(1e-2)
    opt_state = optimizer.init(params)
    grads = jax.tree.map(lambda p: jnp.ones_like(p), params)
    _, opt_state = optimizer.update(grads, opt_state, params)
    key = jax.random.key_data(jax.random.fold_in(jax.random.key(0), seed))
    return {"params": params, "opt_state": opt_state, "key": key}


def assert_trees_equal(actual, expected):
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
        assert np.asarray(a).dtype == np.asarray(e).dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(e))


def largest_array_data_file(step_dir):
    """The biggest file in a `d/` (data) folder of the arrays item: where the array bytes live."""
    found = []
    for dirpath, _, names in os.walk(os.path.join(step_dir, "arrays")):
        if os.path.basename(dirpath) == "d":
            found += [os.path.join(dirpath, n) for n in names]
    return max(found, key=os.path.getsize)


def flip_middle_byte(path):
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) // 2] ^= 0xFF
    open(path, "wb").write(bytes(raw))


def test_round_trip_of_params_optax_state_key_and_meta(tmp_path):
    state = make_state(3)
    meta = {"iteration": 3, "incumbent": "g1 + 0.5*g2", "scores": [0.25, None, 1.0], "nested": {"a": [1, 2]}}
    store = CheckpointStore(tmp_path / "ckpt")
    store.save(3, arrays=state, meta=meta)
    assert store.latest_step() == 3
    template = make_state(99)
    arrays, restored_meta = CheckpointStore(tmp_path / "ckpt").restore(arrays_template=template)
    assert restored_meta == meta
    assert_trees_equal(arrays, state)
    assert isinstance(arrays["opt_state"][0], optax.ScaleByAdamState)
    key = jax.random.wrap_key_data(arrays["key"])
    expected_key = jax.random.fold_in(jax.random.key(0), 3)
    np.testing.assert_array_equal(jax.random.uniform(key, (3,)), jax.random.uniform(expected_key, (3,)))


def test_restore_accepts_abstract_template_and_explicit_step(tmp_path):
    store = CheckpointStore(tmp_path)
    for step in (1, 2):
        store.save(step, arrays=make_state(step), meta={"iteration": step})
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), make_state(0))
    arrays, meta = store.restore(1, arrays_template=abstract)
    assert meta == {"iteration": 1} and store.restored_step == 1
    assert_trees_equal(arrays, make_state(1))
    with pytest.raises(CheckpointError, match="no checkpoint step 7"):
        store.restore(7, arrays_template=abstract)


def test_restore_of_empty_directory_is_none(tmp_path):
    store = CheckpointStore(tmp_path / "empty")
    assert store.latest_step() is None
    assert store.restore(arrays_template=make_state(0)) is None
    assert store.restored_step is None


def test_max_to_keep_is_honoured(tmp_path):
    store = CheckpointStore(tmp_path, max_to_keep=2)
    for step in range(5):
        store.save(step, arrays={"x": jnp.full((3,), step)}, meta={"step": step})
    assert store.all_steps() == [3, 4]
    assert sorted(n for n in os.listdir(tmp_path) if n.isdigit()) == ["3", "4"]


def test_save_rejects_non_increasing_step_and_bad_meta(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(5, arrays={"x": jnp.zeros(2)}, meta={})
    with pytest.raises(ValueError, match="step 5 is not after the latest step 5"):
        store.save(5, arrays={"x": jnp.zeros(2)}, meta={})
    with pytest.raises(ValueError, match="not JSON-serializable"):
        store.save(6, arrays={"x": jnp.zeros(2)}, meta={"bad": object()})
    with pytest.raises(ValueError, match="non-negative int"):
        store.save(-1, arrays={"x": jnp.zeros(2)}, meta={})


def _three_steps(directory):
    store = CheckpointStore(directory, max_to_keep=3)
    for step in (1, 2, 3):
        store.save(step, arrays=make_state(step), meta={"iteration": step})
    return store


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("truncate_data", "reading array"),
        ("garble_data", "checksum mismatch"),
        ("garble_array_metadata", "Error"),
        ("delete_marker", "missing commit marker"),
        ("delete_meta", "FileNotFoundError"),
        ("garble_meta", "JSONDecodeError"),
    ],
)
def test_corrupt_latest_step_falls_back_to_previous(tmp_path, damage, reason):
    _three_steps(tmp_path)
    step_dir = tmp_path / "3"
    if damage == "truncate_data":
        target = largest_array_data_file(step_dir)
        with open(target, "r+b") as handle:
            handle.truncate(os.path.getsize(target) // 2)
    elif damage == "garble_data":
        flip_middle_byte(largest_array_data_file(step_dir))
    elif damage == "garble_array_metadata":
        flip_middle_byte(step_dir / "arrays" / "_METADATA")
    elif damage == "delete_marker":
        os.remove(step_dir / "commit_success.txt")
    elif damage == "delete_meta":
        os.remove(step_dir / "meta" / "metadata")
    elif damage == "garble_meta":
        (step_dir / "meta" / "metadata").write_text('{"iteration": 3')

    store = CheckpointStore(tmp_path, max_to_keep=3)
    with pytest.warns(CorruptCheckpointWarning) as record:
        arrays, meta = store.restore(arrays_template=make_state(0))
    messages = [str(w.message) for w in record if issubclass(w.category, CorruptCheckpointWarning)]
    assert len(messages) == 1 and "step 3" in messages[0]
    assert re.search(reason, messages[0]), messages
    assert meta == {"iteration": 2} and store.restored_step == 2
    assert_trees_equal(arrays, make_state(2))
    # the bad step is moved aside, so the run can save step 3 again
    assert store.all_steps() == [1, 2]
    assert len(os.listdir(tmp_path / "corrupt")) == 1
    store.save(3, arrays=make_state(30), meta={"iteration": 3})
    arrays, meta = store.restore(arrays_template=make_state(0))
    assert meta == {"iteration": 3}


def test_every_step_corrupt_restores_none(tmp_path):
    _three_steps(tmp_path)
    for step in (1, 2, 3):
        os.remove(tmp_path / str(step) / "commit_success.txt")
    store = CheckpointStore(tmp_path)
    with pytest.warns(CorruptCheckpointWarning):
        assert store.restore(arrays_template=make_state(0)) is None


def test_explicit_corrupt_step_raises(tmp_path):
    store = _three_steps(tmp_path)
    os.remove(tmp_path / "2" / "commit_success.txt")
    with pytest.raises(CheckpointError, match="step 2 .* unusable: missing commit marker"):
        store.restore(2, arrays_template=make_state(0))


@pytest.mark.parametrize(
    "template, message",
    [
        ({"x": jnp.zeros(4, jnp.int32)}, r"leaf \['x'\]: saved float32\[4\], template int32\[4\]"),
        ({"x": jnp.zeros(5)}, r"leaf \['x'\]: saved float32\[4\], template float32\[5\]"),
        ({"x": jnp.zeros(4), "y": jnp.zeros(1)}, r"in the template but not saved: \[\"\['y'\]\"\]"),
    ],
)
def test_template_mismatch_raises_and_leaves_checkpoints_alone(tmp_path, template, message):
    store = CheckpointStore(tmp_path)
    for step in (1, 2):
        store.save(step, arrays={"x": jnp.arange(4.0) + step}, meta={})
    with pytest.raises(CheckpointError, match="arrays_template does not fit checkpoint step 2"):
        store.restore(arrays_template=template)
    with pytest.raises(CheckpointError, match=message):
        store.restore(1, arrays_template=template)
    assert store.all_steps() == [1, 2] and not (tmp_path / "corrupt").exists()


SAVER = textwrap.dedent(
    """
    import sys, os
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax.numpy as jnp
    from derl_jax.checkpoint import CheckpointStore
    store = CheckpointStore(sys.argv[1], max_to_keep=2)
    for step in range(10_000):
        value = float(step)
        arrays = {"a": jnp.full((512, 1024), value), "b": {"c": jnp.full((64,), -value)}}
        store.save(step, arrays=arrays, meta={"step": step})
        print(step, flush=True)
    """
)


def test_sigkill_mid_save_leaves_a_consistent_checkpoint(tmp_path):
    directory = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [sys.executable, "-c", SAVER, str(directory)], stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        saved = -1
        while saved < 2:
            line = proc.stdout.readline()
            assert line, f"saver exited early with {proc.poll()}"
            saved = int(line)
            assert time.monotonic() < deadline, "saver too slow"
        time.sleep(0.05)  # land somewhere inside the next save
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    template = {"a": jnp.zeros((512, 1024)), "b": {"c": jnp.zeros((64,))}}
    store = CheckpointStore(directory, max_to_keep=2)
    arrays, meta = store.restore(arrays_template=template)
    step = meta["step"]
    assert step >= 2 and store.restored_step == step
    np.testing.assert_array_equal(np.asarray(arrays["a"]), np.full((512, 1024), float(step), np.float32))
    np.testing.assert_array_equal(np.asarray(arrays["b"]["c"]), np.full((64,), -float(step), np.float32))
    store.save(step + 1, arrays=template, meta={"step": step + 1})
    # interrupted temp dirs are cleaned up (orbax does it in the background; a save waits for it)
    assert not [n for n in os.listdir(directory) if "tmp" in n]


def test_atomic_write_text_and_json(tmp_path):
    path = tmp_path / "sub" / "results.json"
    atomic_write_json(path, {"a": [1, 2.5], "b": None})
    assert json.loads(path.read_text()) == {"a": [1, 2.5], "b": None}
    atomic_write_text(path, "replaced")
    assert path.read_text() == "replaced"
    assert os.listdir(tmp_path / "sub") == ["results.json"]  # no temp files left behind
    with pytest.raises(ValueError, match="not JSON-serializable"):
        atomic_write_json(path, {"x": float("nan")})
    assert path.read_text() == "replaced"
