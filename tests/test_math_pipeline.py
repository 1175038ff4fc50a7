"""The GSM8K/MATH pipeline: domain from files, host-primitive inner loop, budget, sharding.

A tiny random Qwen2 checkpoint (Qwen vocabulary, hidden size 8) is saved with transformers;
the data are the JSONL fixtures of `fixtures_math`. References: PyTorch greedy generation
for what the evaluator decodes and scores, the NumPy reward VM for the rewards used in the
update, a single-device run for the sharded step, hand-derived numbers for the budget.
"""

from __future__ import annotations

import importlib.util
import logging
import os

import jax
import numpy as np
import pytest
import torch
import transformers

import fixtures_math as fx
from derl_jax.domains import math as math_domain
from derl_jax.domains.math_data import MathDataError
from derl_jax.expr import compile_expr, parse, stack_programs
from derl_jax.expr.vm import evaluate_numpy
from derl_jax.experiment import protocol
from derl_jax.experiment.checks import validate_config
from derl_jax.models.hf_tokenizer import bundled_qwen_tokenizer_dir, math_prompt
from derl_jax.parallel import make_mesh
from derl_jax.rl import host_batches, host_policy, placement, rollout, setup
from derl_jax.rl.config import InnerConfig
from derl_jax.rl.grpo import GRPOConfig
from primitives.math import correct

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN_VOCAB = 151936
TEST_RECORDS = (
    {"question": "Mia reads 6 pages a day for 4 days. How many pages does she read?", "answer": "6 * 4 = 24\n#### 24"},
    {"question": "A box holds 9 eggs and 2 break. How many eggs are left?", "answer": "9 - 2 = 7\n#### 7"},
)


