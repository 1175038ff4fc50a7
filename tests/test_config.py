"""derl_jax.config: the shared checkers and the generic validation (one line naming the field)."""

from __future__ import annotations

import numpy as np
import pytest

import primitives.registry  # noqa: F401  (registers the `primitives` check)
from derl_jax import config as C
from derl_jax.config import ConfigError
from derl_jax.domains.registry import DOMAINS, register_domain
from derl_jax.rl import checks  # noqa: F401  (registers `policy`, `inner`, `mesh`)

# The blocks every run has; the outer loop's and the experiment's are tested with them (test_strategies).
RUN_BLOCKS = ("run", "policy", "inner", "mesh", "domain", "primitives")


def shared_config() -> dict:
    """The shared blocks of a run, as a plain dict (ConfigDict would refuse some bad types itself)."""
    sizes = {"hidden_size": 8, "intermediate_size": 16, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 4}
    return {
        "name": "unit", "seed": 0,
        "domain": {"kind": "unit_domain", "size": 3},
        "policy": {**sizes, "sft_steps": 0, "sft_lr": 1e-3, "sft_batch_size": 2},
        "inner": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "lr": 1e-3, "kl": 0.0, "chunk_size": 0,
                  "temperature": 1.0, "common_random_numbers": True, "clip_low": 0.2, "clip_high": 0.28,
                  "kl_kind": "k3", "loss_agg": "token_mean", "epochs": 1, "minibatches": 1, "max_grad_norm": 1.0},
        "mesh": {"cand": 1, "data": 1, "model": -1},
        "primitives": {"modules": ("primitives.arith",)},
    }


@pytest.fixture
def unit_domain():
    def check(cfg):
        C.int_at_least(cfg, "domain.size", 1)

    register_domain("unit_domain", primitive_names=lambda cfg: ("g",), validate=check)(lambda cfg: None)
    yield
    DOMAINS.remove("unit_domain")


def test_checkers_return_the_value_or_name_the_field():
    cfg = {"a": {"n": 3, "x": 0.5, "s": "k2", "t": (1, 2), "b": True, "big": np.int64(7)}}
    assert C.config_value(cfg, "a.n") == 3
    assert C.int_at_least(cfg, "a.big", 7) == 7 and type(C.int_at_least(cfg, "a.big", 7)) is int
    assert C.number(cfg, "a.x", minimum=0.5, strict=False) == 0.5
    assert C.choice(cfg, "a.s", ("k1", "k2")) == "k2"
    assert C.int_tuple(cfg, "a.t", minimum=1) == (1, 2)
    assert C.boolean(cfg, "a.b") is True
    assert C.has_field(cfg, "a.n") and not C.has_field(cfg, "a.n.deeper") and not C.has_field(cfg, "b")
    failures = [
        (lambda: C.config_value(cfg, "a.missing"), "config.a.missing is missing"),
        (lambda: C.int_at_least(cfg, "a.x", 0), "config.a.x must be an integer, got 0.5"),
        (lambda: C.int_at_least(cfg, "a.b", 0), "config.a.b must be an integer, got True"),
        (lambda: C.int_at_least(cfg, "a.n", 4), "config.a.n must be >= 4, got 3"),
        (lambda: C.number(cfg, "a.x", minimum=0.5, strict=True), "config.a.x must be a number > 0.5, got 0.5"),
        (lambda: C.number({"v": float("nan")}, "v", minimum=0, strict=False), "config.v must be a number >= 0, got nan"),
        (lambda: C.choice(cfg, "a.s", ("k1",)), "config.a.s must be one of ('k1',), got 'k2'"),
        (lambda: C.int_tuple(cfg, "a.s", minimum=0), "config.a.s must be a non-empty tuple of integers, got 'k2'"),
        (lambda: C.int_tuple(cfg, "a.t", minimum=2), "config.a.t must hold integers >= 2, got (1, 2)"),
        (lambda: C.int_tuple({"t": (1, 1)}, "t", minimum=0), "config.t must not repeat values, got (1, 1)"),
        (lambda: C.boolean(cfg, "a.n"), "config.a.n must be True or False, got 3"),
    ]
    for call, message in failures:
        with pytest.raises(ConfigError) as info:
            call()
        assert str(info.value) == message


