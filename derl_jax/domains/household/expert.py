"""A scripted expert, its perturbed version, and jitted vmapped episode rollouts.

`expert_action(state)` returns the next action with a correct tag; it decides from the current
state only, so it recovers after any detour. It acts only on what it has seen: an object's place
is known once the agent has stood at that receptacle while it was open (the observation listed
its contents). Until the object it needs is known it searches: the receptacles in the order the
room lists them, skipping searched ones, opening closed ones. So every action it takes can be
read off the prompt (the room listing, the last actions and observations), which is what makes
it a demonstrator a policy can imitate. Its plan for one goal object: find it, go to it, open its
receptacle if closed, take it; for clean / heat / cool go to the appliance and use it; for
examine find the lamp, go to it and switch it on; otherwise go to the goal receptacle (the first
of that type), open it if closed, and put the object in. Holding something else, it puts it
down where it stands first.

`perturbed_policy(rate)(state, key)`: with probability `rate` a random action instead (a random
template over random entities of the room with a random tag, often invalid; one in five is a
random token string), else the expert's.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from derl_jax.domains.household import actions as A
from derl_jax.domains.household import vocab
from derl_jax.domains.household.env import (TAG_PRIORITY, HouseholdEnv, HouseholdState, acceptable_tags,
                                            accessible, held_object)
from derl_jax.domains.household.tasks import CLEAN, COOL, EXAMINE, HEAT, PICK_TWO, Task

Policy = Callable[[HouseholdState, jax.Array], jax.Array]
RANDOM_DRAWS = 7 + A.ACTION_LENGTH   # uniforms behind one random action, plus the perturbation coin


def _first(mask: jax.Array) -> jax.Array:
    """Index of the first True of bool[K], or -1."""
    return jnp.where(jnp.any(mask), jnp.argmax(mask), -1).astype(jnp.int32)


def expert_choice(state: HouseholdState) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(template, object slot, receptacle slot) of the expert's next action, each i32[]."""
    task = state.task
    kind, here = task.kind, state.agent_loc
    is_goal = (task.obj_type == task.goal_object) & (task.obj_type >= 0)
    target_recep = _first(task.recep_type == task.goal_receptacle)
    appliance_type = jnp.select([kind == CLEAN, kind == HEAT], [vocab.SINK, vocab.MICROWAVE], vocab.FRIDGE)
    appliance = _first(task.recep_type == appliance_type)
    treated = jnp.select([kind == CLEAN, kind == HEAT], [state.obj_clean, state.obj_hot], state.obj_cool)
    needs_treatment = (kind >= CLEAN) & (kind <= COOL)
    lamp = _first(jnp.asarray(vocab.LIGHT_SOURCE)[jnp.maximum(task.obj_type, 0)] & (task.obj_type >= 0))
    lamp_loc = state.obj_loc[jnp.maximum(lamp, 0)]
    is_open = accessible(state)
    searched = state.visited & is_open & (task.recep_type >= 0)           # bool[R]: contents seen
    seen = (state.obj_loc >= 0) & searched[jnp.maximum(state.obj_loc, 0)]   # bool[Ob]
    unsearched = _first((task.recep_type >= 0) & ~searched)
    search_step = (jnp.where(here == unsearched, A.OPEN, A.GO), jnp.int32(0), jnp.maximum(unsearched, 0))

    def go_or(dest, template_there, obj, recep_there):
        """Go to `dest`; once there open it if it is closed and the action needs it, else act."""
        closed_there = ~is_open[jnp.maximum(dest, 0)]
        needs_open = (template_there == A.TAKE) | (template_there == A.PUT)
        template = jnp.select([here != dest, closed_there & needs_open], [A.GO, A.OPEN], template_there)
        return template, obj, jnp.where(template == A.GO, dest, recep_there)

    holding = held_object(state)
    held = jnp.maximum(holding, 0)
    # Holding a goal object.
    examine_step = _either(seen[jnp.maximum(lamp, 0)], go_or(lamp_loc, A.USE, lamp, lamp_loc), search_step)
    treat_template = jnp.select([kind == CLEAN, kind == HEAT], [A.CLEAN, A.HEAT], A.COOL)
    treat_step = go_or(appliance, treat_template, held, appliance)
    place_step = go_or(target_recep, A.PUT, held, target_recep)
    goal_step = jax.tree_util.tree_map(
        lambda *xs: jnp.select([kind == EXAMINE, needs_treatment & ~treated[held]], list(xs[:2]), xs[2]),
        examine_step, treat_step, place_step)
    # Holding something else: put it down here (open the receptacle first), or go somewhere first.
    drop_spot = jnp.where(here >= 0, here, 0)
    drop_step = go_or(drop_spot, A.PUT, held, drop_spot)
    # Hands free: fetch the first goal object not already where pick_two wants it.
    wanted = is_goal & ~((kind == PICK_TWO) & (state.obj_loc == target_recep))
    fetch = _first(wanted & seen)
    at = state.obj_loc[jnp.maximum(fetch, 0)]
    fetch_step = _either(fetch >= 0, go_or(at, A.TAKE, jnp.maximum(fetch, 0), at), search_step)
    return jax.tree_util.tree_map(
        lambda g, d, f: jnp.where(holding >= 0, jnp.where(is_goal[held], g, d), f).astype(jnp.int32),
        goal_step, drop_step, fetch_step)


