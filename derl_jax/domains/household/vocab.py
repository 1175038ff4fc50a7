"""The household domain's fixed word-level vocabulary and its object / receptacle catalogue.

Every observation, action, task description and prompt is a sequence of ids of one fixed word
list (`WORDS`), so the environment, the policy and the prompt builder agree on ids without a
host round trip. Ids 0..4 are the specials <pad>, <bos>, <eos>, <obs>, <act>; the four meta-tags
(plan, explore, reflect, act) follow, then verbs and observation words, digits 1..9, object
type names and receptacle type names.

Catalogue (ALFWorld's household, reduced):
  OBJECT_TYPES      name and properties (pickable, cleanable, heatable, coolable, light source),
                    grouped into strata; the seen/unseen split (tasks.py) halves every stratum.
  RECEPTACLE_TYPES  name, openable, and role: the three appliances every room has (sinkbasin
                    cleans, microwave heats, fridge cools) and placement receptacles that can be
                    a task's target.
"""

from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from derl_jax.domains.selfguide import ASSESSMENT_PATTERN, ASSESSMENTS

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
OBJECT_TYPES = {
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
RECEPTACLE_TYPES = {
    "sinkbasin": ("appliance", 0), "microwave": ("appliance", 1), "fridge": ("appliance", 1),
    "cabinet": ("closed", 1), "drawer": ("closed", 1), "safe": ("closed", 1), "box": ("closed", 1),
    "countertop": ("open", 0), "shelf": ("open", 0), "diningtable": ("open", 0), "sidetable": ("open", 0),
    "desk": ("open", 0), "dresser": ("open", 0), "garbagecan": ("open", 0), "coffeetable": ("open", 0),
}
OBJECT_NAMES = tuple(OBJECT_TYPES)
RECEPTACLE_NAMES = tuple(RECEPTACLE_TYPES)
SINK, MICROWAVE, FRIDGE = (RECEPTACLE_NAMES.index(n) for n in ("sinkbasin", "microwave", "fridge"))
APPLIANCES = (SINK, MICROWAVE, FRIDGE)

WORDS = (*SPECIALS, *TAGS, *VERBS, *[w for w in TEXT_WORDS if w not in VERBS], *DIGITS,
         *OBJECT_NAMES, *RECEPTACLE_NAMES)
# Self-assessments (Self-Guide, derl_jax/domains/selfguide.py; used only when the domain's self_guide
# option is on): positive, neutral, negative progress. Their ids follow the base vocabulary, so every
# other id is the same.
ALL_WORDS = (*WORDS, *ASSESSMENTS)
assert len(set(ALL_WORDS)) == len(ALL_WORDS), "household vocabulary repeats a word"
ID = {word: index for index, word in enumerate(ALL_WORDS)}
VOCAB_SIZE = len(WORDS)
SELF_GUIDE_VOCAB_SIZE = len(ALL_WORDS)
ASSESSMENT_IDS = np.array([ID[w] for w in ASSESSMENTS], np.int32)
PAD_ID, BOS_ID, EOS_ID, OBS_ID, ACT_ID = (ID[w] for w in SPECIALS)
TAG_IDS = np.array([ID[t] for t in TAGS], np.int32)
PLAN, EXPLORE, REFLECT, ACT_TAG = range(4)

# Constant lookup tables over the vocabulary (-1 where the word is not of that kind) and over types.
WORD_OBJECT_TYPE = np.full(SELF_GUIDE_VOCAB_SIZE, -1, np.int32)
WORD_OBJECT_TYPE[[ID[n] for n in OBJECT_NAMES]] = np.arange(len(OBJECT_NAMES))
WORD_RECEPTACLE_TYPE = np.full(SELF_GUIDE_VOCAB_SIZE, -1, np.int32)
WORD_RECEPTACLE_TYPE[[ID[n] for n in RECEPTACLE_NAMES]] = np.arange(len(RECEPTACLE_NAMES))
WORD_NUMBER = np.full(SELF_GUIDE_VOCAB_SIZE, -1, np.int32)
WORD_NUMBER[[ID[d] for d in DIGITS]] = np.arange(1, MAX_INSTANCE + 1)
WORD_TAG = np.full(SELF_GUIDE_VOCAB_SIZE, -1, np.int32)
WORD_TAG[TAG_IDS] = np.arange(len(TAGS))
WORD_ASSESSMENT = np.full(SELF_GUIDE_VOCAB_SIZE, -1, np.int32)
WORD_ASSESSMENT[ASSESSMENT_IDS] = np.arange(len(ASSESSMENTS))
OBJECT_WORD = np.array([ID[n] for n in OBJECT_NAMES], np.int32)
RECEPTACLE_WORD = np.array([ID[n] for n in RECEPTACLE_NAMES], np.int32)
NUMBER_WORD = np.array([PAD_ID, *[ID[d] for d in DIGITS]], np.int32)  # index = instance number

_props = np.array([OBJECT_TYPES[n][1:] for n in OBJECT_NAMES], bool)
PICKABLE, CLEANABLE, HEATABLE, COOLABLE, LIGHT_SOURCE = (_props[:, k] for k in range(5))
OPENABLE = np.array([RECEPTACLE_TYPES[n][1] for n in RECEPTACLE_NAMES], bool)
OBJECT_STRATA = {s: tuple(i for i, n in enumerate(OBJECT_NAMES) if OBJECT_TYPES[n][0] == s)
                 for s in ("food", "dish", "tool", "item", "lamp")}
RECEPTACLE_STRATA = {s: tuple(i for i, n in enumerate(RECEPTACLE_NAMES) if RECEPTACLE_TYPES[n][0] == s)
                     for s in ("closed", "open")}

_TOKEN_PATTERN = re.compile(rf"<[a-z]+>|in/on|there's|{ASSESSMENT_PATTERN}|[a-z0-9]+|[.,:]")


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
