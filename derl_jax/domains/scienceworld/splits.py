"""The benchmark's task-variation splits, as the batched env's task arrays.

ScienceWorld divides each task's variations into train, dev and test (its own lists, e.g.
different objects, rooms or substances). The paper's levels over a list of tasks:

  L0  train and evaluate on the train variations of every task (seen variants);
  L1  train on train variations, evaluate on test variations of the same tasks (unseen variants);
  L2  train on the train variations of the tasks not held out, evaluate on the test variations
      of the held-out tasks (unseen task types).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

LEVELS = ("L0", "L1", "L2")


def task_arrays(worker, task_names: Sequence[str], names: Sequence[str], split: str,
                limit: int | None = None) -> dict[str, np.ndarray]:
    """{"task": i32[M], "variation": i32[M]}: `split`'s variations of each of `names` (at most
    `limit` per task, the first ones), tasks as indices into `task_names`."""
    task_ids, variations = [], []
    for name in names:
        found = worker.variations(name, split)[:limit]
        task_ids += [task_names.index(name)] * len(found)
        variations += found
    return {"task": np.array(task_ids, np.int32), "variation": np.array(variations, np.int32)}


def level_split(worker, task_names: Sequence[str], level: str, held_out: Sequence[str] = (),
                limit: int | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(train tasks, evaluation tasks) of generalisation `level` (module docstring)."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    unknown = [name for name in held_out if name not in task_names]
    if unknown:
        raise ValueError(f"held-out tasks {unknown} are not among {list(task_names)}")
    if level == "L2":
        if not held_out:
            raise ValueError("level L2 needs held-out tasks")
        seen = [name for name in task_names if name not in held_out]
        return (task_arrays(worker, task_names, seen, "train", limit),
                task_arrays(worker, task_names, held_out, "test", limit))
    train = task_arrays(worker, task_names, task_names, "train", limit)
    return train, (train if level == "L0" else task_arrays(worker, task_names, task_names, "test", limit))