def load_config(name: str, preset: str):
    spec = importlib.util.spec_from_file_location(f"derl_config_{name}", os.path.join(REPO_ROOT, "configs", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(preset)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """Fixture data files and a tiny random Qwen2 checkpoint saved by transformers."""
    root = tmp_path_factory.mktemp("math_assets")
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=QWEN_VOCAB, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=256, tie_word_embeddings=True, rope_theta=10000.0,
        initializer_range=1.0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    model.save_pretrained(str(root / "policy"))
    return {
        "gsm8k": fx.write_gsm8k_jsonl(root),
        "math": fx.write_math_jsonl(root),
        "test": fx.write_jsonl(root, "gsm8k_test.jsonl", TEST_RECORDS),
        "checkpoint": str(root / "policy"),
        "torch_model": model,
    }


def tiny_config(assets, **domain):
    cfg = load_config("math", "tiny")
    cfg.data.train = f"gsm8k:{assets['gsm8k']},math:{assets['math']}"
    cfg.data.test = f"gsm8k:{assets['test']}"
    cfg.policy.checkpoint = assets["checkpoint"]
    cfg.policy.tokenizer = bundled_qwen_tokenizer_dir()
    cfg.domain.update(domain)
    return cfg


@pytest.fixture(scope="module")
def run(assets):
    cfg = tiny_config(assets)
    validate_config(cfg)
    domain = math_domain.make_math_domain(cfg)
    base_params, evaluator = setup.build_inner(domain, cfg, None)
    yield cfg, (domain, base_params, evaluator)
    evaluator.close()


# --------------------------------------------------------------------------- domain


def test_domain_reads_the_mixture_and_encodes_chat_prompts(run):
    cfg, (domain, _, _) = run
    train_answers = sorted(domain.answers[i] for i in domain.example_indices(domain.train))
    assert train_answers == sorted(fx.GSM8K_GOLD + fx.MATH_GOLD)
    assert [domain.answers[i] for i in domain.example_indices(domain.test)] == ["24", "7"]
    assert domain.primitive_names == ("correct", "boxed", "steps", "gold_anywhere") and domain.outcome_index == 0
    assert domain.train.prompts.shape[1] == 128 and domain.info["train_sources"] == {"gsm8k": 3, "math": 4}
    prompts, mask = np.asarray(domain.train.prompts), np.asarray(domain.train.prompt_mask)
    for row, example in enumerate(domain.example_indices(domain.train)):
        assert not mask[row, : 128 - mask[row].sum()].any(), "left padding"
        expected = domain.tokenizer.tokenizer.apply_chat_template(
            math_prompt(domain.questions[example]), tokenize=False, add_generation_prompt=True)
        assert domain.tokenizer.decode(prompts[row][mask[row]], skip_special_tokens=False) == expected
    assert domain.contexts(domain.test) == [{"answer": "24"}, {"answer": "7"}]


def test_levels_caps_and_ablations(assets):
    cfg = tiny_config(assets, levels=(1,), num_test=1, remove_primitives=("g3",), reverse_primitives=("format",))
    with pytest.raises(math_domain.MathConfigError, match=r"config\.meta\.primitive_descriptions has 4 lines"):
        math_domain.make_math_domain(cfg)
    cfg.meta.primitive_descriptions = ()
    domain = math_domain.make_math_domain(cfg)
    kept = sorted(domain.answers[i] for i in domain.example_indices(domain.train))
    assert kept == sorted(fx.GSM8K_GOLD + ("5", "4"))  # the two level-1 MATH problems
    assert domain.test.size == 1
    assert domain.primitive_names == ("correct", "boxed_reversed", "gold_anywhere")


def test_missing_or_empty_data_fails_before_training(assets, tmp_path):
    cfg = tiny_config(assets)
    cfg.data.train = str(tmp_path / "absent.jsonl")
    with pytest.raises(FileNotFoundError, match=r"config\.data\.train: .*absent\.jsonl"):
        math_domain.make_math_domain(cfg)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cfg.data.train = str(empty)
    with pytest.raises(MathDataError, match=r"config\.data\.train: .*empty"):
        math_domain.make_math_domain(cfg)
    cfg = tiny_config(assets, levels=(5,))
    cfg.data.train = f"math:{assets['math']}"
    with pytest.raises(MathDataError, match=r"config\.data\.train: none of the 4 problems"):
        math_domain.make_math_domain(cfg)
    with pytest.raises(math_domain.MathConfigError, match=r"config\.domain\.levels"):
        math_domain.make_math_domain(tiny_config(assets, levels=(0, 6)))
    cfg = tiny_config(assets)
    cfg.policy.sft_steps = 3
    with pytest.raises(math_domain.MathConfigError, match=r"config\.policy\.sft_steps"):
        math_domain.make_math_domain(cfg)


def test_every_preset_passes_both_validators():
    for name in ("math", "gsm8k"):
        for preset in ("default", "mixture", "tiny"):
            cfg = load_config(name, preset)
            validate_config(cfg)
            math_domain.validate_math_config(cfg)
    paper = load_config("math", "default")
    assert (paper.inner.group_size, paper.inner.lr, paper.inner.kl, paper.inner.kl_kind) == (5, 1e-6, 0.001, "k3")
    assert (paper.domain.max_prompt_tokens, paper.domain.max_new_tokens, paper.outer.num_candidates) == (512, 512, 8)
    assert paper.meta.backbone == "hf" and paper.meta.hf_path.endswith("Qwen2.5-0.5B-Instruct")
    assert paper.inner.steps == 10 * -(-6000 // 64) and paper.final.steps == 15 * -(-7500 // 64)


# --------------------------------------------------------------------------- host helpers


def test_cut_at_stops_matches_a_loop():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 6, (40, 9)).astype(np.int32)
    mask = np.arange(9)[None, :] < rng.integers(0, 10, (40, 1))
    got = np.asarray(rollout.cut_at_stops(tokens, mask, (2, 5)))
    for row in range(40):
        expected = np.zeros(9, bool)
        for t in range(9):
            if not mask[row, t]:
                break
            expected[t] = True
            if tokens[row, t] in (2, 5):
                break
        np.testing.assert_array_equal(got[row], expected)


def test_batch_schedule_and_bucket_trim():
    schedule = host_batches.batch_schedule(jax.random.key(3), 5, 2, 7)
    flat = schedule.reshape(-1)
    assert schedule.shape == (7, 2) and sorted(flat[:5]) == list(range(5)) and sorted(flat[5:10]) == list(range(5))
    np.testing.assert_array_equal(host_batches.batch_schedule(jax.random.key(3), 5, 2, 3), schedule[:3])
    prompts = np.arange(24).reshape(3, 8)
    mask = np.arange(8)[None, :] >= np.array([[5], [3], [6]])
    trimmed, trimmed_mask = host_batches.trim_to_bucket(prompts, mask, (2, 4, 6))
    np.testing.assert_array_equal(trimmed, prompts[:, 2:])
    np.testing.assert_array_equal(trimmed_mask, mask[:, 2:])
    with pytest.raises(ValueError, match="left padded"):
        host_batches.trim_to_bucket(prompts, ~mask, (2, 4, 6))


def test_inner_config_errors_name_the_field():
    with pytest.raises(ValueError, match="budget_reference"):
        InnerConfig(steps=1, prompts_per_step=1, group_size=2, max_new_tokens=4, budget_reference="flops")
    with pytest.raises(ValueError, match="group_size"):
        InnerConfig(steps=1, prompts_per_step=1, group_size=0, max_new_tokens=4)
    with pytest.raises(ValueError, match="minibatches=4 must divide the 6 rollouts"):
        InnerConfig(steps=1, prompts_per_step=3, group_size=2, max_new_tokens=4, grpo=GRPOConfig(minibatches=4))
    assert InnerConfig(steps=3, prompts_per_step=1, group_size=2, max_new_tokens=4).final_steps == 3


# --------------------------------------------------------------------------- inner loop


def torch_greedy_texts(model, domain, dataset, max_new_tokens):
    """Independent reference: transformers greedy decoding of each unpadded prompt."""
    prompts, mask = np.asarray(dataset.prompts), np.asarray(dataset.prompt_mask)
    texts = []
    for row in range(prompts.shape[0]):
        ids = torch.tensor(prompts[row][mask[row]][None].astype(np.int64))
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, eos_token_id=list(domain.stop_ids), pad_token_id=domain.pad_id)
        generated = out[0, ids.shape[1]:].tolist()
        cut = next((i + 1 for i, t in enumerate(generated) if t in domain.stop_ids), len(generated))
        texts.append(domain.tokenizer.decode(generated[:cut]))
    return texts


@pytest.mark.slow
def test_greedy_evaluation_matches_pytorch_generate(run, assets):
    cfg, (domain, base_params, evaluator) = run
    for dataset in (domain.test, domain.train):
        expected = torch_greedy_texts(assets["torch_model"], domain, dataset, cfg.domain.max_new_tokens)
        assert evaluator.greedy_texts(base_params, dataset) == expected
        per_item = np.asarray(correct(expected, domain.contexts(dataset)), np.float32)
        assert evaluator.accuracy(base_params, dataset) == pytest.approx(float(np.mean(per_item)))
        np.testing.assert_array_equal(evaluator.item_scores(base_params, dataset), per_item)


@pytest.mark.slow
def test_tiny_search_and_final_end_to_end(run, tmp_path):
    cfg, (domain, base_params, evaluator) = run
    cfg = cfg.copy_and_resolve_references()
    cfg.evolution.init = "random_trees"  # a search strategy without a Meta-Optimizer model
    result = protocol.run_method("evolution", cfg, domain, evaluator, str(tmp_path), 0, base_params=base_params,
                                 progress=False, echo=lambda line: None)
    from derl_jax.logging import read_jsonl

    history = read_jsonl(os.path.join(tmp_path, "history.jsonl"))
    assert len(history) == 4 and [(r["iteration"], r["index"]) for r in history] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    trained = [r for r in history if r["trained"]]
    assert trained, "no random tree was a valid reward"
    for record in history:
        assert 0.0 <= record["score"] <= 1.0 and record["structure"] in ("stable", "unstable", "invalid")
    for record in trained:
        curves = record["curves"]
        assert len(curves["reward_mean"]) == cfg.inner.steps and curves["trained"] == [1.0] * cfg.inner.steps
        assert all(0.0 <= curves[f"primitive/{name}"][-1] <= 1.0 for name in domain.primitive_names)
        assert curves["generated_tokens"][0] <= 4 * cfg.domain.max_new_tokens
        assert 0.0 < curves["host_share"][-1] < 1.0 and curves["host_seconds"][0] > 0.0
    assert 0.0 <= result.test <= 1.0 and result.expression is not None
    search_reports = [r for r in evaluator.reports if r.mode == "search"]
    assert len(search_reports) >= 2 and evaluator.last_report.mode == "final"
    for report in evaluator.reports:
        assert 0.0 < report.host_share < 1.0 and report.wall_seconds > report.host_seconds > 0.0


def test_update_uses_the_reward_program_on_host_primitives(run):
    cfg, (domain, base_params, evaluator) = run
    fns = evaluator.slices[0]
    split = host_batches.HostSplit(domain.train, domain)
    prompts, mask, contexts = split.batch(np.arange(2), 2, domain.bucket_sizes)
    rollout = fns.sample(base_params, fns.rows(prompts), fns.rows(mask), jax.random.key(5))
    texts = domain.tokenizer.decode_batch(np.asarray(rollout.completions), np.asarray(rollout.mask))
    prims = evaluator.runner.run(texts, contexts)
    np.testing.assert_array_equal(prims[:, 0], correct(texts, contexts))
    program = compile_expr(parse("g1 + 0.5*g2*(g3/2) - u/4", domain.primitive_names), num_primitives=4)
    params = jax.tree.map(lambda x: x.copy(), base_params)
    ref = fns.reference_logprobs(base_params, rollout)
    _, _, metrics = fns.update(params, fns.init_optimizer(params), program, prims, 0.25, rollout, ref, jax.random.key(6))
    expected = evaluate_numpy(program, prims, 0.25)
    assert float(metrics["reward_mean"]) == pytest.approx(float(expected.mean()), abs=1e-6)
    assert float(metrics["nonfinite"]) == 0.0 and "kl" in metrics


@pytest.mark.slow
def test_budget_stops_search_candidates_early_keeps_the_last_policy_and_says_so(run, caplog):
    cfg, (domain, base_params, evaluator) = run
    graphdef = evaluator.graphdef
    budget_cfg = cfg.copy_and_resolve_references()
    budget_cfg.inner.update(budget_factor=0.4, steps=4)
    budget_cfg.final.steps = 4
    budgeted = setup.make_evaluator(domain, graphdef, budget_cfg, mesh=evaluator.mesh)
    program = compile_expr(parse("g1", domain.primitive_names), num_primitives=4)
    key = jax.random.key(11)
    with caplog.at_level(logging.WARNING, logger="derl_jax.rl.host_loop"):
        results = budgeted.evaluate_candidates(stack_programs([program]), base_params, key, domain.train, domain.test)
    report = budgeted.last_report.runs[0]
    curves = {name: values[0] for name, values in results.curves.items()}
    tokens = curves["generated_tokens"]
    reference = 4 * tokens[0]  # steps x N x mean length of the first batch (module docstring of host_loop)
    cap = 0.4 * reference
    expected_steps = int(np.argmax(np.cumsum(tokens) > cap)) + 1
    assert expected_steps < 4 and report.steps_run == expected_steps and report.stop_reason == "budget"
    assert report.budget_tokens == pytest.approx(cap)
    assert curves["trained"].tolist() == [1.0] * expected_steps + [0.0] * (4 - expected_steps)
    assert any("stopped by the compute budget" in r.getMessage() for r in caplog.records)
    params = jax.tree.map(lambda leaf: leaf[0], results.params)

    unbudgeted_cfg = budget_cfg.copy_and_resolve_references()
    unbudgeted_cfg.inner.budget_factor = 0.0
    unbudgeted_cfg.final.steps = expected_steps
    plain = setup.make_evaluator(domain, graphdef, unbudgeted_cfg, mesh=evaluator.mesh)
    reference_params, _ = plain.train_final(program, base_params, key, domain.train)
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(reference_params)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)
    assert plain.last_report.runs[0].stop_reason is None

    # Final training is never cut short: the same budgeted evaluator trains all final.steps.
    final_params, final_curves = budgeted.train_final(program, base_params, key, domain.train)
    final_report = budgeted.last_report.runs[0]
    assert final_report.steps_run == 4 and final_report.stop_reason is None and final_report.budget_tokens is None
    assert final_curves["trained"].tolist() == [1.0] * 4
    assert np.sum(final_curves["generated_tokens"]) > cap
    budgeted.close()
    plain.close()


