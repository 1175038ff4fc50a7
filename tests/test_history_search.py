"""`history_search` is the scripted search `arbo` used to be: same seeds, same histories.

`tests/data/history_search_golden.json` holds what the default `arbo` (the structural
proposer) and its ablations and `eureka` (greedy refinement by the same proposer) produced
against the fake oracle of `arbo_fakes` before `arbo` became the LLM agent: every round's
texts, lineage, belief and scores, straight from the strategies and through the whole search
loop (`derl_jax.outer.search.search` with a fake evaluator). It was written by `golden()` below
with the old names (`OLD` of each run) at the commit named in the file; the test runs the same
code with the new names and compares. Curves are left out of the comparison (they are the fake
oracle's, a function of the texts).
"""

import json
import os
from pathlib import Path

import jax
import ml_collections

from arbo_fakes import NAMES, FakeEvaluator, run_rounds, tiny_data
from derl_jax.logging import read_jsonl
from derl_jax.methods.arbo import history as hist
from derl_jax.outer import make_strategy

GOLDEN = Path(__file__).parent / "data" / "history_search_golden.json"

# (new name, old name, config, seed)
RUNS = (
    ("history_search", "arbo", {}, 0),
    ("history_search", "arbo", {"arbo": {"initial_explore": 2, "patience": 1, "reexplore": 2}}, 1),
    ("history_search_ablation:no_belief", "arbo_ablation:no_belief", {}, 0),
    ("history_search_ablation:scores_only", "arbo_ablation:scores_only", {}, 0),
    ("history_search_ablation:explore_only", "arbo_ablation:explore_only", {}, 0),
    ("history_search_ablation:exploit_only", "arbo_ablation:exploit_only", {}, 0),
    ("history_search_ablation:greedy", "eureka", {}, 0),
)
ROUNDS, PER_ROUND = 6, 4
SEARCH_ITERATIONS = 5


def summary(history: hist.History) -> dict:
    """The history as JSON with each candidate's curves replaced by their names."""
    data = hist.to_json(history)
    for obs in data["observations"]:
        obs["curves"] = sorted(obs["curves"])
    return data


def strategy_run(name: str, cfg: dict, seed: int) -> dict:
    state, proposed = run_rounds(make_strategy(name, cfg, None, NAMES), ROUNDS, PER_ROUND, seed=seed)
    return {"texts": proposed, "history": summary(state.history)}


def search_run(name: str, workdir: str) -> dict:
    """The whole search loop with the fake evaluator: history.jsonl without wall clock and method,
    and the strategy's history file."""
    from derl_jax.outer.search import search

    cfg = ml_collections.ConfigDict({"outer": {"iterations": SEARCH_ITERATIONS, "num_candidates": PER_ROUND},
                                     "inner": {"common_random_numbers": True},
                                     "arbo": {"initial_explore": 1, "patience": 1, "reexplore": 1}})
    strategy = make_strategy(name, cfg, None, NAMES, workdir=workdir)
    data = tiny_data()
    search(strategy, FakeEvaluator(), data, data, NAMES, cfg, workdir, jax.random.key(3),
           init_params={"skill": jax.numpy.float32(0)}, progress=False, echo=lambda line: None)
    keep = ("iteration", "index", "text", "canonical", "valid", "trained", "duplicate_of", "reason", "score")
    records = [{k: r[k] for k in keep} for r in read_jsonl(os.path.join(workdir, "history.jsonl"))]
    return {"records": records, "history": summary(hist.load(workdir))}


def golden(names: dict[str, str], workdir: str) -> dict:
    """What the golden file holds, from the strategies named `names[new name]`."""
    runs = [{"name": new, "config": cfg, "seed": seed, **strategy_run(names.get(new, new), cfg, seed)}
            for new, _, cfg, seed in RUNS]
    return {"runs": runs, "search": search_run(names.get("history_search", "history_search"), workdir)}


def _rounded(value):
    """Floats to 6 significant digits, so the comparison does not hang on the last bit."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def test_history_search_reproduces_the_scripted_arbo_and_eureka(tmp_path):
    expected = json.loads(GOLDEN.read_text())
    got = golden({}, str(tmp_path / "search"))
    for run, want in zip(got["runs"], expected["runs"], strict=True):
        assert run["name"] == want["name"] and run["seed"] == want["seed"]
        assert run["texts"] == want["texts"], run["name"]
        assert _rounded(run["history"]) == _rounded(want["history"]), run["name"]
    assert _rounded(got["search"]) == _rounded(expected["search"])
    # the comparison can fail: another seed gives another history
    other = strategy_run("history_search", {}, 7)
    assert other["texts"] != expected["runs"][0]["texts"]


def test_history_search_says_what_proposed(tmp_path):
    strategy = make_strategy("history_search", {}, None, NAMES, workdir=tmp_path)
    run_rounds(strategy, 1)
    with open(hist.history_path(tmp_path)) as handle:
        saved = json.load(handle)
    assert saved["method"] == "history_search" and saved["proposer"] == "structural"


if __name__ == "__main__":  # how the golden file was written (with the names of the time)
    import subprocess
    import sys
    import tempfile

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    old = {new: old_name for new, old_name, _, _ in RUNS}
    with tempfile.TemporaryDirectory() as tmp:
        data = {"made_by": f"arbo/eureka with the structural proposer at commit {commit}",
                **golden(old, os.path.join(tmp, "search"))}
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(data, indent=1) + "\n")
    sys.exit(0)
