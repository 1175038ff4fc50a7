'''The README's "Adding a method" example, run as written: one new file in
derl_jax/methods/ (here a temporary directory added to that package's path), nothing
else edited. The registry finds it, the config check accepts its name, and a search with it
runs, learns from its records and resumes exactly.'''

from __future__ import annotations

import pytest

import derl_jax.methods as methods_package
from derl_jax.experiment.checks import validate_config
from derl_jax.outer import registry, strategy_names
from derl_jax.outer.search import strip_wall_clock
from test_search import fake_config, run_fake_search

EXAMPLE = '''\
"""Hill climbing: propose the best expression so far and n-1 point mutations of it."""

from derl_jax.expr.parse import parse, to_text
from derl_jax.methods.evolution import operators as evolution
from derl_jax.outer import Strategy, check_update, register_strategy


@register_strategy("hill_climb")
class HillClimb(Strategy):
    def __init__(self, primitive_names):
        self.primitive_names = primitive_names

    @classmethod
    def from_config(cls, name, context):
        return cls(context.primitive_names)

    def init(self, key):
        return {"best": "g1", "score": -1.0}  # start from the outcome primitive

    def propose(self, state, key, n):
        rng = evolution.as_generator(key)
        best = parse(state["best"], self.primitive_names)
        children = [evolution.mutate(best, rng, len(self.primitive_names)) for _ in range(n - 1)]
        return [state["best"]] + [to_text(child) for child in children], None

    def update(self, state, records, scores, aux):
        check_update(records, scores, f"{self.name}.update")
        scored = [r for r in records if r.valid and r.reason is None]
        best = max(scored, key=lambda r: r.score, default=None)
        if best is not None and best.score > state["score"]:
            return {"best": best.text, "score": best.score}
        return state

    def checkpoint(self, state):
        return {}, dict(state)  # no arrays; the JSON part is the whole state

    def restore(self, initial_state, arrays, data):
        return dict(data)
'''


@pytest.fixture
def example_strategy(tmp_path):
    package_dir = tmp_path / "extra_strategies"
    package_dir.mkdir()
    (package_dir / "hill_climb.py").write_text(EXAMPLE)
    methods_package.__path__.append(str(package_dir))
    try:
        yield
    finally:
        methods_package.__path__.remove(str(package_dir))
        registry.STRATEGIES.remove("hill_climb")


def test_a_strategy_in_one_new_file_is_found_checked_and_searched_with(tmp_path, example_strategy):
    assert "hill_climb" in strategy_names()
    cfg = fake_config()
    cfg.outer.strategy = "hill_climb"
    validate_config(cfg)

    result, evaluator = run_fake_search(tmp_path / "a", "hill_climb", iterations=3, num_candidates=4)
    history = result.history
    assert [r["text"] for r in history if r["iteration"] == 0][0] == "g1"
    for i in (1, 2):  # each iteration starts from the best scored candidate so far
        earlier = [r for r in history if r["iteration"] < i and r["valid"] and not r["reason"]]
        best = max(earlier, key=lambda r: r["score"])  # first maximum, as the strategy keeps it
        assert [r["text"] for r in history if r["iteration"] == i][0] == best["text"]
    assert result.best_text is not None and len({r["text"] for r in history}) > 3

    run_fake_search(tmp_path / "b", "hill_climb", iterations=2, num_candidates=4)
    resumed, _ = run_fake_search(tmp_path / "b", "hill_climb", iterations=3, num_candidates=4)
    assert strip_wall_clock(resumed.history) == strip_wall_clock(history)