def test_time_limit_is_an_opt_in_search_only_safety_stop(run, caplog):
    cfg, (domain, base_params, evaluator) = run
    timed_cfg = cfg.copy_and_resolve_references()
    timed_cfg.inner.update(steps=3, time_limit_s=1e-9)
    timed_cfg.final.steps = 3
    timed = setup.make_evaluator(domain, evaluator.graphdef, timed_cfg, mesh=evaluator.mesh)
    program = compile_expr(parse("g1", domain.primitive_names), num_primitives=4)
    with caplog.at_level(logging.WARNING, logger="derl_jax.rl.host_loop"):
        results = timed.evaluate_candidates(stack_programs([program]), base_params, jax.random.key(3), domain.train,
                                            domain.test)
    assert timed.last_report.runs[0].stop_reason == "time_limit" and timed.last_report.runs[0].steps_run == 1
    assert results.curves["trained"][0].tolist() == [1.0, 0.0, 0.0]
    assert any("wall-clock safety limit" in r.getMessage() for r in caplog.records)
    _, curves = timed.train_final(program, base_params, jax.random.key(3), domain.train)
    assert timed.last_report.runs[0].steps_run == 3 and timed.last_report.runs[0].stop_reason is None
    assert curves["trained"].tolist() == [1.0] * 3
    assert math_config_default().inner.time_limit_s == 0.0, "the wall-clock stop must be opt-in"
    timed.close()


