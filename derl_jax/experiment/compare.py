"""A compare: every method x seed of `config.compare`, at one level or at each of several, its
runs shared out over worker processes (`derl_jax.experiment.workers`).

`compare_run` writes results.md / results.json / plots in its workdir (`protocol.compare`);
`compare_per_level` runs the whole compare at each level of `config.compare.levels` in
`<workdir>/<level>`, then `results_levels.md` (methods x levels, the paper's Table 1(a)).
"""

from __future__ import annotations

import copy
import multiprocessing
import os
import sys
from typing import Any, Callable, Sequence

from absl import logging

from derl_jax.config import config_value, has_field
from derl_jax.experiment import build, levels as shared, protocol, report
from derl_jax.experiment.checks import at_level
from derl_jax.experiment.protocol import method_dir
from derl_jax.experiment.runtime import run_cores
from derl_jax.experiment.workers import Claims, resolve_workers
from derl_jax.outer.strategy import OptimizerFactory


def compare_run(cfg: Any, workdir: str, domain: Any, base_params: Any, evaluator: Any, *, progress: bool = True,
                optimizer_factory: OptimizerFactory | None = None) -> dict:
    """The compare in `workdir` (in this process and `compare_workers(cfg) - 1` more); prints and
    returns the report."""
    workers = compare_workers(cfg)
    if workers > 1:
        run_compare_in_workers(cfg, workdir, domain, base_params, evaluator, workers, progress, optimizer_factory)
    seed_base = own_base_policies(cfg, domain, evaluator, workdir, base_params)
    if seed_base is not None:   # every run not yet done, each on its seed's base policy; the pass below reads them
        protocol.base_policy_test(workdir, domain, evaluator, base_params)
        compare_seedwise(cfg, domain, evaluator, workdir, seed_base, claim=lambda method, seed: True,
                         optimizer_factory=optimizer_factory, progress=progress)
    payload = protocol.compare(cfg, domain, evaluator, workdir, base_params=base_params,
                               optimizer_factory=optimizer_factory, progress=progress)
    with open(os.path.join(workdir, protocol.RESULTS_MD), encoding="utf-8") as handle:
        print(handle.read())
    return payload


def compare_per_level(cfg: Any, workdir: str, levels: Sequence[str], *, progress: bool = True,
                      optimizer_factory: OptimizerFactory | None = None) -> dict:
    """The whole compare at each level in `<workdir>/<level>` (its own domain, base policy and
    report), then `results_levels.md` in the workdir.

    Every level but the last keeps its final policies (`compare.keep_final_policies`), so a later
    level with the same training split tests them instead of training them again."""
    payloads, digests = {}, {}
    for done, level in enumerate(levels):
        level_cfg = at_level(cfg, level)
        if done < len(levels) - 1:
            with level_cfg.unlocked():
                level_cfg.compare.keep_final_policies = True
        level_dir = os.path.join(workdir, level)
        shared.share_base_policies([os.path.join(workdir, earlier) for earlier in levels[:done]], level_dir)
        domain = build.build_domain(level_cfg)
        digests[level] = shared.training_digest(domain.train)
        same_split = [earlier for earlier in levels[:done] if digests[earlier] == digests[level]]
        if same_split:   # the same training split: the same searches and trainings; only the tests differ
            runs = [os.path.relpath(method_dir(level_dir, m, s), level_dir) for m in level_cfg.compare.methods
                    for s in level_cfg.compare.seeds]
            copied = shared.share_trainings(os.path.join(workdir, same_split[0]), level_dir, runs)
            if copied:
                print(f"--- level {level}: {len(copied)} trainings shared with level {same_split[0]} (same training split)")
        base_params, evaluator = build.build_inner(domain, level_cfg, level_dir, run_cores("compare"))
        print(f"--- level {level}: {level_dir}")
        payloads[level] = compare_run(level_cfg, level_dir, domain, base_params, evaluator, progress=progress,
                                      optimizer_factory=optimizer_factory)
    print(report.write_levels_report(workdir, payloads))
    return payloads


def compare_workers(cfg: Any) -> int:
    """Processes for the compare's method x seed runs (`config.compare.workers`, 0: one per core)."""
    return resolve_workers(cfg, jobs=len(cfg.compare.methods) * len(cfg.compare.seeds))


