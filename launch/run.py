"""Command-line entry point: search, final training, or the full comparison.

    python launch/run.py --config=configs/arith.py:smoke --mode=compare
    python launch/run.py --config=configs/arith.py --mode=search --config.outer.strategy=derl_pop
    python launch/run.py --config=configs/arith.py --mode=final --workdir=runs/arith
    python launch/run.py --config=configs/arith.py --mode=final --expression="g1+0.5*g2"

Modes:
  search   the outer loop of `config.outer.strategy` in --workdir (resumes if interrupted)
  final    trains a fresh policy on the full training set with --expression, or with the best
           expression of the finished search in --workdir, and reports its test accuracy
  compare  every method of `config.compare.methods` x `config.compare.seeds`, then
           results.md / results.json / plots in --workdir (finished parts are skipped)

--workdir defaults to runs/<config.name>. Library log lines below WARNING are hidden unless
--verbosity is given (e.g. --verbosity=0 for INFO). Every config field can be overridden
(`--config.outer.iterations=3`).

Everything the user gives is checked before any model is built: the flags, the config
(`derl_jax.config.validate`: shared blocks and the domain's fields;
`derl_jax.meta.strategies.validate_config`: the outer loop and each strategy's fields), the
reward expression, and the run directory (created, write-probed, then locked for the run's
lifetime: a second run on it stops at once naming the first). A bad input prints one line
`error: ...` on stderr naming the flag, field or file and exits with status 2 (--debug adds
the traceback); internal errors keep their tracebacks.

What is built, in order: the domain (`derl_jax.domains.registry.get_domain(config.domain.kind)
.build(config)`), then the base policy and the inner-loop evaluator
(`derl_jax.rl.setup.build_inner(domain, config, workdir)`), then the strategies
(`derl_jax.meta.strategies.make_strategy`, whose Meta-Optimizer is
`derl_jax.meta.optimizer.MetaOptimizer(cfg, grammar)`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import traceback
from typing import Any, Mapping, NoReturn, Sequence

from absl import app, flags, logging
from ml_collections import config_flags

from derl_jax import config as config_checks
from derl_jax import workdir as run_dir
from derl_jax.config import ConfigError, InputError
from derl_jax.domains.registry import get_domain
from primitives import registry as primitive_registry

# The outer loop (protocol, search, strategies) and JAX are imported where they are first used,
# so that a mistyped flag is reported without waiting for them.

MODES = ("search", "final", "compare", "plan")
COMPILE_CACHE_DIR = "compile_cache"
COMPILE_CACHE_ENV = "JAX_COMPILATION_CACHE_DIR"
MIN_COMPILE_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
EXIT_USER_ERROR = 2
SCRIPT = "launch/run.py"
HELP_FLAGS = ("-?", "-h", "--help", "-help", "--helpshort", "-helpshort", "--helpfull", "-helpfull", "--helpxml")

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file, e.g. configs/arith.py:smoke.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config.name>).")
_MODE = flags.DEFINE_enum("mode", "search", list(MODES), "What to run.")
_EXPRESSION = flags.DEFINE_string("expression", None, "final mode: the reward expression (default: the search result in --workdir).")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show progress bars (only on a terminal).")
_DEBUG = flags.DEFINE_bool("debug", False, "Show the traceback of a user error too.")
_ACCELERATOR = flags.DEFINE_list("accelerator", ["h100", "h200"], "--mode=plan: accelerators to plan for (h100, h200, "
                                 "a100, v5e, v5p, or name:peak_flops:bandwidth:memory).")
_COMPILE_CACHE = flags.DEFINE_string(
    "compile_cache", None, "Directory of XLA's persistent compilation cache, shared by the run's processes and by "
    "later runs of the same shapes (default: $JAX_COMPILATION_CACHE_DIR when set, else <workdir>/compile_cache in a "
    "single-process job; --compile_cache= turns it off).")
_PLAN_COMPILE = flags.DEFINE_bool("plan_compile", False, "--mode=plan: also compile the step's pieces on fake CPU "
                                  "devices for the compiler's memory figures (minutes for billion-parameter policies).")

# Replaceable by embedding code (and tests): the Meta-Optimizer factory handed to strategies;
# None means `derl_jax.meta.optimizer.MetaOptimizer`.
OPTIMIZER_FACTORY = None


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the checks established before anything is built."""

    mode: str
    workdir: str
    expression: str | None
    primitive_names: tuple[str, ...]


