"""Observation text as token arrays, rendered inside jitted code from a table of formats.

Every observation follows one of `FORMATS`, each the same seven slots:

    phrase, entity, phrase, entity, phrase, listing, phrase

A phrase is fixed words; an entity slot names the action's object, the action's receptacle,
the held object or the agent's receptacle ("cabinet 2"); a listing slot lists the objects in the
action's receptacle ("a apple 1 , a mug 2" or "nothing") or the receptacles of the room. The
environment picks a format index per step and `render` fills it with one gather per slot and a
single packing scatter, so the text costs little to compile under vmap.
Shapes: K items of a listing, O observation tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from derl_jax.domains.household import vocab

NO_ENTITY, OBJECT, RECEPTACLE, HELD_OBJECT, HERE = range(5)
NO_LISTING, OBJECTS_IN_RECEPTACLE, ROOM = range(3)
_ROOM = "you are in the middle of a room . looking quickly around you , you see"
_EMPTY_SLOTS = ("", NO_ENTITY, "", NO_ENTITY, "", NO_LISTING, "")


def _format(*slots) -> tuple:
    """The seven slots (phrase, entity, phrase, entity, phrase, listing, phrase) of a format from
    its leading ones; the slots left off are empty (no words, no entity, no listing)."""
    return slots + _EMPTY_SLOTS[len(slots):]


FORMATS = {
    "arrive_open": _format("you arrive at", RECEPTACLE, ". on the", RECEPTACLE, ", you see",
                           OBJECTS_IN_RECEPTACLE, "."),
    "arrive_closed": _format("you arrive at", RECEPTACLE, ". the", RECEPTACLE, "is closed ."),
    "take": _format("you pick up the", OBJECT, "from the", RECEPTACLE, "."),
    "put": _format("you put the", OBJECT, "in/on the", RECEPTACLE, "."),
    "open": _format("you open the", RECEPTACLE, ". in it , you see", NO_ENTITY, "", OBJECTS_IN_RECEPTACLE, "."),
    "close": _format("you close the", RECEPTACLE, "."),
    "use": _format("you turn on the", OBJECT, "."),
    "clean": _format("you clean the", OBJECT, "using the", RECEPTACLE, "."),
    "heat": _format("you heat the", OBJECT, "using the", RECEPTACLE, "."),
    "cool": _format("you cool the", OBJECT, "using the", RECEPTACLE, "."),
    "examine_object": _format("there's nothing special about the", OBJECT, "."),
    "examine_open": _format("on the", RECEPTACLE, ", you see", NO_ENTITY, "", OBJECTS_IN_RECEPTACLE, "."),
    "examine_closed": _format("the", RECEPTACLE, "is closed ."),
    "look_middle": _format(_ROOM, NO_ENTITY, "", NO_ENTITY, "", ROOM, "."),
    "look_at": _format("you are facing the", HERE, ". next to it , you see nothing ."),
    "carrying": _format("you are carrying : a", HELD_OBJECT, "."),
    "carrying_nothing": _format("you are not carrying anything ."),
    "nothing_happens": _format("nothing happens ."),
}
FORMAT_NAMES = tuple(FORMATS)
FORMAT = {name: index for index, name in enumerate(FORMAT_NAMES)}


def _tables():
    encode = vocab.WordVocab().encode
    phrases = [[encode(row[k]) for k in (0, 2, 4, 6)] for row in FORMATS.values()]
    width = max(len(p) for row in phrases for p in row)
    ids = np.full((len(FORMATS), 4, width), vocab.PAD_ID, np.int32)
    for f, row in enumerate(phrases):
        for k, words in enumerate(row):
            ids[f, k, : len(words)] = words
    entities = np.array([[row[1], row[3]] for row in FORMATS.values()], np.int32)
    listings = np.array([row[5] for row in FORMATS.values()], np.int32)
    return ids, entities, listings


PHRASE_IDS, ENTITY_SLOTS, LISTING_SLOTS = _tables()


def listing(name_words: jax.Array, numbers: jax.Array, show: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(tokens i32[4K+1], mask): "a apple 1 , a mug 2" over the shown items of i32[K] / i32[K] /
    bool[K], or "nothing"."""
    count = name_words.shape[0]
    number_words = jnp.asarray(vocab.NUMBER_WORD)[numbers]
    comma = jnp.full((count,), vocab.ID[","], jnp.int32)
    article = jnp.full((count,), vocab.ID["a"], jnp.int32)
    tokens = jnp.stack([comma, article, name_words.astype(jnp.int32), number_words], axis=1).reshape(-1)
    after_first = jnp.cumsum(show) > 1
    mask = jnp.stack([show & after_first, show, show, show], axis=1).reshape(-1)
    return (jnp.concatenate([tokens, jnp.array([vocab.ID["nothing"]], jnp.int32)]),
            jnp.concatenate([mask, ~jnp.any(show)[None]]))


def pack(tokens: jax.Array, mask: jax.Array, length: int, left: bool) -> jax.Array:
    """i32[length]: the tokens of i32[L] where mask bool[L], in order, padded on the right (or the
    left) with pad; right packing drops what does not fit, left packing needs length >= L."""
    slot = jnp.cumsum(mask) - 1
    if left:
        slot = slot + length - jnp.sum(mask)
    slot = jnp.where(mask, slot, length)  # out of range: dropped
    packed = jnp.full((length,), vocab.PAD_ID, jnp.int32)
    return packed.at[slot].set(tokens.astype(jnp.int32), mode="drop")


def render(fmt: jax.Array, entities: jax.Array, object_listing, room_listing, length: int) -> jax.Array:
    """i32[length]: format `fmt` (i32[]) filled in.

    entities: i32[5, 2] the (name word, number word) of each entity slot kind (row NO_ENTITY unused);
    object_listing / room_listing: (tokens, mask) from `listing`.
    """
    phrases = jnp.asarray(PHRASE_IDS)[fmt]                                 # [4, W]
    slots = jnp.asarray(ENTITY_SLOTS)[fmt]                                 # [2]
    chosen = entities[slots]                                               # [2, 2]
    width = max(object_listing[0].shape[0], room_listing[0].shape[0])

    def widen(piece):
        extra = width - piece[0].shape[0]
        return (jnp.pad(piece[0], (0, extra), constant_values=vocab.PAD_ID),
                jnp.pad(piece[1], (0, extra), constant_values=False))

    (obj_tokens, obj_mask), (room_tokens, room_mask) = widen(object_listing), widen(room_listing)
    kind = jnp.asarray(LISTING_SLOTS)[fmt]
    list_tokens = jnp.where(kind == ROOM, room_tokens, obj_tokens)
    list_mask = jnp.where(kind == ROOM, room_mask, obj_mask) & (kind != NO_LISTING)
    entity_mask = jnp.broadcast_to((slots != NO_ENTITY)[:, None], (2, 2))
    tokens = jnp.concatenate([phrases[0], chosen[0], phrases[1], chosen[1], phrases[2], list_tokens, phrases[3]])
    mask = jnp.concatenate([phrases[0] != vocab.PAD_ID, entity_mask[0], phrases[1] != vocab.PAD_ID, entity_mask[1],
                            phrases[2] != vocab.PAD_ID, list_mask, phrases[3] != vocab.PAD_ID])
    return pack(tokens, mask, length, left=False)
