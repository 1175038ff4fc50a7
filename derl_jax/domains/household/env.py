"""The household environment: ALFWorld's rules as pure JAX functions on a `flax.struct` state.

    env = HouseholdEnv(max_turns=30)
    obs, state = env.reset(key, task)                         # task: one `Task`
    obs, state, reward, done, info = env.step(state, action)  # action: i32[A]

Observations are i32[O] word ids (right-padded); actions are i32[A] (see actions.py). Both calls
are jit- and vmap-able. Rules (ALFWorld's): the agent starts in the middle of the room; it can
`go to` a receptacle, `open` / `close` openable ones it stands at, `take` one object at a time
from the receptacle it stands at (open or not openable), `put` the held object there, `use` a
lamp standing there, `clean` / `heat` / `cool` the held object with the sinkbasin / microwave /
fridge it stands at, `examine` a visible object or the receptacle it stands at, `look`, and
`inventory`. An action that breaks a rule, names a missing entity or is malformed answers
"nothing happens ." and costs a turn. Going to where the agent already is fails.

Goals (checked after every step; the episode ends with reward 1 when met, or at max_turns):
  pick / clean / heat / cool:  an object of the goal type (clean / hot / cool) in a receptacle
                               of the goal type;
  examine:                     holding an object of the goal type where a lamp is on;
  pick_two:                    two objects of the goal type in one receptacle of the goal type.

Meta-tags and step scores (after RLVMR). The correct tags of a step are
  plan     the first step, or the step right after one that completed a subgoal (a rise of
           `progress`: holding the goal object, treating it, placing it; pick_two counts each);
  reflect  the step right after a failed action;
  explore  the action reached an unvisited receptacle or opened a never-opened one;
  act      none of the three above.
A step scores 1 when its action is well-formed and its tag is one of the correct ones.

Self-assessment (Self-Guide; `self_guide=True`): every action starts with one more word, the
policy's assessment of its progress so far (vocab.ASSESSMENTS: progress+ / progress= /
progress-), then the tagged action as above (action_length 9). The assessment maps to the
internal reward `self_rewards` (+0.1 / 0 / -0.1 by default), reported as info["self_reward"];
an action without an assessment word is malformed and its self-reward is 0.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import jax
import jax.numpy as jnp
from flax import struct

from derl_jax.domains import selfguide
from derl_jax.domains.household import actions as A
from derl_jax.domains.household import text, vocab
from derl_jax.domains.household.tasks import (CLEAN, COOL, EXAMINE, HEAT, HELD, PICK_TWO, Task)

OBS_LENGTH = 64
TASK_FIELDS = tuple(field.name for field in dataclasses.fields(Task))
TAG_PRIORITY = (vocab.PLAN, vocab.REFLECT, vocab.EXPLORE, vocab.ACT_TAG)


@struct.dataclass
class HouseholdState:
    """task: the episode's `Task`; obj_loc i32[Ob] (receptacle slot or HELD); obj_clean / obj_hot /
    obj_cool / lamp_on bool[Ob]; recep_open / visited / opened bool[R] (opened: ever opened);
    agent_loc i32[] (-1: middle of the room); turn i32[]; progress i32[] (best subgoal count so
    far); subgoal_done / last_failed / done / success bool[] (of the last step)."""

    task: Task
    obj_loc: jax.Array
    obj_clean: jax.Array
    obj_hot: jax.Array
    obj_cool: jax.Array
    lamp_on: jax.Array
    recep_open: jax.Array
    visited: jax.Array
    opened: jax.Array
    agent_loc: jax.Array
    turn: jax.Array
    progress: jax.Array
    subgoal_done: jax.Array
    last_failed: jax.Array
    done: jax.Array
    success: jax.Array


def _table(values, index):
    return jnp.asarray(values)[jnp.maximum(index, 0)]


def accessible(state: HouseholdState) -> jax.Array:
    """bool[R]: receptacles whose contents can be reached (not openable, or open)."""
    return ~_table(vocab.OPENABLE, state.task.recep_type) | state.recep_open


def held_object(state: HouseholdState) -> jax.Array:
    """i32[]: slot of the held object, or -1."""
    holding = state.obj_loc == HELD
    return jnp.where(jnp.any(holding), jnp.argmax(holding), -1).astype(jnp.int32)


def visible_here(state: HouseholdState) -> jax.Array:
    """bool[Ob]: objects in the receptacle the agent stands at, if it is accessible."""
    here = state.agent_loc
    return (state.obj_loc == here) & (here >= 0) & accessible(state)[jnp.maximum(here, 0)]


def goal_status(state: HouseholdState) -> tuple[jax.Array, jax.Array]:
    """(success bool[], progress i32[]) of the state's task."""
    task = state.task
    is_goal = (task.obj_type == task.goal_object) & (task.obj_type >= 0)
    kind = task.kind
    treated = jnp.select([kind == CLEAN, kind == HEAT, kind == COOL],
                         [state.obj_clean, state.obj_hot, state.obj_cool], jnp.ones_like(is_goal))
    in_goal_recep = (state.obj_loc >= 0) & (_table(task.recep_type, state.obj_loc) == task.goal_receptacle)
    placed = is_goal & treated & in_goal_recep
    per_recep = jnp.sum(placed[None, :] & (state.obj_loc[None, :] == jnp.arange(task.recep_type.shape[0])[:, None]),
                        axis=1)
    holding_goal = jnp.any(is_goal & (state.obj_loc == HELD))
    lamp_lit_here = jnp.any(_table(vocab.LIGHT_SOURCE, task.obj_type) & state.lamp_on & (task.obj_type >= 0)
                            & (state.obj_loc == state.agent_loc) & (state.agent_loc >= 0))
    success = jnp.select(
        [kind == EXAMINE, kind == PICK_TWO],
        [holding_goal & lamp_lit_here, jnp.max(per_recep) >= 2],
        jnp.any(placed),
    )
    treated_any = jnp.any(is_goal & treated) & (kind >= CLEAN) & (kind <= COOL)
    most_placed = jnp.minimum(jnp.max(per_recep), 2)
    progress = jnp.select(
        [success, kind == PICK_TWO, treated_any],
        [jnp.where(kind == PICK_TWO, 4, jnp.where((kind >= CLEAN) & (kind <= COOL), 3, 2)),
         2 * most_placed + holding_goal, 2],
        holding_goal.astype(jnp.int32),
    )
    return success, progress.astype(jnp.int32)


