"""The registered `scienceworld` domain: config checks, errors before anything starts, and the
Hugging Face token table on the real engine. Its end-to-end run (the `sg_tiny` preset, `tiny` with
self-assessment, through the launcher's final mode on the real engine, with the warm-start corpus
checked against the rollout's own prompt layout) is in test_selfguide_engines.py."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from configs import scienceworld as sw_config
from derl_jax.config import ConfigError, InputError, validate
from derl_jax.domains import registry
from derl_jax.domains.scienceworld import engine
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
