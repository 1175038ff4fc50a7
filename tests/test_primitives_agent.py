"""Agent-domain primitives: the paper's example, a NumPy reference on random episodes, jit/vmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from primitives import agent, registry

PHASE_FNS = (agent.phase_first, agent.phase_middle, agent.phase_last)


def reference_phases(scores: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """f32[N, 3] phase means computed row by row with Python's round."""
    out = np.zeros((scores.shape[0], 3), np.float32)
    for row in range(scores.shape[0]):
        taken = scores[row][mask[row]].astype(np.float64)
        length = len(taken)
        cuts = [0, round(length / 3), round(2 * length / 3), length]
        for phase in range(3):
            part = taken[cuts[phase] : cuts[phase + 1]]
            out[row, phase] = part.mean() if len(part) else 0.0
    return out


def random_rollout(rng: np.random.Generator, num_episodes: int, num_slots: int, prefix: bool = True):
    lengths = rng.integers(0, num_slots + 1, size=num_episodes)
    if prefix:
        mask = np.arange(num_slots)[None, :] < lengths[:, None]
    else:
        mask = rng.random((num_episodes, num_slots)) < 0.6
    scores = rng.random((num_episodes, num_slots)).astype(np.float32)
    scores[~mask] = rng.normal(size=int((~mask).sum())) * 100.0  # garbage that must be ignored
    success = (rng.random(num_episodes) < 0.5).astype(np.float32)
    return {"step_scores": scores, "step_mask": mask, "success": success}


def all_primitives(rollout) -> jax.Array:
    """f32[4, N] in AGENT_PRIMITIVES order."""
    return jnp.stack([p.fn(rollout, None) for p in registry.resolve("agent", agent.AGENT_PRIMITIVES)])


def test_paper_example():
    rollout = {
        "step_scores": np.array([[1, 0, 1, 1, 0, 0]], np.float32),
        "step_mask": np.ones((1, 6), bool),
        "success": np.array([1.0], np.float32),
    }
    np.testing.assert_allclose(all_primitives(rollout)[:, 0], [1.0, 0.5, 1.0, 0.0])


def test_registry_order_and_symbols():
    prims = registry.resolve("agent", agent.AGENT_PRIMITIVES)
    assert tuple(p.name for p in prims) == ("outcome", "phase_first", "phase_middle", "phase_last")
    assert all(p.kind == "device" and p.domain == "agent" for p in prims)
    table = registry.symbol_table(prims)
    assert table["g1"] == table["outcome"] == 0 and table["g4"] == table["phase_last"] == 3


@pytest.mark.parametrize(
    "length, expected_sizes",
    [(0, (0, 0, 0)), (1, (0, 1, 0)), (2, (1, 0, 1)), (3, (1, 1, 1)), (4, (1, 2, 1)), (5, (2, 1, 2)), (7, (2, 3, 2))],
)
def test_small_lengths(length, expected_sizes):
    # Step i scores 10**i, so a phase mean identifies exactly which steps it averaged.
    num_slots = 8
    scores = np.zeros((1, num_slots), np.float32)
    scores[0, :length] = 10.0 ** np.arange(length)
    mask = np.arange(num_slots)[None, :] < length
    rollout = {"step_scores": scores, "step_mask": mask, "success": np.zeros(1, np.float32)}
    got = np.array([float(fn(rollout, None)[0]) for fn in PHASE_FNS])
    start, expected = 0, []
    for size in expected_sizes:
        expected.append(np.mean(10.0 ** np.arange(start, start + size)) if size else 0.0)
        start += size
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    b1, b2 = agent.phase_bounds(jnp.array([length]))
    assert (int(b1[0]), int(b2[0]) - int(b1[0]), length - int(b2[0])) == expected_sizes


@pytest.mark.parametrize("prefix", [True, False])
def test_random_episodes_match_numpy_reference(prefix):
    rng = np.random.default_rng(7 if prefix else 8)
    rollout = random_rollout(rng, num_episodes=256, num_slots=11, prefix=prefix)
    got = np.asarray(all_primitives(rollout))
    np.testing.assert_allclose(got[0], rollout["success"])
    np.testing.assert_allclose(got[1:].T, reference_phases(rollout["step_scores"], rollout["step_mask"]), rtol=1e-5, atol=1e-6)


def test_jit_equals_eager_and_vmap_equals_loop():
    rng = np.random.default_rng(3)
    rollouts = [random_rollout(rng, num_episodes=32, num_slots=9) for _ in range(3)]
    eager = [np.asarray(all_primitives(r)) for r in rollouts]
    jitted = jax.jit(all_primitives)
    for r, e in zip(rollouts, eager):
        np.testing.assert_allclose(np.asarray(jitted(r)), e, rtol=1e-6)
    stacked = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *rollouts)
    batched = np.asarray(jax.jit(jax.vmap(all_primitives))(stacked))
    np.testing.assert_allclose(batched, np.stack(eager), rtol=1e-6)


def test_bad_rollouts_are_named():
    good = random_rollout(np.random.default_rng(0), 4, 5)
    with pytest.raises(KeyError, match="step_mask"):
        agent.phase_first({"step_scores": good["step_scores"]}, None)
    with pytest.raises(ValueError, match="step_mask has"):
        agent.phase_last({**good, "step_mask": good["step_mask"][:, :3]}, None)
    with pytest.raises(ValueError, match=r"rollout\['success'\] must have 1 axes"):
        agent.outcome({**good, "success": good["success"][:, None]}, None)