def acceptable_tags(state: HouseholdState, parsed: A.ParsedAction, succeeded: jax.Array) -> jax.Array:
    """bool[4]: which tags (plan, explore, reflect, act) are correct for this step from `state`."""
    recep = jnp.maximum(parsed.recep, 0)
    plan = (state.turn == 0) | state.subgoal_done
    reflect = state.last_failed
    explore = succeeded & (((parsed.template == A.GO) & ~state.visited[recep])
                           | ((parsed.template == A.OPEN) & ~state.opened[recep]))
    return jnp.stack([plan, explore, reflect, ~(plan | explore | reflect)])


def observe(state: HouseholdState, fmt: jax.Array, obj: jax.Array, recep: jax.Array, length: int) -> jax.Array:
    """i32[length]: observation format `fmt` (text.FORMAT) naming object slot `obj` and receptacle
    slot `recep` of `state`'s room (see text.py)."""
    task = state.task
    obj_words = jnp.stack([_table(vocab.OBJECT_WORD, task.obj_type), jnp.asarray(vocab.NUMBER_WORD)[task.obj_num]], 1)
    rec_words = jnp.stack([_table(vocab.RECEPTACLE_WORD, task.recep_type),
                           jnp.asarray(vocab.NUMBER_WORD)[task.recep_num]], 1)
    r = jnp.maximum(recep, 0)
    entities = jnp.stack([jnp.zeros(2, jnp.int32), obj_words[jnp.maximum(obj, 0)], rec_words[r],
                          obj_words[jnp.maximum(held_object(state), 0)], rec_words[jnp.maximum(state.agent_loc, 0)]])
    objects = text.listing(obj_words[:, 0], task.obj_num, (state.obj_loc == r) & (task.obj_type >= 0))
    room = text.listing(rec_words[:, 0], task.recep_num, task.recep_type >= 0)
    return text.render(fmt, entities, objects, room, length)


def _format(state: HouseholdState, p: A.ParsedAction, ok: jax.Array) -> jax.Array:
    """i32[]: the observation format of the step (text.FORMAT)."""
    F = text.FORMAT
    is_open = accessible(state)[jnp.maximum(p.recep, 0)]
    by_template = jnp.array([F["arrive_open"], F["take"], F["put"], F["open"], F["close"], F["use"], F["clean"],
                             F["heat"], F["cool"], F["examine_object"], F["examine_open"], F["look_middle"],
                             F["carrying"]], jnp.int32)
    fmt = by_template[jnp.maximum(p.template, 0)]
    fmt = jnp.where((fmt == F["arrive_open"]) & ~is_open, F["arrive_closed"], fmt)
    fmt = jnp.where((fmt == F["examine_open"]) & ~is_open, F["examine_closed"], fmt)
    fmt = jnp.where((fmt == F["look_middle"]) & (state.agent_loc >= 0), F["look_at"], fmt)
    fmt = jnp.where((fmt == F["carrying"]) & (held_object(state) < 0), F["carrying_nothing"], fmt)
    return jnp.where(ok, fmt, F["nothing_happens"]).astype(jnp.int32)


