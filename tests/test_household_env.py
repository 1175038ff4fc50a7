"""Household environment: step semantics and meta-tag step scores on hand-worked rooms."""

import jax
import numpy as np

from derl_jax.domains.household import env as household_env
from derl_jax.domains.household import tasks as T
from derl_jax.domains.household import vocab

VOCAB = vocab.WordVocab()
ENV = household_env.HouseholdEnv(max_turns=30)
STEP = jax.jit(ENV.step)
RESET = jax.jit(ENV.reset)
ROOM = [("metal fridge", 1), ("metal microwave", 1), ("metal sinkbasin", 1), ("wooden countertop", 1), ("wooden cabinet", 1), ("wooden desk", 1),
        ("wooden cabinet", 2)]
# (object, number, receptacle slot in ROOM)
THINGS = [("red apple", 1, 3), ("red mug", 1, 4), ("red desklamp", 1, 5), ("red pen", 1, 3), ("red apple", 2, 0)]


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
        description=VOCAB.encode_padded("put a red apple in wooden cabinet .", T.DESCRIPTION_LENGTH),
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
    episode = Episode(hand_task(T.PICK, "red apple", "wooden cabinet"))
    assert episode.obs == ("you are in the middle of a room . looking quickly around you , you see a metal fridge 1 , "
                           "a metal microwave 1 , a metal sinkbasin 1 , a wooden countertop 1 , a wooden cabinet 1 , a wooden desk 1 , a wooden cabinet 2 .")
    assert int(episode.state.agent_loc) == -1 and int(episode.state.turn) == 0


def test_go_take_put_open_close_and_failures():
    e = Episode(hand_task(T.PICK, "red apple", "wooden cabinet"))
    e.act("act take red apple 1 from wooden countertop 1", NOTHING)               # not there yet
    assert not e.valid() and int(e.state.turn) == 1 and not bool(e.done)
    e.act("act go to wooden countertop 1",
          "you arrive at wooden countertop 1 . on the wooden countertop 1 , you see a red apple 1 , a red pen 1 .")
    e.act("act go to wooden countertop 1", NOTHING)                           # already there
    e.act("act take red apple 1 from wooden countertop 1", "you pick up the red apple 1 from the wooden countertop 1 .")
    assert int(e.state.obj_loc[0]) == T.HELD
    e.act("act take red pen 1 from wooden countertop 1", NOTHING)                 # one object at a time
    e.act("act put red apple 1 in/on wooden countertop 1").act("act take blue apple 1 from wooden countertop 1",
                                                            NOTHING)             # only the red variant is here
    e.act("act take red apple 1 from wooden countertop 1")
    e.act("act inventory", "you are carrying : a red apple 1 .")
    e.act("act go to wooden cabinet 1", "you arrive at wooden cabinet 1 . the wooden cabinet 1 is closed .")
    e.act("act put red apple 1 in/on wooden cabinet 1", NOTHING)                  # closed
    e.act("act close wooden cabinet 1", NOTHING)                              # already closed
    e.act("act open wooden cabinet 1", "you open the wooden cabinet 1 . in it , you see a red mug 1 .")
    e.act("act open wooden cabinet 1", NOTHING)
    e.act("act examine wooden cabinet 1", "on the wooden cabinet 1 , you see a red mug 1 .")
    e.act("act close wooden cabinet 1", "you close the wooden cabinet 1 .")
    e.act("act open wooden cabinet 1", "you open the wooden cabinet 1 . in it , you see a red mug 1 .")
    assert not bool(e.done) and float(e.reward) == 0.0
    e.act("act put red apple 1 in/on wooden cabinet 1", "you put the red apple 1 in/on the wooden cabinet 1 .")
    assert bool(e.done) and float(e.reward) == 1.0 and float(e.info["success"]) == 1.0
    # A finished episode does not move on.
    e.act("act take red mug 1 from wooden cabinet 1")
    assert int(e.state.turn) == 18 and float(e.reward) == 0.0 and e.score() == 0.0


