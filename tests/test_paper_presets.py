"""Every preset of every config against the paper's settings that hold across presets:

* a Meta-Optimizer follows its backbone: an "hf" (pretrained) one trains with the settings of
  `configs/common.py` META_HF and writes under PAPER_GRAMMAR, never with the scratch model's;
* every math and agent preset gives the task and one description per primitive of its domain;
* equal budgets by construction: DERL-pop's iterations x inner steps is the final budget (to the
  division's remainder), and a search method's final policy never trains longer than a
  baseline's; the agent presets give the baselines 150 steps and DERL 100 (§3.2);
* the planner's paper shapes (`derl_jax.plan.report.PRESETS`) are those of presets that ship.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest

from configs import alfworld, arith, common, gsm8k, household, scienceworld
from configs import math as math_config
from derl_jax.config import ConfigError
from derl_jax.experiment import build
from derl_jax.experiment.checks import validate_config
from derl_jax.models.hf_tokenizer import HFTokenizer
from derl_jax.outer import get_strategy
from derl_jax.outer.budget import final_steps, population_inner_steps, population_iterations
from derl_jax.plan import report

_QWEN3 = ("self_guide_qwen3_1_7b", "self_guide_qwen3_4b")
CONFIGS = {arith: ("default", "smoke"), math_config: ("default", "mixture", "authors_batch", "tiny"),
           gsm8k: ("default", "mixture", "authors_batch", "tiny"),
           household: ("default", "smoke", "self_guide", "sg_smoke"),
           alfworld: ("default", "derl_pop", "self_guide", "tiny", "sg_tiny") + _QWEN3,
           scienceworld: ("default", "derl_pop", "self_guide", "tiny", "sg_tiny") + _QWEN3}
DESCRIBED = (math_config, gsm8k, household, alfworld, scienceworld)   # the math and agent domains
EVERY = [(module, preset) for module, presets in CONFIGS.items() for preset in presets]
ids = lambda case: f"{case[0].__name__.split('.')[-1]}:{case[1]}"  # noqa: E731


@pytest.fixture(scope="module", autouse=True)
def each_tokenizer_folder_read_once():
    """A plan counts the agent prompt's tail in a tokenizer read from its folder
    (`report.agent_tail_tokens`), several times per config: the module reads each folder once."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(HFTokenizer, "from_directory", functools.lru_cache(maxsize=None)(HFTokenizer.from_directory))
        yield


def scratch_settings_leaking(meta) -> dict:
    """The META_HF fields an "hf" Meta-Optimizer block holds at other values: {field: (value, META_HF's)}."""
    return {k: (meta[k], v) for k, v in {**common.META_HF, **common.PAPER_GRAMMAR}.items() if meta[k] != v}


def test_the_hf_settings_differ_from_the_scratch_models():
    assert all(common.META_HF[k] != common.META[k] for k in ("lr", "cold_start_lr", "cold_start_steps", "kl", "epochs"))
    scratch = arith.get_config()
    assert scratch.meta.backbone == "scratch" and scratch_settings_leaking(scratch.meta)   # the check can fail


def test_every_set_has_its_presets():
    for module, presets in CONFIGS.items():
        with pytest.raises(ValueError, match=r"expected one of \(" + ", ".join(f"'{p}'" for p in presets) + r"\)"):
            module.get_config("nope")


@pytest.mark.parametrize("case", EVERY, ids=ids)
def test_a_meta_optimizer_follows_its_backbone(case):
    module, preset = case
    cfg = module.get_config(preset)
    if cfg.meta.backbone == "hf":
        assert cfg.meta.hf_path and scratch_settings_leaking(cfg.meta) == {}
    else:
        assert cfg.meta.backbone == "scratch" and not cfg.meta.hf_path
        assert (cfg.meta.max_decimals, cfg.meta.epochs, cfg.meta.cold_start_lr) == (3, 3, common.META["cold_start_lr"])


@pytest.mark.parametrize("case", [c for c in EVERY if c[0] in DESCRIBED], ids=ids)
def test_every_primitive_is_described(case):
    module, preset = case
    cfg = module.get_config(preset)
    names = build.primitive_names(cfg)
    assert cfg.meta.task_description.strip()
    assert len(cfg.meta.primitive_descriptions) == len(names) >= 4
    assert all(line.strip() for line in cfg.meta.primitive_descriptions)


