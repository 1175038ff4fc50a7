"""Household environment: step semantics and meta-tag step scores on hand-worked rooms."""

import pytest
import jax
import numpy as np

from derl_jax.domains.household import env as household_env
from derl_jax.domains.household import tasks as T
from derl_jax.domains.household import vocab

VOCAB = vocab.WordVocab()
ENV = household_env.HouseholdEnv(max_turns=30)
STEP = jax.jit(ENV.step)
RESET = jax.jit(ENV.reset)
ROOM = [("fridge", 1), ("microwave", 1), ("sinkbasin", 1), ("countertop", 1), ("cabinet", 1), ("desk", 1),
        ("cabinet", 2)]
# (object, number, receptacle slot in ROOM)
THINGS = [("apple", 1, 3), ("mug", 1, 4), ("desklamp", 1, 5), ("pen", 1, 3), ("apple", 2, 0)]


def hand_task(kind: int, goal_object: str, goal_receptacle: str | None, room=ROOM, things=THINGS) -> T.Task:
    def padded(values, length, fill):
        return np.array(list(values) + [fill] * (length - len(values)), np.int32)

    return T.Task(
        kind=np.int32(kind),
        goal_object=np.int32(vocab.OBJECT_NAMES.index(goal_object)),
        goal_receptacle=np.int32(-1 if goal_receptacle is None else vocab.RECEPTACLE_NAMES.index(goal_receptacle)),
        recep_type=padded([vocab.RECEPTACLE_NAMES.index(n) for n, _ in room], T.MAX_RECEPTACLES, -1),
        recep_num=padded([k for _, k in room], T.MAX_RECEPTACLES, 0),
        obj_type=padded([vocab.OBJECT_NAMES.index(n) for n, _, _ in things], T.MAX_OBJECTS, -1),
        obj_num=padded([k for _, k, _ in things], T.MAX_OBJECTS, 0),
        obj_loc=padded([r for _, _, r in things], T.MAX_OBJECTS, T.NOWHERE),
        description=VOCAB.encode_padded("put a apple in cabinet .", T.DESCRIPTION_LENGTH),
    )


class Episode:
    """Plays text actions through the jitted step and keeps what came back."""

    def __init__(self, task: T.Task):
        obs, self.state = RESET(jax.random.PRNGKey(0), task)
        self.obs = VOCAB.decode(obs)

    def act(self, action: str, expect: str | None = None):
        ids = VOCAB.encode(action)
        tokens = np.full(ENV.action_length, vocab.PAD_ID, np.int32)
        tokens[: len(ids)] = ids
        obs, self.state, self.reward, self.done, self.info = STEP(self.state, tokens)
        self.obs = VOCAB.decode(obs)
        if expect is not None:
            assert self.obs == expect, f"{action!r}: got {self.obs!r}, expected {expect!r}"
        return self

    def score(self) -> float:
        return float(self.info["step_score"])

    def valid(self) -> bool:
        return bool(self.info["valid"])


NOTHING = "nothing happens ."


def test_reset_lists_the_room():
    episode = Episode(hand_task(T.PICK, "apple", "cabinet"))
    assert episode.obs == ("you are in the middle of a room . looking quickly around you , you see a fridge 1 , "
                           "a microwave 1 , a sinkbasin 1 , a countertop 1 , a cabinet 1 , a desk 1 , a cabinet 2 .")
    assert int(episode.state.agent_loc) == -1 and int(episode.state.turn) == 0


@pytest.mark.slow
def test_go_take_put_open_close_and_failures():
    e = Episode(hand_task(T.PICK, "apple", "cabinet"))
    e.act("act take apple 1 from countertop 1", NOTHING)               # not there yet
    assert not e.valid() and int(e.state.turn) == 1 and not bool(e.done)
    e.act("act go to countertop 1",
          "you arrive at countertop 1 . on the countertop 1 , you see a apple 1 , a pen 1 .")
    e.act("act go to countertop 1", NOTHING)                           # already there
    e.act("act take apple 1 from countertop 1", "you pick up the apple 1 from the countertop 1 .")
    assert int(e.state.obj_loc[0]) == T.HELD
    e.act("act take pen 1 from countertop 1", NOTHING)                 # one object at a time
    e.act("act inventory", "you are carrying : a apple 1 .")
    e.act("act go to cabinet 1", "you arrive at cabinet 1 . the cabinet 1 is closed .")
    e.act("act put apple 1 in/on cabinet 1", NOTHING)                  # closed
    e.act("act close cabinet 1", NOTHING)                              # already closed
    e.act("act open cabinet 1", "you open the cabinet 1 . in it , you see a mug 1 .")
    e.act("act open cabinet 1", NOTHING)
    e.act("act examine cabinet 1", "on the cabinet 1 , you see a mug 1 .")
    e.act("act close cabinet 1", "you close the cabinet 1 .")
    e.act("act open cabinet 1", "you open the cabinet 1 . in it , you see a mug 1 .")
    assert not bool(e.done) and float(e.reward) == 0.0
    e.act("act put apple 1 in/on cabinet 1", "you put the apple 1 in/on the cabinet 1 .")
    assert bool(e.done) and float(e.reward) == 1.0 and float(e.info["success"]) == 1.0
    # A finished episode does not move on.
    e.act("act take mug 1 from cabinet 1")
    assert int(e.state.turn) == 15 and float(e.reward) == 0.0 and e.score() == 0.0


