"""The experimental protocol (DERL paper §2.2 and Appendix B): split, search, final, compare.

* `split_train(train, seed)`: the domain's training set is cut 8:2 into an inner-training
  split (trains every candidate policy) and a validation split (scores candidates). The
  split seed (`config.outer.split_seed`) is the same for every method and seed.
* `run_method(method, ...)`: the search on (inner-train, validation) — fixed baselines skip
  it, their expression is given — then *final mode*: the chosen expression trains a fresh
  policy from the base policy on the FULL training set for `config.final.steps` steps (the
  same for every method) and that policy's test accuracy is reported. The validation split
  is never part of the reported number.
* `compare(...)`: methods x seeds -> `results.md`, `results.json` and plots.

This module is the only place that touches the test split: `search` is handed the
inner-training and validation splits only.

Random keys: for seed s, the search, the final training and the fixed baselines'
validation run each get their own stream of `jax.random.key(s)`; the final-training key is
the same for every method, so methods are compared under common random numbers.

Figure 3 (validation and test per outer iteration): the validation curve is the mean
validation score of each iteration's n candidates (invalid ones count as 0, the score the
Meta-Optimizer receives). The test curve needs one extra final-mode training per iteration,
method and seed; it is computed only with `config.compare.per_iteration_test=True` (the
test accuracy of each iteration's best expression trained in final mode). Otherwise
`results.json` has no test curve and the plot shows validation only; `results.md` says which.

Resuming: every (method, seed) writes `method_result.json` atomically when done and is
skipped when it exists; an unfinished search resumes from its own checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from derl_jax.checkpoint import atomic_write_json, atomic_write_text
from derl_jax.config import ConfigError, config_value, validate_shared
from derl_jax.config import choice as _choice
from derl_jax.config import int_at_least as _int_at_least
from derl_jax.config import int_tuple as _int_tuple
from derl_jax.config import model_sizes as _model_sizes
from derl_jax.config import number as _number
from derl_jax.domains.base import TokenDataset, TokenDomain
from derl_jax.expr.canonical import canonical, to_latex
from derl_jax.expr.check import check_text
from derl_jax.expr.grammar import Grammar, make_grammar
from derl_jax.expr.parse import MAX_NESTING
from derl_jax.expr.program import compile_expr, stack_programs
from derl_jax.logging import RunLogger
from derl_jax.meta import report
from derl_jax.evaluator import CandidateEvaluator
from derl_jax.meta.candidates import STRUCTURE_CLASSES
from derl_jax.meta.search import SearchResult, search
from derl_jax.meta.strategies import OptimizerFactory, get_strategy, make_strategy
from derl_jax.meta.strategies import validate_config as validate_strategies

TRAIN_FRACTION = 0.8
DEFAULT_METHODS = ("derl", "derl_pop", "random", "evolution", "outcome", "outcome_format", "average")
METHOD_RESULT_FILE = "method_result.json"
FINAL_RESULT_FILE = "final_result.json"
RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
CURVES_PLOT = "outer_curves.png"
_SEARCH_STREAM, _FINAL_STREAM, _FIXED_VALIDATION_STREAM = 0, 1, 2


def validate_config(cfg: Any) -> None:
    """Raise ConfigError naming the first bad field, e.g.
    `config.outer.num_candidates must be >= 2, got 1`."""
    validate_shared(cfg)
    _int_at_least(cfg, "domain.seed", 0)
    _int_at_least(cfg, "domain.num_train", 5)
    _int_at_least(cfg, "domain.num_test", 1)
    _int_tuple(cfg, "domain.levels", minimum=1)
    _int_at_least(cfg, "domain.max_new_tokens", 2)
    validate_strategies(cfg)


# --------------------------------------------------------------------------- splits and keys


def split_train(train_set: TokenDataset, seed: int) -> tuple[TokenDataset, TokenDataset]:
    """(inner-training split, validation split): an 8:2 shuffle-and-cut with `seed`."""
    return train_set.split(TRAIN_FRACTION, seed)


def run_keys(seed: int) -> dict[str, jax.Array]:
    """The independent key streams of one seed: "search", "final", "fixed_validation"."""
    root = jax.random.key(int(seed))
    return {
        "search": jax.random.fold_in(root, _SEARCH_STREAM),
        "final": jax.random.fold_in(root, _FINAL_STREAM),
        "fixed_validation": jax.random.fold_in(root, _FIXED_VALIDATION_STREAM),
    }


def meta_grammar(cfg: Any, num_primitives: int) -> Grammar:
    """The Meta-Optimizer's grammar: `config.meta.max_symbols` symbols, `config.meta.max_depth` nesting."""
    return make_grammar(num_primitives, int(cfg.meta.max_symbols), int(cfg.meta.max_depth))