# --------------------------------------------------------------------------- checks


def validate(cfg: Any) -> None:
    """Every config check (ConfigError naming the first bad field); nothing is built."""
    from derl_jax.meta.strategies import validate_config as validate_outer_loop

    config_checks.validate(cfg)
    validate_outer_loop(cfg)
    try:
        primitive_registry.import_modules(_primitives_entry(cfg, "modules"))
    except ModuleNotFoundError as err:
        raise ConfigError(f"config.primitives.modules: no module named {err.name!r}") from None
    for name in _primitives_entry(cfg, "extra"):
        try:
            primitive_registry.get(cfg.domain.kind, name)
        except KeyError as err:
            raise ConfigError(f"config.primitives.extra: {err.args[0]}") from None


def check_policy_files(cfg: Any) -> None:
    """The local directories the policy is loaded from (`policy.checkpoint`, `policy.tokenizer`) exist."""
    for field in ("checkpoint", "tokenizer"):
        path = f"policy.{field}"
        value = str(config_checks.config_value(cfg, path)).strip() if config_checks.has_field(cfg, path) else ""
        if value and not os.path.isdir(os.path.expanduser(value)):
            raise ConfigError(f"config.{path}={value!r}: no such directory")


def _primitives_entry(cfg: Any, field: str) -> tuple[str, ...]:
    """`config.primitives.<field>` (module names or extra primitive names); () when absent."""
    path = f"primitives.{field}"
    return tuple(config_checks.config_value(cfg, path)) if config_checks.has_field(cfg, path) else ()


def primitive_names(cfg: Any) -> tuple[str, ...]:
    """The run's primitives in order (g1, g2, ...): the domain's, then `config.primitives.extra`; no data loaded."""
    return tuple(get_domain(cfg.domain.kind).primitive_names(cfg)) + _primitives_entry(cfg, "extra")


def default_workdir(cfg: Any) -> str:
    """runs/<config.name>."""
    return os.path.join("runs", str(config_checks.config_value(cfg, "name")))


def check_expression(expression: str, primitive_names: Sequence[str], outcome_index: int = 0, flag: str = "--expression") -> None:
    """InputError naming `flag` when `expression` does not parse or is not a valid reward."""
    from derl_jax.meta import protocol

    try:
        protocol.compile_checked(expression, primitive_names, outcome_index)
    except ValueError as err:
        raise InputError(f"{flag}={expression!r}: {_reason(err)}") from None


def _reason(err: ValueError) -> str:
    text = str(err)
    marker = "is not a valid reward: "
    return text.split(marker, 1)[1] if marker in text else text


def final_expression(workdir: str, expression: str | None) -> tuple[str, str]:
    """(expression, where it came from) for final mode: --expression, or the finished search's best."""
    from derl_jax.meta.search import SEARCH_RESULT_FILE, read_search_result

    if expression is not None:
        return expression, "--expression"
    if not os.path.exists(os.path.join(workdir, SEARCH_RESULT_FILE)):
        raise InputError(
            f"--mode=final needs --expression or a finished search in --workdir={workdir} (no {SEARCH_RESULT_FILE} there)"
        )
    found = read_search_result(workdir)["incumbent"]["text"]
    if found is None:
        raise InputError(f"the search in --workdir={workdir} found no valid expression; pass --expression")
    return found, f"the search result in {workdir}"


