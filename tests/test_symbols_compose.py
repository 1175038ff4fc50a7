"""The composed symbols tasks: answers, primitives on hand-written outputs, the reward classifier,
the corpus, the configs and the domain's config errors."""

from __future__ import annotations

import importlib.util
import os

import jax.numpy as jnp
import numpy as np
import pytest

import primitives.symbols_compose as prims
from derl_jax.config import ConfigError
from derl_jax.domains import symbols_compose
from derl_jax.domains.symbols_classes import reward_class, used_primitives
from derl_jax.experiment.checks import validate_config
from primitives import registry

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_PATH = os.path.join(REPO_ROOT, "configs", "symbols_compose.py")
TOK = prims.compose_tokenizer()
T = 9
ORDER = ("exact", "order", "case", "end", "marker", "echo", "bag", "length", "ended", "letters", "start")


def load_config_module():
    spec = importlib.util.spec_from_file_location("symbols_compose_config", CONFIG_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rollouts(outputs, ended, source, aspects):
    """Rollout and context arrays for output texts against the string `source` (every row)."""
    tokens = np.full((len(outputs), T), TOK.pad_id, np.int32)
    mask = np.zeros((len(outputs), T), bool)
    for row, (text, done) in enumerate(zip(outputs, ended)):
        ids = TOK.encode(text, add_eos=done)
        while not done and len(ids) < T:
            ids += TOK.encode(text)
        ids = ids[:T]
        tokens[row, : len(ids)], mask[row, : len(ids)] = ids, True
    n = len(outputs)
    answer, answer_mask = TOK.encode_batch([symbols_compose.compose_answer(source, aspects)] * n, 7, left_pad=False)
    src, src_mask = TOK.encode_batch([source] * n, 6, left_pad=False)
    context = prims.context_arrays(answer, answer_mask.sum(1), src, src_mask.sum(1))
    return {"tokens": jnp.asarray(tokens), "mask": jnp.asarray(mask)}, context


def test_answers_compose_the_aspects():
    assert symbols_compose.compose_answer("cabd", 1) == "dbac"
    assert symbols_compose.compose_answer("cabd", 2) == "DBAC"
    assert symbols_compose.compose_answer("cabd", 3) == "DBAC!"
    assert prims.compose_primitive_names(2, 1) == ("exact", "order", "case", "marker")
    assert prims.compose_primitive_names(3, 4) == ("exact", "order", "case", "end", "marker", "echo", "bag", "length")
    assert prims.compose_primitive_names(2, 7)[-3:] == ("ended", "letters", "start")
    with pytest.raises(ValueError, match="aspects"):
        prims.compose_primitive_names(4, 0)


def test_primitives_on_hand_written_outputs():
    # s = cabd (L = 4), reversed dbac; the three-aspect answer is DBAC!
    cases = [  # output, ended, (exact, order, case, end, marker, echo, bag, length, ended, letters, start) by hand
        ("DBAC!", True, (1, 1, 1, 1, 0, 0, 1, 1, 1, 0.8, 1)),             # the answer
        ("dbac", True, (0, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1)),                # reversed only
        ("DBAC", True, (0, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1)),                # reversed, upper, no `!`
        ("cabd!", True, (0, 0, 0, 1, 0, 1, 1, 1, 1, 0.8, 1)),             # a copy with `!`
        ("dBa#", True, (0, 0.75, 0.25, 0, 1, 0, 0.75, 0, 1, 0.75, 1)),    # 3 letters of 4 aligned, one upper, a decoy
        ("dbacc", True, (0, 0.8, 0, 0, 0, 0, 0.8, 0, 1, 1, 1)),           # one letter too many: 4 of max(5, 4)
        ("DBA", True, (0, 0.75, 0.75, 0, 0, 0, 0.75, 0, 1, 1, 1)),        # one letter short
        ("CAbd", True, (0, 0, 0.5, 0, 0, 1, 1, 1, 1, 1, 1)),              # a copy, half upper
        ("DBAC!", False, (0, 0.5, 0.5, 0, 0, 0, 0.5, 0, 0, 8 / 9, 1)),    # no EOS: DBAC!DBAC fills 9 tokens, 8 letters
        ("", True, (0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0)),
        ("hbac", True, (0, 0.75, 0, 0, 0, 0, 0.75, 1, 1, 1, 0)),          # starts with a letter s lacks
        ("#bac", True, (0, 0.75, 0, 0, 1, 0, 0.75, 0, 1, 0.75, 0)),       # starts with the decoy symbol
    ]
    rollout, context = rollouts([c[0] for c in cases], [c[1] for c in cases], "cabd", 3)
    got = np.stack([np.asarray(registry.get("symbols_compose", name).fn(rollout, context)) for name in ORDER], -1)
    np.testing.assert_allclose(got, np.array([c[2] for c in cases], np.float32), atol=1e-6)


def test_exact_follows_the_number_of_aspects():
    outputs = ["dbac", "DBAC", "DBAC!"]
    for aspects, right in ((1, 0), (2, 1), (3, 2)):
        rollout, context = rollouts(outputs, [True] * 3, "cabd", aspects)
        values = np.asarray(registry.get("symbols_compose", "exact").fn(rollout, context))
        np.testing.assert_array_equal(values, np.eye(3)[right])


@pytest.mark.parametrize("text, expected", [
    ("g2+g3", "top"), ("g2*g3", "top"), ("max(g2, g3) - g4", "top"), ("g2 + 0.5*g3 + g6", "top"),
    ("g2+g3+0.01*g4", "top"),                     # a trifle of the decoy does not count
    ("g2 + 0.01*g3 + g6", "partial"),             # nor a trifle of an aligned primitive
    ("g3 + g1*g2", "partial"),                    # nor one gated by the outcome, which is about 0
    ("g2", "partial"), ("g3 - g2", "partial"), ("g2+g3+g4", "decoy"), ("g2+g3+g5", "decoy"),
    ("g1", "other"), ("g6 + g7", "other"), ("2.5", "other"), ("g2 +", "other"), ("g9", "other"),
])
def test_reward_classes_by_hand(text, expected):
    # m = 2, D = 4: exact, order, case | marker, echo, bag, length
    names = prims.compose_primitive_names(2, 4)
    assert reward_class(names, text) == expected


def test_used_primitives_reads_the_direction_of_each():
    names = ("exact", "position", "bag", "length", "marker")
    assert used_primitives("g2 - g5", names) == ("position",)
    assert used_primitives("(g1+g2+g3+g4+g5)/5", names) == names
    assert used_primitives("g2*(1-u) + u*g1", names) == ("exact", "position")
    assert reward_class(names, "(g1+g2+g3+g4)/4") == "top"
    assert reward_class(names, "(g1+g2+g3+g4+g5)/5") == "decoy"
    assert reward_class(names, "g3") == "other"


def test_corpus_rates_and_greedy_choice():
    rng = np.random.default_rng(0)
    rates = dict(symbols_compose.DEFAULT_RATES)
    text = "abcdefgh"[:6]
    outs = [symbols_compose.corpus_answer(text, 3, "mixed", rng, rates) for _ in range(4000)]
    reversed_share = np.mean([o[i].lower() == text[::-1][i] for o in outs for i in range(6)])
    upper_share = np.mean([o[i].isupper() for o in outs for i in range(6)])
    end_share = np.mean([o.endswith("!") for o in outs])
    for share in (reversed_share, upper_share, end_share):
        assert abs(share - 0.2) < 0.02
    marked = symbols_compose.corpus_answer(text, 1, "marked", rng, rates)
    assert marked.count("#") == 1 and len(marked) == 6 and marked == marked.lower()


def test_domain_splits_answers_and_classifier():
    cfg = load_config_module().get_config("smoke")
    domain = symbols_compose.make_compose_domain(cfg.domain)
    aspects = int(cfg.domain.aspects)
    strings = domain.info["train_strings"].tolist()
    answers = ["".join(TOK.token_names[i] for i in row if i > TOK.eos_id) for row in np.asarray(domain.train.context["answer"])]
    assert answers == [symbols_compose.compose_answer(s, aspects) for s in strings]
    assert set(strings).isdisjoint(domain.info["test_strings"].tolist())
    assert domain.primitive_names == prims.compose_primitive_names(aspects, int(cfg.domain.decoys))
    if hasattr(domain, "classifier"):
        assert domain.reward_class("g2+g3") == "top" and domain.reward_class("g4") == "decoy"


@pytest.mark.parametrize("preset, aspects, decoys", [("easy", 2, 1), ("medium", 2, 4), ("hard", 3, 4)])
def test_presets_validate(preset, aspects, decoys):
    cfg = load_config_module().get_config(preset)
    validate_config(cfg)
    assert (cfg.domain.aspects, cfg.domain.decoys) == (aspects, decoys)
    assert set(cfg.domain.base_policy_band) <= set(prims.compose_primitive_names(aspects, decoys))


@pytest.mark.parametrize("field, value, message", [
    ("domain.aspects", 4, "config.domain.aspects"), ("domain.decoys", 8, "config.domain.decoys"),
    ("domain.max_new_tokens", 7, "config.domain.max_new_tokens"), ("policy.sft_upper_rate", 1.5, "sft_upper_rate"),
])
def test_config_errors_name_the_field(field, value, message):
    cfg = load_config_module().get_config("smoke")
    block, name = field.split(".")
    cfg[block][name] = value
    with pytest.raises(ConfigError, match=message):
        validate_config(cfg)
