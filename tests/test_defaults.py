"""One source of defaults: every library default that mirrors a config field equals configs/common.py's.

The library's settings classes keep defaults so they can be built by hand (tests, notebooks);
these tests fail when one of them drifts from the config default it mirrors, or when a config
block has a field its settings class does not know.
"""

from __future__ import annotations

import dataclasses

import pytest

from configs import common
from derl_jax.methods.arbo.settings import default_config as arbo_defaults
from derl_jax.methods.derl.settings import MetaConfig
from derl_jax.rl.config import GRPO_KEYS, InnerConfig, grpo_config
from derl_jax.rl.grpo import GRPOConfig
from derl_jax.selfguide import TrustSchedule


def defaults_of(cls) -> dict:
    """Field -> default of a dataclass (fields without a plain default left out)."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def test_the_meta_optimizer_defaults_are_the_meta_block():
    library = defaults_of(MetaConfig)
    assert set(common.META) <= set(library), "a meta field MetaConfig does not take"
    grammar_checked = {"max_symbols", "max_depth", "max_decimals", "operators", "num_primitives"}  # None: taken from the grammar
    differing = {k: (library[k], common.META.get(k)) for k in library if k not in grammar_checked
                 and library[k] != common.META.get(k)}
    assert differing == {}
    assert all(library[k] is None for k in grammar_checked)


def test_the_inner_loop_defaults_are_the_inner_block():
    library = defaults_of(InnerConfig)
    mirrored = {k: v for k, v in library.items() if k in common.INNER}
    assert mirrored == {k: common.INNER[k] for k in mirrored}
    assert set(library) - set(common.INNER) == {"final_steps"}  # set from final.steps
    assert {f.name for f in dataclasses.fields(InnerConfig) if f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING} == {"steps", "prompts_per_step", "group_size", "max_new_tokens"}


def test_the_grpo_defaults_are_the_inner_block():
    library = defaults_of(GRPOConfig)
    block = {**common.GRPO, **common.INNER}
    assert {key: library[field] for key, field in GRPO_KEYS.items()} == {key: block[key] for key in GRPO_KEYS}
    assert library["group_size"] == common.INNER["group_size"]
    # a block with only the required key reads every other setting from the same defaults
    assert grpo_config({"lr": common.INNER["lr"]}) == GRPOConfig(learning_rate=common.INNER["lr"])


def test_the_method_blocks_defaults_are_the_configs():
    assert dataclasses.asdict(TrustSchedule()) == common.TRUST
    assert arbo_defaults().to_dict() == common.ARBO


@pytest.mark.parametrize("field, value", [("lr", 1e-6), ("epochs", 5), ("cold_start_corpus", 12)])
def test_a_meta_block_value_reaches_the_settings(field, value):
    assert getattr(MetaConfig.from_config({**common.META, field: value}), field) == value