def math_config_default():
    return load_config("math", "default")


@pytest.mark.slow
def test_outcome_run_reference_is_the_outcome_trainings_token_count(run):
    cfg, (domain, base_params, evaluator) = run
    measured_cfg = cfg.copy_and_resolve_references()
    measured_cfg.inner.update(budget_factor=0.5, budget_reference="outcome_run", steps=3)
    measured_cfg.final.steps = 3
    measured = setup.make_evaluator(domain, evaluator.graphdef, measured_cfg, mesh=evaluator.mesh)
    program = compile_expr(parse("g1 + g2", domain.primitive_names), num_primitives=4)
    key = jax.random.key(21)
    measured.evaluate_candidates(stack_programs([program]), base_params, key, domain.train, domain.test)
    plain_cfg = measured_cfg.copy_and_resolve_references()
    plain_cfg.inner.budget_factor = 0.0
    plain = setup.make_evaluator(domain, evaluator.graphdef, plain_cfg, mesh=evaluator.mesh)
    _, outcome_curves = plain.train_final(compile_expr(parse("g1", domain.primitive_names), num_primitives=4),
                                          base_params, key, domain.train)
    report = measured.last_report
    assert report.reference_tokens == pytest.approx(float(outcome_curves["generated_tokens"].sum()))
    assert report.runs[0].budget_tokens == pytest.approx(0.5 * report.reference_tokens)
    assert report.runs[0].stop_reason == "budget" and report.runs[0].steps_run < 3
    measured.close()
    plain.close()


