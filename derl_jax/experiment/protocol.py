"""The experimental protocol (DERL paper §2.2 and Appendix B): split, search, final, compare.

* `split_train(train, seed)`: the domain's training set is cut 8:2 into an inner-training
  split (trains every candidate policy) and a validation split (scores candidates). The
  split seed (`config.outer.split_seed`) is the same for every method and seed.
* `run_method(method, ...)`: the search on (inner-train, validation) — fixed baselines skip
  it, their expression is given — then *final mode*: the chosen expression trains a fresh
  policy from the base policy on the FULL training set and that policy's test accuracy is
  reported. A search method's final policy trains `config.final.steps` steps, a fixed
  baseline's `config.final.baseline_steps` when set (`derl_jax.outer.budget.final_steps`;
  the agent presets: 150 to DERL's 100, as the paper's §3.2), so DERL never trains its final
  policy longer than a baseline. The validation split is never part of the reported number.
* `compare(...)`: methods x seeds -> `results.md`, `results.json` and plots
  (`derl_jax.experiment.report`).

DERL-pop. It runs `outer.population_iterations` iterations (0: `outer.iterations`) whose
candidates train `outer.population_inner_steps` inner steps each (`derl_jax.outer.budget`: by
default `final.steps // population iterations`, so the policy it evolves trains as many steps
in total as a search method's final policy). Its product is that evolved
policy — the best policy of its last iteration, trained through the curriculum of rewards —
so its headline test accuracy is the evolved policy's (`MethodResult.headline == "evolved"`);
the policy retrained from scratch with its best expression is reported beside it
(`retrained_test`). Both inner-step totals are in `MethodResult.budget`.

Figure 3 (validation and test per outer iteration): the validation curve is the mean
validation score of each iteration's n candidates (invalid ones count as 0, the score the
Meta-Optimizer receives). With `config.compare.candidate_test=True` the search keeps each
iteration's candidate policies on disk and, once the search has finished, this module tests
them: the test curve is the mean test accuracy of the same n candidates (invalid ones 0), the
paper's curve. With `config.compare.per_iteration_test=True` each iteration's best expression
is also retrained in final mode and tested (a second panel).

Test sets and metrics: a domain may name several test sets (`domain.test_sets`, e.g. GSM8K and
MATH for Table 1(b)) and its own test metrics (`domain.test_metrics(texts, dataset)` on the
greedy outputs, e.g. exact match then math-verify equivalence). Every reported policy is
tested on each set by each metric (`test_accuracies`, `MethodResult.test_sets`); the
headline number `test` is the first metric on the first set. Domains without them report
`evaluator.accuracy` on `domain.test`.

This module is the only place that touches the test split: `search` is handed the
inner-training and validation splits only.

Random keys: for seed s, the search, the final training and the fixed baselines'
validation run each get their own stream of `jax.random.key(s)`; the final-training key is
the same for every method, so methods are compared under common random numbers.

Resuming: every (method, seed) writes `method_result.json` atomically when done and is
skipped when it exists; an unfinished search resumes from its own checkpoints, and candidate
test results are saved per iteration (`candidate_tests.json`).

Kept trainings (`compare.keep_final_policies`, single-process runs): the final policy is
written to `final_policy.npz` (with its expression and training curves in
`final_policy.json`, and as a Hugging Face directory `final_policy_hf/`:
derl_jax/experiment/export.py) and a fixed method's validation score to `fixed_validation.json`. A run
that finds them for its expression tests the kept policy instead of training it again, which
is how a generalisation level with an earlier level's training split (derl_jax/experiment/levels.py)
only runs its own tests.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from derl_jax.checkpoint import atomic_write_json, atomic_write_text
from derl_jax.config import ConfigError, config_value, has_field
from derl_jax.domains.base import TokenDataset, TokenDomain, reward_classifier
from derl_jax.rl.evaluator import CandidateEvaluator
from derl_jax.expr.canonical import canonical, to_latex
from derl_jax.expr.candidate import examine
from derl_jax.expr.grammar import MAX_FRACTION_DIGITS, Grammar, make_grammar
from derl_jax.expr.parse import ExpressionError, parse
from derl_jax.expr.program import stack_programs
from derl_jax.logging import RunLogger
from derl_jax.outer import candidate_policies
from derl_jax.outer.budget import final_steps, inner_step_totals, population_inner_steps, population_iterations
from derl_jax.outer.candidates import select
from derl_jax.experiment.export import FINAL_POLICY_FILE, FINAL_POLICY_HF_DIR, write_policy_hf
from derl_jax.experiment import claims, reevaluate
from derl_jax.experiment.report import RESULTS_JSON, RESULTS_MD, write_report
from derl_jax.logging import HISTORY_FILE, read_jsonl
from derl_jax.experiment.results import HEADLINE_EVOLVED, HEADLINE_RETRAINED, MethodResult, best_so_far, per_iteration_summary
from derl_jax.outer.search import SearchResult, search
from derl_jax.outer import OptimizerFactory, get_strategy, make_strategy

__all__ = ["ConfigError", "MethodResult", "RESULTS_JSON", "RESULTS_MD", "compare", "run_method", "run_final", "search_method"]

TRAIN_FRACTION = 0.8
METHOD_RESULT_FILE = "method_result.json"
FINAL_POLICY_INFO = "final_policy.json"
FIXED_VALIDATION_FILE = "fixed_validation.json"
FINAL_RESULT_FILE = "final_result.json"
CANDIDATE_TESTS_FILE = "candidate_tests.json"
BASE_TEST_FILE = "base_policy_test.json"
_SEARCH_STREAM, _FINAL_STREAM, _FIXED_VALIDATION_STREAM = 0, 1, 2


def _flag(cfg: Any, path: str) -> bool:
    return bool(config_value(cfg, path)) if has_field(cfg, path) else False


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
    """The Meta-Optimizer's grammar: `config.meta.max_symbols` symbols, `config.meta.max_depth` nesting,
    `config.meta.max_decimals` digits after a decimal point (3 when the block has no such field),
    `config.meta.operators` operator set ("extended" when absent)."""
    decimals = int(config_value(cfg, "meta.max_decimals")) if has_field(cfg, "meta.max_decimals") else MAX_FRACTION_DIGITS
    operators = str(config_value(cfg, "meta.operators")) if has_field(cfg, "meta.operators") else "extended"
    return make_grammar(num_primitives, int(cfg.meta.max_symbols), int(cfg.meta.max_depth), decimals, operators)


# --------------------------------------------------------------------------- final mode


@dataclasses.dataclass(frozen=True)
class FinalResult:
    """A fresh policy trained with one expression on the full training set, tested once."""

    expression: str
    canonical: str
    test: float
    params: Any
    curves: Mapping[str, list]
    test_sets: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    test_items: list[float] | None = None


def test_accuracies(domain: TokenDomain, evaluator: CandidateEvaluator,
                   params: Any) -> tuple[dict[str, dict[str, float]], list[float] | None]:
    """({test set: {metric: accuracy}}, per-item scores of the first set or None) of one policy
    (module docstring): the domain's named test sets (`domain.test_sets`, else {"test":
    domain.test}), each scored by the domain's `test_metrics` on the evaluator's greedy outputs
    when both exist, else by the evaluator's per-item scores (`item_scores`, whose mean is the
    accuracy) or, for an evaluator without them, its `accuracy`."""
    test_sets = dict(getattr(domain, "test_sets", None) or {}) or {"test": domain.test}
    metrics = getattr(domain, "test_metrics", None)
    if metrics is not None and hasattr(evaluator, "greedy_texts"):
        return {name: metrics(evaluator.greedy_texts(params, data), data) for name, data in test_sets.items()}, None
    tests, first_items = {}, None
    for name, data in test_sets.items():
        if not hasattr(evaluator, "item_scores"):
            tests[name] = {"accuracy": float(evaluator.accuracy(params, data))}
            continue
        items = np.asarray(evaluator.item_scores(params, data), np.float32)
        tests[name] = {"accuracy": float(items.sum(dtype=np.float32) / np.float32(items.size))}  # as `accuracy` rounds
        first_items = items.tolist() if first_items is None else first_items
    return tests, first_items


def headline_accuracy(test_sets: Mapping[str, Mapping[str, float]]) -> float:
    """The headline test number: the first metric of the first test set."""
    first = next(iter(test_sets.values()))
    return float(next(iter(first.values())))


def compile_checked(expression: str, primitive_names: Sequence[str], outcome_index: int = 0):
    """The Program of `expression`; ValueError with the checker's reason when it is not a valid reward."""
    candidate = examine(expression, primitive_names, outcome_index)
    if not candidate.valid:
        raise ValueError(f"expression {expression!r} is not a valid reward: {candidate.reason}")
    return candidate.expr, candidate.program


