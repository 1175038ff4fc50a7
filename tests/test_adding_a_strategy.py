'''The "Adding a search method" example of docs/extending.md, run as written there: one new file in
derl_jax/methods/ (here a temporary directory added to that package's path), nothing
else edited. The registry finds it, the config check accepts its name, and a search with it
runs, learns from its records and resumes exactly.'''

from __future__ import annotations

import pytest

import derl_jax.methods as methods_package
from derl_jax.experiment.checks import validate_config
from derl_jax.outer import registry, strategy_names
from derl_jax.outer.search import strip_wall_clock
from test_docs import docs_example
from test_search import fake_config, run_fake_search

EXAMPLE = docs_example("derl_jax/methods/hill_climb.py")  # the "Adding a search method" example of docs/extending.md


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
