"""The household domain's fixed word-level vocabulary and its object / receptacle catalogue.

Every observation, action, task description and prompt is a sequence of ids of one fixed word
list (`WORDS`), so the environment, the policy and the prompt builder agree on ids without a
host round trip. Ids 0..4 are the specials <pad>, <bos>, <eos>, <obs>, <act>; the four meta-tags
(plan, explore, reflect, act) follow, then verbs and observation words, digits 1..9, modifiers,
object nouns and receptacle nouns.

Catalogue (ALFWorld's household, reduced). An object or receptacle *type* is a variant: a
modifier and a noun, two words ("red mug", "wooden cabinet"); an entity in a room is a type and
an instance number ("red mug 2"). Variants make unseen types that a word-level policy can still
name: every word of an unseen variant occurs in training, only the pair does not.
  OBJECT_NOUNS      name and properties (pickable, cleanable, heatable, coolable, light source),
                    grouped into strata; every noun comes in the OBJECT_MODIFIERS (colours).
  RECEPTACLE_NOUNS  name, openable, and role: the three appliances every room has (sinkbasin
                    cleans, microwave heats, fridge cools; one variant each, "metal") and
                    placement receptacles that can be a task's target, in every
                    RECEPTACLE_MODIFIERS (materials).
  OBJECT_NAMES / RECEPTACLE_NAMES  the types' two-word names, indexed by type id; the
                    appliances are receptacle types 0, 1, 2.
The seen/unseen split (tasks.py) halves the variants of every noun.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

PAD, BOS, EOS, OBS, ACT = "<pad>", "<bos>", "<eos>", "<obs>", "<act>"
SPECIALS = (PAD, BOS, EOS, OBS, ACT)
TAGS = ("plan", "explore", "reflect", "act")
VERBS = ("go", "to", "take", "from", "put", "in/on", "open", "close", "use", "clean", "with", "heat",
         "cool", "examine", "look", "inventory")
TEXT_WORDS = (
    "you", "are", "in", "the", "middle", "of", "a", "room", ".", ",", ":", "looking", "quickly",
    "around", "see", "arrive", "at", "is", "closed", "on", "it", "nothing", "happens", "pick", "up",
    "turn", "carrying", "not", "anything", "facing", "next", "there's", "special", "about", "using",
    "your", "task", "some", "hot", "two", "under",
)
DIGITS = tuple(str(d) for d in range(1, 10))
MAX_INSTANCE = len(DIGITS)

# name: (stratum, pickable, cleanable, heatable, coolable, light_source)
OBJECT_NOUNS = {
    "apple": ("food", 1, 1, 1, 1, 0), "potato": ("food", 1, 1, 1, 1, 0), "tomato": ("food", 1, 1, 1, 1, 0),
    "egg": ("food", 1, 1, 1, 1, 0), "bread": ("food", 1, 1, 1, 1, 0), "lettuce": ("food", 1, 1, 1, 1, 0),
    "mug": ("dish", 1, 1, 1, 1, 0), "cup": ("dish", 1, 1, 1, 1, 0), "plate": ("dish", 1, 1, 1, 1, 0),
    "bowl": ("dish", 1, 1, 1, 1, 0), "pan": ("dish", 1, 1, 1, 1, 0), "pot": ("dish", 1, 1, 1, 1, 0),
    "knife": ("tool", 1, 1, 0, 0, 0), "fork": ("tool", 1, 1, 0, 0, 0), "spoon": ("tool", 1, 1, 0, 0, 0),
    "spatula": ("tool", 1, 1, 0, 0, 0), "ladle": ("tool", 1, 1, 0, 0, 0), "butterknife": ("tool", 1, 1, 0, 0, 0),
    "pen": ("item", 1, 0, 0, 0, 0), "pencil": ("item", 1, 0, 0, 0, 0), "book": ("item", 1, 0, 0, 0, 0),
    "cellphone": ("item", 1, 0, 0, 0, 0), "keychain": ("item", 1, 0, 0, 0, 0), "watch": ("item", 1, 0, 0, 0, 0),
    "creditcard": ("item", 1, 0, 0, 0, 0), "cd": ("item", 1, 0, 0, 0, 0), "remotecontrol": ("item", 1, 0, 0, 0, 0),
    "alarmclock": ("item", 1, 0, 0, 0, 0), "vase": ("item", 1, 0, 0, 0, 0), "statue": ("item", 1, 0, 0, 0, 0),
    "desklamp": ("lamp", 0, 0, 0, 0, 1), "floorlamp": ("lamp", 0, 0, 0, 0, 1),
}
# name: (stratum, openable); stratum "appliance" = present in every room, never a target.
RECEPTACLE_NOUNS = {
    "sinkbasin": ("appliance", 0), "microwave": ("appliance", 1), "fridge": ("appliance", 1),
    "cabinet": ("closed", 1), "drawer": ("closed", 1), "safe": ("closed", 1), "box": ("closed", 1),
    "countertop": ("open", 0), "shelf": ("open", 0), "diningtable": ("open", 0), "sidetable": ("open", 0),
    "desk": ("open", 0), "dresser": ("open", 0), "garbagecan": ("open", 0), "coffeetable": ("open", 0),
}
OBJECT_MODIFIERS = ("red", "blue", "green", "yellow")
RECEPTACLE_MODIFIERS = ("wooden", "metal", "stone", "plastic")
APPLIANCE_MODIFIER = "metal"
# Type id -> (modifier, noun): the appliances first, then every modifier of every other noun.
OBJECT_TYPES = tuple((m, n) for n in OBJECT_NOUNS for m in OBJECT_MODIFIERS)
RECEPTACLE_TYPES = (tuple((APPLIANCE_MODIFIER, n) for n, (stratum, _) in RECEPTACLE_NOUNS.items()
                          if stratum == "appliance")
                    + tuple((m, n) for n, (stratum, _) in RECEPTACLE_NOUNS.items() if stratum != "appliance"
                            for m in RECEPTACLE_MODIFIERS))
OBJECT_NAMES = tuple(f"{m} {n}" for m, n in OBJECT_TYPES)
RECEPTACLE_NAMES = tuple(f"{m} {n}" for m, n in RECEPTACLE_TYPES)
SINK, MICROWAVE, FRIDGE = (RECEPTACLE_TYPES.index((APPLIANCE_MODIFIER, n)) for n in ("sinkbasin", "microwave", "fridge"))
APPLIANCES = (SINK, MICROWAVE, FRIDGE)

WORDS = (*SPECIALS, *TAGS, *VERBS, *[w for w in TEXT_WORDS if w not in VERBS], *DIGITS,
         *OBJECT_MODIFIERS, *RECEPTACLE_MODIFIERS, *OBJECT_NOUNS, *RECEPTACLE_NOUNS)
# Self-assessments (Self-Guide; used only when the domain's self_guide option is on): positive,
# neutral, negative progress. Their ids follow the base vocabulary, so every other id is the same.
ASSESSMENTS = ("progress+", "progress=", "progress-")
ALL_WORDS = (*WORDS, *ASSESSMENTS)
assert len(set(ALL_WORDS)) == len(ALL_WORDS), "household vocabulary repeats a word"
ID = {word: index for index, word in enumerate(ALL_WORDS)}
VOCAB_SIZE = len(WORDS)
SELF_GUIDE_VOCAB_SIZE = len(ALL_WORDS)
ASSESSMENT_IDS = np.array([ID[w] for w in ASSESSMENTS], np.int32)
PAD_ID, BOS_ID, EOS_ID, OBS_ID, ACT_ID = (ID[w] for w in SPECIALS)
TAG_IDS = np.array([ID[t] for t in TAGS], np.int32)
PLAN, EXPLORE, REFLECT, ACT_TAG = range(4)


def _word_index(words) -> np.ndarray:
    """i32[V]: the position of each vocabulary word in `words`, -1 for the other words."""
    table = np.full(SELF_GUIDE_VOCAB_SIZE, -1, np.int32)
    table[[ID[w] for w in words]] = np.arange(len(words))
    return table


def _pair_types(types, modifiers, nouns) -> np.ndarray:
    """i32[len(modifiers), len(nouns)]: the type id of each (modifier, noun), -1 for no such type."""
    table = np.full((len(modifiers), len(nouns)), -1, np.int32)
    for type_id, (m, n) in enumerate(types):
        table[modifiers.index(m), list(nouns).index(n)] = type_id
    return table


# Constant lookup tables over the vocabulary (-1 where the word is not of that kind) and over types.
WORD_OBJECT_MODIFIER = _word_index(OBJECT_MODIFIERS)
WORD_OBJECT_NOUN = _word_index(tuple(OBJECT_NOUNS))
WORD_RECEPTACLE_MODIFIER = _word_index(RECEPTACLE_MODIFIERS)
WORD_RECEPTACLE_NOUN = _word_index(tuple(RECEPTACLE_NOUNS))
OBJECT_PAIR_TYPE = _pair_types(OBJECT_TYPES, OBJECT_MODIFIERS, OBJECT_NOUNS)
RECEPTACLE_PAIR_TYPE = _pair_types(RECEPTACLE_TYPES, RECEPTACLE_MODIFIERS, RECEPTACLE_NOUNS)
WORD_NUMBER = np.full(SELF_GUIDE_VOCAB_SIZE, -1, np.int32)
WORD_NUMBER[[ID[d] for d in DIGITS]] = np.arange(1, MAX_INSTANCE + 1)
WORD_TAG = _word_index(TAGS)
WORD_ASSESSMENT = _word_index(ASSESSMENTS)
OBJECT_WORDS = np.array([[ID[m], ID[n]] for m, n in OBJECT_TYPES], np.int32)          # i32[To, 2]
RECEPTACLE_WORDS = np.array([[ID[m], ID[n]] for m, n in RECEPTACLE_TYPES], np.int32)  # i32[Tr, 2]
NUMBER_WORD = np.array([PAD_ID, *[ID[d] for d in DIGITS]], np.int32)  # index = instance number

_props = np.array([OBJECT_NOUNS[n][1:] for _, n in OBJECT_TYPES], bool)
PICKABLE, CLEANABLE, HEATABLE, COOLABLE, LIGHT_SOURCE = (_props[:, k] for k in range(5))
OPENABLE = np.array([RECEPTACLE_NOUNS[n][1] for _, n in RECEPTACLE_TYPES], bool)
# Noun -> its variants' type ids (the placement receptacles only: appliances are never split).
OBJECT_VARIANTS = {noun: tuple(i for i, (_, n) in enumerate(OBJECT_TYPES) if n == noun) for noun in OBJECT_NOUNS}
RECEPTACLE_VARIANTS = {noun: tuple(i for i, (_, n) in enumerate(RECEPTACLE_TYPES) if n == noun)
                       for noun, (stratum, _) in RECEPTACLE_NOUNS.items() if stratum != "appliance"}

_TOKEN_PATTERN = re.compile(r"<[a-z]+>|in/on|there's|progress[-+=]|[a-z0-9]+|[.,:]")


class WordVocab:
    """Encoder/decoder for `WORDS` (with `self_guide`: `ALL_WORDS`, the self-assessments too):
    text is split into words and the punctuation . , : ."""

    pad_id, bos_id, eos_id, obs_id, act_id = PAD_ID, BOS_ID, EOS_ID, OBS_ID, ACT_ID
    token_names = WORDS
    vocab_size = VOCAB_SIZE

    def __init__(self, self_guide: bool = False):
        self.self_guide = bool(self_guide)
        self.token_names = ALL_WORDS if self.self_guide else WORDS
        self.vocab_size = len(self.token_names)

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of the words of `text` (lower-cased); an unknown word raises naming it."""
        ids = [BOS_ID] if add_bos else []
        for word in _TOKEN_PATTERN.findall(text.lower()):
            if ID.get(word, self.vocab_size) >= self.vocab_size:
                raise ValueError(f"WordVocab.encode: word {word!r} of {text!r} is not in the household vocabulary")
            ids.append(ID[word])
        leftover = _TOKEN_PATTERN.sub(" ", text.lower()).strip()
        if leftover:
            raise ValueError(f"WordVocab.encode: {leftover!r} in {text!r} is not a household word")
        return ids + ([EOS_ID] if add_eos else [])

    def decode(self, ids: Sequence[int], *, keep_specials: bool = False) -> str:
        """Words of `ids` joined by spaces; stops at the first eos; drops pad (and bos unless kept)."""
        words = []
        for position, token in enumerate(np.asarray(ids).reshape(-1).tolist()):
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"WordVocab.decode: id {token} at position {position} is outside [0, {self.vocab_size})")
            if token == EOS_ID and not keep_specials:
                break
            if token == PAD_ID or (token == BOS_ID and not keep_specials):
                continue
            words.append(ALL_WORDS[token])
        return " ".join(words)

    def decode_batch(self, ids) -> list[str]:
        """`decode` of every row of i32[B, L]."""
        return [self.decode(row) for row in np.asarray(ids)]

    def encode_padded(self, text: str, length: int) -> np.ndarray:
        """i32[length]: `encode(text)` right-padded with pad; longer text raises."""
        ids = self.encode(text)
        if len(ids) > length:
            raise ValueError(f"WordVocab.encode_padded: {text!r} has {len(ids)} words, more than {length}")
        return np.array(ids + [PAD_ID] * (length - len(ids)), np.int32)

    def encode_batch(self, texts: Sequence[str], length: int, left_pad: bool, *, add_bos: bool = False,
                     add_eos: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(ids i32[B, length], mask bool[B, length]): `encode` of every text, padded on the left
        (prompts) or the right; a text longer than `length` raises naming it."""
        ids = np.full((len(texts), length), PAD_ID, np.int32)
        mask = np.zeros((len(texts), length), bool)
        for row, text in enumerate(texts):
            tokens = self.encode(text, add_bos=add_bos, add_eos=add_eos)
            if len(tokens) > length:
                raise ValueError(f"WordVocab.encode_batch: text {row} {text!r} has {len(tokens)} tokens, "
                                 f"more than length={length}")
            span = slice(length - len(tokens), length) if left_pad else slice(0, len(tokens))
            ids[row, span] = tokens
            mask[row, span] = True
        return ids, mask
