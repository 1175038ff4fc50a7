"""primitives.registry: a new primitive file is found without editing a list, and scores rewards."""

from __future__ import annotations

import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import primitives
from derl_jax.expr.check import check_text
from derl_jax.expr.program import compile_expr
from derl_jax.expr.vm import evaluate
from primitives import registry
from test_docs import docs_example

# A whole primitive file: device primitives of a toy domain over token arrays.
UNIT_PRIMITIVES = '''
import jax.numpy as jnp

from primitives.registry import register_primitive


@register_primitive("{prefix}_length", kind="device", domain="{domain}")
def length(rollout, context):
    """Generated tokens over the target length."""
    return jnp.sum(rollout["mask"], axis=-1).astype(jnp.float32) / context["target"]


@register_primitive("{prefix}_hits", kind="device", domain="{domain}", aliases=("{prefix}_h",))
def hits(rollout, context):
    """1 where the first token is the wanted one."""
    return (rollout["tokens"][:, 0] == context["wanted"]).astype(jnp.float32)
'''


@pytest.fixture
def primitive_dir(tmp_path, monkeypatch):
    """A directory on the `primitives` package path: a file put there is `primitives.<name>`."""
    monkeypatch.setattr(primitives, "__path__", [*primitives.__path__, str(tmp_path)])
    added = []

    def write(name: str, domain: str) -> None:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(UNIT_PRIMITIVES.format(prefix=name, domain=domain)))
        added.append((name, domain))

    yield write
    for name, domain in added:
        sys.modules.pop(f"primitives.{name}", None)
        for key in [k for k in registry.PRIMITIVES.registered() if k[0] == domain]:
            registry.PRIMITIVES.remove(key)


def rollout_batch():
    tokens = jnp.array([[5, 1, 2, 0], [7, 7, 0, 0], [5, 0, 0, 0]], jnp.int32)
    mask = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]], bool)
    context = {"target": jnp.float32(4.0), "wanted": jnp.int32(5)}
    return {"tokens": tokens, "mask": mask}, context


def test_a_new_primitive_file_is_discovered_and_used_in_a_reward(primitive_dir):
    primitive_dir("unitprims", domain="unit")
    assert "primitives.unitprims" in registry.discovered_modules()
    assert "primitives.registry" not in registry.discovered_modules()
    prims = registry.resolve("unit", ("unitprims_hits", "unitprims_length"))
    assert [p.name for p in prims] == ["unitprims_hits", "unitprims_length"]
    assert prims[1].doc == "Generated tokens over the target length."
    assert [p.name for p in registry.registered("unit")] == ["unitprims_hits", "unitprims_length"]

    rollout, context = rollout_batch()
    values = jnp.stack([p.fn(rollout, context) for p in prims], axis=-1)  # f32[N, P]
    np.testing.assert_array_equal(np.asarray(values), [[1, 0.75], [0, 0.5], [1, 0.25]])

    table = registry.symbol_table(prims)
    assert table == {"g1": 0, "unitprims_hits": 0, "unitprims_h": 0, "g2": 1, "unitprims_length": 1}
    tree, validity = check_text("unitprims_h + 0.5*unitprims_length", table)
    assert validity.ok, validity.reason
    rewards = jax.jit(evaluate)(compile_expr(tree, num_primitives=2), values, jnp.float32(0.0))   # as the inner loop runs it
    np.testing.assert_allclose(np.asarray(rewards), [1.375, 0.25, 1.125], rtol=1e-6)


def test_builtin_families_are_found_by_discovery():
    found = registry.discovered_modules()
    for module in ("primitives.agent", "primitives.arith", "primitives.math"):
        assert module in found
    assert [p.name for p in registry.resolve("arith", ("correct", "boxed"))] == ["correct", "boxed"]


def test_a_module_named_in_the_config_registers_its_primitives(tmp_path, monkeypatch):
    (tmp_path / "my_reward_family.py").write_text(textwrap.dedent(UNIT_PRIMITIVES.format(prefix="mine", domain="unit_cfg")))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(KeyError, match="no primitive 'mine_hits' in domain 'unit_cfg'; registered: \\[\\]"):
            registry.get("unit_cfg", "mine_hits")
        registry.import_modules(("my_reward_family",))
        assert registry.get("unit_cfg", "mine_hits").aliases == ("mine_h",)
        with pytest.raises(ModuleNotFoundError, match="no_such_reward_module"):
            registry.import_modules(("no_such_reward_module",))
        with pytest.raises(TypeError, match="sequence of module names"):
            registry.import_modules("my_reward_family")
    finally:
        sys.modules.pop("my_reward_family", None)
        for key in [k for k in registry.PRIMITIVES.registered() if k[0] == "unit_cfg"]:
            registry.PRIMITIVES.remove(key)


# The "Adding a primitive" example of docs/extending.md, as written there: one new file in
# primitives/, no other edit.
README_EXAMPLE = docs_example("primitives/my_prims.py")


@pytest.fixture
def readme_primitive(tmp_path, monkeypatch):
    monkeypatch.setattr(primitives, "__path__", [*primitives.__path__, str(tmp_path)])
    (tmp_path / "my_prims.py").write_text(README_EXAMPLE)
    yield
    sys.modules.pop("primitives.my_prims", None)
    registry.PRIMITIVES.remove(("arith", "short_answer"))


@pytest.mark.slow
def test_the_readme_example_adds_a_primitive_to_a_run_by_config_alone(readme_primitive, tmp_path):
    from derl_jax.experiment import build
    from derl_jax.experiment.run import check_inputs
    from test_search import get_config

    from primitives.arith import correct

    cfg = get_config("smoke")
    cfg.primitives.extra = ("short_answer",)  # --config.primitives.extra="('short_answer',)"
    checked = check_inputs(cfg, str(tmp_path / "run"), "final", "correct + 0.5*short_answer")
    assert checked.primitive_names == ("correct", "boxed", "steps", "gold_anywhere", "short_answer")
    domain = build.build_domain(cfg)
    assert domain.primitive_names == checked.primitive_names and domain.primitives[-1].kind == "device"

    # The reward the inner loop computes for two rollouts of the first test prompts.
    tokenizer = domain.tokenizer
    rows = domain.test.take(np.arange(2)).context
    completions = ["1+2=3;[3]", "12345678901234"]
    tokens = np.zeros((2, 16), np.int32)
    mask = np.zeros((2, 16), bool)
    for i, text in enumerate(completions):
        ids = [tokenizer.id_of(c) for c in text]
        tokens[i, : len(ids)], mask[i, : len(ids)] = ids, True
    rollout = {"tokens": jnp.asarray(tokens), "mask": jnp.asarray(mask)}
    values = jnp.stack([p.fn(rollout, rows) for p in domain.primitives], axis=-1)  # f32[2, 5]
    tree, validity = check_text("correct + 0.5*short_answer", registry.symbol_table(domain.primitives))
    assert validity.ok, validity.reason
    rewards = jax.jit(evaluate)(compile_expr(tree, num_primitives=5), values, jnp.float32(0.5))
    expected = np.asarray(correct(rollout, rows)) + 0.5 * (mask.sum(-1) <= 12)
    np.testing.assert_allclose(np.asarray(rewards), expected, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(values[:, 4]), [1.0, 0.0])  # 9 tokens are short, 14 are not