def plan(cfg: Any, workdir: str, mode: str, expression: str | None = None) -> Plan:
    """Check everything the user gave, in the order a user would fix it; InputError names the input."""
    if mode not in MODES:
        raise InputError(f"--mode must be one of {MODES}, got {mode!r}")
    if expression is not None and mode != "final":
        raise InputError(f"--expression applies to --mode=final only; --mode={mode} finds its own expressions")
    validate(cfg)
    check_policy_files(cfg)
    names = primitive_names(cfg)
    if mode == "final":
        expression, source = final_expression(workdir, expression)
        check_expression(expression, names, flag="--expression" if source == "--expression" else source)
    if mode == "compare":
        compare_levels(cfg)
    if _primary_process():  # in a multi-process job process 0 alone writes the run directory
        run_dir.check_writable(workdir)
    return Plan(mode, workdir, expression, names)


def compile_cache_dir(flag: str | None, workdir: str, environ: Mapping[str, str], process_count: int) -> str | None:
    """The run's persistent compilation cache directory, None for none: `flag` (--compile_cache)
    when given ('' for none), else the environment's JAX_COMPILATION_CACHE_DIR, else
    `<workdir>/compile_cache` when this is a single-process job (in a multi-process job only
    process 0 writes the run directory, so each host names its own cache)."""
    if flag is not None:
        return flag.strip() or None
    if environ.get(COMPILE_CACHE_ENV):
        return environ[COMPILE_CACHE_ENV]
    return os.path.join(workdir, COMPILE_CACHE_DIR) if process_count == 1 else None


def use_compile_cache(directory: str | None) -> None:
    """Point JAX's persistent compilation cache at `directory` (None: off) for this process and the
    compare workers it spawns (they inherit the environment). Every compilation is cached, however
    short: a run compiles dozens of small programs whose sum is a large share of a CPU run."""
    import jax

    if directory is None:
        os.environ.pop(COMPILE_CACHE_ENV, None)
        jax.config.update("jax_compilation_cache_dir", None)
        return
    os.environ[COMPILE_CACHE_ENV] = directory
    os.environ.setdefault(MIN_COMPILE_TIME_ENV, "0")
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(os.environ[MIN_COMPILE_TIME_ENV]))


def make_host_devices(cfg: Any, mode: str, environ: dict) -> None:
    """Before JAX starts its backend: one XLA host device per core in `environ["XLA_FLAGS"]`
    for a run that may split its steps over them (`run_cores(mode)` > 1, `config.mesh.data` 0,
    see `derl_jax.rl.placement.auto_data_size`) when no mesh axis is -1, the job is one process
    and XLA_FLAGS does not already fix the count. Harmless on accelerators, where the host
    devices go unused."""
    from derl_jax.parallel import distributed_requested, host_device_flags

    sizes = [config_checks.config_value(cfg, f"mesh.{axis}") for axis in ("cand", "data", "model")]
    if mode == "plan" or sizes[1] != 0 or -1 in sizes or distributed_requested(environ):
        return
    environ["XLA_FLAGS"] = host_device_flags(environ.get("XLA_FLAGS", ""), run_cores(mode))


def run_cores(mode: str) -> int:
    """The CPU cores one run of this process may use: all of them, or one in a compare, whose
    workers use the cores (so that its results do not depend on the worker count)."""
    from derl_jax.parallel import host_cores

    return 1 if mode == "compare" else host_cores()


def _primary_process() -> bool:
    """False on processes 1.. of a multi-process job (JAX is imported by then); True otherwise."""
    jax = sys.modules.get("jax")
    return jax is None or jax.process_index() == 0


# --------------------------------------------------------------------------- building and running


def build_domain(cfg: Any):
    """The domain named by `config.domain.kind` (data, primitives, tokenizer; no model), with the
    primitives of `config.primitives.extra` after its own."""
    try:
        domain = get_domain(cfg.domain.kind).build(cfg)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError) as err:
        raise InputError(str(err)) from err  # a data file the config names
    extra = _primitives_entry(cfg, "extra")
    if not extra:
        return domain
    return dataclasses.replace(domain, primitives=tuple(domain.primitives) + primitive_registry.resolve(domain.name, extra))