# --------------------------------------------------------------------------- final mode


@dataclasses.dataclass(frozen=True)
class FinalResult:
    """A fresh policy trained with one expression on the full training set, tested once."""

    expression: str
    canonical: str
    test: float
    params: Any
    curves: Mapping[str, list]


def compile_checked(expression: str, primitive_names: Sequence[str], outcome_index: int = 0):
    """The Program of `expression`; ValueError with the checker's reason when it is not a valid reward."""
    tree, validity = check_text(expression, primitive_names, outcome_index=outcome_index)
    if tree is None or not validity.ok:
        raise ValueError(f"expression {expression!r} is not a valid reward: {validity.reason}")
    return tree, compile_expr(tree, num_primitives=len(primitive_names))


def train_final(
    expression: str, domain: TokenDomain, evaluator: CandidateEvaluator, key: jax.Array, base_params: Any
) -> FinalResult:
    """Final mode: train a fresh policy from `base_params` with `expression` on the full training
    split, report its accuracy on the test split."""
    tree, program = compile_checked(expression, domain.primitive_names, domain.outcome_index)
    params, curves = evaluator.train_final(program, base_params, key, domain.train)
    test = float(evaluator.accuracy(params, domain.test))
    host_curves = {str(k): np.asarray(v, np.float64).reshape(-1).tolist() for k, v in dict(curves).items()}
    return FinalResult(expression, canonical(tree), test, params, host_curves)


def fixed_validation_score(
    expression: str, domain: TokenDomain, evaluator: CandidateEvaluator, key: jax.Array, base_params: Any,
    inner_train: TokenDataset, validation: TokenDataset,
) -> float:
    """Validation score of a fixed expression: one inner training on inner-train, scored on validation."""
    _, program = compile_checked(expression, domain.primitive_names, domain.outcome_index)
    results = evaluator.evaluate_candidates(stack_programs([program]), base_params, key, inner_train, validation)
    return float(np.asarray(results.scores).reshape(-1)[0])


# --------------------------------------------------------------------------- one method


@dataclasses.dataclass(frozen=True)
class MethodResult:
    """One (method, seed): the chosen expression, its validation score, the final test accuracy.

    per_iteration (search methods): lists over outer iterations of "validation_mean",
    "validation_best", "validity_rate", "structure_shares" ([stable, unstable, invalid]),
    "best_text", and "test_of_best" (or None without `compare.per_iteration_test`).
    evolved_policy_test (population strategies): test accuracy of the policy the search itself
    evolved (the paper's DERL-pop number), next to the protocol's fresh final policy.
    """

    method: str
    seed: int
    expression: str | None
    canonical: str | None
    latex: str | None
    validation: float
    test: float
    budget: Mapping[str, int]
    per_iteration: Mapping[str, Any] | None
    final_curves: Mapping[str, list]
    evolved_policy_test: float | None = None
    note: str = ""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "MethodResult":
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - fields
        if unknown:
            raise ValueError(f"MethodResult.from_json: unknown fields {sorted(unknown)}")
        return cls(**dict(data))


def per_iteration_summary(history: Sequence[Mapping[str, Any]]) -> dict[str, list]:
    """Per outer iteration: mean/best validation score, validity, structure shares, best text."""
    iterations = sorted({int(r["iteration"]) for r in history})
    summary: dict[str, list] = {k: [] for k in ("validation_mean", "validation_best", "validity_rate", "structure_shares", "best_text")}
    for i in iterations:
        records = [r for r in history if r["iteration"] == i]
        scores = np.array([r["score"] for r in records], np.float64)
        summary["validation_mean"].append(float(scores.mean()))
        summary["validation_best"].append(float(scores.max()))
        summary["validity_rate"].append(float(np.mean([r["valid"] for r in records])))
        summary["structure_shares"].append(report.structure_shares([[r["structure"] for r in records]])[0].tolist())
        valid = [r for r in records if r["valid"]]
        summary["best_text"].append(max(valid, key=lambda r: r["score"])["text"] if valid else None)
    return summary