def test_heat_needs_the_microwave_clean_needs_the_sinkbasin_cool_needs_the_fridge():
    e = Episode(hand_task(T.HEAT, "red apple", "wooden countertop"))
    e.act("act go to metal fridge 1", "you arrive at metal fridge 1 . the metal fridge 1 is closed .")
    e.act("act open metal fridge 1", "you open the metal fridge 1 . in it , you see a red apple 2 .")
    e.act("act take red apple 2 from metal fridge 1", "you pick up the red apple 2 from the metal fridge 1 .")
    e.act("act heat red apple 2 with metal fridge 1", NOTHING)
    e.act("act heat red apple 2 with metal microwave 1", NOTHING)                 # not at the metal microwave
    e.act("act go to metal sinkbasin 1", "you arrive at metal sinkbasin 1 . on the metal sinkbasin 1 , you see nothing .")
    e.act("act heat red apple 2 with metal sinkbasin 1", NOTHING)
    e.act("act clean red apple 2 with metal sinkbasin 1", "you clean the red apple 2 using the metal sinkbasin 1 .")
    assert bool(e.state.obj_clean[4]) and not bool(e.state.obj_hot[4])
    e.act("act go to metal microwave 1", "you arrive at metal microwave 1 . the metal microwave 1 is closed .")
    e.act("act clean red apple 2 with metal microwave 1", NOTHING)
    e.act("act heat red apple 2 with metal microwave 1", "you heat the red apple 2 using the metal microwave 1 .")
    assert bool(e.state.obj_hot[4])
    e.act("act go to metal fridge 1")
    e.act("act cool red apple 2 with metal fridge 1", "you cool the red apple 2 using the metal fridge 1 .")
    assert bool(e.state.obj_cool[4]) and not bool(e.state.obj_hot[4])      # cooling undoes heating
    e.act("act go to metal microwave 1")
    e.act("act heat red apple 2 with metal microwave 1")
    e.act("act go to wooden countertop 1")
    assert not bool(e.done)
    e.act("act put red apple 2 in/on wooden countertop 1", "you put the red apple 2 in/on the wooden countertop 1 .")
    assert bool(e.done) and float(e.reward) == 1.0


def test_a_pen_cannot_be_heated_and_an_unheated_apple_does_not_finish_heat_and_place():
    e = Episode(hand_task(T.HEAT, "red apple", "wooden desk"))
    e.act("act go to wooden countertop 1").act("act take red pen 1 from wooden countertop 1")
    e.act("act go to metal microwave 1").act("act heat red pen 1 with metal microwave 1", NOTHING)
    e.act("act go to wooden countertop 1").act("act put red pen 1 in/on wooden countertop 1")
    e.act("act take red apple 1 from wooden countertop 1").act("act go to wooden desk 1")
    e.act("act put red apple 1 in/on wooden desk 1", "you put the red apple 1 in/on the wooden desk 1 .")
    assert not bool(e.done) and float(e.reward) == 0.0


def test_examine_in_light_needs_a_lit_desklamp_where_the_object_is_held():
    e = Episode(hand_task(T.EXAMINE, "red apple", None))
    e.act("act use red desklamp 1", NOTHING)                                  # not at the wooden desk
    e.act("act go to wooden countertop 1").act("act take red apple 1 from wooden countertop 1")
    e.act("act examine red apple 1", "there's nothing special about the red apple 1 .")
    e.act("act go to wooden desk 1", "you arrive at wooden desk 1 . on the wooden desk 1 , you see a red desklamp 1 .")
    assert not bool(e.done)                                               # the lamp is off
    e.act("act take red desklamp 1 from wooden desk 1", NOTHING)                     # lamps are not pickable
    e.act("act use red desklamp 1", "you turn on the red desklamp 1 .")
    assert bool(e.done) and float(e.reward) == 1.0


def test_lamp_switched_on_first_then_arriving_with_the_object_succeeds():
    e = Episode(hand_task(T.EXAMINE, "red pen", None))
    e.act("act go to wooden desk 1").act("act use red desklamp 1", "you turn on the red desklamp 1 .")
    assert not bool(e.done)
    e.act("act go to wooden countertop 1").act("act take red pen 1 from wooden countertop 1")
    assert not bool(e.done)                                               # lamp is elsewhere
    e.act("act go to wooden desk 1")
    assert bool(e.done) and float(e.reward) == 1.0


def test_pick_two_needs_both_in_one_receptacle():
    e = Episode(hand_task(T.PICK_TWO, "red apple", "wooden cabinet"))
    e.act("act go to wooden countertop 1").act("act take red apple 1 from wooden countertop 1")
    e.act("act go to wooden cabinet 1").act("act open wooden cabinet 1").act("act put red apple 1 in/on wooden cabinet 1")
    e.act("act go to metal fridge 1").act("act open metal fridge 1").act("act take red apple 2 from metal fridge 1")
    e.act("act go to wooden cabinet 2").act("act open wooden cabinet 2").act("act put red apple 2 in/on wooden cabinet 2")
    assert not bool(e.done)                                               # one in each wooden cabinet
    e.act("act take red apple 2 from wooden cabinet 2").act("act go to wooden cabinet 1")
    e.act("act put red apple 2 in/on wooden cabinet 1")
    assert bool(e.done) and float(e.reward) == 1.0


