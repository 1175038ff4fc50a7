"""DAPO's pieces (`derl_jax.rl.dapo`) against hand-computed examples."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from derl_jax.rl import dapo


def test_overlong_penalty_by_hand():
    # limit 20 tokens, buffer 4: no penalty up to 16, then -1/4 per token, -1 at the limit
    lengths = np.array([0, 10, 16, 17, 18, 19, 20])
    np.testing.assert_allclose(np.asarray(dapo.overlong_penalty(lengths, 20, 4)),
                               [0, 0, 0, -0.25, -0.5, -0.75, -1.0])
    np.testing.assert_allclose(np.asarray(jax.jit(dapo.overlong_penalty, static_argnums=(1, 2))(lengths, 20, 4)),
                               [0, 0, 0, -0.25, -0.5, -0.75, -1.0])
    with pytest.raises(ValueError, match="0 < buffer <= max_new_tokens"):
        dapo.overlong_penalty(lengths, 20, 0)


def test_informative_groups_come_first_in_sampled_order():
    rewards = np.array([[1.0, 1.0, 1.0],    # all equal: no gradient
                        [0.0, 1.0, 0.0],
                        [0.0, 0.0, 0.0],    # all equal
                        [0.5, 0.2, 0.5],
                        [1.0, 0.0, 1.0]], np.float32)
    indices, shortfall = dapo.informative_groups(rewards, 2)
    assert np.asarray(indices).tolist() == [1, 3] and int(shortfall) == 0
    indices, shortfall = jax.jit(dapo.informative_groups, static_argnums=1)(rewards, 4)
    assert np.asarray(indices).tolist() == [1, 3, 4, 0] and int(shortfall) == 1   # topped up by the first equal group
    indices, shortfall = dapo.informative_groups(np.ones((3, 4), np.float32), 3)
    assert np.asarray(indices).tolist() == [0, 1, 2] and int(shortfall) == 3


def test_informative_groups_checks_its_arguments():
    with pytest.raises(ValueError, match=r"f32\[P, G\]"):
        dapo.informative_groups(np.zeros(4), 2)
    with pytest.raises(ValueError, match="keep must be in 1..3"):
        dapo.informative_groups(np.zeros((3, 2)), 4)