def test_heat_needs_the_microwave_clean_needs_the_sinkbasin_cool_needs_the_fridge():
    e = Episode(hand_task(T.HEAT, "apple", "countertop"))
    e.act("act go to fridge 1", "you arrive at fridge 1 . the fridge 1 is closed .")
    e.act("act open fridge 1", "you open the fridge 1 . in it , you see a apple 2 .")
    e.act("act take apple 2 from fridge 1", "you pick up the apple 2 from the fridge 1 .")
    e.act("act heat apple 2 with fridge 1", NOTHING)
    e.act("act heat apple 2 with microwave 1", NOTHING)                 # not at the microwave
    e.act("act go to sinkbasin 1", "you arrive at sinkbasin 1 . on the sinkbasin 1 , you see nothing .")
    e.act("act heat apple 2 with sinkbasin 1", NOTHING)
    e.act("act clean apple 2 with sinkbasin 1", "you clean the apple 2 using the sinkbasin 1 .")
    assert bool(e.state.obj_clean[4]) and not bool(e.state.obj_hot[4])
    e.act("act go to microwave 1", "you arrive at microwave 1 . the microwave 1 is closed .")
    e.act("act clean apple 2 with microwave 1", NOTHING)
    e.act("act heat apple 2 with microwave 1", "you heat the apple 2 using the microwave 1 .")
    assert bool(e.state.obj_hot[4])
    e.act("act go to fridge 1")
    e.act("act cool apple 2 with fridge 1", "you cool the apple 2 using the fridge 1 .")
    assert bool(e.state.obj_cool[4]) and not bool(e.state.obj_hot[4])      # cooling undoes heating
    e.act("act go to microwave 1")
    e.act("act heat apple 2 with microwave 1")
    e.act("act go to countertop 1")
    assert not bool(e.done)
    e.act("act put apple 2 in/on countertop 1", "you put the apple 2 in/on the countertop 1 .")
    assert bool(e.done) and float(e.reward) == 1.0


def test_a_pen_cannot_be_heated_and_an_unheated_apple_does_not_finish_heat_and_place():
    e = Episode(hand_task(T.HEAT, "apple", "desk"))
    e.act("act go to countertop 1").act("act take pen 1 from countertop 1")
    e.act("act go to microwave 1").act("act heat pen 1 with microwave 1", NOTHING)
    e.act("act go to countertop 1").act("act put pen 1 in/on countertop 1")
    e.act("act take apple 1 from countertop 1").act("act go to desk 1")
    e.act("act put apple 1 in/on desk 1", "you put the apple 1 in/on the desk 1 .")
    assert not bool(e.done) and float(e.reward) == 0.0


def test_examine_in_light_needs_a_lit_desklamp_where_the_object_is_held():
    e = Episode(hand_task(T.EXAMINE, "apple", None))
    e.act("act use desklamp 1", NOTHING)                                  # not at the desk
    e.act("act go to countertop 1").act("act take apple 1 from countertop 1")
    e.act("act examine apple 1", "there's nothing special about the apple 1 .")
    e.act("act go to desk 1", "you arrive at desk 1 . on the desk 1 , you see a desklamp 1 .")
    assert not bool(e.done)                                               # the lamp is off
    e.act("act take desklamp 1 from desk 1", NOTHING)                     # lamps are not pickable
    e.act("act use desklamp 1", "you turn on the desklamp 1 .")
    assert bool(e.done) and float(e.reward) == 1.0


def test_lamp_switched_on_first_then_arriving_with_the_object_succeeds():
    e = Episode(hand_task(T.EXAMINE, "pen", None))
    e.act("act go to desk 1").act("act use desklamp 1", "you turn on the desklamp 1 .")
    assert not bool(e.done)
    e.act("act go to countertop 1").act("act take pen 1 from countertop 1")
    assert not bool(e.done)                                               # lamp is elsewhere
    e.act("act go to desk 1")
    assert bool(e.done) and float(e.reward) == 1.0