def test_a_missing_description_is_a_config_error():
    cfg = scienceworld.get_config("tiny")
    validate_config(cfg)
    cfg.meta.primitive_descriptions = common.AGENT_PRIMITIVE_DESCRIPTIONS[:3]
    with pytest.raises(ConfigError, match=r"config.meta.primitive_descriptions must hold one non-empty line per "
                                          r"primitive \('outcome', 'phase_first', 'phase_middle', 'phase_last'\), got 3"):
        validate_config(cfg)
    cfg.meta.primitive_descriptions = common.AGENT_PRIMITIVE_DESCRIPTIONS[:3] + (" ",)
    with pytest.raises(ConfigError, match="config.meta.primitive_descriptions"):
        validate_config(cfg)


@pytest.mark.parametrize("case", EVERY, ids=ids)
def test_derl_pop_trains_the_final_budget(case):
    module, preset = case
    cfg = module.get_config(preset)
    iterations, steps, final = population_iterations(cfg), population_inner_steps(cfg), int(cfg.final.steps)
    assert 0 <= final - iterations * steps < iterations     # the final budget, but the division's remainder
    assert final_steps(cfg, searches=True) <= final_steps(cfg, searches=False)


@pytest.mark.parametrize("module, iterations, steps", [(alfworld, 10, 10), (scienceworld, 3, 33), (math_config, 7, 252)])
def test_the_paper_schedules(module, iterations, steps):
    for preset in ("default", "derl_pop"):
        if preset not in CONFIGS[module]:
            continue
        cfg = module.get_config(preset)
        assert (population_iterations(cfg), population_inner_steps(cfg)) == (iterations, steps)
        baseline = 150 if module in (alfworld, scienceworld) else int(cfg.final.steps)
        assert (final_steps(cfg, True), final_steps(cfg, False)) == (int(cfg.final.steps), baseline)
        assert {get_strategy(m).searches for m in ("outcome", "average")} == {False}


def test_final_steps_are_checked():
    cfg = arith.get_config("smoke")
    cfg.final.baseline_steps = 1   # fewer than final.steps = 2
    with pytest.raises(ConfigError, match=r"config.final.baseline_steps=1 is fewer than config.final.steps=2"):
        validate_config(cfg)
    cfg.final.baseline_steps = -1
    with pytest.raises(ConfigError, match="config.final.baseline_steps"):
        validate_config(cfg)
    cfg.final.baseline_steps = 0
    cfg.outer.population_iterations = -1
    with pytest.raises(ConfigError, match="config.outer.population_iterations"):
        validate_config(cfg)


@pytest.mark.parametrize("module, preset, planned", [(math_config, "default", "math_3b"), (alfworld, "default", "agent_1_5b"),
                                                      (scienceworld, "default", "agent_1_5b")])
def test_the_planners_paper_shapes_are_presets_that_ship(module, preset, planned):
    shape = report.shape_from_config(module.get_config(preset))
    expected = report.PRESETS[planned]()
    shape = shape.replace(model=dataclasses.replace(shape.model, rope_theta=expected.model.rope_theta),
                          chunk_size=expected.chunk_size)   # rope_theta changes no size; chunk: the planner's choice
    assert shape == expected


@pytest.mark.parametrize("module", [math_config, alfworld, scienceworld], ids=lambda m: m.__name__.split(".")[-1])
def test_plan_mode_shows_the_hf_settings_and_memory_units(module, capsys, monkeypatch):
    from derl_jax.experiment.run import plan_run

    monkeypatch.delenv("ALFWORLD_DATA", raising=False)   # a plan needs no data, checkpoint or engine
    for name in ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR"):
        monkeypatch.delenv(name, raising=False)
    result = plan_run(module.get_config(), ("h100",), devices=(8,))
    out = capsys.readouterr().out
    assert ("meta.backbone=hf meta.hf_path=/models/Qwen2.5-0.5B-Instruct meta.lr=1e-06 meta.cold_start_lr=1e-05 "
            "meta.cold_start_steps=64 meta.kl=0.001 meta.kl_kind=k3 meta.epochs=4 meta.max_symbols=64 meta.max_depth=12 "
            "meta.max_decimals=8 task/primitive descriptions: yes/4") in out
    header, _, row = [line for line in out.splitlines() if line.startswith("|")][:3]
    assert "params / device" in header and row.startswith("| H100 SXM | 8 |")
    memory = [cell.strip() for cell in row.split("|")[6:13]]
    assert all(cell.endswith((" GiB", " MiB")) for cell in memory), memory
    peak, usable = (cell.strip() for cell in row.split("|")[13].split("/"))
    assert peak.endswith(" GiB") and usable == "55.9 GiB" and result["plans"][0]["fits"]   # 75% of 80 GB