def _latex_of(expression: str | None, primitive_names: Sequence[str]) -> str | None:
    if expression is None:
        return None
    tree, _ = check_text(expression, primitive_names)
    return to_latex(tree) if tree is not None else None


def search_method(
    method: str,
    cfg: Any,
    domain: TokenDomain,
    evaluator: CandidateEvaluator,
    workdir: str | os.PathLike,
    seed: int,
    *,
    base_params: Any,
    optimizer_factory: OptimizerFactory | None = None,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
) -> SearchResult:
    """The outer-loop search of `method` on (inner-train, validation) of `domain`, in `workdir`."""
    names = domain.primitive_names
    inner_train, validation = split_train(domain.train, int(cfg.outer.split_seed))
    strategy = make_strategy(
        method, cfg, meta_grammar(cfg, len(names)), names, outcome_index=domain.outcome_index,
        optimizer_factory=optimizer_factory,
    )
    return search(
        strategy, evaluator, inner_train, validation, names, cfg, workdir, run_keys(seed)["search"],
        init_params=base_params, outcome_index=domain.outcome_index, progress=progress, echo=echo,
    )


def run_final(
    expression: str,
    domain: TokenDomain,
    evaluator: CandidateEvaluator,
    workdir: str | os.PathLike,
    seed: int,
    *,
    base_params: Any,
) -> FinalResult:
    """Final mode alone (the `--mode=final` entry point): train, test, write `final_result.json`."""
    final = train_final(expression, domain, evaluator, run_keys(seed)["final"], base_params)
    atomic_write_json(
        os.path.join(os.fspath(workdir), FINAL_RESULT_FILE),
        {"expression": final.expression, "canonical": final.canonical, "seed": int(seed), "test": final.test,
         "curves": final.curves},
    )
    return final


def run_method(
    method: str,
    cfg: Any,
    domain: TokenDomain,
    evaluator: CandidateEvaluator,
    workdir: str | os.PathLike,
    seed: int,
    *,
    base_params: Any,
    optimizer_factory: OptimizerFactory | None = None,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
) -> MethodResult:
    """Search (unless `method` is a fixed expression) then final mode; see the module docstring.

    Returns the saved result when `workdir/method_result.json` exists.
    """
    workdir = os.fspath(workdir)
    saved = os.path.join(workdir, METHOD_RESULT_FILE)
    if os.path.exists(saved):
        with open(saved, encoding="utf-8") as handle:
            return MethodResult.from_json(json.load(handle))
    names = domain.primitive_names
    keys = run_keys(seed)
    strategy = make_strategy(method, cfg, None, names, outcome_index=domain.outcome_index) if _is_fixed(method) else None

    per_iteration, budget, evolved_test, note = None, {}, None, ""
    if strategy is None:
        found = search_method(
            method, cfg, domain, evaluator, workdir, seed, base_params=base_params,
            optimizer_factory=optimizer_factory, progress=progress, echo=echo,
        )
        expression, validation_score, budget = found.best_text, found.best_score, dict(found.budget)
        per_iteration = per_iteration_summary(found.history)
        if found.incumbent_params is not None:
            evolved_test = float(evaluator.accuracy(found.incumbent_params, domain.test))
    else:
        inner_train, validation = split_train(domain.train, int(cfg.outer.split_seed))
        expression = strategy.text
        validation_score = fixed_validation_score(
            expression, domain, evaluator, keys["fixed_validation"], base_params, inner_train, validation
        )

    if expression is None:
        note = "no valid expression was found; the base policy's test accuracy is reported"
        result_canonical, test, curves = None, float(evaluator.accuracy(base_params, domain.test)), {}
    else:
        final = train_final(expression, domain, evaluator, keys["final"], base_params)
        result_canonical, test, curves = final.canonical, final.test, final.curves
        if per_iteration is not None and bool(cfg.compare.per_iteration_test):
            per_iteration["test_of_best"] = _iteration_tests(per_iteration["best_text"], domain, evaluator, keys["final"], base_params)
    if per_iteration is not None:
        per_iteration.setdefault("test_of_best", None)

    result = MethodResult(
        method=method,
        seed=int(seed),
        expression=expression,
        canonical=result_canonical,
        latex=_latex_of(expression, names),
        validation=float(validation_score),
        test=test,
        budget=budget,
        per_iteration=per_iteration,
        final_curves=curves,
        evolved_policy_test=evolved_test,
        note=note,
    )
    atomic_write_json(saved, result.to_json())
    return result