def build_inner(domain: Any, cfg: Any, workdir: str, host_cores: int | None = None):
    """(base_params, evaluator): the base policy and the one inner-loop evaluator (on a mesh
    whose automatic 'data' axis takes at most `host_cores` CPU cores)."""
    from derl_jax.rl.setup import build_inner as build

    return build(domain, cfg, workdir, host_cores=host_cores)


def plan_run(cfg: Any, accelerators: Sequence[str], compile: bool) -> dict:
    """--mode=plan: per-device memory, FLOPs and roofline step time of the configured run, and
    whether it fits (derl_jax/plan); no model is built, no run directory written."""
    validate(cfg)
    from derl_jax.plan.report import plan_from_config

    needs_domain = not (str(getattr(cfg.policy, "checkpoint", "") or "").strip()
                        and config_checks.has_field(cfg, "domain.max_prompt_tokens"))
    try:
        result = plan_from_config(cfg, accelerators, compile, domain=build_domain(cfg) if needs_domain else None)
    except (ValueError, OSError) as err:  # an unknown accelerator, a checkpoint without config.json
        raise InputError(str(err)) from err
    print(result["table"])
    return result


def run(cfg: Any, workdir: str, mode: str, expression: str | None = None, *, progress: bool = True,
        accelerators: Sequence[str] = ("h100", "h200"), plan_compile: bool = False) -> Any:
    """Check the inputs, lock `workdir`, build the domain and the inner loop, run `mode`; returns its result."""
    import jax  # noqa: F401  (before the checks: which process this is decides who writes and locks)

    if mode == "plan":
        return plan_run(cfg, accelerators, plan_compile)

    checked = plan(cfg, workdir, mode, expression)
    levels = compare_levels(cfg) if mode == "compare" else ()
    lock = run_dir.exclusive(workdir) if _primary_process() else contextlib.nullcontext()  # one lock per run
    with lock:
        if levels:
            return compare_per_level(cfg, checked, levels, progress)
        domain = build_domain(cfg)
        if checked.expression is not None:
            check_expression(checked.expression, domain.primitive_names, domain.outcome_index)
        base_params, evaluator = build_inner(domain, cfg, workdir, run_cores(mode))
        return _run_mode(cfg, checked, domain, base_params, evaluator, progress)


def at_level(cfg: Any, level: str) -> Any:
    """A copy of `cfg` at generalisation level `level`."""
    copy = cfg.copy_and_resolve_references()
    with copy.unlocked():
        copy.domain.level = level
    return copy


def compare_levels(cfg: Any) -> tuple[str, ...]:
    """`config.compare.levels`, each checked like the domain's own `domain.level` (before anything is built)."""
    from derl_jax.meta.strategies.validation import compare_levels as levels_of

    levels = levels_of(cfg)
    for level in levels:
        try:
            config_checks.validate(at_level(cfg, level))
        except ConfigError as err:
            raise ConfigError(f"config.compare.levels: level {level!r}: {err}") from None
    return levels


def compare_per_level(cfg: Any, checked: Plan, levels: Sequence[str], progress: bool) -> dict:
    """The whole compare at each level in `<workdir>/<level>` (its own domain, base policy and
    report), then `results_levels.md` in the workdir: methods x levels (the paper's Table 1(a)).

    Every level but the last keeps its final policies (`compare.keep_final_policies`), so a later
    level with the same training split tests them instead of training them again."""
    from derl_jax.meta import levels as shared
    from derl_jax.meta import report
    from derl_jax.meta.protocol import method_dir

    payloads, digests = {}, {}
    for done, level in enumerate(levels):
        level_cfg = at_level(cfg, level)
        if done < len(levels) - 1:
            with level_cfg.unlocked():
                level_cfg.compare.keep_final_policies = True
        level_dir = os.path.join(checked.workdir, level)
        shared.share_base_policies([os.path.join(checked.workdir, earlier) for earlier in levels[:done]], level_dir)
        domain = build_domain(level_cfg)
        digests[level] = shared.training_digest(domain.train)
        same_split = [earlier for earlier in levels[:done] if digests[earlier] == digests[level]]
        if same_split:   # the same training split: the same searches and trainings; only the tests differ
            runs = [os.path.relpath(method_dir(level_dir, m, s), level_dir) for m in level_cfg.compare.methods
                    for s in level_cfg.compare.seeds]
            copied = shared.share_trainings(os.path.join(checked.workdir, same_split[0]), level_dir, runs)
            if copied:
                print(f"--- level {level}: {len(copied)} trainings shared with level {same_split[0]} (same training split)")
        base_params, evaluator = build_inner(domain, level_cfg, level_dir, run_cores("compare"))
        print(f"--- level {level}: {level_dir}")
        payloads[level] = _run_mode(level_cfg, dataclasses.replace(checked, workdir=level_dir), domain, base_params,
                                    evaluator, progress)
    print(report.write_levels_report(checked.workdir, payloads))
    return payloads