def train_final(
    expression: str, domain: TokenDomain, evaluator: CandidateEvaluator, key: jax.Array, base_params: Any,
    keep_dir: str | None = None, steps: int | None = None,
) -> FinalResult:
    """Final mode: train a fresh policy from `base_params` with `expression` on the full training
    split, report its accuracy on the test split. keep_dir: keep the trained policy there (module
    docstring); a policy kept there for the same expression is tested instead of trained again.
    steps: inner steps when they differ from the evaluator's `final.steps` (a baseline's
    `final.baseline_steps`); None: `final.steps`."""
    tree, program = compile_checked(expression, domain.primitive_names, domain.outcome_index)
    saved = _kept(keep_dir, FINAL_POLICY_INFO, expression)
    if saved is not None and os.path.exists(os.path.join(keep_dir, FINAL_POLICY_FILE)):
        stacked, _ = candidate_policies.load_stack(os.path.join(keep_dir, FINAL_POLICY_FILE), base_params)
        params = jax.tree_util.tree_map(lambda x, like: jax.device_put(x[0], getattr(like, "sharding", None)),
                                        stacked, base_params)
        host_curves = saved["curves"]
    else:
        extra = {} if steps is None else {"steps": int(steps)}
        params, curves = evaluator.train_final(program, base_params, key, domain.train, **extra)
        host_curves = {str(k): np.asarray(v, np.float64).reshape(-1).tolist() for k, v in dict(curves).items()}
        if keep_dir is not None:
            stacked = jax.tree_util.tree_map(lambda x: np.asarray(x)[None], params)
            candidate_policies.save_stack(os.path.join(keep_dir, FINAL_POLICY_FILE), stacked, [0])
            _write_hf(keep_dir, domain, evaluator, params)
            # Curves may hold NaN (Python's json reads it back), so not atomic_write_json.
            atomic_write_text(os.path.join(keep_dir, FINAL_POLICY_INFO),
                              json.dumps({"expression": expression, "curves": host_curves}) + "\n")
    tests, items = test_accuracies(domain, evaluator, params)
    return FinalResult(expression, canonical(tree), headline_accuracy(tests), params, host_curves, tests, items)


