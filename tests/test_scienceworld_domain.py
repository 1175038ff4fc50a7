"""The registered `scienceworld` domain: config checks, and the `tiny` preset end to end through the
launcher's final mode on the real engine, with the warm-start corpus checked against the rollout's
own prompt layout."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from configs import scienceworld as sw_config
from derl_jax.config import ConfigError, InputError, validate
from derl_jax.domains import registry
from derl_jax.domains.scienceworld import engine
from derl_jax.domains.scienceworld.splits import sample

from derl_jax.experiment import build
from derl_jax.experiment.run import run



def test_registered_with_the_agent_primitives():
    spec = registry.get_domain("scienceworld")
    assert "scienceworld" in registry.DOMAINS.registered()
    assert spec.primitive_names(sw_config.get_config("tiny")) == ("outcome", "phase_first", "phase_middle", "phase_last")


@pytest.mark.parametrize("field, value, message", [
    ("domain.level", "L3", "config.domain.level"),
    ("domain.tasks", ("boil", "no-such-task"), r"unknown ScienceWorld tasks \['no-such-task'\]"),
    ("domain.tasks", (), "config.domain.tasks must be a tuple"),
    ("domain.held_out_tasks", ("boil",), r"held_out_tasks \['boil'\] are not in config.domain.tasks"),
    ("domain.num_train", 2, "num_train x training tasks must be >= 5"),
    ("domain.simplifications", "easy,fast", "config.domain.simplifications"),
    ("domain.obs_length", 4, "config.domain.obs_length"),
    ("policy.sft_perturb_rate", 1.5, "config.policy.sft_perturb_rate"),
])
def test_bad_fields_are_named(field, value, message):
    cfg = sw_config.get_config("tiny")
    block, key = field.split(".")
    cfg[block][key] = value
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_level_l2_needs_some_held_out_tasks():
    cfg = sw_config.get_config("tiny")
    cfg.domain.update(level="L2", tasks=("boil", "melt"), held_out_tasks=())
    with pytest.raises(ConfigError, match="held_out_tasks must name some but not all"):
        validate(cfg)
    cfg.domain.held_out_tasks = ("melt",)
    validate(cfg)


def test_presets_carry_the_paper_settings():
    from derl_jax.outer.budget import population_inner_steps, population_iterations

    cfg = sw_config.get_config()
    assert (cfg.inner.steps, cfg.final.steps, cfg.outer.num_candidates) == (80, 100, 8)
    assert cfg.policy.checkpoint.endswith("Qwen2.5-1.5B-Instruct") and cfg.meta.hf_path.endswith("Qwen2.5-0.5B-Instruct")
    assert cfg.final.baseline_steps == 150
    pop = sw_config.get_config("derl_pop")
    assert (population_iterations(pop), population_inner_steps(pop), pop.compare.methods) == (3, 33, ("derl_pop",))
    assert len(cfg.domain.tasks) == 30 and set(cfg.domain.held_out_tasks) < set(cfg.domain.tasks)
    from derl_jax.experiment.checks import validate_config

    for preset in ("default", "derl_pop", "tiny"):
        validate(sw_config.get_config(preset)), validate_config(sw_config.get_config(preset))
    l2 = sw_config.get_config()
    l2.domain.level = "L2"
    validate(l2)


def test_missing_java_fails_before_anything_starts(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr("derl_jax.domains.scienceworld.env.ScienceWorldEnv.__init__",
                        lambda self, *a, **k: started.append(1))
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(InputError, match=r"^config.domain.kind='scienceworld': ScienceWorld needs Java.*openjdk") as err:
        run(sw_config.get_config("tiny"), str(tmp_path / "run"), "final", "g1", progress=False)
    assert "\n" not in str(err.value) and not started and not (tmp_path / "run").exists()


def test_missing_checkpoint_directory_fails_before_anything_starts(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr("derl_jax.domains.scienceworld.env.ScienceWorldEnv.__init__",
                        lambda self, *a, **k: started.append(1))
    cfg = sw_config.get_config("tiny")
    cfg.policy.checkpoint = str(tmp_path / "no-such-model")
    with pytest.raises(InputError, match="no-such-model") as err:
        run(cfg, str(tmp_path / "run"), "final", "g1", progress=False)
    assert "\n" not in str(err.value) and not started


@pytest.mark.slow
def test_a_hugging_face_tokenizer_as_the_token_table():
    from derl_jax.domains.scienceworld.env import ScienceWorldEnv
    from derl_jax.domains.scienceworld.subword import SubwordTable
    from derl_jax.models.hf_tokenizer import HFTokenizer, bundled_qwen_tokenizer_dir

    hf = HFTokenizer.from_directory(bundled_qwen_tokenizer_dir())
    table = SubwordTable(hf)
    ids = table.encode("plan open door to kitchen", 12)
    assert ids.tolist() == hf.encode("plan open door to kitchen") + [hf.pad_id] * (12 - len(hf.encode("plan open door to kitchen")))
    assert table.decode(ids) == "plan open door to kitchen" and table.decode([*ids[:3], hf.eos_id, *ids[3:]]) == hf.decode(ids[:3])
    batch, mask = table.encode_batch(["go to kitchen"], 8, left_pad=True, add_bos=True)
    assert batch[0, mask[0]].tolist() == hf.encode("go to kitchen") and not mask[0, 0]
    # the engine plays a gold path written in the policy's tokens
    engine.require_engine()
    with ScienceWorldEnv(["find-non-living-thing"], num_workers=1, vocab=table, obs_length=64, action_length=24,
                         max_turns=5) as env:
        obs, states = env.reset(np.zeros((1, 2), np.uint32), {"task": np.zeros(1, np.int32), "variation": np.array([4], np.int32)})
        assert "this room is called the" in table.decode(obs[0]).lower()
        gold = ["plan open door to kitchen", "explore go to kitchen", "plan look around", "act focus on table",
                "plan move table to yellow box"]
        for text in gold:
            obs, states, reward, done, info = env.step(states, table.encode(text, env.action_length)[None])
        assert done.tolist() == [True] and info["success"].tolist() == [1.0]


@pytest.mark.slow
def test_tiny_preset_final_run_end_to_end(monkeypatch, tmp_path):
    engine.require_engine()   # the agents extra and Java are part of the test environment
    built = []
    real_build = build.build_domain
    monkeypatch.setattr(build, "build_domain", lambda cfg: built.append(real_build(cfg)) or built[-1])
    cfg = sw_config.get_config("tiny")
    workdir = tmp_path / "run"
    final = run(cfg, str(workdir), "final", "g1+0.5*g2", progress=False)

    result = json.loads((workdir / "final_result.json").read_text())
    assert result["expression"] == "g1+0.5*g2" and result["seed"] == 0 and result["test"] == final.test
    assert 0.0 <= result["test"] <= 1.0 and result["test"] * 2 == round(result["test"] * 2)   # 2 test episodes
    curves = {name: np.asarray(values) for name, values in result["curves"].items()}
    steps = cfg.final.steps
    assert all(values.shape == (steps,) and np.isfinite(values).all() for values in curves.values())
    for name in ("outcome", "phase_first", "phase_middle", "phase_last"):
        assert ((0 <= curves[f"primitive/{name}"]) & (curves[f"primitive/{name}"] <= 1)).all()
    # the reward is linear in the primitives, so its batch mean is the same expression of their means
    np.testing.assert_allclose(curves["reward_mean"], curves["primitive/outcome"] + 0.5 * curves["primitive/phase_first"],
                               atol=1e-5)
    assert (0 < curves["response_length"]).all() and (curves["response_length"] <= cfg.domain.action_length).all()
    recorded = json.loads((workdir / "domain.json").read_text())
    assert recorded["domain"] == "scienceworld"

    # the warm-start corpus of training row 0 without perturbation is the gold path with correct
    # tags, and its prompts are exactly what the rollout builds from the environment's answers
    domain = built[0]
    env, vocab = domain.env, domain.tokenizer
    dev = env.workers[0].variations("find-non-living-thing", "dev")   # L0 tests on 2 of ScienceWorld's dev variations
    assert recorded["test_variations"]["variation"] == sample(dev, 2, 0, 1, 0) and set(recorded["test_variations"]["variation"]) < set(dev)
    pairs = domain.corpus(0, list(range(1, domain.train.size)), {"sft_perturb_rate": 0.0})
    assert len(pairs) == 5 and all(c.split()[0] in ("plan", "explore", "reflect", "act") for _, c in pairs)
    from derl_jax.domains.env import turn_prompts

    context = {name: np.asarray(value)[:1] for name, value in domain.train.context.items()}
    obs, states = env.reset(np.zeros((1, 2), np.uint32), context)
    task = np.asarray(domain.train.prompts[:1])
    window_actions = np.full((1, 1, env.action_length), vocab.pad_id, np.int32)
    window_obs = obs[:, None]
    for turn, (prompt, completion) in enumerate(pairs):
        rollout_prompt, rollout_mask = turn_prompts(task, task != vocab.pad_id, window_actions, window_actions != vocab.pad_id,
                                                    window_obs, window_obs != vocab.pad_id)
        rollout_ids = np.asarray(rollout_prompt)[0][np.asarray(rollout_mask)[0]]
        corpus_ids = vocab.encode_batch([prompt], domain.prompt_length, left_pad=True, add_bos=True)[0][0]
        assert corpus_ids[corpus_ids != vocab.pad_id].tolist() == rollout_ids.tolist(), f"turn {turn}"
        action = vocab.encode(completion, env.action_length)[None]
        obs, states, reward, done, info = env.step(states, action)
        assert info["step_score"].tolist() == [1.0], f"turn {turn}: {completion!r} is tagged as the rules say"
        window_actions, window_obs = action[:, None], obs[:, None]
    assert done.tolist() == [True] and info["success"].tolist() == [1.0] and math.isclose(info["score"][0], 1.0)
    env.close()
    assert env.workers == []