def _run_mode(cfg: Any, checked: Plan, domain: Any, base_params: Any, evaluator: Any, progress: bool) -> Any:
    from derl_jax.meta import protocol

    workdir = checked.workdir
    if checked.mode == "search":
        result = protocol.search_method(
            cfg.outer.strategy, cfg, domain, evaluator, workdir, int(cfg.seed),
            base_params=base_params, optimizer_factory=OPTIMIZER_FACTORY, progress=progress,
        )
        print(f"search finished: best {result.best_text!r} (validation {result.best_score:.4f}); results in {workdir}")
        return result
    if checked.mode == "final":
        final = protocol.run_final(checked.expression, domain, evaluator, workdir, int(cfg.seed), base_params=base_params)
        print(f"final policy for {final.expression!r}: test accuracy {final.test:.4f}; written to {workdir}/{protocol.FINAL_RESULT_FILE}")
        return final
    workers = compare_workers(cfg)
    if workers > 1:
        run_compare_in_workers(cfg, workdir, domain, base_params, evaluator, workers, progress)
    payload = protocol.compare(
        cfg, domain, evaluator, workdir, base_params=base_params, optimizer_factory=OPTIMIZER_FACTORY, progress=progress,
    )
    with open(os.path.join(workdir, protocol.RESULTS_MD), encoding="utf-8") as handle:
        print(handle.read())
    return payload


def compare_workers(cfg: Any) -> int:
    """Processes for the compare's method x seed runs (`config.compare.workers`, 0: one per core)."""
    from derl_jax.meta.workers import resolve_workers

    return resolve_workers(cfg, jobs=len(cfg.compare.methods) * len(cfg.compare.seeds))


def run_compare_in_workers(cfg: Any, workdir: str, domain: Any, base_params: Any, evaluator: Any, workers: int,
                           progress: bool) -> None:
    """The compare's runs shared out over this process and `workers - 1` more (derl_jax/meta/workers.py).

    The base policy (cached in `workdir`) and its test are built here first, so the other
    processes load them; a process that fails leaves its runs to the caller's read-back pass.
    """
    import multiprocessing

    from derl_jax.meta import protocol
    from derl_jax.meta.workers import Claims

    protocol.base_policy_test(workdir, domain, evaluator, base_params)
    claims = Claims.fresh(workdir)
    context = multiprocessing.get_context("spawn")  # JAX's threads make fork unsafe
    processes = [context.Process(target=compare_worker, args=(cfg, workdir, claims.token), name=f"compare worker {i}")
                 for i in range(1, workers)]
    print(f"--- {len(processes) + 1} processes share the runs of {workdir}")
    for process in processes:
        process.start()
    try:
        protocol.compare(cfg, domain, evaluator, workdir, base_params=base_params, optimizer_factory=OPTIMIZER_FACTORY,
                         progress=progress, claim=claims.claim)
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
    import multiprocessing
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
    from derl_jax.meta import protocol
    from derl_jax.meta.workers import Claims

    _stop_with_parent()
    logging.set_verbosity(logging.WARNING)
    domain = build_domain(cfg)
    base_params, evaluator = build_inner(domain, cfg, workdir, run_cores("compare"))
    protocol.compare(cfg, domain, evaluator, workdir, base_params=base_params, optimizer_factory=OPTIMIZER_FACTORY,
                     progress=False, claim=Claims(workdir, token).claim)


