"""ALFWorld's action set as token templates: parsing a policy's action and writing one.

An action is i32[A] (A = ACTION_LENGTH): a meta-tag word (plan / explore / reflect / act), then
one of the templates below, then pad (anything after the first eos is ignored):

    go to R#            take O# from R#      put O# in/on R#      open R#      close R#
    use O#              clean O# with R#     heat O# with R#      cool O# with R#
    examine O#          examine R#           look                 inventory

O# / R# are an object / receptacle type name followed by an instance number ("cabinet 2").
An action is well-formed when it has a tag and matches a template exactly; it names an entity
that may or may not exist in the room (a missing one makes the action fail, not malformed).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from derl_jax.domains.household import vocab

ACTION_LENGTH = 8
END, LIT, OBJ, OBJ_NUM, REC, REC_NUM = range(6)
_SLOT = {"O": (OBJ, OBJ_NUM), "R": (REC, REC_NUM)}
TEMPLATE_TEXT = (
    ("go", "go to R"), ("take", "take O from R"), ("put", "put O in/on R"), ("open", "open R"),
    ("close", "close R"), ("use", "use O"), ("clean", "clean O with R"), ("heat", "heat O with R"),
    ("cool", "cool O with R"), ("examine_object", "examine O"), ("examine_receptacle", "examine R"),
    ("look", "look"), ("inventory", "inventory"),
)
TEMPLATE_NAMES = tuple(name for name, _ in TEMPLATE_TEXT)
(GO, TAKE, PUT, OPEN, CLOSE, USE, CLEAN, HEAT, COOL, EXAMINE_OBJECT, EXAMINE_RECEPTACLE, LOOK,
 INVENTORY) = range(len(TEMPLATE_TEXT))
BODY_LENGTH = ACTION_LENGTH - 1


def _template_tables() -> tuple[np.ndarray, np.ndarray]:
    """(slot kinds i32[T, BODY_LENGTH], literal word ids i32[T, BODY_LENGTH])."""
    kinds = np.full((len(TEMPLATE_TEXT), BODY_LENGTH), END, np.int32)
    literals = np.full((len(TEMPLATE_TEXT), BODY_LENGTH), vocab.PAD_ID, np.int32)
    for row, (_, text) in enumerate(TEMPLATE_TEXT):
        position = 0
        for word in text.split():
            if word in _SLOT:
                kinds[row, position : position + 2] = _SLOT[word]
                position += 2
            else:
                kinds[row, position], literals[row, position] = LIT, vocab.ID[word]
                position += 1
    return kinds, literals


SLOT_KINDS, SLOT_LITERALS = _template_tables()
HAS_OBJECT = (SLOT_KINDS == OBJ).any(axis=1)
HAS_RECEPTACLE = (SLOT_KINDS == REC).any(axis=1)
OBJECT_POSITION = np.where(HAS_OBJECT, (SLOT_KINDS == OBJ).argmax(axis=1), 0).astype(np.int32)
RECEPTACLE_POSITION = np.where(HAS_RECEPTACLE, (SLOT_KINDS == REC).argmax(axis=1), 0).astype(np.int32)


@struct.dataclass
class ParsedAction:
    """tag: i32[] tag index or -1; template: i32[] template index or -1 (malformed);
    obj / recep: i32[] slot of the named object / receptacle, -1 when not named or not in the room;
    well_formed: bool[] a tag and an exact template match."""

    tag: jax.Array
    template: jax.Array
    obj: jax.Array
    recep: jax.Array
    well_formed: jax.Array


def truncate_at_eos(action: jax.Array) -> jax.Array:
    """i32[..., A] with the first eos and everything after it (along the last axis) replaced by pad."""
    after = jnp.cumsum(action == vocab.EOS_ID, axis=-1) > 0
    return jnp.where(after, vocab.PAD_ID, action).astype(jnp.int32)


def _resolve(types: jax.Array, numbers: jax.Array, word: jax.Array, number_word: jax.Array, table) -> jax.Array:
    """Slot index of the entity named by (type word, number word) among types/numbers i32[K], else -1."""
    wanted_type = jnp.asarray(table)[word]
    wanted_number = jnp.asarray(vocab.WORD_NUMBER)[number_word]
    hit = (types == wanted_type) & (numbers == wanted_number) & (wanted_type >= 0) & (types >= 0)
    return jnp.where(jnp.any(hit), jnp.argmax(hit), -1).astype(jnp.int32)


def parse_action(action: jax.Array, task) -> ParsedAction:
    """Parse `action` i32[A] against the room of `task` (a single `Task`)."""
    action = truncate_at_eos(action.astype(jnp.int32))
    tag = jnp.asarray(vocab.WORD_TAG)[action[0]]
    body = action[1:]
    kinds, literals = jnp.asarray(SLOT_KINDS), jnp.asarray(SLOT_LITERALS)
    fits = jnp.select(
        [kinds == END, kinds == LIT, kinds == OBJ, kinds == REC],
        [body == vocab.PAD_ID, body == literals,
         jnp.asarray(vocab.WORD_OBJECT_TYPE)[body] >= 0, jnp.asarray(vocab.WORD_RECEPTACLE_TYPE)[body] >= 0],
        jnp.asarray(vocab.WORD_NUMBER)[body] >= 0,
    )
    matches = jnp.all(fits, axis=1)
    template = jnp.where(jnp.any(matches), jnp.argmax(matches), -1).astype(jnp.int32)
    known = template >= 0
    row = jnp.maximum(template, 0)
    obj_at, rec_at = jnp.asarray(OBJECT_POSITION)[row], jnp.asarray(RECEPTACLE_POSITION)[row]
    obj = _resolve(task.obj_type, task.obj_num, body[obj_at], body[obj_at + 1], vocab.WORD_OBJECT_TYPE)
    recep = _resolve(task.recep_type, task.recep_num, body[rec_at], body[rec_at + 1], vocab.WORD_RECEPTACLE_TYPE)
    obj = jnp.where(known & jnp.asarray(HAS_OBJECT)[row], obj, -1)
    recep = jnp.where(known & jnp.asarray(HAS_RECEPTACLE)[row], recep, -1)
    return ParsedAction(tag=tag, template=template, obj=obj, recep=recep, well_formed=known & (tag >= 0))


def make_action(tag: jax.Array, template: jax.Array, obj: jax.Array, recep: jax.Array, task) -> jax.Array:
    """i32[A]: the action `template` with tag index `tag` naming object slot `obj` and receptacle slot
    `recep` of `task` (unused arguments are ignored)."""
    kinds = jnp.asarray(SLOT_KINDS)[template]
    obj, recep = jnp.maximum(obj, 0), jnp.maximum(recep, 0)
    obj_word = jnp.asarray(vocab.OBJECT_WORD)[jnp.maximum(task.obj_type[obj], 0)]
    rec_word = jnp.asarray(vocab.RECEPTACLE_WORD)[jnp.maximum(task.recep_type[recep], 0)]
    number_word = jnp.asarray(vocab.NUMBER_WORD)
    body = jnp.select(
        [kinds == LIT, kinds == OBJ, kinds == OBJ_NUM, kinds == REC, kinds == REC_NUM],
        [jnp.asarray(SLOT_LITERALS)[template], jnp.broadcast_to(obj_word, kinds.shape),
         jnp.broadcast_to(number_word[task.obj_num[obj]], kinds.shape),
         jnp.broadcast_to(rec_word, kinds.shape), jnp.broadcast_to(number_word[task.recep_num[recep]], kinds.shape)],
        vocab.PAD_ID,
    )
    return jnp.concatenate([jnp.asarray(vocab.TAG_IDS)[tag][None], body]).astype(jnp.int32)