def _apply(state: HouseholdState, p: A.ParsedAction):
    """(ok bool[], state after a successful action) for every template; the caller selects by template."""
    task = state.task
    o, r = jnp.maximum(p.obj, 0), jnp.maximum(p.recep, 0)
    has_o, has_r = p.obj >= 0, p.recep >= 0
    here = state.agent_loc
    holding = held_object(state)
    obj_type = task.obj_type[o]
    at_r = has_r & (here == r)
    reachable_o = has_o & (state.obj_loc[o] == here) & (here >= 0) & accessible(state)[jnp.maximum(here, 0)]
    openable_r = _table(vocab.OPENABLE, task.recep_type[r])
    held_o = has_o & (state.obj_loc[o] == HELD)
    rtype = task.recep_type[r]
    treat = [(A.CLEAN, vocab.SINK, vocab.CLEANABLE, "obj_clean"), (A.HEAT, vocab.MICROWAVE, vocab.HEATABLE, "obj_hot"),
             (A.COOL, vocab.FRIDGE, vocab.COOLABLE, "obj_cool")]
    branches = {
        A.GO: (has_r & (here != r), dataclasses.replace(state, agent_loc=r, visited=state.visited.at[r].set(True))),
        A.TAKE: (at_r & reachable_o & (holding < 0) & _table(vocab.PICKABLE, obj_type),
                 dataclasses.replace(state, obj_loc=state.obj_loc.at[o].set(HELD))),
        A.PUT: (at_r & held_o & accessible(state)[r], dataclasses.replace(state, obj_loc=state.obj_loc.at[o].set(r))),
        A.OPEN: (at_r & openable_r & ~state.recep_open[r],
                 dataclasses.replace(state, recep_open=state.recep_open.at[r].set(True),
                                     opened=state.opened.at[r].set(True))),
        A.CLOSE: (at_r & openable_r & state.recep_open[r],
                  dataclasses.replace(state, recep_open=state.recep_open.at[r].set(False))),
        A.USE: (reachable_o & _table(vocab.LIGHT_SOURCE, obj_type) & ~state.lamp_on[o],
                dataclasses.replace(state, lamp_on=state.lamp_on.at[o].set(True))),
        A.EXAMINE_OBJECT: (held_o | reachable_o, state),
        A.EXAMINE_RECEPTACLE: (at_r, state),
        A.LOOK: (jnp.bool_(True), state),
        A.INVENTORY: (jnp.bool_(True), state),
    }
    for template, device, able, field in treat:
        after = {"obj_clean": state.obj_clean, "obj_hot": state.obj_hot, "obj_cool": state.obj_cool}
        after[field] = after[field].at[o].set(True)
        if field != "obj_clean":  # heating and cooling undo each other
            other = "obj_cool" if field == "obj_hot" else "obj_hot"
            after[other] = after[other].at[o].set(False)
        branches[template] = (at_r & held_o & (rtype == device) & _table(able, obj_type),
                              dataclasses.replace(state, **after))
    return [branches[t] for t in range(len(A.TEMPLATE_TEXT))]


