"""notebooks/derl_dynamics.ipynb runs on a small comparison directory and shows what it promises."""

from __future__ import annotations

import pytest
import os

import nbformat
from nbclient import NotebookClient

from derl_jax.domains.arith import make_arith_domain
from derl_jax.expr.canonical import to_latex
from derl_jax.expr.parse import parse
from derl_jax.logging import read_jsonl
from derl_jax.experiment.protocol import compare
from arbo_fakes import Replay, completion
from test_search import BASE_PARAMS, REPO_ROOT, FakeEvaluator, FakeMetaOptimizer, fake_config, get_config

NOTEBOOK = os.path.join(REPO_ROOT, "notebooks", "derl_dynamics.ipynb")


def outputs_of(notebook, kind: str) -> list:
    return [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs if kind in o.get("data", {})]


# Eureka's replies name the primitives (correct, boxed, ...), as LLM searchers do
EUREKA = [completion([f"```reward\n{text}\n```" for text in texts], n=3) for texts in (
    ("correct+0.5*boxed", "correct*(1+steps)", "boxed+"),
    ("correct+0.25*boxed", "2*correct+0.1*gold_anywhere", "correct+boxed*steps"),
    ("correct+0.5*boxed*(1-u)", "correct", "correct+steps"))]


@pytest.mark.slow
def test_notebook_runs_on_a_run_directory(tmp_path, monkeypatch):
    """Smoke runs of derl (texts in g1, g2, ...), history_search and eureka (texts in primitive names)."""
    cfg = fake_config(iterations=3, num_candidates=3)
    cfg.compare.methods = ("derl", "history_search", "eureka", "outcome")
    domain = make_arith_domain(get_config("smoke").domain)
    with Replay(EUREKA) as server:
        cfg.arbo.agent.url = server.url
        compare(cfg, domain, FakeEvaluator(), tmp_path, base_params=BASE_PARAMS,
                optimizer_factory=FakeMetaOptimizer, progress=False, echo=lambda line: None)

    monkeypatch.setenv("DERL_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()

    errors = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs if o.output_type == "error"]
    assert errors == []
    printed = "".join(o.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs)
    for method in ("derl", "history_search", "eureka"):
        assert f"{method}/seed_0: 3 outer iterations, 9 candidates" in printed
    # outer curves + one inner-curve figure per search + structure evolution
    assert len(outputs_of(notebook, "image/png")) == 5
    latex = "".join(o["data"]["text/latex"] for o in outputs_of(notebook, "text/latex"))
    names = domain.primitive_names
    for method in ("derl", "history_search", "eureka"):
        history = read_jsonl(tmp_path / method / "seed_0" / "history.jsonl")
        best = max((r for r in history if r["valid"]), key=lambda r: r["score"])
        assert to_latex(parse(best["text"], names)) in latex
        if method == "eureka":
            assert "correct" in best["text"]    # a text in primitive names: what the cell used to fail on
    markdown = "".join(o["data"]["text/markdown"] for o in outputs_of(notebook, "text/markdown"))
    assert "# DERL comparison" in markdown and "| outcome |" in markdown