def test_validate_accepts_the_shared_blocks_and_runs_the_domain_check(unit_domain):
    C.validate(shared_config(), RUN_BLOCKS)
    cfg = shared_config()
    cfg["domain"]["size"] = 0
    with pytest.raises(ConfigError, match=r"^config\.domain\.size must be >= 1, got 0$"):
        C.validate(cfg, RUN_BLOCKS)
    C.validate(cfg, ("run", "policy", "inner", "mesh"))  # the blocks without the domain's own check
    cfg = shared_config()
    cfg["domain"]["kind"] = "no_such_domain"
    with pytest.raises(ConfigError, match=r"^config\.domain\.kind must be one of \(.*'unit_domain'.*got 'no_such_domain'$"):
        C.validate(cfg, RUN_BLOCKS)
    with pytest.raises(ValueError, match="unknown blocks"):
        C.validate(cfg, ("inner", "nonsense"))


def test_each_block_is_checked_by_its_owner_in_one_order():
    from derl_jax.experiment import checks as experiment_checks  # noqa: F401  (imports every owner)

    assert C.registered_checks() == C.BLOCK_ORDER
    with pytest.raises(ValueError, match="block 'inner' is already checked by derl_jax.rl.checks"):
        C.register_check("inner", lambda cfg: None)


@pytest.mark.parametrize(
    "path, value, message",
    [
        ("seed", -1, "config.seed must be >= 0, got -1"),
        ("name", "", "config.name must be a non-empty name without '/', got ''"),
        ("name", "a/b", "config.name must be a non-empty name without '/', got 'a/b'"),
        ("domain.kind", 3, "config.domain.kind must name a domain, got 3"),
        ("policy.num_kv_heads", 3, "config.policy.num_heads must be a multiple of config.policy.num_kv_heads, got 2 and 3"),
        ("policy.hidden_size", 0, "config.policy.hidden_size must be >= 1, got 0"),
        ("policy.sft_lr", 0.0, "config.policy.sft_lr must be a number > 0.0, got 0.0"),
        ("inner.group_size", 1, "config.inner.group_size must be >= 2, got 1"),
        ("inner.group_size", 2.5, "config.inner.group_size must be an integer, got 2.5"),
        ("inner.lr", 0.0, "config.inner.lr must be a number > 0.0, got 0.0"),
        ("inner.common_random_numbers", "yes", "config.inner.common_random_numbers must be True or False, got 'yes'"),
        ("inner.clip_low", 1.0, "config.inner.clip_low must be < 1, got 1.0"),
        ("inner.clip_high", -0.1, "config.inner.clip_high must be a number >= 0.0, got -0.1"),
        ("inner.kl_kind", "k9", "config.inner.kl_kind must be one of ('k1', 'k2', 'k3'), got 'k9'"),
        ("inner.loss_agg", "sum", "config.inner.loss_agg must be one of"),
        ("inner.minibatches", 0, "config.inner.minibatches must be >= 1, got 0"),
        ("inner.max_grad_norm", -1.0, "config.inner.max_grad_norm must be a number >= 0.0, got -1.0"),
        ("inner.minibatches", 3, "config.inner.minibatches must divide the 4 rollouts per step"),
        ("inner.dispatch", "fast", "config.inner.dispatch must be one of"),
        ("inner.kl_metric", 1, "config.inner.kl_metric must be True or False, got 1"),
        ("primitives.modules", "my.mod", "config.primitives.modules must be a tuple of module names, got 'my.mod'"),
        ("primitives.extra", ("ok", ""), "config.primitives.extra must be a tuple of primitive names, got ('ok', '')"),
        ("mesh.cand", 0, "config.mesh.cand must be a positive integer or -1 (fill), got 0"),
        ("mesh.model", -2, "config.mesh.model must be a positive integer or -1 (fill), got -2"),
        ("mesh.data", -2, "config.mesh.data must be a positive integer, -1 (fill) or 0 (auto: one per CPU core), got -2"),
    ],
)
def test_validate_names_the_first_bad_field(unit_domain, path, value, message):
    cfg = shared_config()
    section, _, field = path.rpartition(".")
    (cfg[section] if section else cfg)[field] = value
    with pytest.raises(ConfigError) as info:
        C.validate(cfg, RUN_BLOCKS)
    assert str(info.value).startswith(message), str(info.value)


def test_a_grpo_block_is_checked_like_the_inner_block(unit_domain):
    cfg = shared_config()
    cfg["grpo"] = {"clip_low": 0.2, "kl_kind": "k1"}
    C.validate(cfg, RUN_BLOCKS)
    cfg["grpo"]["kl_kind"] = "k0"
    with pytest.raises(ConfigError, match=r"^config\.grpo\.kl_kind must be one of"):
        C.validate(cfg, RUN_BLOCKS)
    cfg = shared_config()
    del cfg["inner"]["steps"]
    with pytest.raises(ConfigError, match=r"^config\.inner\.steps is missing$"):
        C.validate(cfg, RUN_BLOCKS)