def _is_fixed(method: str) -> bool:
    return not get_strategy(method).searches


def _iteration_tests(best_texts, domain, evaluator, key, base_params) -> list[float | None]:
    """Test accuracy of each iteration's best expression trained in final mode (identical texts trained once)."""
    tested: dict[str, float] = {}
    out = []
    for text in best_texts:
        if text is None:
            out.append(None)
            continue
        if text not in tested:
            tested[text] = train_final(text, domain, evaluator, key, base_params).test
        out.append(tested[text])
    return out


# --------------------------------------------------------------------------- comparison


def compare(
    cfg: Any,
    domain: TokenDomain,
    evaluator: CandidateEvaluator,
    workdir: str | os.PathLike,
    *,
    base_params: Any,
    methods: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    optimizer_factory: OptimizerFactory | None = None,
    progress: bool = True,
    echo: Callable[[str], None] | None = None,
) -> dict:
    """Every method x seed (`config.compare.methods` / `.seeds` unless given), then the report.

    Writes `<workdir>/<method>/seed_<s>/` run directories, `results.json`, `results.md`,
    `outer_curves.png` and `structure_<method>.png`; returns the results.json content.
    """
    workdir = os.fspath(workdir)
    methods = tuple(methods if methods is not None else cfg.compare.methods)
    seeds = tuple(int(s) for s in (seeds if seeds is not None else cfg.compare.seeds))
    if not methods or not seeds:
        raise ValueError(f"compare: need at least one method and one seed, got methods={methods}, seeds={seeds}")
    os.makedirs(workdir, exist_ok=True)
    RunLogger(workdir, tensorboard=False).write_config(cfg)
    results: dict[str, list[MethodResult]] = {}
    for method in methods:
        results[method] = [
            run_method(
                method, cfg, domain, evaluator, method_dir(workdir, method, seed), seed,
                base_params=base_params, optimizer_factory=optimizer_factory, progress=progress,
                echo=echo or _console(f"[{method} seed {seed}]"),
            )
            for seed in seeds
        ]
    return write_report(workdir, results, per_iteration_test=bool(cfg.compare.per_iteration_test))


def _console(prefix: str) -> Callable[[str], None]:
    """Print search summary lines with `prefix`, without breaking progress bars."""
    from tqdm.auto import tqdm

    return lambda line: tqdm.write(f"{prefix} {line}", file=sys.stdout)


def method_dir(workdir: str | os.PathLike, method: str, seed: int) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in method)
    return os.path.join(os.fspath(workdir), safe, f"seed_{int(seed)}")


def write_report(workdir: str, results: Mapping[str, Sequence[MethodResult]], *, per_iteration_test: bool) -> dict:
    """results.json, results.md and the plots from finished method results."""
    test_pct = {m: [100.0 * r.test for r in rs] for m, rs in results.items()}
    val_pct = {m: [100.0 * r.validation for r in rs] for m, rs in results.items()}
    test_md, test_summary = report.results_table(test_pct, column="test accuracy (%)", clip=(0.0, 100.0))
    val_md, val_summary = report.results_table(val_pct, column="validation accuracy (%)", clip=(0.0, 100.0))

    curves, plots = {}, {}
    for method, rs in results.items():
        if any(r.per_iteration is None for r in rs):
            continue
        validation = _ragged([r.per_iteration["validation_mean"] for r in rs])
        series = {"validation (mean of candidates)": validation}
        test_curves = [r.per_iteration.get("test_of_best") for r in rs]
        if per_iteration_test and all(t is not None for t in test_curves):
            tests = _ragged(test_curves)
            if np.all(np.isfinite(tests).any(axis=0)):  # every iteration has a tested expression in some seed
                series["test (best of iteration, final mode)"] = tests
        curves[method] = {name: values.tolist() for name, values in series.items()}
        shares = np.nanmean(_ragged_shares([r.per_iteration["structure_shares"] for r in rs]), axis=0)
        plots[f"structure_{method}"] = report.plot_structure_shares(
            shares, os.path.join(workdir, f"structure_{method}.png"), title=f"{method}: reward structures"
        )
    if curves:
        panels = {m: {k: np.asarray(v, np.float64) for k, v in c.items()} for m, c in curves.items()}
        plots["outer_curves"] = report.plot_outer_curves(panels, os.path.join(workdir, CURVES_PLOT), ylabel="accuracy")

    payload = {
        "methods": list(results),
        "test": test_summary,
        "validation": val_summary,
        "per_seed": {m: [_seed_row(r) for r in rs] for m, rs in results.items()},
        "budget": {m: [dict(r.budget) for r in rs] for m, rs in results.items()},
        "curves": curves,
        "test_curve": "per-iteration final-mode test" if per_iteration_test else "not computed (validation only)",
        "plots": {k: os.path.basename(v) for k, v in plots.items()},
    }
    atomic_write_json(os.path.join(workdir, RESULTS_JSON), _json_safe(payload))
    atomic_write_text(os.path.join(workdir, RESULTS_MD), _markdown(results, test_md, val_md, per_iteration_test, plots))
    return payload


