"""A compact byte-level BPE tokenizer for tests of the agent domains with checkpoints.

Qwen's 151,936-token vocabulary makes a tiny policy's embedding and logits hundreds of times
larger than its layers, so the tests that train or run such a policy spend their time there.
This tokenizer is trained (Hugging Face `tokenizers`) on the household's expert cold-start
turns read through Qwen's chat template: the same chat markers (`<|im_start|>`, `<|im_end|>`,
`<|endoftext|>`), a byte-level alphabet (any text encodes, engine observations included), and
about 700 tokens. A household turn takes ~220 tokens against Qwen's ~240. It is written as a
Hugging Face directory (`tokenizer.json` + `tokenizer_config.json`) that
`HFTokenizer.from_directory` loads like any other; with no chat template of its own it is read
with the Qwen2.5 template. Built once per test session (`compact_tokenizer_dir`).
"""

from __future__ import annotations

import os

import ml_collections

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_LIMIT = 1024


def household_turn_texts() -> list[str]:
    """The household expert corpus's turns (prompt + answer, chat markers kept) as text."""
    from derl_jax.domains.household.domain import make_household_domain
    from derl_jax.models.hf_tokenizer import bundled_qwen_tokenizer_dir

    block = ml_collections.ConfigDict({
        "kind": "household", "level": "L0", "seed": 0, "num_train": 40, "num_test": 4, "held_out_kinds": (4, 5),
        "max_turns": 6, "history": "window", "window": 1, "answer_length": 64, "obs_length": 96,
        "admissible_length": 192})
    domain = make_household_domain(block, bundled_qwen_tokenizer_dir())
    decode = domain.tokenizer.tokenizer.decode
    return [decode(list(prompt) + list(answer), skip_special_tokens=False)
            for prompt, answer in domain.corpus(0, [], {"sft_perturb_rate": 0.5})]


def write_compact_tokenizer(path: str, texts: list[str]) -> str:
    """Trains the byte-level BPE on `texts` and saves it as a Hugging Face directory -> `path`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_LIMIT, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    os.makedirs(path, exist_ok=True)
    wrapped.save_pretrained(path)
    return path