def run_compare_in_workers(cfg: Any, workdir: str, domain: Any, base_params: Any, evaluator: Any, workers: int,
                           progress: bool, optimizer_factory: OptimizerFactory | None = None) -> None:
    """The compare's runs shared out over this process and `workers - 1` more.

    The base policy (cached in `workdir`) and its test are built here first, so the other
    processes load them; a process that fails leaves its runs to the caller's read-back pass.
    The other processes use the methods' own Meta-Optimizers (`optimizer_factory` is this
    process's alone).
    """
    protocol.base_policy_test(workdir, domain, evaluator, base_params)
    claims = Claims.fresh(workdir)
    context = multiprocessing.get_context("spawn")  # JAX's threads make fork unsafe
    processes = [context.Process(target=compare_worker, args=(cfg, workdir, claims.token), name=f"compare worker {i}")
                 for i in range(1, workers)]
    print(f"--- {len(processes) + 1} processes share the runs of {workdir}")
    for process in processes:
        process.start()
    try:
        seed_base = own_base_policies(cfg, domain, evaluator, workdir, base_params)
        if seed_base is not None:
            compare_seedwise(cfg, domain, evaluator, workdir, seed_base, claim=claims.claim,
                             optimizer_factory=optimizer_factory, progress=progress)
        else:
            protocol.compare(cfg, domain, evaluator, workdir, base_params=base_params,
                             optimizer_factory=optimizer_factory, progress=progress, claim=claims.claim)
    finally:
        for process in processes:
            process.join()
    failed = [process.name for process in processes if process.exitcode != 0]
    if failed:
        print(f"warning: {', '.join(failed)} stopped early; their unfinished runs continue here", file=sys.stderr)


def _stop_with_parent() -> None:
    """End this process when the lead process ends, however it ends (Linux; elsewhere a worker
    finishes the run it holds): a restarted compare must not meet an orphan in its runs."""
    import ctypes
    import signal

    parent = multiprocessing.parent_process().pid
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:   # the lead process ended before the signal was armed
        os._exit(1)


def compare_worker(cfg: Any, workdir: str, token: str) -> None:
    """One extra process of `run_compare_in_workers`: the same domain and base policy, the runs it claims."""
    _stop_with_parent()
    logging.set_verbosity(logging.WARNING)
    domain = build.build_domain(cfg)
    base_params, evaluator = build.build_inner(domain, cfg, workdir, run_cores("compare"))
    seed_base = own_base_policies(cfg, domain, evaluator, workdir, base_params)
    if seed_base is not None:
        compare_seedwise(cfg, domain, evaluator, workdir, seed_base, claim=Claims(workdir, token).claim, progress=False)
        return
    protocol.compare(cfg, domain, evaluator, workdir, base_params=base_params, progress=False,
                     claim=Claims(workdir, token).claim)


def own_base_policies(cfg: Any, domain: Any, evaluator: Any, workdir: str, base_params: Any
                      ) -> Callable[[int], Any] | None:
    """`seed -> base params` when `config.compare.own_base_policy` is set (for a cheap warm start:
    each seed warm-starts its own base policy with `config.seed = seed`, cached in
    `<workdir>/base_policy/`, its banded property checked and recorded there), else None (every
    seed shares `base_params`, the base policy of `config.seed`)."""
    if not (has_field(cfg, "compare.own_base_policy") and bool(config_value(cfg, "compare.own_base_policy"))):
        return None
    from derl_jax.rl.setup import base_policy

    built = {int(cfg.seed): base_params}

    def base_of(seed: int) -> Any:
        if int(seed) not in built:
            seed_cfg = copy.deepcopy(cfg)
            with seed_cfg.unlocked():
                seed_cfg.seed = int(seed)
            params = base_policy(domain, seed_cfg, workdir)[1]
            built[int(seed)] = evaluator.place(params) if domain.rollout == "host" else params
        return built[int(seed)]

    return base_of


def compare_seedwise(cfg: Any, domain: Any, evaluator: Any, workdir: str, seed_base: Callable[[int], Any], *,
                     claim: Callable[[str, int], bool], optimizer_factory: OptimizerFactory | None = None,
                     progress: bool = True) -> None:
    """The compare's runs that `claim` grants, each on its seed's base policy `seed_base(seed)`
    (built only for a claimed run not yet done); no report."""
    for method in cfg.compare.methods:
        for seed in (int(s) for s in cfg.compare.seeds):
            done = os.path.exists(os.path.join(method_dir(workdir, method, seed), protocol.METHOD_RESULT_FILE))
            if claim(method, seed) and not done:
                protocol.compare(cfg, domain, evaluator, workdir, base_params=seed_base(seed), methods=(method,),
                                 seeds=(seed,), optimizer_factory=optimizer_factory, progress=progress,
                                 claim=lambda m, s: True)