def test_pick_two_needs_both_in_one_receptacle():
    e = Episode(hand_task(T.PICK_TWO, "apple", "cabinet"))
    e.act("act go to countertop 1").act("act take apple 1 from countertop 1")
    e.act("act go to cabinet 1").act("act open cabinet 1").act("act put apple 1 in/on cabinet 1")
    e.act("act go to fridge 1").act("act open fridge 1").act("act take apple 2 from fridge 1")
    e.act("act go to cabinet 2").act("act open cabinet 2").act("act put apple 2 in/on cabinet 2")
    assert not bool(e.done)                                               # one in each cabinet
    e.act("act take apple 2 from cabinet 2").act("act go to cabinet 1")
    e.act("act put apple 2 in/on cabinet 1")
    assert bool(e.done) and float(e.reward) == 1.0


def test_look_inventory_and_malformed_actions():
    e = Episode(hand_task(T.PICK, "apple", "cabinet"))
    e.act("act look", "you are in the middle of a room . looking quickly around you , you see a fridge 1 , "
                      "a microwave 1 , a sinkbasin 1 , a countertop 1 , a cabinet 1 , a desk 1 , a cabinet 2 .")
    e.act("act inventory", "you are not carrying anything .")
    e.act("act go to desk 1").act("act look", "you are facing the desk 1 . next to it , you see nothing .")
    for malformed in ["go to desk 1", "act go to", "act go desk 1", "act look look", "plan", "act take apple 1",
                      "act go to desk apple"]:
        e.act(malformed, NOTHING)
        assert float(e.info["well_formed"]) == 0.0 and e.score() == 0.0 and not e.valid(), malformed
    e.act("act go to safe 1", NOTHING)                                    # well-formed, no such thing
    assert float(e.info["well_formed"]) == 1.0 and not e.valid()
    e.act("act go to cabinet 9", NOTHING)
    assert float(e.info["well_formed"]) == 1.0 and not e.valid()


def test_tokens_after_eos_are_ignored():
    e = Episode(hand_task(T.PICK, "apple", "cabinet"))
    tokens = np.full(ENV.action_length, vocab.PAD_ID, np.int32)
    tokens[:6] = VOCAB.encode("plan go to desk 1", add_eos=True)
    tokens[6:] = VOCAB.encode("look look")
    _, _, _, _, info = STEP(e.state, tokens)
    assert float(info["valid"]) == 1.0 and float(info["step_score"]) == 1.0


def test_tag_scores_follow_the_rules():
    e = Episode(hand_task(T.CLEAN, "apple", "cabinet"))
    # Turn 0: plan is right; go to an unvisited place is also explore.
    assert Episode(hand_task(T.CLEAN, "apple", "cabinet")).act("plan go to desk 1").score() == 1.0
    assert Episode(hand_task(T.CLEAN, "apple", "cabinet")).act("explore go to desk 1").score() == 1.0
    assert Episode(hand_task(T.CLEAN, "apple", "cabinet")).act("act go to desk 1").score() == 0.0
    assert Episode(hand_task(T.CLEAN, "apple", "cabinet")).act("reflect go to desk 1").score() == 0.0
    assert Episode(hand_task(T.CLEAN, "apple", "cabinet")).act("act look").score() == 0.0
    assert Episode(hand_task(T.CLEAN, "apple", "cabinet")).act("plan look").score() == 1.0
    e.act("plan go to countertop 1")
    assert e.score() == 1.0
    # Reaching an unvisited place is explore; act is wrong there.
    assert e.act("explore go to desk 1").score() == 1.0
    assert e.act("act go to countertop 1").score() == 1.0             # visited before: act is right
    assert e.act("explore go to desk 1").score() == 0.0               # ... and explore is wrong
    # A failed action: the next step is reflect.
    e.act("act take apple 1 from countertop 1", NOTHING)
    assert e.score() == 1.0                                            # failing does not change its own tag
    assert e.act("act go to countertop 1").score() == 0.0
    e.act("act take apple 1 from countertop 1")                       # completes the subgoal "hold"
    assert e.valid() and e.score() == 1.0
    assert e.act("act go to sinkbasin 1").score() == 0.0               # plan (after a subgoal) expected
    e.act("plan clean apple 1 with microwave 1", NOTHING)
    assert e.score() == 0.0                                            # not after a subgoal any more
    e.act("reflect clean apple 1 with sinkbasin 1")
    assert e.valid() and e.score() == 1.0                              # after a failure; completes "clean"
    e.act("plan go to cabinet 1")                                      # plan right after a subgoal
    assert e.score() == 1.0
    e.act("explore open cabinet 1")                                    # never-opened receptacle
    assert e.valid() and e.score() == 1.0
    e.act("act close cabinet 1").act("act open cabinet 1")
    assert e.score() == 1.0                                            # opened before: act
    e.act("explore go to fridge 1").act("explore open fridge 1")
    assert e.valid() and e.score() == 1.0


def test_unsuccessful_explore_is_not_explore():
    e = Episode(hand_task(T.CLEAN, "apple", "cabinet"))
    e.act("plan look")
    e.act("explore open cabinet 1", NOTHING)                           # not there: fails, not explore
    assert e.score() == 0.0
