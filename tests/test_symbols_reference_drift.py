"""The drift check of the symbols reference table on hand-made tables (the slow drift test's verdicts)."""

import copy

import pytest

from benchmarks import symbols_reference as reference

TABLE = {
    "seeds": [0, 1, 2, 3],
    "per_seed": {reference.BASE_ROW: [0.0] * 4, "g2": [0.5, 0.18, 0.04, 0.15], "g1+g2": [0.3, 0.2, 0.1, 0.25]},
    "train_reward": {"g2": [0.85, 0.65, 0.59, 0.66], "g1+g2": [0.6, 0.5, 0.55, 0.62]},
    "base_property": {"position": [0.30, 0.31, 0.30, 0.29], "marker": [0.13, 0.12, 0.12, 0.15]},
}


def rerun(**changes):
    table = copy.deepcopy(TABLE)
    for path, values in changes.items():
        group, key = path.split(".")
        table[group][key] = values
    return table


def test_the_same_table_and_a_rounding_sized_move_pass():
    assert reference.drift_violations(TABLE, copy.deepcopy(TABLE)) == []
    # seeds re-drawn as float rounding re-draws them, the property within 0.02
    moved = rerun(**{"per_seed.g2": [0.265, 0.095, 0.05, 0.3], "train_reward.g2": [0.72, 0.71, 0.52, 0.7],
                     "base_property.position": [0.295, 0.287, 0.294, 0.269]})
    assert reference.drift_violations(TABLE, moved) == []


def test_a_moved_property_or_a_collapsed_training_is_named():
    lines = reference.drift_violations(TABLE, rerun(**{"base_property.marker": [0.2, 0.17, 0.16, 0.18]}))
    assert len(lines) == 1 and lines[0].startswith("base property marker: mean 0.130 -> 0.177")
    # training that no longer learns: the train reward back at the base rate on every seed
    lines = reference.drift_violations(TABLE, rerun(**{"train_reward.g2": [0.30, 0.29, 0.31, 0.30],
                                                       "per_seed.g2": [0.0, 0.0, 0.0, 0.0]}))
    assert [line.split(":")[0] for line in lines] == ["`g2` train_reward"]
    assert "99% Welch" in lines[0]


def test_tables_of_other_seeds_are_refused():
    with pytest.raises(ValueError, match="seeds"):
        reference.drift_violations(TABLE, dict(rerun(), seeds=[0, 1, 2, 4]))


def test_train_reward_is_the_last_quarter_of_the_curve():
    assert reference.train_reward({"curves": {"reward_mean": [0.0] * 6 + [1.0, 0.5]}}) == pytest.approx(0.75)
