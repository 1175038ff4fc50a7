"""A Hugging Face policy's own tokenizer as the ScienceWorld domain's token table.

With a pretrained policy (`config.policy.checkpoint`, e.g. Qwen2.5-1.5B-Instruct) observations
and actions must be ids of the policy's tokenizer, not of the word vocabulary. `SubwordTable`
offers what the adapter, the corpus and the domain use of `vocab.Vocabulary` (`encode`,
`tokens`, `decode`, `encode_batch`, `decode_batch`, `vocab_size`, `pad_id`, `eos_id`) over an
`derl_jax.models.hf_tokenizer.HFTokenizer`. There is no <bos> (Qwen has none): `add_bos` adds
nothing. Text re-encoded after decoding may split into other sub-words than the ids it came
from, so the warm-start corpus is for word-vocabulary policies; a checkpoint is not fine-tuned
on it.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from derl_jax.domains.scienceworld.vocab import ids_before_eos, pack_texts


class SubwordTable:
    """`Vocabulary`'s interface over a Hugging Face tokenizer (module docstring)."""

    def __init__(self, tokenizer, task_names: Sequence[str] = ()):
        self.tokenizer = tokenizer
        self.task_names = tuple(task_names)
        self.pad_id, self.eos_id, self.bos_id = int(tokenizer.pad_id), int(tokenizer.eos_id), None
        self.vocab_size = int(tokenizer.vocab_size)

    def __len__(self) -> int:
        return self.vocab_size

    def tokens(self, text: str | Sequence[int]) -> list[int]:
        """Token ids of `text` (no special tokens added); a sequence of ids (an agent-prompt
        corpus row, `derl_jax.domains.agent_prompt`) is taken as it is."""
        if not isinstance(text, str):
            return [int(i) for i in text]
        return self.tokenizer.encode(text)

    def encode(self, text: str, length: int) -> np.ndarray:
        """i32[length]: the first `length` token ids of `text`, padded."""
        ids = self.tokens(text)[:length]
        return np.array(ids + [self.pad_id] * (length - len(ids)), np.int32)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of the ids up to the first eos, padding dropped."""
        return self.tokenizer.decode([i for i in ids_before_eos(ids, self.eos_id) if i != self.pad_id])

    def decode_batch(self, ids) -> list[str]:
        return [self.decode(row) for row in np.asarray(ids)]

    def encode_batch(self, texts: Sequence[str], length: int, left_pad: bool, *, add_bos: bool = False,
                     add_eos: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(ids i32[B, length], mask bool[B, length]), padded left (prompts) or right; a text
        longer than `length` raises naming it."""
        def tokens(text: str) -> list[int]:
            return self.tokens(text) + [self.eos_id] * add_eos

        return pack_texts(texts, tokens, length, left_pad, self.pad_id, "ScienceWorld token table")
