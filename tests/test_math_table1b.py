"""Table 1(b) as the paper reports it: named test sets (GSM8K and MATH), exact match as the
headline test metric with math-verify beside it, g1's answer comparison, the report's columns.

References: hand-checked answer pairs, NumPy means over the fixture rows, a fake evaluator
whose greedy outputs are known, and the math presets themselves.
"""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from derl_jax.config import ConfigError
from derl_jax.domains import math as math_domain
from derl_jax.domains.base import TokenDataset
from derl_jax.rl.evaluator import CandidateResults
from derl_jax.experiment import protocol
from derl_jax.experiment.report import write_report
from derl_jax.models.hf_tokenizer import bundled_qwen_tokenizer_dir
from primitives import registry
from primitives.math import answer_metrics, answers_exact, correct_exact, math_primitive_names

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config(name: str, preset: str):
    spec = importlib.util.spec_from_file_location(f"derl_config_{name}_t1b", os.path.join(REPO_ROOT, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(preset)


# --------------------------------------------------------------------------- metrics


def test_exact_match_differs_from_math_verify_where_it_should():
    assert answers_exact("\\dfrac{1}{2}", "\\frac{1}{2}") and answers_exact(" 1,250. ", "1250")
    assert not answers_exact("0.5", "\\frac{1}{2}") and not answers_exact(None, "3")
    texts = ["so \\boxed{0.5}", "\\boxed{\\dfrac{1}{2}}", "#### 7", "no answer", "\\boxed{8}"]
    golds = ["\\frac{1}{2}", "\\frac{1}{2}", "7", "7", "7"]
    metrics = answer_metrics(texts, golds)
    np.testing.assert_array_equal(metrics["exact"], [0, 1, 1, 0, 0])
    np.testing.assert_array_equal(metrics["verify"], [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(correct_exact(texts, [{"answer": g} for g in golds]), [0, 1, 1, 0, 0])


def test_reward_match_picks_g1():
    assert math_primitive_names() == ("correct", "boxed", "steps", "gold_anywhere")
    assert math_primitive_names(reward_match="exact") == ("correct_exact", "boxed", "steps", "gold_anywhere")
    assert registry.get("math", "correct_exact").kind == "host"
    cfg = load_config("math", "tiny")
    assert cfg.domain.reward_match == "verify"
    cfg.domain.reward_match = "exact"
    assert math_domain.configured_primitive_names(cfg)[0] == "correct_exact"
    cfg.domain.reward_match = "fuzzy"
    with pytest.raises(ConfigError, match=r"config\.domain\.reward_match must be one of \('verify', 'exact'\)"):
        math_domain.validate_math_config(cfg)


def test_test_set_specs_names_and_errors():
    assert math_domain.test_set_specs("gsm8k:/a/test.jsonl, math:/b/test.jsonl") == [
        ("gsm8k", "gsm8k:/a/test.jsonl"), ("math", "math:/b/test.jsonl")]
    assert math_domain.test_set_specs("hard=math:/b/t.jsonl,/c/extra.parquet") == [
        ("hard", "math:/b/t.jsonl"), ("extra", "/c/extra.parquet")]
    with pytest.raises(ConfigError, match=r"config\.data\.test: test set names must differ"):
        math_domain.test_set_specs("math:/a.jsonl,math:/b.jsonl")


def test_presets_test_on_gsm8k_and_math_and_carry_the_released_meta_settings():
    for name in ("math", "gsm8k"):
        for preset in ("default", "mixture", "tiny"):
            cfg = load_config(name, preset)
            assert [n for n, _ in math_domain.test_set_specs(cfg.data.test)] == [name, *({"gsm8k", "math"} - {name})]
            assert cfg.inner.time_limit_s == 0.0
    cfg = load_config("math", "default")
    assert (cfg.meta.epochs, cfg.meta.lr, cfg.meta.kl, cfg.meta.kl_kind) == (4, 1e-6, 0.001, "k3")
    assert cfg.inner.budget_factor == 1.3 and cfg.policy.vocab_size == 151936


# --------------------------------------------------------------------------- domain


@pytest.fixture(scope="module")
def tiny_domain(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("tiny_math"))
    math_domain.write_tiny_data(directory, count=6)
    cfg = load_config("math", "tiny")
    cfg.data.train = f"gsm8k:{directory}/gsm8k_train.jsonl,math:{directory}/math_train.jsonl"
    cfg.data.test = f"gsm8k:{directory}/gsm8k_test.jsonl,math:{directory}/math_test.jsonl"
    cfg.policy.tokenizer = bundled_qwen_tokenizer_dir()
    return directory, math_domain.make_math_domain(cfg)


def read_golds(path):
    with open(path, encoding="utf-8") as handle:
        records = [json.loads(line) for line in handle]
    return [r["answer"].split("#### ")[-1].strip() if "answer" in r else r["solution"].split("boxed{")[-1].split("}")[0]
            for r in records]


def test_domain_holds_each_named_test_set(tiny_domain):
    directory, domain = tiny_domain
    assert list(domain.test_sets) == ["gsm8k", "math"] and domain.info["test_sets"] == {"gsm8k": 3, "math": 3}
    for name, dataset in domain.test_sets.items():
        got = [domain.answers[i] for i in domain.example_indices(dataset)]
        assert got == read_golds(os.path.join(directory, f"{name}_test.jsonl"))
    assert domain.test.size == 6
    sizes = {name: ds.size for name, ds in domain.test_sets.items()}
    assert sum(sizes.values()) == domain.test.size


def test_domain_test_metrics_match_numpy(tiny_domain):
    _, domain = tiny_domain
    dataset = domain.test_sets["math"]
    golds = [domain.answers[i] for i in domain.example_indices(dataset)]
    texts = [f"\\boxed{{{golds[0]}}}", f"#### {golds[1]}.0", "nothing"]
    exact = np.array([1.0, 0.0, 0.0])  # "x.0" is not an exact match but math-verify accepts it
    verify = np.array([1.0, 1.0, 0.0])
    assert domain.test_metrics(texts, dataset) == {"exact": pytest.approx(exact.mean()), "verify": pytest.approx(verify.mean())}


# --------------------------------------------------------------------------- protocol and report


class TextEvaluator:
    """A fake evaluator: params is a number p; its greedy output on row r is right when r < p."""

    def __init__(self, domain):
        self.domain = domain

    def evaluate_candidates(self, programs, init_params, key, train_set, val_set, *, steps=None):
        k = int(np.asarray(programs.ops).shape[0])
        return CandidateResults(scores=np.full(k, 0.5, np.float32), curves={}, params=None)

    def train_final(self, program, init_params, key, train_set):
        return 2, {"reward_mean": np.zeros(2, np.float32)}

    def greedy_texts(self, params, dataset: TokenDataset):
        golds = [self.domain.answers[i] for i in self.domain.example_indices(dataset)]
        return [f"\\boxed{{{g}}}" if r < params else "\\boxed{none}" for r, g in enumerate(golds)]

    def accuracy(self, params, dataset):
        raise AssertionError("a domain with test metrics is scored from greedy texts")


def test_every_final_policy_is_reported_on_each_test_set_by_each_metric(tiny_domain, tmp_path):
    _, domain = tiny_domain
    cfg = load_config("math", "tiny")
    evaluator = TextEvaluator(domain)
    result = protocol.run_method("outcome", cfg, domain, evaluator, str(tmp_path / "outcome"), 0, base_params=0,
                                 progress=False, echo=lambda line: None)
    expected = {name: {"exact": min(2, ds.size) / ds.size, "verify": min(2, ds.size) / ds.size}
                for name, ds in domain.test_sets.items()}
    for name in ("gsm8k", "math"):
        assert result.test_sets[name] == pytest.approx(expected[name])
    assert list(result.test_sets) == ["gsm8k", "math"] and result.retrained_test_sets == result.test_sets
    assert result.test == pytest.approx(expected["gsm8k"]["exact"])
    payload = write_report(str(tmp_path), {"outcome": [result]})
    assert payload["test_sets"]["outcome"]["math"]["verify"]["mean"] == pytest.approx(expected["math"]["verify"])
    with open(tmp_path / "results.md", encoding="utf-8") as handle:
        text = handle.read()
    header = "| method | seeds | gsm8k exact (%) | gsm8k verify (%) | math exact (%) | math verify (%) |"
    assert header in text and text.index(header) < text.index("## Test accuracy (headline")
    row = f"| outcome | 1 | {100 * expected['gsm8k']['exact']:.2f} ± 0.00*"
    assert row in text