def _seed_row(r: MethodResult) -> dict:
    return {
        "seed": r.seed,
        "expression": r.expression,
        "canonical": r.canonical,
        "latex": r.latex,
        "validation": r.validation,
        "test": r.test,
        "evolved_policy_test": r.evolved_policy_test,
        "note": r.note,
    }


def _ragged(rows: Sequence[Sequence[float | None]]) -> np.ndarray:
    """f64[S, I] with NaN where a seed has no value (None or a shorter run)."""
    width = max(len(row) for row in rows)
    out = np.full((len(rows), width), np.nan)
    for s, row in enumerate(rows):
        out[s, : len(row)] = [np.nan if v is None else float(v) for v in row]
    return out


def _ragged_shares(rows: Sequence[Sequence[Sequence[float]]]) -> np.ndarray:
    width = max(len(row) for row in rows)
    out = np.full((len(rows), width, len(STRUCTURE_CLASSES)), np.nan)
    for s, row in enumerate(rows):
        out[s, : len(row)] = np.asarray(row, np.float64)
    return out


def _json_safe(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (np.floating, np.integer)):
        return _json_safe(value.item())
    return value


def _markdown(results, test_md: str, val_md: str, per_iteration_test: bool, plots: Mapping[str, str]) -> str:
    lines = ["# DERL comparison", "", "## Test accuracy (final policy, full training set)", "", test_md]
    lines += ["## Validation accuracy (search score; fixed baselines: one inner training)", "", val_md]
    lines += ["## Chosen expressions", "", "| method | seed | expression | canonical | validation (%) | test (%) |", "|---|---:|---|---|---:|---:|"]
    for method, rs in results.items():
        for r in rs:
            lines.append(
                f"| {method} | {r.seed} | `{r.expression}` | `{r.canonical}` | {100 * r.validation:.2f} | {100 * r.test:.2f} |"
            )
    evolved = [(m, r) for m, rs in results.items() for r in rs if r.evolved_policy_test is not None]
    if evolved:
        lines += ["", "Policies evolved by population search (tested as they are, without final retraining):", ""]
        lines += [f"- {m}, seed {r.seed}: {100 * r.evolved_policy_test:.2f}%" for m, r in evolved]
    budgets = [(m, r) for m, rs in results.items() for r in rs if r.budget]
    if budgets:
        lines += ["", "## Search budget", "", "| method | seed | candidates charged | candidates trained |", "|---|---:|---:|---:|"]
        lines += [f"| {m} | {r.seed} | {r.budget['candidates_charged']} | {r.budget['candidates_trained']} |" for m, r in budgets]
    notes = [f"- {m}, seed {r.seed}: {r.note}" for m, rs in results.items() for r in rs if r.note]
    if notes:
        lines += ["", "## Notes", ""] + notes
    lines += ["", "## Plots", ""]
    curve_text = (
        "validation: mean score of each iteration's candidates; test: each iteration's best expression trained in final mode"
        if per_iteration_test
        else "validation only (mean score of each iteration's candidates); the per-iteration test curve was not computed "
        "(set config.compare.per_iteration_test=True)"
    )
    for name, path in plots.items():
        lines.append(f"- `{os.path.basename(path)}`" + (f": {curve_text}" if name == "outer_curves" else ""))
    return "\n".join(lines) + "\n"
