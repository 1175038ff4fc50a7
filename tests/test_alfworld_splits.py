"""ALFWorld's splits as the paper uses them, on a small fake $ALFWORLD_DATA tree the test writes:
every training game by default (or a sample drawn with the split seed), ALFWorld's own seen /
unseen evaluation games as L0's / L1's test sets, the held-out kinds' unseen games at L2; the
default preset reads the data directory from $ALFWORLD_DATA."""

from __future__ import annotations

import json
import os

import pytest

from configs import alfworld as alf_config
from derl_jax.config import ConfigError, InputError, validate
from derl_jax.domains.alfworld import problems as P
from derl_jax.domains.alfworld.splits import expand_data_dir, level_games

SPLIT = P.type_split(0)
SEEN = tuple(SPLIT[s][0] for s in ("objects", "receptacles", "lamps"))
KINDS = ("pick_and_place_simple", "look_at_obj_in_light", "pick_cool_then_place_in_recep")
# games written per split and kind; valid_unseen has fewer of the first kind than a sample of 3 asks
COUNTS = {"train": {KINDS[0]: 6, KINDS[1]: 5, KINDS[2]: 4},
          "valid_seen": {KINDS[0]: 3, KINDS[1]: 2, KINDS[2]: 2},
          "valid_unseen": {KINDS[0]: 2, KINDS[1]: 3, KINDS[2]: 3}}


def write_tree(root) -> dict[str, dict[str, list[str]]]:
    """A json_2.1.1 tree under `root` with COUNTS playable games, plus games ALFWorld leaves out
    (a movable receptacle, a sliced object, one marked unsolvable). -> {split: {kind: [game file]}}."""
    written: dict[str, dict[str, list[str]]] = {}
    for s, (split, counts) in enumerate(COUNTS.items()):
        written[split] = {}
        for kind, count in counts.items():
            games = P.generate_games((kind,), count, seed=10 + s, objects=SEEN[0], receptacles=SEEN[1],
                                     lamps=SEEN[2])
            written[split][kind] = []
            for i, game in enumerate(games):
                target = game.toggle or game.recep
                trial = root / "json_2.1.1" / split / f"{kind}-{game.obj}-None-{target}-{10 + i}" / f"trial_{i}"
                trial.mkdir(parents=True)
                P.write_game_file(game, str(trial / "game.tw-pddl"))
                written[split][kind].append(str(trial / "game.tw-pddl"))
        spare = P.generate_games((KINDS[0],), 1, seed=99, objects=SEEN[0], receptacles=SEEN[1], lamps=SEEN[2])[0]
        for name in ("pick_and_place_with_movable_recep-Apple-Bowl-Fridge-1", f"{KINDS[0]}-AppleSliced-None-Fridge-2",
                     f"{KINDS[0]}-{spare.obj}-None-{spare.recep}-3"):
            trial = root / "json_2.1.1" / split / name / "trial_0"
            trial.mkdir(parents=True)
            P.write_game_file(spare, str(trial / "game.tw-pddl"))
        unsolvable = root / "json_2.1.1" / split / f"{KINDS[0]}-{spare.obj}-None-{spare.recep}-3" / "trial_0" / "game.tw-pddl"
        data = json.loads(unsolvable.read_text())
        unsolvable.write_text(json.dumps({**data, "solvable": False}))
    return {split: {kind: sorted(paths) for kind, paths in kinds.items()} for split, kinds in written.items()}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("alfworld_data")
    return root, write_tree(root)


def sources(games) -> list[str]:
    return [g.source for g in games]


def test_every_game_of_the_split_by_default_and_alfworlds_own_evaluation_sets(tree):
    root, written = tree
    every = lambda split, kinds: [path for kind in kinds for path in written[split][kind]]  # noqa: E731
    train, test = level_games("L0", KINDS, (), 0, 0, data_dir=str(root))
    assert sources(train) == every("train", KINDS) and len(train) == 15      # the left-out games are not there
    assert sources(test) == every("valid_seen", KINDS)
    train_l1, test = level_games("L1", KINDS, (), 0, 0, data_dir=str(root / "json_2.1.1"))
    assert sources(train_l1) == sources(train) and sources(test) == every("valid_unseen", KINDS)
    train, test = level_games("L2", KINDS, (KINDS[2],), 0, 0, data_dir=str(root))
    assert sources(train) == every("train", KINDS[:2]) and sources(test) == every("valid_unseen", KINDS[2:])
    assert {g.kind for g in train} == set(KINDS[:2]) and {g.kind for g in test} == {KINDS[2]}


def test_a_sample_per_kind_is_drawn_with_the_split_seed(tree):
    root, written = tree
    draws = {seed: level_games("L1", KINDS, (), 3, 3, data_dir=str(root), seed=seed) for seed in range(6)}
    for train, test in draws.values():
        for split, games in (("train", train), ("valid_unseen", test)):
            for kind in KINDS:
                chosen = [g.source for g in games if g.kind == kind]
                pool = written[split][kind]
                assert len(chosen) == min(3, len(pool)) and set(chosen) <= set(pool)
                assert chosen == [p for p in pool if p in chosen]                 # listed in path order
    assert sources(draws[2][0]) == sources(level_games("L1", KINDS, (), 3, 3, data_dir=str(root), seed=2)[0])
    assert len({tuple(sources(train)) for train, _ in draws.values()}) > 1      # the seed picks the sample
    # L0 and L1 train on the same draw; only the evaluation split differs
    assert sources(level_games("L0", KINDS, (), 3, 3, data_dir=str(root), seed=4)[0]) == sources(draws[4][0])


def test_the_default_preset_reads_alfworld_data(tree, monkeypatch):
    root, _ = tree
    cfg = alf_config.get_config()
    assert cfg.domain.data_dir == "$ALFWORLD_DATA" and (cfg.domain.num_train, cfg.domain.num_test) == (0, 0)
    monkeypatch.setenv("ALFWORLD_DATA", str(root))
    assert expand_data_dir(cfg.domain.data_dir) == str(root)
    validate(cfg)
    assert len(level_games("L0", tuple(cfg.domain.kinds[:1]), (), 0, 0, cfg.domain.data_dir)[0]) == 6
    monkeypatch.delenv("ALFWORLD_DATA")
    with pytest.raises(InputError, match=r"^config.domain.data_dir='\$ALFWORLD_DATA': .*ALFWORLD_DATA, which is not set"):
        validate(cfg)
    cfg.domain.update(data_dir="", num_train=0)   # generated games need a count per kind
    with pytest.raises(ConfigError, match="config.domain.num_train must be >= 1"):
        validate(cfg)
    with pytest.raises(ValueError, match="generated games need num_train and num_test >= 1"):
        level_games("L0", KINDS, (), 0, 1)
    assert not os.environ.get("ALFWORLD_DATA")