# --------------------------------------------------------------------------- the command line


def user_error(message: str, *, debug: bool = False) -> NoReturn:
    """Print `error: message` (after the traceback when `debug`) and exit with status 2."""
    if debug and sys.exc_info()[0] is not None:
        traceback.print_exc()
    first_line = message.strip().splitlines()[0] if message.strip() else "invalid input"
    print(f"{SCRIPT}: error: {first_line}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing with each failure turned into one line naming the flag."""
    if any(arg.split("=", 1)[0] in HELP_FLAGS for arg in argv[1:]):
        return flags.FLAGS(argv)  # absl prints the help and exits
    debug = any(arg in ("--debug", "-debug") for arg in argv)
    config_arg = _config_argument(argv)
    if config_arg is None:
        user_error("--config is required, e.g. --config=configs/arith.py:smoke")
    config_path = config_arg.split(":", 1)[0]
    if not os.path.isfile(config_path):
        user_error(f"--config={config_arg}: no such config file {config_path!r}")
    try:
        remaining = flags.FLAGS(argv)
        _CONFIG.value  # noqa: B018  (loads the config file when loading is lazy)
    except flags.Error as err:
        user_error(_flag_error(str(err), config_arg), debug=debug)
    except (AttributeError, KeyError) as err:
        user_error(_override_error(argv, err), debug=debug)
    except Exception as err:  # the config file itself raised
        user_error(f"--config={config_arg}: {type(err).__name__}: {err}", debug=debug)
    return remaining


def _config_argument(argv: Sequence[str]) -> str | None:
    for index, arg in enumerate(argv[1:], start=1):
        if arg.startswith(("--config=", "-config=")):
            return arg.split("=", 1)[1]
        if arg in ("--config", "-config") and index + 1 < len(argv):
            return argv[index + 1]
    return None


def _flag_error(text: str, config_arg: str) -> str:
    """The useful line of an absl flag error (a config file's error is its traceback's last line)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if "Traceback (most recent call last)" in text:
        return f"--config={config_arg}: {lines[-1].strip()}"
    if "must have a value other than None" in text:
        return "--config is required, e.g. --config=configs/arith.py:smoke"
    return lines[0].removeprefix("flag ")


def _override_error(argv: Sequence[str], err: BaseException) -> str:
    """`--config.a.b=...` naming a field the config does not have."""
    names = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", str(err.args[0]) if err.args else "")
    missing = names[0] if names else ""
    for arg in argv[1:]:
        flag = arg.split("=", 1)[0].lstrip("-")
        if flag.startswith("config.") and missing in flag.split(".")[1:]:
            parent = flag.rsplit(".", 1)[0]
            return f"--{flag}: {parent} has no field {missing!r}"
    return f"a --config.* override names a field the config does not have ({missing!r})"


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        user_error(f"unexpected arguments {argv[1:]}; flags take the form --name=value")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # library INFO lines (checkpointing) would drown the summaries
    from derl_jax.parallel import maybe_initialize_distributed

    cfg = _CONFIG.value
    make_host_devices(cfg, _MODE.value, os.environ)
    maybe_initialize_distributed()
    try:
        workdir = _WORKDIR.value or default_workdir(cfg)
        if _MODE.value != "plan":
            import jax

            use_compile_cache(compile_cache_dir(_COMPILE_CACHE.value, workdir, os.environ, jax.process_count()))
        run(cfg, workdir, _MODE.value, _EXPRESSION.value, progress=_PROGRESS.value and sys.stderr.isatty(),
            accelerators=_ACCELERATOR.value, plan_compile=_PLAN_COMPILE.value)
    except InputError as err:
        user_error(str(err), debug=_DEBUG.value)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
