"""The registered `alfworld` domain: config checks and presets. Its end-to-end run (the `sg_tiny`
preset, `tiny` with self-assessment, through the launcher's final mode on generated games, with
the warm-start corpus checked against the rollout's own prompt layout) is in
test_selfguide_engines.py."""

from __future__ import annotations

import pytest

from configs import alfworld as alf_config
from derl_jax.config import ConfigError, validate
from derl_jax.domains import registry


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
    ("policy.sft_expert", "oracle", r"config.policy.sft_expert must be one of \('planner', 'search'\)"),
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