# --------------------------------------------------------------------------- devices


def test_candidate_slices_split_the_mesh():
    mesh = make_mesh(2, 2, 2)
    slices = placement.candidate_slices(mesh)
    assert len(slices) == 2 and all(s.axis_names == ("data", "model") and dict(s.shape) == {"data": 2, "model": 2} for s in slices)
    first, second = ({d.id for d in np.asarray(s.devices).reshape(-1)} for s in slices)
    assert not first & second and len(first | second) == 8


@pytest.mark.slow
def test_sharded_step_equals_unsharded(run):
    """The tiny Qwen policy on a (data 2, model 4) mesh of the 8 fake devices vs one device."""
    cfg, (domain, base_params, evaluator) = run
    single = evaluator.slices[0]
    inner = evaluator.config
    sharded = host_policy.shared_policy_functions(
        evaluator.graphdef, placement.candidate_slices(make_mesh(1, 2, 4))[0], max_new_tokens=inner.max_new_tokens,
        temperature=inner.temperature, top_k=inner.top_k, grpo=inner.grpo, eos_id=domain.eos_id, pad_id=domain.pad_id,
        stop_ids=domain.stop_ids)
    prompts, mask, _ = host_batches.HostSplit(domain.train, domain).batch(np.arange(2), 2, domain.bucket_sizes)
    prims = np.random.default_rng(1).integers(0, 2, (4, 4)).astype(np.float32)
    program = compile_expr(parse("g1 + 0.5*g2 - g3*u", domain.primitive_names), num_primitives=4)
    host_params = jax.tree.map(np.asarray, base_params)
    rollouts, results = [], []
    for fns in (single, sharded):
        placed = fns.place(host_params)
        rollouts.append(fns.sample(placed, fns.rows(prompts), fns.rows(mask), jax.random.key(3)))
    np.testing.assert_array_equal(np.asarray(rollouts[0].completions), np.asarray(rollouts[1].completions))
    np.testing.assert_allclose(np.asarray(rollouts[0].logprobs), np.asarray(rollouts[1].logprobs), rtol=1e-5, atol=1e-5)
    for fns in (single, sharded):
        rollout = jax.tree.map(lambda x: fns.rows(np.asarray(x)), rollouts[0])
        start = fns.place(host_params)
        shardings = jax.tree.map(lambda x: x.sharding, start)
        ref = fns.reference_logprobs(start, rollout)
        new, _, metrics = fns.update(start, fns.init_optimizer(start), program, prims, 0.5, rollout, ref, jax.random.key(4))
        assert jax.tree.map(lambda x: x.sharding, new) == shardings
        results.append((jax.tree.map(np.asarray, new), jax.device_get(metrics)))
    (new_1, metrics_1), (new_8, metrics_8) = results
    embedding = sharded.place(host_params)["embed"]["embedding"]
    assert embedding.sharding.spec[0] == "model" and len(embedding.sharding.device_set) == 8
    assert embedding.addressable_shards[0].data.shape == (QWEN_VOCAB // 4, 8)
    changed = 0
    for got, want, before in zip(jax.tree.leaves(new_8), jax.tree.leaves(new_1), jax.tree.leaves(host_params)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        changed += not np.allclose(want, before)
    assert changed > 0
    for name in metrics_1:
        np.testing.assert_allclose(metrics_8[name], metrics_1[name], rtol=1e-4, atol=1e-6)
    assert metrics_1["reward_mean"] == pytest.approx(float(evaluate_numpy(program, prims, 0.5).mean()), abs=1e-6)


def test_evaluate_candidates_trains_for_the_steps_asked(run):
    cfg, (domain, base_params, evaluator) = run
    programs = stack_programs([compile_expr(parse("g1 + g2", domain.primitive_names), num_primitives=4)])
    train, validation = domain.train.split(0.75, 0)
    results = evaluator.evaluate_candidates(programs, base_params, jax.random.key(2), train, validation, steps=1)
    assert {name: curve.shape for name, curve in results.curves.items()} == {name: (1, 1) for name in results.curves}
    assert evaluator.last_report.runs[0].steps_planned == 1 != cfg.inner.steps


class _Finished:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class AnswerSetRunner:
    """Stands in for the outcome runner: a row scores 1 when its gold answer is in `right`."""

    def __init__(self, right):
        self.right = set(right)

    def submit(self, texts, contexts):
        return _Finished(np.array([[float(c["answer"] in self.right)] for c in contexts], np.float32))

    def close(self):
        pass


@pytest.mark.slow
def test_mixed_validation_score_is_the_example_weighted_mean(run, monkeypatch):
    """On MATH+GSM8K the candidate's validation score is the accuracy over all validation rows,
    i.e. the example-weighted mean of its GSM8K and MATH parts (not the mean of the two means)."""
    cfg, (domain, base_params, evaluator) = run
    monkeypatch.setattr(evaluator, "outcome_runner", AnswerSetRunner({"7", "5", "4"}))
    monkeypatch.setattr(evaluator, "config", evaluator.config.replace(eval_batch_size=3))  # a padded last batch
    validation = domain.train  # 3 GSM8K + 4 MATH rows
    answers = [domain.answers[i] for i in domain.example_indices(validation)]
    is_gsm8k = np.array([a in fx.GSM8K_GOLD for a in answers])
    right = np.array([a in {"7", "5", "4"} for a in answers], np.float64)
    parts = {"gsm8k": is_gsm8k, "math": ~is_gsm8k}
    part_accuracy = {name: evaluator.accuracy(base_params, validation.take(np.flatnonzero(rows)))
                     for name, rows in parts.items()}
    assert part_accuracy == pytest.approx({"gsm8k": 1 / 3, "math": 2 / 4})
    weighted = sum(rows.sum() * part_accuracy[name] for name, rows in parts.items()) / len(answers)
    programs = stack_programs([compile_expr(parse("g1", domain.primitive_names), num_primitives=4)])
    results = evaluator.evaluate_candidates(programs, base_params, jax.random.key(4), domain.train, validation, steps=1)
    assert float(results.scores[0]) == pytest.approx(weighted) == pytest.approx(right.mean())
    assert float(results.scores[0]) != pytest.approx(np.mean(list(part_accuracy.values())))


@pytest.mark.slow
def test_budgeted_search_resumes_to_the_uninterrupted_history(run, tmp_path):
    """The compute budget counts tokens, so a search stopped after one iteration and resumed
    (with a fresh evaluator, as a new process would) ends with the uninterrupted history."""
    from derl_jax.logging import read_jsonl

    cfg, (domain, base_params, evaluator) = run
    cfg = cfg.copy_and_resolve_references()
    cfg.evolution.init = "random_trees"
    cfg.inner.update(budget_factor=0.5, steps=3)

    def search(workdir, iterations):
        run_cfg = cfg.copy_and_resolve_references()
        run_cfg.outer.iterations = iterations
        fresh = setup.make_evaluator(domain, evaluator.graphdef, run_cfg, mesh=evaluator.mesh)
        try:
            protocol.search_method("evolution", run_cfg, domain, fresh, str(workdir), 0, base_params=base_params,
                                   progress=False, echo=lambda line: None)
        finally:
            fresh.close()
        return read_jsonl(os.path.join(workdir, "history.jsonl"))

    straight = search(tmp_path / "straight", 2)
    search(tmp_path / "resumed", 1)
    resumed = search(tmp_path / "resumed", 2)
    trained = [r for r in straight if r["trained"]]
    assert trained and all(r["curves"]["trained"] == [1.0, 1.0, 0.0] for r in trained), "the budget must fire"
    assert len(resumed) == len(straight) == 4
    for a, b in zip(straight, resumed):
        assert (a["iteration"], a["index"], a["text"], a["score"]) == (b["iteration"], b["index"], b["text"], b["score"])
        if a["trained"]:
            for name in ("trained", "generated_tokens", "reward_mean"):
                np.testing.assert_allclose(a["curves"][name], b["curves"][name], rtol=1e-6)