@dataclasses.dataclass(frozen=True)
class HouseholdEnv:
    """The JAX household environment (implements derl_jax.domains.env.JaxEnv)."""

    max_turns: int = 30
    obs_length: int = OBS_LENGTH
    action_length: int | None = None       # None: A.ACTION_LENGTH, plus one with self_guide
    self_guide: bool = False
    self_rewards: tuple[float, float, float] = selfguide.DEFAULT_SELF_REWARDS

    def __post_init__(self):
        if self.max_turns < 1:
            raise ValueError(f"HouseholdEnv: max_turns must be >= 1, got {self.max_turns}")
        expected = A.ACTION_LENGTH + int(bool(self.self_guide))
        if self.action_length is None:
            object.__setattr__(self, "action_length", expected)
        if self.obs_length < OBS_LENGTH or self.action_length != expected:
            raise ValueError(f"HouseholdEnv: obs_length must be >= {OBS_LENGTH} and action_length "
                             f"{expected}, got {self.obs_length} and {self.action_length}")
        object.__setattr__(self, "self_rewards",
                           selfguide.checked_rewards(self.self_rewards, "HouseholdEnv: self_rewards"))

    def reset(self, key: jax.Array, task: Task) -> tuple[jax.Array, HouseholdState]:
        """(obs i32[O], state) in the middle of the room of `task` (a `Task` or a mapping with its
        fields; `key` is unused: the task fixes everything)."""
        del key
        if isinstance(task, Mapping):   # a row of a dataset's context: the fields of `Task`
            task = Task(**{name: task[name] for name in TASK_FIELDS})
        task = jax.tree_util.tree_map(jnp.asarray, task)
        num_obj, num_rec = task.obj_type.shape[0], task.recep_type.shape[0]
        no_obj, no_rec, false = jnp.zeros(num_obj, bool), jnp.zeros(num_rec, bool), jnp.bool_(False)
        state = HouseholdState(task=task, obj_loc=task.obj_loc, obj_clean=no_obj, obj_hot=no_obj, obj_cool=no_obj,
                               lamp_on=no_obj, recep_open=no_rec, visited=no_rec, opened=no_rec,
                               agent_loc=jnp.int32(-1), turn=jnp.int32(0), progress=jnp.int32(0),
                               subgoal_done=false, last_failed=false, done=false, success=false)
        return observe(state, jnp.int32(text.FORMAT["look_middle"]), jnp.int32(0), jnp.int32(0), self.obs_length), state

    def step(self, state: HouseholdState, action: jax.Array):
        """(obs i32[O], state, reward f32[], done bool[], info) after `action` i32[A].

        info: step_score f32[] (well-formed and correctly tagged), success f32[] (task solved),
        valid f32[] (the action succeeded), well_formed f32[], tags bool[4] (correct tags); with
        self_guide also assessment i32[] (index into vocab.ASSESSMENTS, -1 when missing) and
        self_reward f32[] (its internal reward).
        A step from a finished episode changes nothing and scores 0.
        """
        if self.self_guide:
            action = A.truncate_at_eos(action.astype(jnp.int32))
            assessment = jnp.asarray(vocab.WORD_ASSESSMENT)[action[0]]
            action = action[1:]
        parsed = A.parse_action(action, state.task)
        if self.self_guide:
            parsed = parsed.replace(well_formed=parsed.well_formed & (assessment >= 0))
        outcomes = _apply(state, parsed)
        template = jnp.maximum(parsed.template, 0)
        ok = parsed.well_formed & jnp.stack([b[0] for b in outcomes])[template]
        moved = {}
        for field in dataclasses.fields(HouseholdState):
            value = getattr(state, field.name)
            for index, (_, branch_state) in enumerate(outcomes):   # only the branches that change the field
                if getattr(branch_state, field.name) is not getattr(state, field.name):
                    value = jnp.where(template == index, getattr(branch_state, field.name), value)
            moved[field.name] = value
        moved = HouseholdState(**moved)
        obs = observe(state, _format(state, parsed, ok), parsed.obj, parsed.recep, self.obs_length)
        tags = acceptable_tags(state, parsed, ok)
        tag_ok = tags[jnp.maximum(parsed.tag, 0)] & (parsed.tag >= 0)
        after = jax.tree_util.tree_map(lambda new, old: jnp.where(ok, new, old), moved, state)
        success, progress = goal_status(after)
        done = success | (state.turn + 1 >= self.max_turns)
        after = dataclasses.replace(after, turn=state.turn + 1, progress=jnp.maximum(state.progress, progress),
                                    subgoal_done=progress > state.progress, last_failed=~ok, done=done,
                                    success=success)
        live = ~state.done
        new_state = jax.tree_util.tree_map(lambda new, old: jnp.where(live, new, old), after, state)
        info = {
            "step_score": (live & parsed.well_formed & tag_ok).astype(jnp.float32),
            "success": new_state.success.astype(jnp.float32),
            "valid": (live & ok).astype(jnp.float32),
            "well_formed": parsed.well_formed.astype(jnp.float32),
            "tags": tags,
        }
        if self.self_guide:
            info["assessment"] = assessment
            info["self_reward"] = selfguide.self_reward(assessment, self.self_rewards, live, xp=jnp)
        reward = (live & success).astype(jnp.float32)
        return obs, new_state, reward, new_state.done, info
