"""The ScienceWorld domain's fixed word-level vocabulary.

Ids 0..4 are the specials <pad>, <unk>, <bos>, <eos>, <obs>; the four meta-tags follow, then
`BASE_WORDS` (the engine's fixed phrasing and action verbs), then the words of the engine's
own vocabulary (`Worker.vocabulary()`: visible object names and action templates) and of every
observation along the engine's gold path of variation 0 of each task, sorted, and last, with
Self-Guide (`assessments=True`), the three self-assessment words (progress+ / progress= /
progress-, derl_jax/domains/selfguide.py), so no other id moves. So the word list depends only
on the engine's version, the task names and that option, never on run order or machine. Text
is lower-cased and split into words and punctuation (an assessment word is one word); a word
outside the list is <unk>.

`Vocabulary` is also the domain's tokenizer (`vocab_size`, `encode_batch`, `decode_batch`):
`decode` writes specials by name and `tokens` reads them back, so decoded text re-encodes to
the same ids.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable, Sequence

import numpy as np

from derl_jax.domains.scienceworld.tags import TAGS
from derl_jax.domains.selfguide import ASSESSMENT_PATTERN, ASSESSMENTS

SPECIALS = ("<pad>", "<unk>", "<bos>", "<eos>", "<obs>")
BASE_WORDS = tuple(
    "this room is called the in it you see a an also door to that open closed containing which has on "
    "of and your task what how there nothing here no known action matches input move teleport go look "
    "around at pick up put down drop focus use activate deactivate connect disconnect eat flush mix pour "
    "read wait wait1 inventory close dunk into with from now not can't clear get substance called agent already "
    "air water first then take actions will cause state matter . , : ? ! ( ) ' - 0 1 2 3 4 5 6 7 8 9".split())
_TOKEN = re.compile(rf"{ASSESSMENT_PATTERN}|[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]")


def words(text: str) -> list[str]:
    """Lower-cased words and punctuation marks of `text`."""
    return _TOKEN.findall(text.lower())


class Vocabulary:
    """Word <-> id table; `encode` pads or cuts to a length, `decode` stops at padding."""

    def __init__(self, extra_words: Iterable[str], task_names: Sequence[str], assessments: bool = False):
        listed = list(dict.fromkeys((*SPECIALS, *TAGS, *BASE_WORDS)))
        known = set(listed) | set(ASSESSMENTS)
        listed += sorted({w for w in extra_words if w not in known})
        listed += list(ASSESSMENTS) if assessments else []
        self.words = tuple(listed)
        self.ids = {w: i for i, w in enumerate(self.words)}
        self.task_names = tuple(task_names)
        self.pad_id, self.unk_id = self.ids["<pad>"], self.ids["<unk>"]
        self.bos_id, self.eos_id = self.ids["<bos>"], self.ids["<eos>"]

    def __len__(self) -> int:
        return len(self.words)

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def tokens(self, text: str) -> list[int]:
        """Ids of `text`'s words, a special written by name (`<unk>`) read back as itself."""
        ids = []
        for piece in text.split():
            ids += [self.ids[piece]] if piece in SPECIALS else [self.ids.get(w, self.unk_id) for w in words(piece)]
        return ids

    def encode_batch(self, texts: Sequence[str], length: int, left_pad: bool, *, add_bos: bool = False,
                     add_eos: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(ids i32[B, length], mask bool[B, length]) of `tokens` of every text (with bos / eos),
        padded on the left (prompts) or right; a text longer than `length` raises naming it."""
        def tokens(text: str) -> list[int]:
            return [self.bos_id] * add_bos + self.tokens(text) + [self.eos_id] * add_eos

        return pack_texts(texts, tokens, length, left_pad, self.pad_id, "ScienceWorld vocabulary")

    def decode_batch(self, ids) -> list[str]:
        """`decode` of every row of i32[B, L]."""
        return [self.decode(row) for row in np.asarray(ids)]

    def encode(self, text: str, length: int) -> np.ndarray:
        """i32[length]: ids of the first `length` words of `text`, padded."""
        ids = [self.ids.get(w, self.unk_id) for w in words(text)][:length]
        return np.array(ids + [self.pad_id] * (length - len(ids)), np.int32)

    def decode(self, ids: Sequence[int]) -> str:
        """Words of the ids up to the first <eos>, without padding and <bos>, joined by spaces."""
        kept = [i for i in ids_before_eos(ids, self.eos_id) if i not in (self.pad_id, self.bos_id)]
        return " ".join(self.words[i] if 0 <= i < len(self.words) else "<unk>" for i in kept)


def ids_before_eos(ids, eos_id: int) -> list[int]:
    """The ids of i32[...] (flattened) before the first `eos_id`."""
    flat = np.asarray(ids).reshape(-1).tolist()
    return flat[: flat.index(eos_id)] if eos_id in flat else flat


def pack_texts(texts: Sequence[str], tokens: Callable[[str], list[int]], length: int, left_pad: bool, pad_id: int,
               table: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids i32[B, length], mask bool[B, length]): `tokens(text)` of every text, padded with `pad_id`
    on the left (prompts) or right; a text of more than `length` tokens raises naming it and `table`."""
    ids, mask = np.full((len(texts), length), pad_id, np.int32), np.zeros((len(texts), length), bool)
    for row, text in enumerate(texts):
        row_tokens = tokens(text)
        if len(row_tokens) > length:
            raise ValueError(f"{table}: text {row} {text[:60]!r} has {len(row_tokens)} tokens, more than {length}")
        span = slice(length - len(row_tokens), length) if left_pad else slice(0, len(row_tokens))
        ids[row, span], mask[row, span] = row_tokens, True
    return ids, mask


def build_vocabulary(worker, task_names: Sequence[str], simplifications: str = "easy",
                     assessments: bool = False) -> Vocabulary:
    """The vocabulary of `task_names` from the engine: plays the gold path of variation 0 of each
    task once and keeps the words it meets (words of other variations may be <unk>); the
    self-assessment words last with `assessments`."""
    extra: set[str] = set()
    for name in task_names:
        worker.load(name, 0, simplifications, gold_path=True)
        extra.update(words(worker.reset()))
        for action in worker.gold_actions():
            for phrase in worker.vocabulary():
                extra.update(words(phrase))
            extra.update(words(action))
            extra.update(words(worker.step(action)[0]))
    return Vocabulary(extra, task_names, assessments=assessments)
