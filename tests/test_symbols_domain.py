"""The symbols domain: primitives on hand-written outputs, strings, corpus, config, training, launcher."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import primitives.symbols as prims
from configs import common
from derl_jax.config import ConfigError
from derl_jax.experiment.checks import validate_config
from derl_jax.domains import symbols
from derl_jax.domains.registry import get_domain
from derl_jax.experiment.protocol import compile_checked, run_keys, split_train
from derl_jax.rl.setup import build_inner
from primitives import registry

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_PATH = os.path.join(REPO_ROOT, "configs", "symbols.py")
TOK = prims.symbols_tokenizer()
T = 8
A = 6
NAMES = prims.SYMBOLS_PRIMITIVES
PLACEHOLDERS = {TOK.pad_id: "\x00", TOK.bos_id: "\x01"}  # special tokens inside an output, as characters


def load_config_module():
    spec = importlib.util.spec_from_file_location("symbols_config", CONFIG_PATH)  # as --config= loads it
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rollouts(outputs, ended, gold, width=T):
    """Rollout and context arrays for output texts (EOS after those that `ended`; the others fill
    `width` by repeating their text) against gold strings."""
    tokens = np.full((len(outputs), width), TOK.pad_id, np.int32)
    mask = np.zeros((len(outputs), width), bool)
    for row, (text, done) in enumerate(zip(outputs, ended)):
        ids = TOK.encode(text, add_eos=done)
        while not done and len(ids) < width:
            ids += TOK.encode(text or "a")
        ids = ids[:width]
        tokens[row, : len(ids)], mask[row, : len(ids)] = ids, True
    answer, answer_mask = TOK.encode_batch(gold, A, left_pad=False)
    context = {"answer": jnp.asarray(answer), "answer_len": jnp.asarray(answer_mask.sum(1).astype(np.int32))}
    return {"tokens": jnp.asarray(tokens), "mask": jnp.asarray(mask)}, context


def all_primitives(rollout, context):
    """f32[N, 5]: every symbols primitive, from the registry, in g1..g5 order."""
    return jnp.stack([registry.get("symbols", name).fn(rollout, context) for name in NAMES], axis=-1)


# ----------------------------------------------------------------------------- primitives


def test_primitives_on_hand_written_outputs():
    gold = "dcba"
    cases = [  # output, ended, (exact, position, bag, length, marker) by hand
        ("dcba", True, (1, 1, 1, 1, 0)),          # the answer
        ("abcd", True, (0, 0, 1, 1, 0)),          # a copy: every letter present, none aligned
        ("dcb", True, (0, 0.75, 0.75, 0, 0)),     # one short
        ("dcbaa", True, (0, 0.8, 0.8, 0, 0)),     # one extra letter
        ("dc#a", True, (0, 0.75, 0.75, 1, 1)),    # one letter replaced by the decoy
        ("####", True, (0, 0, 0, 1, 1)),          # the decoy alone, at the right length
        ("", True, (0, 0, 0, 0, 0)),              # EOS at once
        ("dcba", False, (0, 0.5, 0.5, 0, 0)),     # no EOS: `dcbadcba` fills all 8 tokens
        ("dcbb", True, (0, 0.75, 0.75, 1, 0)),
        ("ddcc", True, (0, 0.25, 0.5, 1, 0)),     # d aligned once; two d and two c, one of each in gold
    ]
    rollout, context = rollouts([c[0] for c in cases], [c[1] for c in cases], [gold] * len(cases))
    got = np.asarray(all_primitives(rollout, context))
    np.testing.assert_allclose(got, [c[2] for c in cases], rtol=0, atol=1e-7)
    assert got.dtype == np.float32


def test_the_aliases_name_the_outcome_the_dense_signal_and_the_decoy():
    table = registry.symbol_table(registry.resolve("symbols", NAMES))
    assert table["outcome"] == 0 and table["dense"] == 1 and table["decoy"] == 4
    assert [table[f"g{i + 1}"] for i in range(5)] == [table[name] for name in NAMES]


def text_reference(output: str, ended: bool, gold: str) -> tuple[float, ...]:
    """The primitives from their text definitions (primitives/symbols.py), in plain Python."""
    n, m = len(output), len(gold)
    longer = max(n, m, 1)
    aligned = sum(o == g for o, g in zip(output, gold))
    overlap = sum(min(output.count(c), gold.count(c)) for c in prims.LETTERS)
    return (float(ended and output == gold), aligned / longer, overlap / longer, float(ended and n == m),
            float(prims.MARKER in output))


def text_output(tokens: np.ndarray, mask: np.ndarray) -> tuple[str, bool]:
    """(output text, ended) of one rollout: its masked prefix up to the first EOS."""
    chars = []
    for token in tokens[: int(mask.sum())].tolist():
        if token == TOK.eos_id:
            return "".join(chars), True
        chars.append(PLACEHOLDERS.get(token) or TOK.decode([token]))
    return "".join(chars), False


def test_primitives_match_their_text_definitions_on_random_tokens():
    rng = np.random.default_rng(0)
    count = 600
    gold = ["".join(rng.choice(list("abcd"), size=rng.integers(1, A + 1))) for _ in range(count)]
    tokens = rng.integers(0, TOK.vocab_size, size=(count, T)).astype(np.int32)
    # bias towards near-answers so exact and length are often 1: copy the gold string into half the rows
    for row in range(0, count, 2):
        ids = TOK.encode(gold[row], add_eos=True)
        tokens[row, : len(ids)] = ids
    mask = np.arange(T)[None, :] < rng.integers(0, T + 1, size=count)[:, None]
    mask[::2] = True
    answer, answer_mask = TOK.encode_batch(gold, A, left_pad=False)
    context = {"answer": answer, "answer_len": answer_mask.sum(1).astype(np.int32)}
    rollout = {"tokens": tokens, "mask": mask}
    jitted = np.asarray(jax.jit(all_primitives)(rollout, context))
    np.testing.assert_array_equal(jitted, np.asarray(all_primitives(rollout, context)))
    expected = np.array([text_reference(*text_output(tokens[i], mask[i]), gold[i]) for i in range(count)])
    np.testing.assert_allclose(jitted, expected, rtol=1e-6, atol=1e-7)
    assert np.all(expected.mean(axis=0) > 0.05) and np.all(expected[:, [0, 3, 4]].mean(axis=0) < 0.95)


def test_reference_styles_score_as_designed():
    strings = symbols.make_strings(3, 50, symbols.StringSpec(8, 4, 6))
    gold = [symbols.answer_of(s) for s in strings]
    rng = np.random.default_rng(0)
    for style, expected in {"reverse": (1, 1, 1, 1, 0), "copy": (0, None, 1, 1, 0)}.items():
        rollout, context = rollouts([symbols.reference_answer(s, style, rng) for s in strings], [True] * 50, gold)
        got = np.asarray(all_primitives(rollout, context))
        for column, value in enumerate(expected):
            if value is not None:
                np.testing.assert_array_equal(got[:, column], value, err_msg=f"{style} {NAMES[column]}")
    copies = np.asarray(all_primitives(*rollouts(strings, [True] * 50, gold)))
    assert np.all(copies[:, 1] < 1)  # no string is a palindrome, so copying never aligns everywhere
    marked = [symbols.reference_answer(s, "marked", rng, reverse_rate=1.0) for s in strings]
    got = np.asarray(all_primitives(*rollouts(marked, [True] * 50, gold)))
    lengths = np.array([len(s) for s in strings])
    np.testing.assert_allclose(got, np.stack([np.zeros(50), (lengths - 1) / lengths, (lengths - 1) / lengths,
                                              np.ones(50), np.ones(50)], axis=1), rtol=1e-6)


# ----------------------------------------------------------------------------- strings and corpus


def test_strings_are_deterministic_distinct_and_within_the_spec():
    spec = symbols.StringSpec(alphabet_size=6, min_len=3, max_len=6)
    first = symbols.make_strings(7, 400, spec)
    assert first == symbols.make_strings(7, 400, spec) and first != symbols.make_strings(8, 400, spec)
    assert len(set(first)) == 400
    assert all(3 <= len(s) <= 6 and set(s) <= set("abcdef") and s != "".join(reversed(s)) for s in first)
    assert {len(s) for s in first} == {3, 4, 5, 6}
    three = [np.base_repr(i, 6).zfill(3) for i in range(6**3)]
    assert spec.count(3) == sum(s != s[::-1] for s in three) == 180
    with pytest.raises(ValueError, match="strings of length 2 asked for, but only 2 non-palindromes"):
        symbols.make_strings(0, 20, symbols.StringSpec(2, 2, 2))


def test_splits_have_their_sizes_and_answers_are_the_reversed_prompts():
    cfg = ml_collections.ConfigDict({"seed": 4, "num_train": 120, "num_test": 30, "alphabet_size": 6, "min_len": 4,
                                     "max_len": 6, "max_new_tokens": 8})
    domain = symbols.make_symbols_domain(cfg)
    assert domain.train.prompts.shape == (120, 8) and domain.test.prompts.shape == (30, 8)
    assert domain.train.context["answer"].shape == (120, 6)
    train, test = domain.info["train_strings"].tolist(), domain.info["test_strings"].tolist()
    assert not set(train) & set(test)
    for split, strings in ((domain.train, train), (domain.test, test)):
        for row, text in enumerate(strings):
            prompt = TOK.decode(np.asarray(split.prompts[row]))
            assert prompt == text + "=" and int(split.prompts[row][-len(text) - 2]) == TOK.bos_id
            answer = np.asarray(split.context["answer"][row])[: int(split.context["answer_len"][row])]
            assert TOK.decode(answer) == "".join(reversed(prompt[:-1]))  # an independent reversal
    again = symbols.make_symbols_domain(cfg)
    np.testing.assert_array_equal(np.asarray(again.test.prompts), np.asarray(domain.test.prompts))
    assert domain.primitive_names == NAMES and domain.validation_metric == "exact"


def test_corpus_styles_mix_and_held_out_rows():
    strings = symbols.make_strings(1, 400, symbols.StringSpec(8, 4, 6))
    assert symbols.sft_corpus(strings, 0, {"copy": 1}) == [(s + "=", s) for s in strings]
    assert symbols.sft_corpus(strings, 0, {"mixed": 1}, reverse_rate=1.0) == [(s + "=", s[::-1]) for s in strings]
    corpus = symbols.sft_corpus(strings, 5, {"mixed": 0.8, "marked": 0.2}, reverse_rate=0.2)
    assert corpus == symbols.sft_corpus(strings, 5, {"mixed": 0.8, "marked": 0.2}, reverse_rate=0.2)
    marked = [c for _, c in corpus if "#" in c]
    assert 0.12 < len(marked) / len(corpus) < 0.28 and all(c.count("#") == 1 for c in marked)
    reversed_here = differing = 0
    for (prompt, completion), text in zip(corpus, strings):
        assert len(completion) == len(text)
        for i, char in enumerate(completion):
            assert char in (text[i], text[::-1][i], "#")
            if text[i] != text[::-1][i] and char != "#":
                differing += 1
                reversed_here += char == text[::-1][i]
    assert 0.15 < reversed_here / differing < 0.25
    with pytest.raises(ValueError, match="unknown styles \\['boxed'\\]"):
        symbols.sft_corpus(strings, 0, {"boxed": 1})

    cfg = ml_collections.ConfigDict({"seed": 0, "num_train": 50, "num_test": 20, "alphabet_size": 8, "min_len": 4,
                                     "max_len": 6, "max_new_tokens": 8})
    domain = symbols.make_symbols_domain(cfg)
    train = domain.info["train_strings"].tolist()
    texts = [p[:-1] for p, _ in domain.corpus(0, [0, 3], {"sft_extra_strings": 30})]
    assert texts[:48] == [s for row, s in enumerate(train) if row not in (0, 3)]
    extra = texts[48:]
    assert len(extra) == 30 and not set(extra) & (set(train) | set(domain.info["test_strings"].tolist()))
    assert extra == [p[:-1] for p, _ in domain.corpus(0, [0, 3], {"sft_extra_strings": 30})][48:]


# ----------------------------------------------------------------------------- registration and config


def test_the_domain_registers_itself_with_its_checks():
    module = load_config_module()
    spec = get_domain("symbols")
    for preset in ("default", "smoke"):
        cfg = module.get_config(preset)
        validate_config(cfg)
        spec.validate(cfg)
        assert spec.primitive_names(cfg) == NAMES
        reference = common.base("x", {}, {})
        for block in ("inner", "meta", "outer", "evolution", "final", "compare", "mesh", "primitives"):
            assert set(cfg[block].keys()) == set(reference[block].keys()), block
    default = module.get_config()
    assert default.domain.num_test >= 1000 and default.domain.num_train >= 1000
    assert default.final.steps == default.inner.steps
    assert "--config=configs/symbols.py" in module.__doc__ and "minutes" in module.__doc__
    bad = {"domain.alphabet_size": (9, "config.domain.alphabet_size must be <= 8, got 9"),
           "domain.max_len": (3, "config.domain.max_len must be >= 4, got 3"),
           "domain.max_new_tokens": (6, "config.domain.max_new_tokens must be >= 7, got 6"),
           "policy.sft_reverse_rate": (1.5, "config.policy.sft_reverse_rate must be a number in [0, 1], got 1.5")}
    for path, (value, message) in bad.items():
        cfg = module.get_config()
        block, field = path.split(".")
        cfg[block][field] = value
        with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
            spec.validate(cfg)
    cfg = module.get_config()
    cfg.policy.sft_mix = {"mixed": 1.0, "boxed": 1.0}
    with pytest.raises(ConfigError, match="^config.policy.sft_mix must map styles"):
        spec.validate(cfg)


# ----------------------------------------------------------------------------- training


def ordering_config() -> ml_collections.ConfigDict:
    """A small default-like run: the default policy with enough warm start to copy, 12 inner steps."""
    cfg = load_config_module().get_config()
    cfg.domain.update(num_train=200, num_test=100)
    cfg.policy.update(sft_steps=250, sft_lr=5e-3, sft_batch_size=64, sft_extra_strings=800)
    cfg.inner.update(steps=12, prompts_per_step=8, group_size=4)
    cfg.final.steps = 12
    cfg.mesh.data = 1
    cfg.domain.base_policy_band = {}   # a shorter warm start than the default's: not the declared difficulty
    return cfg


@pytest.mark.slow
def test_dense_reward_beats_the_decoy_and_a_seed_repeats_its_run(tmp_path):
    cfg = ordering_config()
    domain = get_domain("symbols").build(cfg)
    base, evaluator = build_inner(domain, cfg, str(tmp_path))
    inner_train, _ = split_train(domain.train, 0)
    key = run_keys(0)["final"]
    curves = {}
    for expression in ("g2", "g5"):
        _, program = compile_checked(expression, domain.primitive_names)
        params, curves[expression] = evaluator.train_final(program, base, key, inner_train)
        curves[expression]["test"] = evaluator.accuracy(params, domain.test)
    late = slice(cfg.inner.steps // 2, None)
    mean = lambda expression, name: float(np.mean(curves[expression][f"primitive/{name}"][late]))  # noqa: E731
    assert mean("g2", "position") > mean("g5", "position") + 0.1
    assert mean("g5", "marker") > mean("g2", "marker") + 0.4   # the decoy is what g5 learns
    assert curves["g5"]["test"] <= curves["g2"]["test"]
    _, program = compile_checked("g2", domain.primitive_names)
    _, again = evaluator.train_final(program, base, key, inner_train)
    for name, values in again.items():
        np.testing.assert_array_equal(values, curves["g2"][name], err_msg=name)


@pytest.mark.slow
def test_the_launcher_runs_the_smoke_compare_end_to_end(tmp_path):
    """One process runs both methods (a second worker would import JAX and compile everything again;
    tests/test_compare_workers.py covers the compare shared out over processes)."""
    workdir = tmp_path / "run"
    completed = subprocess.run(
        [sys.executable, os.path.join(REPO_ROOT, "launch", "run.py"), "--config=configs/symbols.py:smoke",
         "--mode=compare", f"--workdir={workdir}", "--noprogress", "--config.compare.workers=1"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=900)
    assert completed.returncode == 0, completed.stderr[-3000:]
    saved = json.load(open(workdir / "results.json"))
    assert saved["methods"] == ["derl", "outcome"]
    for method in ("derl", "outcome"):
        (row,) = saved["per_seed"][method]
        assert row["seed"] == 0 and 0.0 <= row["test"] <= 1.0
        assert round(row["test"] * 20) == pytest.approx(row["test"] * 20, abs=1e-6)  # a pass rate over 20 strings
    info = json.load(open(workdir / "domain.json"))
    assert info["domain"] == "symbols" and info["primitives"] == list(NAMES) and "test_strings" not in info
    assert "| outcome |" in completed.stdout
