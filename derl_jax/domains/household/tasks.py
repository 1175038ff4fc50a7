"""Household tasks as arrays, their generator, and the generalisation levels L0 / L1 / L2.

A task is one generated room (receptacles, objects and where they start) and a goal of one of
ALFWorld's six kinds. A batch of tasks is the same `Task` with a leading axis M.

Seen / unseen variants (the paper's Appendix B, after ALFWorld's seen and unseen test sets):
`type_split(seed)` halves every object stratum (food, dishes, tools, small items, lamps) and
both placement-receptacle strata (closed, open) into seen and unseen types. Appliances
(sinkbasin, microwave, fridge) are in every room and never a goal. A "seen" task draws its goal
object, goal receptacle, lamp and every other object and receptacle of its room from seen
types; an "unseen" task draws goal object, goal receptacle and lamp from unseen types (the rest
of its room from all types), so neither its goal object nor its goal receptacle ever occurs in
a seen task.

Levels (`level_splits`): L0 trains on all six kinds (seen) and tests on new seen tasks; L1
trains on all six (seen) and tests on unseen tasks; L2 trains on four kinds (seen) and tests on
the other two (`held_out_kinds`, default cool & place and pick two & place) with unseen
variants; L2-seen is L2 with seen variants, so it holds out the task kinds alone (every test
entity type occurs in training tasks). Test tasks never repeat a training task.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from derl_jax.domains.household import vocab

KINDS = ("pick", "examine", "clean", "heat", "cool", "pick_two")
PICK, EXAMINE, CLEAN, HEAT, COOL, PICK_TWO = range(len(KINDS))
MAX_RECEPTACLES = 10
MAX_OBJECTS = 12
EXTRA_RECEPTACLES = 3   # receptacles besides the appliances and the placements: 1 .. this many
DISTRACTORS = 5         # objects besides the goal objects and the lamp: 2 .. this many
DESCRIPTION_LENGTH = 12
HELD = -1      # obj_loc of the object in the agent's hand
NOWHERE = -2   # obj_loc of a padding object slot
LEVELS = ("L0", "L1", "L2", "L2-seen")
DEFAULT_HELD_OUT_KINDS = (COOL, PICK_TWO)
_MAX_PER_RECEPTACLE = 4
_MAX_SAME_TYPE = 3


@struct.dataclass
class Task:
    """One task (or a batch with a leading axis M on every field).

    kind:            i32[]  index into KINDS.
    goal_object:     i32[]  object type to handle.
    goal_receptacle: i32[]  receptacle type to put it in (-1 for examine).
    recep_type:      i32[R] receptacle type per slot, -1 on padding slots.
    recep_num:       i32[R] instance number ("cabinet 2" -> 2), 0 on padding.
    obj_type:        i32[Ob] object type per slot, -1 on padding.
    obj_num:         i32[Ob] instance number, 0 on padding.
    obj_loc:         i32[Ob] receptacle slot where the object starts (NOWHERE on padding).
    description:     i32[D] the goal in words ("put a hot apple in countertop ."), pad-filled.
    """

    kind: jax.Array
    goal_object: jax.Array
    goal_receptacle: jax.Array
    recep_type: jax.Array
    recep_num: jax.Array
    obj_type: jax.Array
    obj_num: jax.Array
    obj_loc: jax.Array
    description: jax.Array

    @property
    def size(self) -> int:
        return int(np.shape(self.kind)[0])

    def take(self, indices) -> "Task":
        return jax.tree_util.tree_map(lambda x: x[indices], self)


@dataclasses.dataclass(frozen=True)
class TypeSplit:
    """Seen and unseen object types and placement-receptacle types (sorted tuples of type ids)."""

    seen_objects: tuple[int, ...]
    unseen_objects: tuple[int, ...]
    seen_receptacles: tuple[int, ...]
    unseen_receptacles: tuple[int, ...]


def type_split(seed: int) -> TypeSplit:
    """Halve every stratum into seen / unseen types with a generator seeded by `seed`."""
    rng = np.random.default_rng([seed, 0x5EE7])
    halves = {"seen_objects": [], "unseen_objects": [], "seen_receptacles": [], "unseen_receptacles": []}
    for strata, kind in ((vocab.OBJECT_STRATA, "objects"), (vocab.RECEPTACLE_STRATA, "receptacles")):
        for members in strata.values():
            order = rng.permutation(np.array(members))
            cut = len(order) // 2
            halves[f"seen_{kind}"] += order[:cut].tolist()
            halves[f"unseen_{kind}"] += order[cut:].tolist()
    return TypeSplit(**{name: tuple(sorted(ids)) for name, ids in halves.items()})


def _goal_objects_for(kind: int, types: np.ndarray) -> np.ndarray:
    needed = {CLEAN: vocab.CLEANABLE, HEAT: vocab.HEATABLE, COOL: vocab.COOLABLE}.get(kind, vocab.PICKABLE)
    return types[needed[types]]


def describe(kind: int, goal_object: int, goal_receptacle: int, lamp_type: int) -> str:
    """The goal in words, e.g. "put a clean apple in countertop ."."""
    obj = vocab.OBJECT_NAMES[goal_object]
    if kind == EXAMINE:
        return f"look at {obj} under the {vocab.OBJECT_NAMES[lamp_type]} ."
    recep = vocab.RECEPTACLE_NAMES[goal_receptacle]
    adjective = {PICK: "a", CLEAN: "a clean", HEAT: "a hot", COOL: "a cool", PICK_TWO: "two"}[kind]
    return f"put {adjective} {obj} in {recep} ."


def _numbered(types: list[int]) -> list[int]:
    seen: dict[int, int] = {}
    numbers = []
    for t in types:
        seen[t] = seen.get(t, 0) + 1
        numbers.append(seen[t])
    return numbers


def generate_task(rng: np.random.Generator, kind: int, split: TypeSplit, unseen: bool) -> dict[str, np.ndarray]:
    """One task of `kind` as a dict of NumPy arrays (the fields of `Task`)."""
    seen_obj, seen_rec = np.array(split.seen_objects), np.array(split.seen_receptacles)
    goal_obj_pool = np.array(split.unseen_objects if unseen else split.seen_objects)
    goal_rec_pool = np.array(split.unseen_receptacles if unseen else split.seen_receptacles)
    room_obj_pool = np.union1d(seen_obj, split.unseen_objects) if unseen else seen_obj
    room_rec_pool = np.union1d(seen_rec, split.unseen_receptacles) if unseen else seen_rec

    goal_object = int(rng.choice(_goal_objects_for(kind, goal_obj_pool)))
    lamp_pool = goal_obj_pool if kind == EXAMINE else room_obj_pool
    lamp_type = int(rng.choice(lamp_pool[vocab.LIGHT_SOURCE[lamp_pool]]))
    goal_receptacle = -1 if kind == EXAMINE else int(rng.choice(goal_rec_pool))

    # Receptacles: the appliances, the goal receptacle, an open surface for the lamp, then extras.
    open_surfaces = room_rec_pool[~vocab.OPENABLE[room_rec_pool]]
    placements = [goal_receptacle] if goal_receptacle >= 0 else []
    placements.append(int(rng.choice(open_surfaces)))
    for _ in range(int(rng.integers(1, EXTRA_RECEPTACLES + 1))):
        choice = int(rng.choice(room_rec_pool))
        if placements.count(choice) < _MAX_SAME_TYPE:
            placements.append(choice)
    recep_types = [*vocab.APPLIANCES, *placements]
    recep_types = [recep_types[i] for i in rng.permutation(len(recep_types))]
    recep_nums = _numbered(recep_types)
    recep_types_arr = np.array(recep_types)
    lamp_spots = np.flatnonzero(~vocab.OPENABLE[recep_types_arr] & ~np.isin(recep_types_arr, vocab.APPLIANCES))

    # Objects: goal objects, the lamp, distractors of other pickable types.
    goal_count = 2 if kind == PICK_TWO else 1 + int(rng.random() < 0.25)
    distractor_pool = room_obj_pool[vocab.PICKABLE[room_obj_pool] & (room_obj_pool != goal_object)]
    obj_types = [goal_object] * goal_count + [lamp_type]
    for _ in range(int(rng.integers(2, DISTRACTORS + 1))):
        choice = int(rng.choice(distractor_pool))
        if obj_types.count(choice) < _MAX_SAME_TYPE:
            obj_types.append(choice)
    obj_locs, load = [], np.zeros(len(recep_types), np.int64)
    for t in obj_types:
        allowed = lamp_spots if vocab.LIGHT_SOURCE[t] else np.arange(len(recep_types))
        if t == goal_object and goal_receptacle >= 0:
            allowed = allowed[recep_types_arr[allowed] != goal_receptacle]
        allowed = allowed[load[allowed] < _MAX_PER_RECEPTACLE]
        loc = int(rng.choice(allowed))
        load[loc] += 1
        obj_locs.append(loc)
    order = rng.permutation(len(obj_types))
    obj_types = [obj_types[i] for i in order]
    obj_locs = [obj_locs[i] for i in order]
    obj_nums = _numbered(obj_types)

    def padded(values, length, fill):
        return np.array(list(values) + [fill] * (length - len(values)), np.int32)

    return {
        "kind": np.int32(kind),
        "goal_object": np.int32(goal_object),
        "goal_receptacle": np.int32(goal_receptacle),
        "recep_type": padded(recep_types, MAX_RECEPTACLES, -1),
        "recep_num": padded(recep_nums, MAX_RECEPTACLES, 0),
        "obj_type": padded(obj_types, MAX_OBJECTS, -1),
        "obj_num": padded(obj_nums, MAX_OBJECTS, 0),
        "obj_loc": padded(obj_locs, MAX_OBJECTS, NOWHERE),
        "description": vocab.WordVocab().encode_padded(
            describe(kind, goal_object, goal_receptacle, lamp_type), DESCRIPTION_LENGTH),
    }


def stack_tasks(rows: list[dict[str, np.ndarray]]) -> Task:
    """A `Task` batch (NumPy arrays, leading axis M) from per-task dicts."""
    return Task(**{name: np.stack([row[name] for row in rows]) for name in rows[0]})


def _fingerprint(row: dict[str, np.ndarray]) -> bytes:
    return b"".join(np.ascontiguousarray(row[name]).tobytes() for name in sorted(row))


def generate_tasks(seed: int, count: int, kinds, split: TypeSplit, unseen: bool,
                   exclude: frozenset = frozenset(), stream: int = 0) -> Task:
    """`count` tasks cycling through `kinds`, none equal to a fingerprint in `exclude`.

    `seed` and `stream` (0 train, 1 test) seed the generator, so the two streams are independent.
    """
    kinds = tuple(int(k) for k in kinds)
    if count < 1:
        raise ValueError(f"generate_tasks: count must be >= 1, got {count}")
    if not kinds or any(k not in range(len(KINDS)) for k in kinds):
        raise ValueError(f"generate_tasks: kinds must be a non-empty subset of 0..{len(KINDS) - 1}, got {kinds}")
    rng = np.random.default_rng([seed, stream, 0x7A5C])
    rows: list[dict[str, np.ndarray]] = []
    while len(rows) < count:
        row = generate_task(rng, kinds[len(rows) % len(kinds)], split, unseen)
        if _fingerprint(row) not in exclude:
            rows.append(row)
    return stack_tasks(rows)


def level_kinds(level: str, held_out_kinds=DEFAULT_HELD_OUT_KINDS) -> tuple[tuple[int, ...], tuple[int, ...], bool]:
    """(train kinds, test kinds, test unseen) of `level`."""
    if level not in LEVELS:
        raise ValueError(f"household level must be one of {LEVELS}, got {level!r}")
    held_out = tuple(sorted(int(k) for k in held_out_kinds))
    if len(held_out) != 2 or len(set(held_out)) != 2 or any(k not in range(len(KINDS)) for k in held_out):
        raise ValueError(f"household held_out_kinds must be two different kinds in 0..5, got {held_out_kinds}")
    everything = tuple(range(len(KINDS)))
    if level in ("L2", "L2-seen"):
        return tuple(k for k in everything if k not in held_out), held_out, level == "L2"
    return everything, everything, level == "L1"


def level_splits(level: str, seed: int, num_train: int, num_test: int,
                 held_out_kinds=DEFAULT_HELD_OUT_KINDS) -> tuple[Task, Task]:
    """(train, test) task batches of `level`; the same arguments give identical arrays."""
    train_kinds, test_kinds, test_unseen = level_kinds(level, held_out_kinds)
    split = type_split(seed)
    train = generate_tasks(seed, num_train, train_kinds, split, unseen=False, stream=0)
    seen_prints = frozenset(fingerprint(train, i) for i in range(num_train))
    test = generate_tasks(seed, num_test, test_kinds, split, unseen=test_unseen, exclude=seen_prints, stream=1)
    return train, test


_FIELDS = tuple(f.name for f in dataclasses.fields(Task))


def fingerprint(tasks: Task, row: int) -> bytes:
    """Bytes identifying task `row` of a batch (equal bytes: the same task)."""
    return _fingerprint({name: np.asarray(getattr(tasks, name))[row] for name in _FIELDS})


def to_device(tasks: Task) -> Task:
    """The same batch with jnp arrays."""
    return jax.tree_util.tree_map(jnp.asarray, tasks)