def _write_hf(directory: str, domain: TokenDomain, evaluator: CandidateEvaluator, params: Any) -> None:
    """The final policy `params` as `<directory>/final_policy_hf/` (`export.write_policy_hf`, with the
    domain's tokenizer) in a single-process run of a model evaluator (one with a `graphdef`)."""
    graphdef = getattr(evaluator, "graphdef", None)
    if graphdef is not None and jax.process_count() == 1:
        write_policy_hf(os.path.join(directory, FINAL_POLICY_HF_DIR), params, graphdef=graphdef,
                        tokenizer=domain.tokenizer)


def _kept(keep_dir: str | None, name: str, expression: str) -> dict | None:
    """The JSON file `name` in `keep_dir` when it was written for `expression`, else None."""
    path = os.path.join(keep_dir, name) if keep_dir is not None else None
    if path is None or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        saved = json.load(handle)
    return saved if saved.get("expression") == expression else None


def fixed_validation_score(
    expression: str, domain: TokenDomain, evaluator: CandidateEvaluator, key: jax.Array, base_params: Any,
    inner_train: TokenDataset, validation: TokenDataset, keep_dir: str | None = None,
) -> float:
    """Validation score of a fixed expression: one inner training on inner-train, scored on
    validation; kept in `keep_dir` (when given) like `train_final` keeps the final policy."""
    saved = _kept(keep_dir, FIXED_VALIDATION_FILE, expression)
    if saved is not None:
        return float(saved["validation"])
    _, program = compile_checked(expression, domain.primitive_names, domain.outcome_index)
    results = evaluator.evaluate_candidates(stack_programs([program]), base_params, key, inner_train, validation)
    score = float(np.asarray(results.scores).reshape(-1)[0])
    if keep_dir is not None:
        atomic_write_text(os.path.join(keep_dir, FIXED_VALIDATION_FILE),
                          json.dumps({"expression": expression, "validation": score}) + "\n")
    return score


