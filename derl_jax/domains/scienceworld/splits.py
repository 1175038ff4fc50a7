"""The benchmark's task-variation splits, as the batched env's task arrays.

ScienceWorld divides each task's variations into train, dev and test (its own lists: the test
variations use objects, substances or places that the train variations do not). The paper's
levels (Appendix B, after RLVMR) over a list of tasks, with `num_train` training and `num_test`
evaluation variations per task:

  L0  in distribution, seen: train on the first train variations of every task, evaluate on
      the train variations that follow them (the same pool of objects, other episodes);
  L1  in distribution, unseen: train as L0, evaluate on the test variations of the same tasks;
  L2  out of distribution: train on the tasks not held out, evaluate on the test variations
      of the held-out tasks (unseen task types).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

LEVELS = ("L0", "L1", "L2")


def _arrays(task_names: Sequence[str], chosen: Sequence[tuple[str, Sequence[int]]]) -> dict[str, np.ndarray]:
    task_ids = [task_names.index(name) for name, found in chosen for _ in found]
    variations = [v for _, found in chosen for v in found]
    return {"task": np.array(task_ids, np.int32), "variation": np.array(variations, np.int32)}


def task_arrays(worker, task_names: Sequence[str], names: Sequence[str], split: str, start: int = 0,
                limit: int | None = None) -> dict[str, np.ndarray]:
    """{"task": i32[M], "variation": i32[M]}: `split`'s variations start..start+limit of each of
    `names`, tasks as indices into `task_names`."""
    stop = None if limit is None else start + limit
    return _arrays(task_names, [(name, worker.variations(name, split)[start:stop]) for name in names])


def level_split(worker, task_names: Sequence[str], level: str, held_out: Sequence[str] = (),
                num_train: int | None = None, num_test: int | None = None
                ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(train tasks, evaluation tasks) of generalisation `level` (module docstring); None = all.
    A task with too few train variations for both L0 parts raises naming it."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    unknown = [name for name in held_out if name not in task_names]
    if unknown:
        raise ValueError(f"held-out tasks {unknown} are not among {list(task_names)}")
    if level == "L2":
        if not held_out:
            raise ValueError("level L2 needs held-out tasks")
        seen = [name for name in task_names if name not in held_out]
        if not seen:
            raise ValueError("level L2 holds out every task; none is left to train on")
        return (task_arrays(worker, task_names, seen, "train", 0, num_train),
                task_arrays(worker, task_names, held_out, "test", 0, num_test))
    train = task_arrays(worker, task_names, task_names, "train", 0, num_train)
    if level == "L1":
        return train, task_arrays(worker, task_names, task_names, "test", 0, num_test)
    if num_train is None:
        raise ValueError("level L0 evaluates on the train variations after the first num_train; give num_train")
    evaluate = task_arrays(worker, task_names, task_names, "train", num_train, num_test)
    short = [name for i, name in enumerate(task_names) if not np.any(evaluate["task"] == i)]
    if short:
        raise ValueError(f"tasks {short} have no train variations left after the first {num_train} for L0's evaluation")
    return train, evaluate
