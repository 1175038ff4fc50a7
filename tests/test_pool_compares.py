"""Pooling kept compare runs over disjoint seeds (benchmarks/pool_compares.py), on the kept `hard` compare."""

import json
import os

import pytest

from benchmarks import pool_compares
from derl_jax.experiment import endpoints
from derl_jax.experiment.pages import kept_histories

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEPT = os.path.join(REPO_ROOT, "docs", "results", "runs", "symbols_compose_hard")
METHODS = ("derl", "random")


def classify(text):   # any rule serves: pooling must not change what it sees
    return "top" if "g2" in text and "g3" in text else ("partial" if "g2" in text else None)


@pytest.fixture(scope="module")
def kept():
    with open(os.path.join(KEPT, "results.json"), encoding="utf-8") as handle:
        return json.load(handle), kept_histories(KEPT)


def split(payload, histories, seeds):
    part = dict(payload, per_seed={m: [r for r in rows if r["seed"] in seeds] for m, rows in payload["per_seed"].items()})
    return part, {m: {s: h for s, h in by_seed.items() if s in seeds} for m, by_seed in histories.items()}


def test_one_run_gives_its_own_e2_and_protocols(kept):
    payload, histories = kept
    results, _ = pool_compares.pool([("hard", payload, histories)], METHODS)
    assert [r.seed for r in results["derl"]] == list(range(10))
    e2 = endpoints.e2_repeated_final(results)
    saved = next(row for row in payload["endpoints"] if row["endpoint"].startswith("E2")
                 and row["measured_as"].startswith("derl − random"))
    assert e2["difference"] == pytest.approx(saved["difference"]) and e2["ci95_low"] == pytest.approx(saved["ci95_low"])
    differences = pool_compares.protocol_differences(results, *METHODS)
    assert differences["repeated"]["difference"] == pytest.approx(saved["difference"])
    assert 100 * (payload["protocols"]["derl"]["paper"]["mean"] - payload["protocols"]["random"]["paper"]["mean"]) == \
        pytest.approx(100 * differences["paper"]["difference"], abs=1e-6)


def test_two_halves_pool_to_the_whole(kept):
    payload, histories = kept
    whole = pool_compares.pool([("hard", payload, histories)], METHODS)
    halves = pool_compares.pool([("a", *split(payload, histories, {5, 6, 7, 8, 9})),
                                 ("b", *split(payload, histories, {0, 1, 2, 3, 4}))], METHODS)
    assert endpoints.endpoint_rows(*halves, classify, pairs=(METHODS,)) == \
        endpoints.endpoint_rows(*whole, classify, pairs=(METHODS,))
    assert pool_compares.protocol_differences(halves[0], *METHODS) == pool_compares.protocol_differences(whole[0], *METHODS)


def test_a_seed_in_two_runs_and_a_missing_method_are_refused(kept):
    payload, histories = kept
    with pytest.raises(ValueError, match="seed 4 of derl is in a and b"):
        pool_compares.pool([("a", *split(payload, histories, {3, 4})), ("b", *split(payload, histories, {4, 5}))], METHODS)
    with pytest.raises(ValueError, match="no method 'nope'"):
        pool_compares.pool([("a", payload, histories)], ("derl", "nope"))


def test_commands_compare_without_their_seeds_methods_and_workdir():
    a = "python launch/run.py --config=x.py:hard --mode=compare --config.compare.seeds=(0,1) --workdir=runs/a --noprogress"
    b = "python launch/run.py --config=x.py:hard --mode=compare --config.compare.seeds=(10,11) --workdir=runs/b --noprogress"
    c = "python launch/run.py --config=x.py:hard --mode=compare --config.outer.iterations=10 --workdir=runs/c --noprogress"
    assert pool_compares.command_without_varying_flags(a) == pool_compares.command_without_varying_flags(b)
    assert pool_compares.command_without_varying_flags(a) != pool_compares.command_without_varying_flags(c)
