"""The benchmark's task-variation splits, as the batched env's task arrays.

ScienceWorld divides each task's variations into its own train, dev and test lists (the
engine's `getVariationsTrain/Dev/Test`; the dev and test variations use objects, substances or
places of their own). The paper's levels (Appendix B, after RLVMR) over a list of tasks:

  L0  in distribution, seen: train on the train variations of every task, evaluate on the dev
      variations of the same tasks (the seen test set of the agent benchmarks that use
      ScienceWorld's lists; the paper does not name one);
  L1  in distribution, unseen: train as L0, evaluate on the test variations of the same tasks;
  L2  out of distribution: train on the tasks not held out, evaluate on the test variations
      of the held-out tasks (unseen task types).

`num_train` / `num_test` = 0 takes every variation of the list; N > 0 takes N variations of
each task (all of a task with fewer) drawn at random with `seed` (`domain.split_seed`; the
training and evaluation draws and each task's are independent), in the list's order.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

LEVELS = ("L0", "L1", "L2")
EVALUATION_SPLIT = {"L0": "dev", "L1": "test", "L2": "test"}


def sample(variations: Sequence[int], count: int, seed: int, salt: int, task_index: int) -> list[int]:
    """`variations` (count 0 or count >= len), else `count` of them drawn at random with
    (`seed`, `salt`, `task_index`), in their order."""
    variations = [int(v) for v in variations]
    if not 0 < count < len(variations):
        return variations
    rows = np.random.default_rng((int(seed), int(salt), int(task_index))).choice(len(variations), count, replace=False)
    return [variations[row] for row in sorted(rows.tolist())]


def task_arrays(worker, task_names: Sequence[str], names: Sequence[str], split: str, count: int = 0, seed: int = 0,
                salt: int = 0) -> dict[str, np.ndarray]:
    """{"task": i32[M], "variation": i32[M]}: `split`'s variations of each of `names` (all, or
    `count` per task drawn by `sample`), tasks as indices into `task_names`. A task whose list
    is empty raises naming it."""
    task_ids, variations = [], []
    for name in names:
        found = worker.variations(name, split)
        if not found:
            raise ValueError(f"ScienceWorld task {name!r} has no {split} variations")
        index = list(task_names).index(name)
        chosen = sample(found, int(count), seed, salt, index)
        task_ids += [index] * len(chosen)
        variations += chosen
    return {"task": np.array(task_ids, np.int32), "variation": np.array(variations, np.int32)}


def level_split(worker, task_names: Sequence[str], level: str, held_out: Sequence[str] = (), num_train: int = 0,
                num_test: int = 0, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(train tasks, evaluation tasks) of generalisation `level` (module docstring)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    unknown = [name for name in held_out if name not in task_names]
    if unknown:
        raise ValueError(f"held-out tasks {unknown} are not among {list(task_names)}")
    trained, tested = list(task_names), list(task_names)
    if level == "L2":
        if not held_out:
            raise ValueError("level L2 needs held-out tasks")
        trained = [name for name in task_names if name not in held_out]
        if not trained:
            raise ValueError("level L2 holds out every task; none is left to train on")
        tested = list(held_out)
    return (task_arrays(worker, task_names, trained, "train", num_train, seed, 0),
            task_arrays(worker, task_names, tested, EVALUATION_SPLIT[level], num_test, seed, 1))