def run_final(
    expression: str,
    domain: TokenDomain,
    evaluator: CandidateEvaluator,
    workdir: str | os.PathLike,
    seed: int,
    *,
    base_params: Any,
) -> FinalResult:
    """Final mode alone (the `--mode=final` entry point): train, test, write `final_result.json` and
    the policy as `final_policy_hf/` in `workdir`."""
    final = train_final(expression, domain, evaluator, run_keys(seed)["final"], base_params)
    _write_hf(os.fspath(workdir), domain, evaluator, final.params)
    atomic_write_json(
        os.path.join(os.fspath(workdir), FINAL_RESULT_FILE),
        {"expression": final.expression, "canonical": final.canonical, "seed": int(seed), "test": final.test,
         "test_sets": final.test_sets, "curves": final.curves},
    )
    return final


# --------------------------------------------------------------------------- one method


def _latex_of(expression: str | None, primitive_names: Sequence[str]) -> str | None:
    if expression is None:
        return None
    try:
        return to_latex(parse(expression, primitive_names))
    except ExpressionError:
        return None


def meta_optimizer_mesh(evaluator: CandidateEvaluator) -> Any:
    """The mesh the Meta-Optimizer runs on: the inner loop's (None without one), also when it
    spans several processes: its steps are then one sharded computation of the whole job."""
    return getattr(evaluator, "mesh", None)


def search_method(
    method: str, cfg: Any, domain: TokenDomain, evaluator: CandidateEvaluator, workdir: str | os.PathLike, seed: int,
    *, base_params: Any, optimizer_factory: OptimizerFactory | None = None, **console: Any,
) -> SearchResult:
    """The outer-loop search of `method` on (inner-train, validation) of `domain`, in `workdir`.

    Population strategies run `budget.population_iterations(cfg)` iterations of
    `budget.population_inner_steps(cfg)` inner steps per candidate; with
    `compare.candidate_test` the candidate policies are kept for testing.
    console: `progress` and `echo` of `search`.
    """
    names = domain.primitive_names
    inner_train, validation = split_train(domain.train, int(cfg.outer.split_seed))
    strategy = make_strategy(
        method, cfg, meta_grammar(cfg, len(names)), names, outcome_index=domain.outcome_index,
        optimizer_factory=optimizer_factory, mesh=meta_optimizer_mesh(evaluator), workdir=os.fspath(workdir),
    )
    return search(
        strategy, evaluator, inner_train, validation, names, cfg, workdir, run_keys(seed)["search"],
        init_params=base_params, outcome_index=domain.outcome_index, **console,
        inner_steps=population_inner_steps(cfg) if strategy.population else None,
        iterations=population_iterations(cfg) if strategy.population else None,
        keep_candidate_policies=_flag(cfg, "compare.candidate_test"),
    )


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
    cls = get_strategy(method)
    keep_dir = workdir if _flag(cfg, "compare.keep_final_policies") and jax.process_count() == 1 else None

    per_iteration, budget, evolved_tests, evolved_items, note = None, {}, None, None, ""
    if cls.searches:
        found = search_method(
            method, cfg, domain, evaluator, workdir, seed, base_params=base_params,
            optimizer_factory=optimizer_factory, progress=progress, echo=echo,
        )
        expression, validation_score = found.best_text, found.best_score
        budget = {**found.budget, **inner_step_totals(cfg, found.budget, population=cls.population)}
        per_iteration = per_iteration_summary(found.history)
        if cls.population and found.incumbent_params is not None:
            evolved_tests, evolved_items = test_accuracies(domain, evaluator, found.incumbent_params)
        per_iteration["candidate_test_mean"] = (
            candidate_test_means(workdir, found.history, evaluator, domain.test, base_params)
            if _flag(cfg, "compare.candidate_test") else None
        )
    else:
        strategy = make_strategy(method, cfg, None, names, outcome_index=domain.outcome_index)
        inner_train, validation = split_train(domain.train, int(cfg.outer.split_seed))
        expression = strategy.text
        validation_score = fixed_validation_score(
            expression, domain, evaluator, keys["fixed_validation"], base_params, inner_train, validation, keep_dir
        )

    if expression is None:
        note = "no valid expression was found; the base policy's test accuracy is reported"
        retrained_tests, retrained_items = test_accuracies(domain, evaluator, base_params)
        result_canonical, retrained, curves = None, headline_accuracy(retrained_tests), {}
    else:
        final = train_final(expression, domain, evaluator, keys["final"], base_params, keep_dir,
                            steps=_final_steps_if_other(cfg, cls.searches))
        result_canonical, retrained, curves = final.canonical, final.test, final.curves
        retrained_tests, retrained_items = final.test_sets, final.test_items
    final_tests, reevaluated = _repeats_and_reevaluation(cfg, cls, domain, evaluator, keys, base_params, expression,
                                                         retrained, found.history if cls.searches else None)
    if cls.searches and not cls.population and reevaluate.top_k(cfg):   # charged even when nothing was re-trained
        budget = reevaluate.charge(budget, reevaluate.top_k(cfg))
    evolved_test = headline_accuracy(evolved_tests) if evolved_tests is not None else None
    if per_iteration is not None:
        per_iteration["test_of_best"] = (
            _iteration_tests(per_iteration["best_text"], domain, evaluator, keys["final"], base_params)
            if expression is not None and bool(cfg.compare.per_iteration_test) else None
        )

    result = MethodResult(
        method=method,
        seed=int(seed),
        expression=expression,
        canonical=result_canonical,
        latex=_latex_of(expression, names),
        validation=float(validation_score),
        test=evolved_test if evolved_test is not None else retrained,
        budget=budget,
        per_iteration=per_iteration,
        final_curves=curves,
        retrained_test=retrained,
        evolved_policy_test=evolved_test,
        test_sets=evolved_tests if evolved_tests is not None else retrained_tests,
        retrained_test_sets=retrained_tests,
        headline=HEADLINE_EVOLVED if evolved_test is not None else HEADLINE_RETRAINED,
        note=note,
        test_items=evolved_items if evolved_test is not None else retrained_items,
        final_repeat_tests=final_tests,
        reevaluated=reevaluated,
    )
    atomic_write_json(saved, result.to_json())
    return result


