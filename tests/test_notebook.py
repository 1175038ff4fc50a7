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
from test_search import BASE_PARAMS, REPO_ROOT, FakeEvaluator, FakeMetaOptimizer, fake_config, get_config

NOTEBOOK = os.path.join(REPO_ROOT, "notebooks", "derl_dynamics.ipynb")


def outputs_of(notebook, kind: str) -> list:
    return [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs if kind in o.get("data", {})]


@pytest.mark.slow
def test_notebook_runs_on_a_run_directory(tmp_path, monkeypatch):
    cfg = fake_config(iterations=3, num_candidates=3)
    cfg.compare.methods = ("derl", "evolution", "outcome")
    domain = make_arith_domain(get_config("smoke").domain)
    compare(cfg, domain, FakeEvaluator(), tmp_path, base_params=BASE_PARAMS,
            optimizer_factory=FakeMetaOptimizer, progress=False, echo=lambda line: None)

    monkeypatch.setenv("DERL_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(notebook, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()

    errors = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs if o.output_type == "error"]
    assert errors == []
    printed = "".join(o.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs)
    assert "derl/seed_0: 3 outer iterations, 9 candidates" in printed
    assert "evolution/seed_0: 3 outer iterations, 9 candidates" in printed
    # outer curves + one inner-curve figure per search + structure evolution
    assert len(outputs_of(notebook, "image/png")) == 4
    latex = "".join(o["data"]["text/latex"] for o in outputs_of(notebook, "text/latex"))
    for method in ("derl", "evolution"):
        history = read_jsonl(tmp_path / method / "seed_0" / "history.jsonl")
        best = max((r for r in history if r["valid"]), key=lambda r: r["score"])
        assert to_latex(parse(best["text"])) in latex
    markdown = "".join(o["data"]["text/markdown"] for o in outputs_of(notebook, "text/markdown"))
    assert "# DERL comparison" in markdown and "| outcome |" in markdown
