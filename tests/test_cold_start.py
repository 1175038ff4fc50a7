"""A pretrained policy in the agent domains: the cold-start corpus in the agent prompt, the cold
start itself, and whole runs with tiny checkpoints written by `transformers` (random Qwen2
weights).

The corpus test and the ALFWorld and ScienceWorld runs read through the Qwen2.5 tokenizer
(checkpoints over its 151,936 tokens); the household cold start and Self-Guide run use the
session's compact byte-level tokenizer (tests/compact_tokenizer.py: the same chat markers and
template, ~700 tokens), whose small embedding and logits leave the tiny policies' time to the
code under test.

The measured shares of well-formed answers naming an admissible action on held-out games
(slow tests) are reported in docs/domains/household.md.
"""

from __future__ import annotations

import json

import jax
import ml_collections
import numpy as np
import pytest

from benchmarks import cold_start_share
from conftest import compact_tokenizer_dir
from derl_jax.domains import agent_prompt as AP
from derl_jax.models.hf_tokenizer import HFTokenizer, bundled_qwen_tokenizer_dir

def household_block(**changes) -> ml_collections.ConfigDict:
    block = {"kind": "household", "level": "L0", "seed": 0, "num_train": 12, "num_test": 4, "held_out_kinds": (4, 5),
             "max_turns": 5, "history": "window", "window": 1, "answer_length": 40, "obs_length": 64,
             "admissible_length": 160}
    return ml_collections.ConfigDict({**block, **changes})


@pytest.fixture(scope="module")
def household():
    from derl_jax.domains.household.domain import make_household_domain

    return make_household_domain(household_block(), bundled_qwen_tokenizer_dir())


def test_household_corpus_is_the_expert_in_the_agent_prompt(household):
    from derl_jax.domains.household.domain import tasks_of

    corpus = household.corpus(0, [0, 1], {"sft_perturb_rate": 0.0})
    table, prompt = household.tokenizer, household.env.prompt
    train = tasks_of(household.train)
    firsts = {tuple(prompt.task_ids(household.env.task_text(d))) for d in np.asarray(train.description)[2:]}
    kinds = set()
    for prompt_ids, answer_ids in corpus:
        assert len(prompt_ids) <= household.prompt_length and len(answer_ids) < household.max_new_tokens
        text = table.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        assert text.endswith("<|im_start|>assistant\n") and text.count("Admissible actions now: [") == 1
        answer = AP.parse_answer(table.decode(answer_ids))
        listed = text.split("Admissible actions now: [")[1].split("]")[0].split(", ")
        assert answer.well_formed and answer.action in listed   # no detours: every action is the expert's
        kinds.add(answer.kind)
        assert any(tuple(prompt_ids[: len(f)]) == f for f in firsts)   # rows 0 and 1 left out
    assert {"plan", "explore"} <= kinds and len(corpus) >= 10 * 2


def test_beyond_look_counts_admissible_answers_that_do_more_than_look():
    record = [["look", True], ["go to desk 1", True], ["examine shelf 1", True], ["open fridge 1", False],
              ["inventory", True], ["take apple 1 from table 1", True], ["", False], ["help", True]]
    assert cold_start_share.beyond_look(record) == pytest.approx(2 / 8)
    assert cold_start_share.beyond_look([]) == 0.0


def write_checkpoint(path, vocab_size: int, hidden: int = 32, layers: int = 1, seed: int = 0) -> str:
    """A tiny random Qwen2 over `vocab_size` tokens, saved by transformers."""
    return cold_start_share.write_checkpoint(str(path), hidden=hidden, layers=layers, heads=2, kv_heads=1, seed=seed,
                                             vocab_size=vocab_size)


