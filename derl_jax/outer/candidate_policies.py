"""Each iteration's candidate policies on disk, for testing them once the search is over (Fig. 3).

    save_iteration(workdir, iteration, params, rows)       # params: K stacked policies
    for iteration in saved_iterations(workdir):
        policies, rows = load_iteration(workdir, iteration, template)

`rows` i32[n] maps each of the iteration's n candidates to its policy's row in the stack, -1
for a candidate without a policy (invalid, or its training gave no finite score). A file per
iteration, `candidate_policies/iteration_<i>.npz`, written atomically: leaf k of the flattened
pytree as raw bytes (`leaf_<k>`, so any dtype, bfloat16 included, round-trips exactly) with
its shape; the structure and dtypes come back from a template policy. `save_stack` /
`load_stack` are the same format at any path (the compare keeps final policies with them).
"""

from __future__ import annotations

import io
import os
import re
from typing import Any, Sequence

import jax
import numpy as np

from derl_jax.checkpoint import atomic_write

POLICY_DIR = "candidate_policies"
_NAME = re.compile(r"^iteration_(\d+)\.npz$")


def policy_path(workdir: str, iteration: int) -> str:
    return os.path.join(os.fspath(workdir), POLICY_DIR, f"iteration_{int(iteration):06d}.npz")


def save_iteration(workdir: str, iteration: int, params: Any, rows: Sequence[int]) -> None:
    """Write iteration `iteration`'s stacked policies (leading axis K) and candidate rows i32[n]."""
    save_stack(policy_path(workdir, iteration), params, rows)


def save_stack(path: str, params: Any, rows: Sequence[int]) -> None:
    """Write stacked policies (leading axis K, or None) and rows i32[n] to `path` atomically."""
    leaves = [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(params)] if params is not None else []
    arrays = {"rows": np.asarray(rows, np.int32), "num_leaves": np.asarray(len(leaves), np.int64)}
    for k, leaf in enumerate(leaves):
        arrays[f"leaf_{k}"] = np.frombuffer(np.ascontiguousarray(leaf).tobytes(), np.uint8)
        arrays[f"shape_{k}"] = np.asarray(leaf.shape, np.int64)
        arrays[f"dtype_{k}"] = np.asarray(str(leaf.dtype))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write(path, lambda handle: handle.write(buffer.getvalue()))


def load_iteration(workdir: str, iteration: int, template: Any) -> tuple[Any, np.ndarray]:
    """(stacked policies with `template`'s structure and dtypes — None when none were saved —,
    rows i32[n]). ValueError naming the file when it does not fit the template."""
    return load_stack(policy_path(workdir, iteration), template)


def load_stack(path: str, template: Any) -> tuple[Any, np.ndarray]:
    """`load_iteration` of the file at `path`."""
    with np.load(path) as data:
        rows = np.asarray(data["rows"], np.int32)
        count = int(data["num_leaves"])
        if count == 0:
            return None, rows
        leaves, treedef = jax.tree_util.tree_flatten(template)
        if count != len(leaves):
            raise ValueError(f"{path}: holds {count} arrays, the policy template has {len(leaves)}")
        out = []
        for k, leaf in enumerate(leaves):
            dtype = np.dtype(leaf.dtype)
            if str(data[f"dtype_{k}"]) != str(dtype):
                raise ValueError(f"{path}: array {k} has dtype {data[f'dtype_{k}']}, the template {dtype}")
            shape = tuple(int(d) for d in data[f"shape_{k}"])
            if shape[1:] != tuple(np.shape(leaf)):
                raise ValueError(f"{path}: array {k} has shape {shape}, the template [K, *{tuple(np.shape(leaf))}]")
            out.append(np.frombuffer(data[f"leaf_{k}"].tobytes(), dtype).reshape(shape))
    return jax.tree_util.tree_unflatten(treedef, out), rows


def saved_iterations(workdir: str) -> list[int]:
    """Iterations with saved candidate policies, ascending."""
    directory = os.path.join(os.fspath(workdir), POLICY_DIR)
    if not os.path.isdir(directory):
        return []
    return sorted(int(m.group(1)) for m in map(_NAME.match, os.listdir(directory)) if m)
