"""configs/: a package whose experiments share configs/common.py and override only what differs."""

from __future__ import annotations

import importlib
import inspect
import os

import pytest

from configs import arith, common, gsm8k
from configs import math as math_config
from derl_jax.experiment.checks import validate_config
from derl_jax.outer import ALL_METHODS

PRESETS = {arith: ("default", "smoke"), math_config: ("default", "mixture", "tiny"), gsm8k: ("default", "mixture", "tiny")}
SHARED_BLOCKS = ("inner", "meta", "outer", "evolution", "final", "compare", "mesh", "primitives", "trust", "arbo")


@pytest.mark.parametrize("module, preset", [(m, p) for m, ps in PRESETS.items() for p in ps])
def test_every_preset_passes_the_checks_and_has_every_shared_key(module, preset):
    cfg = module.get_config(preset)
    validate_config(cfg)
    reference = common.base("x", {}, {})
    for block in SHARED_BLOCKS:
        assert set(cfg[block].keys()) == set(reference[block].keys()), block  # every key overridable from the CLI
    assert cfg.primitives.modules == ()


def test_the_shared_blocks_come_from_common_and_only_differences_are_written():
    smoke, tiny = arith.get_config("smoke"), math_config.get_config("tiny")
    for block in ("outer", "evolution", "final"):
        assert smoke[block].to_dict() == tiny[block].to_dict(), block
    assert smoke.compare.to_dict() == {**tiny.compare.to_dict(), "candidate_test": True}
    assert not tiny.compare.candidate_test  # host-scored math: no test pass per candidate
    default = arith.get_config()
    assert default.inner.to_dict() == common.INNER and default.meta.to_dict() == common.META
    assert tuple(default.compare.methods) == ALL_METHODS and common.ALL_METHODS is ALL_METHODS
    paper = math_config.get_config()
    changed = {k for k, v in paper.inner.items() if common.INNER[k] != v}
    assert changed == {"steps", "prompts_per_step", "group_size", "lr", "kl", "minibatches", "weight_decay",
                       "chunk_size", "budget_factor"}  # the wall-clock limit is opt-in (0)
    # 10 epochs of the 6,000-problem inner-training split at 64 prompts per step; 15 of the full 7,500
    assert paper.inner.steps == 10 * 94 and paper.final.steps == 15 * 118
    assert (paper.meta.backbone, paper.mesh.model, paper.outer.iterations) == ("hf", -1, 8)


def test_gsm8k_imports_the_math_config_and_differs_only_in_its_data():
    assert gsm8k.math_config is importlib.import_module("configs.math")
    assert "spec_from_file_location" not in inspect.getsource(gsm8k)
    for preset in ("default", "tiny"):
        g, m = gsm8k.get_config(preset).to_dict(), math_config.get_config(preset).to_dict()
        differs = {k for k in m if g[k] != m[k]}
        assert differs <= {"name", "data", "inner", "final"}, differs
    assert gsm8k.get_config().data.test == "gsm8k:/data/gsm8k/test.jsonl,math:/data/MATH/test.jsonl"  # Table 1(b): both
    assert gsm8k.get_config("tiny").name == "gsm8k_tiny"


@pytest.mark.parametrize("module", list(PRESETS))
def test_docstring_gives_the_run_command_and_time_and_presets_are_checked(module):
    name = os.path.basename(module.__file__)
    assert f"python launch/run.py --config=configs/{name}" in module.__doc__
    assert "time" in module.__doc__.lower()
    for preset in PRESETS[module]:
        assert f"  {preset}  " in module.__doc__
    with pytest.raises(ValueError, match=rf"configs/{name}: unknown preset 'nope'; expected one of \('default'"):
        module.get_config("nope")
    assert module.get_config(" ").to_dict() == module.get_config(None).to_dict() == module.get_config("default").to_dict()