def _either(condition: jax.Array, then, otherwise):
    """The (template, object, receptacle) triple `then` where `condition` holds, else `otherwise`."""
    return tuple(jnp.where(condition, a, b).astype(jnp.int32) for a, b in zip(then, otherwise))


def tagged(state: HouseholdState, template, obj, recep) -> jax.Array:
    """i32[A]: the action with the first correct tag (plan, reflect, explore, act), assuming it succeeds."""
    parsed = A.ParsedAction(tag=jnp.int32(0), template=template, obj=obj, recep=recep, well_formed=jnp.bool_(True))
    tags = acceptable_tags(state, parsed, jnp.bool_(True))
    priority = jnp.asarray(TAG_PRIORITY)
    tag = priority[jnp.argmax(tags[priority])]
    return A.make_action(tag, template, obj, recep, state.task)


def expert_action(state: HouseholdState, key: jax.Array | None = None) -> jax.Array:
    """i32[A]: the expert's next action (`key` unused; it is a `Policy`)."""
    del key
    return tagged(state, *expert_choice(state))


def _pick(uniform: jax.Array, allowed: jax.Array) -> jax.Array:
    """Index of a uniformly chosen True of bool[K] (at least one True), from `uniform` in [0, 1)."""
    rank = jnp.floor(uniform * jnp.sum(allowed)).astype(jnp.int32)
    return jnp.argmax(jnp.cumsum(allowed) > rank).astype(jnp.int32)


def random_action(state: HouseholdState, key: jax.Array) -> jax.Array:
    """i32[A]: a random template over random room entities with a random tag, or (one in five) a
    random word string. All draws come from one call to the generator (cheap to compile)."""
    return _random_action(state, jax.random.uniform(key, (RANDOM_DRAWS,)))


def _random_action(state: HouseholdState, u: jax.Array) -> jax.Array:
    """`random_action` from uniforms u f32[RANDOM_DRAWS] (the last one is left for the caller)."""
    task = state.task
    template = jnp.floor(u[0] * len(A.TEMPLATE_TEXT)).astype(jnp.int32)
    tag = jnp.floor(u[1] * len(vocab.TAGS)).astype(jnp.int32)
    formed = A.make_action(tag, template, _pick(u[2], task.obj_type >= 0), _pick(u[3], task.recep_type >= 0), task)
    first_word = len(vocab.SPECIALS)
    soup = (first_word + jnp.floor(u[6:-1] * (vocab.VOCAB_SIZE - first_word))).astype(jnp.int32)
    soup_length = 1 + jnp.floor(u[4] * A.BODY_LENGTH)     # room for the <eos> a completion ends with
    soup = jnp.where(jnp.arange(A.ACTION_LENGTH) < soup_length, soup, vocab.PAD_ID)
    return jnp.where(u[5] < 0.2, soup, formed).astype(jnp.int32)


def perturbed_policy(rate) -> Policy:
    """The expert, replaced by `random_action` with probability `rate` (f32[], may be traced) at every turn."""
    def policy(state: HouseholdState, key: jax.Array) -> jax.Array:
        u = jax.random.uniform(key, (RANDOM_DRAWS,))
        return jnp.where(u[-1] < rate, _random_action(state, u), expert_action(state))
    return policy


def rollout(env: HouseholdEnv, tasks: Task, key: jax.Array, policy: Policy = expert_action) -> dict:
    """Play one episode per task (M tasks) for env.max_turns turns under `policy`, vmapped.

    Returns NumPy-able arrays: obs i32[M, S+1, O] (obs[:, t] is what the policy saw at turn t),
    actions i32[M, S, A], step_scores f32[M, S], step_mask bool[M, S] (turns taken before done),
    valid f32[M, S], success f32[M], reward f32[M, S]. Jit it with `env` and `policy` static.
    """
    def episode(task, episode_key):
        obs0, state0 = env.reset(episode_key, task)

        def turn(carry, turn_key):
            obs, state = carry
            action = policy(state, turn_key)
            next_obs, next_state, reward, done, info = env.step(state, action)
            out = {"obs": obs, "action": action, "step_score": info["step_score"], "taken": ~state.done,
                   "valid": info["valid"], "reward": reward}
            return (next_obs, next_state), out

        (last_obs, last_state), steps = jax.lax.scan(turn, (obs0, state0), jax.random.split(episode_key, env.max_turns))
        return {
            "obs": jnp.concatenate([steps["obs"], last_obs[None]]),
            "actions": steps["action"],
            "step_scores": steps["step_score"],
            "step_mask": steps["taken"],
            "valid": steps["valid"],
            "reward": steps["reward"],
            "success": last_state.success.astype(jnp.float32),
        }

    keys = jax.random.split(key, tasks.kind.shape[0])
    return jax.vmap(episode)(tasks, keys)
