"""Character tokenizer for small embedded domains.

Ids: 0 = pad, 1 = bos, 2 = eos, then one id per alphabet character in alphabet order
(character `alphabet[i]` has id `3 + i`). Special tokens have no character form: they are
only ever produced or consumed as ids.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

NUM_SPECIAL = 3


class CharTokenizer:
    """One token per character of `alphabet`, plus pad/bos/eos.

    pad, bos, eos: display names of the special tokens (used in `token_names`).
    """

    def __init__(self, alphabet: str, *, pad: str = "<pad>", bos: str = "<bos>", eos: str = "<eos>"):
        if not alphabet:
            raise ValueError("CharTokenizer: alphabet is empty")
        repeated = sorted({c for c in alphabet if alphabet.count(c) > 1})
        if repeated:
            raise ValueError(f"CharTokenizer: alphabet {alphabet!r} repeats characters {repeated}")
        self.alphabet = alphabet
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self.token_names = (pad, bos, eos, *alphabet)
        self._id_of = {c: NUM_SPECIAL + i for i, c in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return NUM_SPECIAL + len(self.alphabet)

    def id_of(self, char: str) -> int:
        """The id of one alphabet character."""
        if char not in self._id_of:
            raise ValueError(f"CharTokenizer.id_of: {char!r} is not in the alphabet {self.alphabet!r}")
        return self._id_of[char]

    def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of the characters of `text` (optionally framed by bos/eos)."""
        ids = [self.bos_id] if add_bos else []
        for position, char in enumerate(text):
            if char not in self._id_of:
                raise ValueError(
                    f"CharTokenizer.encode: character {char!r} at position {position} of {text!r} "
                    f"is not in the alphabet {self.alphabet!r}"
                )
            ids.append(self._id_of[char])
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`: stops at the first eos, skips pad and bos."""
        chars = []
        for position, token in enumerate(np.asarray(ids).reshape(-1).tolist()):
            if token == self.eos_id:
                break
            if token in (self.pad_id, self.bos_id):
                continue
            if not 0 <= token < self.vocab_size:
                raise ValueError(
                    f"CharTokenizer.decode: id {token} at position {position} is outside the vocabulary "
                    f"[0, {self.vocab_size})"
                )
            chars.append(self.alphabet[token - NUM_SPECIAL])
        return "".join(chars)

    def decode_batch(self, ids) -> list[str]:
        """`decode` of every row of i32[B, L]."""
        return [self.decode(row) for row in np.asarray(ids)]

    def encode_batch(
        self, texts: Sequence[str], length: int, left_pad: bool, *, add_bos: bool = False, add_eos: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Encode and pad to `length`.

        Returns (ids i32[B, length], mask bool[B, length]) with mask True on real tokens;
        padding goes on the left when `left_pad` (prompts) and on the right otherwise.
        """
        ids = np.full((len(texts), length), self.pad_id, np.int32)
        mask = np.zeros((len(texts), length), bool)
        for row, text in enumerate(texts):
            tokens = self.encode(text, add_bos=add_bos, add_eos=add_eos)
            if len(tokens) > length:
                raise ValueError(
                    f"CharTokenizer.encode_batch: text {row} {text!r} needs {len(tokens)} tokens, "
                    f"more than length={length}"
                )
            span = slice(length - len(tokens), length) if left_pad else slice(0, len(tokens))
            ids[row, span] = tokens
            mask[row, span] = True
        return ids, mask
