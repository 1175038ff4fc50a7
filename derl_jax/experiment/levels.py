"""Running one compare per generalisation level (`config.compare.levels`) without repeating work.

Levels of one domain often share their training split (L0 and L1 train on the same tasks and
differ only in what they test on). The search of a method sees only the training split (its
inner-train / validation cut), so with the same split, base policy and seed it is the same
search. Two things carry over from an earlier level with the same training split:

* `share_base_policies`: the cached warm-start policies (the cache is keyed by content, so a
  level with another corpus simply does not match them);
* `share_trainings`: each method directory that holds a finished search or a kept training
  (`compare.keep_final_policies`: the final policy, a fixed method's validation score; see
  derl_jax/experiment/protocol.py), without the files that hold test results (`method_result.json`,
  `candidate_tests.json`). The level then loads the finished search and the kept final policy
  (or trains the chosen reward's final policy when none was kept) and tests them on its own
  test split.

`training_digest(domain)` tells when two levels share the split.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from typing import Sequence

import numpy as np

from derl_jax.domains.base import TokenDataset

PER_LEVEL_FILES = ("method_result.json", "candidate_tests.json")   # test results: never shared


def training_digest(train: TokenDataset) -> str:
    """A hex digest of a training split: prompts, masks and every context array."""
    digest = hashlib.sha256()
    arrays = {"prompts": train.prompts, "prompt_mask": train.prompt_mask, **dict(train.context or {})}
    for name in sorted(arrays):
        array = np.ascontiguousarray(np.asarray(arrays[name]))
        digest.update(f"{name}:{array.dtype}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _copy_missing(source: str, target: str, skip: Sequence[str] = ()) -> None:
    """Copy the files under `source` that `target` lacks (by relative path), except names in `skip`."""
    for root, _, files in os.walk(source):
        relative = os.path.relpath(root, source)
        for name in sorted(files):
            destination = os.path.normpath(os.path.join(target, relative, name))
            if name in skip or os.path.exists(destination):
                continue
            os.makedirs(os.path.dirname(destination), exist_ok=True)
            shutil.copy2(os.path.join(root, name), destination)


def share_base_policies(earlier_dirs: Sequence[str], level_dir: str) -> None:
    """Copy the base policies cached in `earlier_dirs` into `level_dir`'s cache (none is overwritten)."""
    from derl_jax.rl.setup import BASE_POLICY_DIR

    for earlier in earlier_dirs:
        source = os.path.join(earlier, BASE_POLICY_DIR)
        if os.path.isdir(source):
            _copy_missing(source, os.path.join(level_dir, BASE_POLICY_DIR))


def share_trainings(source_dir: str, level_dir: str, method_dirs: Sequence[str]) -> list[str]:
    """Copy the method directories `method_dirs` (paths relative to a level directory, e.g.
    "derl/seed_0") that hold a finished search or a kept training in `source_dir` into
    `level_dir`, without their test results; one with neither, or already present in
    `level_dir`, is left alone. Returns the ones copied."""
    from derl_jax.experiment.protocol import FINAL_POLICY_INFO, FIXED_VALIDATION_FILE
    from derl_jax.outer.search import SEARCH_RESULT_FILE

    copied = []
    for method_dir in method_dirs:
        source, target = os.path.join(source_dir, method_dir), os.path.join(level_dir, method_dir)
        trained = any(os.path.exists(os.path.join(source, name))
                      for name in (SEARCH_RESULT_FILE, FINAL_POLICY_INFO, FIXED_VALIDATION_FILE))
        if trained and not os.path.exists(target):
            _copy_missing(source, target, skip=PER_LEVEL_FILES)
            copied.append(method_dir)
    return copied