def checkpoint_run(module, preset: str, checkpoint: tuple[str, str], tmp_path, **domain):
    """The preset's final mode with the (checkpoint, tokenizer) directories, the agent prompt and a
    short cold start -> (final result, domain.json)."""
    from derl_jax.experiment.run import run

    cfg = module.get_config(preset)
    cfg.domain.update(domain)
    cfg.policy.update(checkpoint=checkpoint[0], tokenizer=checkpoint[1], sft_steps=3, sft_lr=1e-3,
                      sft_batch_size=4, param_dtype="float32", compute_dtype="float32")
    cfg.final.steps = 2
    run(cfg, str(tmp_path / "run"), "final", "g1+0.5*g2", progress=False)
    result = json.loads((tmp_path / "run" / "final_result.json").read_text())
    info = json.loads((tmp_path / "run" / "domain.json").read_text())
    assert info["prompt_style"] == "agent"
    curves = {name: np.asarray(values) for name, values in result["curves"].items()}
    assert all(v.shape == (2,) and np.isfinite(v).all() for v in curves.values())
    assert 0.0 <= min(curves["primitive/phase_first"]) <= max(curves["primitive/phase_first"]) <= 1.0
    return result, info


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(checkpoint, tokenizer): a tiny checkpoint over Qwen2.5's padded 151,936-token vocabulary
    for the engine runs (each run only reads it)."""
    return (write_checkpoint(tmp_path_factory.mktemp("ckpt"), cold_start_share.QWEN_VOCAB),
            bundled_qwen_tokenizer_dir())


@pytest.fixture(scope="module")
def compact_checkpoint(tmp_path_factory):
    """(checkpoint, tokenizer): a tiny checkpoint over the compact tokenizer."""
    tokenizer = compact_tokenizer_dir()
    return write_checkpoint(tmp_path_factory.mktemp("compact_ckpt"), HFTokenizer.from_directory(tokenizer).vocab_size), tokenizer


@pytest.mark.slow
def test_household_self_guide_in_words_end_to_end_with_a_checkpoint(compact_checkpoint, tmp_path):
    """The household's final mode with a checkpoint, the agent prompt, its cold start (cached in
    the run's base_policy/) and self-assessments in words; the plain agent answer's run is
    the ALFWorld and ScienceWorld runs below."""
    from configs import household

    result, _ = checkpoint_run(household, "sg_smoke", compact_checkpoint, tmp_path, num_train=10, num_test=4, max_turns=3,
                               window=1, answer_length=64, obs_length=64, admissible_length=160)
    assert list((tmp_path / "run" / "base_policy").glob("cold_start_*.npz"))
    g_sg = np.asarray(result["curves"]["primitive/g_sg"])
    assert (np.abs(g_sg) <= 3 * 0.1 + 1e-6).all()


@pytest.mark.slow
def test_cold_start_teaches_the_answer_format_on_held_out_household_tasks(tmp_path):
    """Before the cold start a random policy writes no well-formed answer; after 100 steps of it
    (a 2-layer, 64-wide policy over the compact tokenizer) every answer on held-out tasks is
    well-formed, and some name an admissible action (measured: 16 of 96 turns, the first turn of
    each episode; the policy repeats its first action afterwards, which a longer cold start or
    a larger policy would have to fix)."""
    from derl_jax.domains.household.domain import make_household_domain
    from derl_jax.models.transformer import init_params, tiny_config
    from derl_jax.rl import sft

    domain = make_household_domain(household_block(num_train=40, num_test=16, max_turns=6, answer_length=48,
                                                    obs_length=96, admissible_length=192),
                                   compact_tokenizer_dir())
    model = tiny_config(domain.tokenizer.vocab_size, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=16, max_position=domain.prompt_length + domain.max_new_tokens)
    graphdef, params = init_params(model, jax.random.key(0))
    before = cold_start_share.answer_shares(domain, domain.test, params, graphdef)
    policy = ml_collections.ConfigDict({"sft_steps": 100, "sft_lr": 3e-3, "sft_batch_size": 16,
                                        "sft_perturb_rate": 0.1})
    after = cold_start_share.answer_shares(domain, domain.test, sft.cold_start(domain, graphdef, params, policy,
                                                                             str(tmp_path), seed=0), graphdef)
    print(f"answer shares before the cold start {before}, after {after}")
    assert before["well_formed"] <= 0.05 and before["admissible"] <= 0.05
    assert after["well_formed"] >= 0.9 and after["admissible"] >= 0.1


AGENT_SIZES = {"obs_length": 64, "action_length": 40, "admissible_length": 128}   # an answer needs ~30 tokens


@pytest.mark.slow
def test_alfworld_tiny_runs_end_to_end_with_a_checkpoint(checkpoint, tmp_path):
    pytest.importorskip("alfworld")
    from configs import alfworld

    checkpoint_run(alfworld, "tiny", checkpoint, tmp_path, max_turns=3, **AGENT_SIZES)


@pytest.mark.slow
def test_scienceworld_tiny_runs_end_to_end_with_a_checkpoint(checkpoint, tmp_path):
    pytest.importorskip("scienceworld")
    from configs import scienceworld

    checkpoint_run(scienceworld, "tiny", checkpoint, tmp_path, num_train=5, num_test=1,
                   max_turns=3, **AGENT_SIZES)