def _repeats_and_reevaluation(cfg, cls, domain, evaluator, keys, base_params, expression, first_test, history):
    """(the r-key final tests of `expression`, the re-evaluated protocol's choice or None):
    `derl_jax.experiment.reevaluate`; (None, None) without an expression."""
    if expression is None:
        return None, None
    steps = _final_steps_if_other(cfg, cls.searches)
    train = lambda text, key: train_final(text, domain, evaluator, key, base_params, steps=steps).test  # noqa: E731
    repeats = reevaluate.final_repeats(cfg)
    tests = reevaluate.repeated_tests(train, expression, first_test, keys["final"], repeats)
    if history is None or cls.population or not reevaluate.top_k(cfg):
        return tests, None
    programs_of = lambda texts: stack_programs(  # noqa: E731
        [compile_checked(t, domain.primitive_names, domain.outcome_index)[1] for t in texts])
    inner_train, validation = split_train(domain.train, int(cfg.outer.split_seed))
    return tests, reevaluate.reevaluated_choice(history, reevaluate.top_k(cfg), train, programs_of, evaluator,
                                                keys["search"], keys["final"], repeats, base_params, inner_train,
                                                validation, (expression, tests))


def _final_steps_if_other(cfg: Any, searches: bool) -> int | None:
    """The final policy's inner steps (`budget.final_steps`) when they are not `final.steps`, else None."""
    steps = final_steps(cfg, searches)
    return None if steps == int(cfg.final.steps) else steps


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