def test_look_inventory_and_malformed_actions():
    e = Episode(hand_task(T.PICK, "red apple", "wooden cabinet"))
    e.act("act look", "you are in the middle of a room . looking quickly around you , you see a metal fridge 1 , "
                      "a metal microwave 1 , a metal sinkbasin 1 , a wooden countertop 1 , a wooden cabinet 1 , a wooden desk 1 , a wooden cabinet 2 .")
    e.act("act inventory", "you are not carrying anything .")
    e.act("act go to wooden desk 1").act("act look", "you are facing the wooden desk 1 . next to it , you see nothing .")
    for malformed in ["go to wooden desk 1", "act go to", "act go wooden desk 1", "act look look", "plan", "act take red apple 1",
                      "act go to wooden desk red apple", "act go to desk 1", "act go to red desk 1",
                      "act take wooden apple 1 from wooden desk 1", "act go to wooden metal desk 1"]:
        e.act(malformed, NOTHING)
        assert float(e.info["well_formed"]) == 0.0 and e.score() == 0.0 and not e.valid(), malformed
    e.act("act go to wooden safe 1", NOTHING)                                    # well-formed, no such thing
    assert float(e.info["well_formed"]) == 1.0 and not e.valid()
    e.act("act go to wooden cabinet 9", NOTHING)
    assert float(e.info["well_formed"]) == 1.0 and not e.valid()
    e.act("act go to stone desk 1", NOTHING)                                      # another variant of desk
    assert float(e.info["well_formed"]) == 1.0 and not e.valid()


def test_tokens_after_eos_are_ignored():
    e = Episode(hand_task(T.PICK, "red apple", "wooden cabinet"))
    tokens = np.full(ENV.action_length, vocab.PAD_ID, np.int32)
    tokens[:7] = VOCAB.encode("plan go to wooden desk 1", add_eos=True)
    tokens[7:] = VOCAB.encode("look look look")
    _, _, _, _, info = STEP(e.state, tokens)
    assert float(info["valid"]) == 1.0 and float(info["step_score"]) == 1.0


def test_tag_scores_follow_the_rules():
    e = Episode(hand_task(T.CLEAN, "red apple", "wooden cabinet"))
    # Turn 0: plan is right; go to an unvisited place is also explore.
    assert Episode(hand_task(T.CLEAN, "red apple", "wooden cabinet")).act("plan go to wooden desk 1").score() == 1.0
    assert Episode(hand_task(T.CLEAN, "red apple", "wooden cabinet")).act("explore go to wooden desk 1").score() == 1.0
    assert Episode(hand_task(T.CLEAN, "red apple", "wooden cabinet")).act("act go to wooden desk 1").score() == 0.0
    assert Episode(hand_task(T.CLEAN, "red apple", "wooden cabinet")).act("reflect go to wooden desk 1").score() == 0.0
    assert Episode(hand_task(T.CLEAN, "red apple", "wooden cabinet")).act("act look").score() == 0.0
    assert Episode(hand_task(T.CLEAN, "red apple", "wooden cabinet")).act("plan look").score() == 1.0
    e.act("plan go to wooden countertop 1")
    assert e.score() == 1.0
    # Reaching an unvisited place is explore; act is wrong there.
    assert e.act("explore go to wooden desk 1").score() == 1.0
    assert e.act("act go to wooden countertop 1").score() == 1.0             # visited before: act is right
    assert e.act("explore go to wooden desk 1").score() == 0.0               # ... and explore is wrong
    # A failed action: the next step is reflect.
    e.act("act take red apple 1 from wooden countertop 1", NOTHING)
    assert e.score() == 1.0                                            # failing does not change its own tag
    assert e.act("act go to wooden countertop 1").score() == 0.0
    e.act("act take red apple 1 from wooden countertop 1")                       # completes the subgoal "hold"
    assert e.valid() and e.score() == 1.0
    assert e.act("act go to metal sinkbasin 1").score() == 0.0               # plan (after a subgoal) expected
    e.act("plan clean red apple 1 with metal microwave 1", NOTHING)
    assert e.score() == 0.0                                            # not after a subgoal any more
    e.act("reflect clean red apple 1 with metal sinkbasin 1")
    assert e.valid() and e.score() == 1.0                              # after a failure; completes "clean"
    e.act("plan go to wooden cabinet 1")                                      # plan right after a subgoal
    assert e.score() == 1.0
    e.act("explore open wooden cabinet 1")                                    # never-opened receptacle
    assert e.valid() and e.score() == 1.0
    e.act("act close wooden cabinet 1").act("act open wooden cabinet 1")
    assert e.score() == 1.0                                            # opened before: act
    e.act("explore go to metal fridge 1").act("explore open metal fridge 1")
    assert e.valid() and e.score() == 1.0


def test_unsuccessful_explore_is_not_explore():
    e = Episode(hand_task(T.CLEAN, "red apple", "wooden cabinet"))
    e.act("plan look")
    e.act("explore open wooden cabinet 1", NOTHING)                           # not there: fails, not explore
    assert e.score() == 0.0
