"""The registered `alfworld` domain: config checks, presets, and the `tiny` preset end to end through
the launcher's final mode on generated games, with the warm-start corpus checked against the
rollout's own prompt layout."""

from __future__ import annotations

import json

import numpy as np
import pytest

from configs import alfworld as alf_config
from derl_jax.config import ConfigError, validate
from derl_jax.domains import registry

from derl_jax.experiment import build
from derl_jax.experiment.run import run



def test_registered_with_the_agent_primitives():
    spec = registry.get_domain("alfworld")
    assert "alfworld" in registry.DOMAINS.registered()
    assert spec.primitive_names(alf_config.get_config("tiny")) == ("outcome", "phase_first", "phase_middle", "phase_last")


@pytest.mark.parametrize("field, value, message", [
    ("domain.level", "L3", "config.domain.level"),
    ("domain.kinds", ("pick_and_place_simple", "slice_it"), "config.domain.kinds must be a tuple of distinct"),
    ("domain.kinds", (), "config.domain.kinds must be a tuple"),
    ("domain.held_out_kinds", ("pick_two_obj_and_place",), r"held_out_kinds \['pick_two_obj_and_place'\] are not in"),
    ("domain.num_train", 2, "num_train x training kinds must be >= 5"),
    ("domain.num_workers", -1, "config.domain.num_workers"),
    ("domain.obs_length", 4, "config.domain.obs_length"),
    ("policy.sft_perturb_rate", 1.5, "config.policy.sft_perturb_rate"),
])
def test_bad_fields_are_named(field, value, message):
    cfg = alf_config.get_config("tiny")
    block, key = field.split(".")
    cfg[block][key] = value
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_presets_carry_the_paper_settings(monkeypatch, tmp_path):
    from derl_jax.outer.budget import population_inner_steps, population_iterations
    from test_alfworld_splits import write_tree

    write_tree(tmp_path)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    cfg = alf_config.get_config()
    assert (cfg.inner.steps, cfg.final.steps, cfg.outer.num_candidates, cfg.outer.iterations) == (40, 100, 8, 10)
    assert cfg.final.baseline_steps == 150
    assert cfg.policy.checkpoint.endswith("Qwen2.5-1.5B-Instruct") and cfg.meta.hf_path.endswith("Qwen2.5-0.5B-Instruct")
    pop = alf_config.get_config("derl_pop")
    assert (population_iterations(pop), population_inner_steps(pop), pop.compare.methods) == (10, 10, ("derl_pop",))
    assert len(cfg.domain.kinds) == 6 and set(cfg.domain.held_out_kinds) < set(cfg.domain.kinds)
    from derl_jax.experiment.checks import validate_config

    for preset in ("default", "derl_pop", "tiny"):
        validate(alf_config.get_config(preset)), validate_config(alf_config.get_config(preset))
    l2 = alf_config.get_config()
    l2.domain.level = "L2"
    validate(l2)
    l2.domain.held_out_kinds = ()
    with pytest.raises(ConfigError, match="held_out_kinds must name some but not all"):
        validate(l2)


@pytest.mark.slow
def test_tiny_preset_final_run_end_to_end(monkeypatch, tmp_path):
    built = []
    real_build = build.build_domain
    monkeypatch.setattr(build, "build_domain", lambda cfg: built.append(real_build(cfg)) or built[-1])
    cfg = alf_config.get_config("tiny")
    workdir = tmp_path / "run"
    final = run(cfg, str(workdir), "final", "g1+0.5*g2", progress=False)

    result = json.loads((workdir / "final_result.json").read_text())
    assert result["expression"] == "g1+0.5*g2" and result["seed"] == 0 and result["test"] == final.test
    assert 0.0 <= result["test"] <= 1.0 and result["test"] * 2 == round(result["test"] * 2)   # 2 test games
    curves = {name: np.asarray(values) for name, values in result["curves"].items()}
    assert all(values.shape == (cfg.final.steps,) and np.isfinite(values).all() for values in curves.values())
    for name in ("outcome", "phase_first", "phase_middle", "phase_last"):
        assert ((0 <= curves[f"primitive/{name}"]) & (curves[f"primitive/{name}"] <= 1)).all()
    np.testing.assert_allclose(curves["reward_mean"], curves["primitive/outcome"] + 0.5 * curves["primitive/phase_first"],
                               atol=1e-5)
    recorded = json.loads((workdir / "domain.json").read_text())
    assert recorded["domain"] == "alfworld" and len(recorded["train_games"]) == 6 and len(recorded["test_games"]) == 2

    # the warm-start corpus of training row 0 without perturbation is the planner's plan with correct
    # tags, and its prompts are exactly what the rollout builds from the environment's answers
    domain = built[0]
    env, vocab = domain.env, domain.tokenizer
    pairs = domain.corpus(0, list(range(1, domain.train.size)), {"sft_perturb_rate": 0.0})
    assert 3 <= len(pairs) <= env.max_turns and all(c.split()[0] in ("plan", "explore", "reflect", "act") for _, c in pairs)
    from derl_jax.domains.env import turn_prompts

    obs, states = env.reset(np.zeros((1, 2), np.uint32), {"game": np.zeros(1, np.int32)})
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
    assert done.tolist() == [True] and info["success"].tolist() == [1.0] and reward.tolist() == [1.0]