def candidate_test_means(
    workdir: str, history: Sequence[Mapping[str, Any]], evaluator: CandidateEvaluator, test_set: TokenDataset,
    policy_template: Any,
) -> list[float]:
    """Per iteration, the mean test accuracy of its n candidate policies (invalid ones 0).

    Reads the policies the finished search kept (`derl_jax.outer.candidate_policies`); each
    distinct policy is tested once. Finished iterations are saved in `candidate_tests.json`
    so an interrupted run does not test them again.
    """
    path = os.path.join(workdir, CANDIDATE_TESTS_FILE)
    done: dict[str, list[float]] = {}
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            done = json.load(handle)
    means = []
    for iteration in sorted({int(r["iteration"]) for r in history}):
        if str(iteration) not in done:
            if not os.path.exists(candidate_policies.policy_path(workdir, iteration)):
                raise FileNotFoundError(
                    f"{candidate_policies.policy_path(workdir, iteration)} is missing: the candidate policies of iteration "
                    f"{iteration} were not kept (set config.compare.candidate_test=True before the search runs)"
                )
            policies, rows = candidate_policies.load_iteration(workdir, iteration, policy_template)
            accuracy = {int(k): float(evaluator.accuracy(select(policies, int(k)), test_set)) for k in set(rows.tolist()) if k >= 0}
            done[str(iteration)] = [accuracy[int(k)] if k >= 0 else 0.0 for k in rows]
            atomic_write_json(path, done)
        means.append(float(np.mean(done[str(iteration)])))
    return means


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
    claim: Callable[[str, int], bool] | None = None,
) -> dict | None:
    """Every method x seed (`config.compare.methods` / `.seeds` unless given), then the report.

    Writes `<workdir>/<method>/seed_<s>/` run directories and the report
    (`derl_jax.experiment.report.write_report`); returns the results.json content.
    claim: `(method, seed) -> bool` when several processes share the runs
    (`derl_jax.experiment.workers.Claims.claim`): only the runs claimed are run, and no report is
    written (None is returned); the lead process calls `compare` again without `claim` once
    they all finished, which reads them back and writes the report.
    """
    workdir = os.fspath(workdir)
    methods = tuple(methods if methods is not None else cfg.compare.methods)
    seeds = tuple(int(s) for s in (seeds if seeds is not None else cfg.compare.seeds))
    if not methods or not seeds:
        raise ValueError(f"compare: need at least one method and one seed, got methods={methods}, seeds={seeds}")
    os.makedirs(workdir, exist_ok=True)
    RunLogger(workdir, tensorboard=False).write_config(cfg)
    base_test = base_policy_test(workdir, domain, evaluator, base_params)
    results: dict[str, list[MethodResult]] = {method: [] for method in methods}
    for method in methods:
        for seed in seeds:
            if claim is None or claim(method, seed):
                results[method].append(run_method(
                    method, cfg, domain, evaluator, method_dir(workdir, method, seed), seed,
                    base_params=base_params, optimizer_factory=optimizer_factory, progress=progress,
                    echo=echo or _console(f"[{method} seed {seed}]"),
                ))
    if claim is not None:
        return None
    histories = {m: {s: read_jsonl(os.path.join(method_dir(workdir, m, s), HISTORY_FILE)) for s in seeds}
                 for m in methods if get_strategy(m).searches}
    searched = {m: [best_so_far(history[s]) for s in seeds] for m, history in histories.items()}
    return write_report(workdir, results, base_test=base_test, best_so_far=searched,
                        aligned=getattr(domain, "aligned_indices", ()), histories=histories,
                        classify=reward_classifier(domain),
                        structure_of=functools.partial(claims.structure_with_aligned, names=domain.primitive_names,
                                                       outcome_index=domain.outcome_index,
                                                       aligned=getattr(domain, "aligned_indices", ())))


def base_policy_test(workdir: str, domain: TokenDomain, evaluator: CandidateEvaluator, base_params: Any) -> float:
    """The base policy's headline test accuracy (before any RL), kept in `workdir/base_policy_test.json`."""
    path = os.path.join(workdir, BASE_TEST_FILE)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            return float(json.load(handle)["test"])
    tests, items = test_accuracies(domain, evaluator, base_params)
    atomic_write_json(path, {"test": headline_accuracy(tests), "test_sets": tests, "test_items": items})
    return headline_accuracy(tests)


def _console(prefix: str) -> Callable[[str], None]:
    """Print search summary lines with `prefix`, without breaking progress bars."""
    from tqdm.auto import tqdm

    return lambda line: tqdm.write(f"{prefix} {line}", file=sys.stdout)


def method_dir(workdir: str | os.PathLike, method: str, seed: int) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in method)
    return os.path.join(os.fspath(workdir), safe, f"seed_{int(seed)}")
