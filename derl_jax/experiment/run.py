"""One run, as the command line or a notebook starts it: check everything, then search, final or compare.

    from derl_jax.experiment.run import run
    run(cfg, "runs/arith", "compare")            # what `launch/run.py --mode=compare` does

Modes:
  search   the outer loop of `config.outer.strategy` in the workdir (resumes if interrupted)
  final    trains a fresh policy on the full training set with `expression`, or with the best
           expression of the finished search in the workdir, and reports its test accuracy
  compare  every method of `config.compare.methods` x `config.compare.seeds`, then
           results.md / results.json / plots in the workdir (finished parts are skipped)
  plan     per-device memory, FLOPs and roofline step time of the configured run; nothing built
  export   the kept final policies under the workdir (or --policy=FILE.npz) as Hugging Face
           directories beside them (`derl_jax.experiment.export`); nothing trained

Everything the user gives is checked before any model is built (`check_inputs`): the config
(`derl_jax.experiment.checks.validate_config`: every block, each by the package that owns
it), the policy's local files, the reward expression, and the run directory (created,
write-probed, then locked for the run's lifetime: a second run on it stops at once naming the
first). A bad input raises `InputError` naming the field, flag or file.

What is built, in order: the domain (`build.build_domain`), then the base policy and the
inner-loop evaluator (`build.build_inner`), then the methods (`derl_jax.outer.make_strategy`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import time
from typing import Any, Mapping, Sequence

from derl_jax import workdir as run_dir
from derl_jax.config import ConfigError, InputError, config_value, has_field
from derl_jax.experiment import build, compare, protocol
from derl_jax.experiment.checks import check_devices, check_mesh_rows, checked_levels, validate_config
from derl_jax.experiment.runtime import (compile_cache_dir, make_host_devices, memory_note, platform_devices,
                                         primary_process, record_run, run_cores, run_info, use_compile_cache)
from derl_jax.outer.search import SEARCH_RESULT_FILE, read_search_result
from derl_jax.outer.strategy import OptimizerFactory
from primitives import registry as primitive_registry

MODES = ("search", "final", "compare", "plan", "export")
DEFAULT_ACCELERATORS = ("h100", "h200")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the checks established before anything is built."""

    mode: str
    workdir: str
    expression: str | None
    primitive_names: tuple[str, ...]


# --------------------------------------------------------------------------- checks


def check_policy_files(cfg: Any) -> None:
    """The local directories the policy is loaded from (`policy.checkpoint`, `policy.tokenizer`) exist,
    and the checkpoint's config.json describes a model we run (Qwen2 / Qwen3, no RoPE scaling or
    sliding window: `hf.config_from_hf`) with its weight files present; nothing is loaded."""
    for field in ("checkpoint", "tokenizer"):
        path = f"policy.{field}"
        value = str(config_value(cfg, path)).strip() if has_field(cfg, path) else ""
        if value and not os.path.isdir(os.path.expanduser(value)):
            raise ConfigError(f"config.{path}={value!r}: no such directory")
    checkpoint = str(config_value(cfg, "policy.checkpoint")).strip() if has_field(cfg, "policy.checkpoint") else ""
    if checkpoint:
        from derl_jax.models import hf

        where = f"config.policy.checkpoint={checkpoint!r}"
        try:
            directory = os.path.expanduser(checkpoint)
            hf.config_from_hf(hf.read_hf_config(directory), where=where)
            hf.weight_files(directory)
        except (OSError, ValueError) as err:
            message = str(err).strip().splitlines()[0]
            raise ConfigError(message if message.startswith(where) else f"{where}: {message}") from None


def default_workdir(cfg: Any) -> str:
    """runs/<config.name>."""
    return os.path.join("runs", str(config_value(cfg, "name")))


def check_expression(expression: str, primitive_names: Sequence[str], outcome_index: int = 0,
                     flag: str = "--expression", domain: str | None = None) -> str:
    """`expression` in the run's primitive names: with `domain` (its kind) the primitives' aliases
    are replaced by their names (`outcome+format` -> `correct+boxed` in arith). InputError naming
    `flag` when it does not parse or is not a valid reward; an unknown name that is a registered
    primitive of `domain` left out of the run says how to add it (`config.primitives.extra`)."""
    text = expression if domain is None else primitive_registry.with_names(expression, domain, primitive_names)
    try:
        protocol.compile_checked(text, primitive_names, outcome_index)
    except ValueError as err:
        message = str(err) if text == expression else _parse_error(expression, domain, primitive_names) or str(err)
        marker = "is not a valid reward: "
        reason = message.split(marker, 1)[1] if marker in message else message
        unknown = re.search(r"unknown name '([^']+)'", reason)
        hint = primitive_registry.missing_hint(domain, primitive_names, unknown.group(1)) if unknown and domain else ""
        raise InputError(f"{flag}={expression!r}: {reason}{hint}") from None
    return text


def _parse_error(expression: str, domain: str, primitive_names: Sequence[str]) -> str | None:
    """The parser's message for `expression` as written (aliases and all: its positions are the
    user's), None when it parses."""
    from derl_jax.expr.parse import ExpressionError, parse

    try:
        parse(expression, primitive_registry.expression_symbols(domain, primitive_names))
    except ExpressionError as err:
        return f"parse error at {err.position}: {err.reason}"
    return None


def final_expression(workdir: str, expression: str | None) -> tuple[str, str]:
    """(expression, where it came from) for final mode: `expression`, or the finished search's best."""
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


def check_inputs(cfg: Any, workdir: str, mode: str, expression: str | None = None) -> Plan:
    """Check everything the user gave, in the order a user would fix it; InputError names the input."""
    if mode not in MODES:
        raise InputError(f"--mode must be one of {MODES}, got {mode!r}")
    if expression is not None and mode != "final":
        raise InputError(f"--expression applies to --mode=final only; --mode={mode} finds its own expressions")
    validate_config(cfg)
    check_devices(cfg)
    check_policy_files(cfg)
    names = build.primitive_names(cfg)
    if mode == "final":
        expression, source = final_expression(workdir, expression)
        expression = check_expression(expression, names, flag="--expression" if source == "--expression" else source,
                                      domain=str(config_value(cfg, "domain.kind")))
    if mode == "compare":
        checked_levels(cfg)
    if primary_process():  # in a multi-process job process 0 alone writes the run directory
        run_dir.check_writable(workdir)
    return Plan(mode, workdir, expression, names)


# --------------------------------------------------------------------------- running


def plan_checks(cfg: Any) -> str:
    """The config's checks for --mode=plan, which needs neither the data nor the engines: a bad
    value raises ConfigError as in every mode; the domain's missing files or engines (an
    InputError that is not a ConfigError) are returned as a note instead ("" when none)."""
    try:
        validate_config(cfg)
    except ConfigError:
        raise
    except InputError as err:
        validate_config(cfg, skip=("domain",))
        return str(err)
    return ""


def plan_run(cfg: Any, accelerators: Sequence[str] = DEFAULT_ACCELERATORS, compile: bool = False,
             devices: Sequence[int] = ()) -> dict:
    """--mode=plan: per-device memory, FLOPs and roofline step time of the configured run (or,
    with `devices`, of each device count's first layout that fits), the settings it is for,
    and whether it fits (derl_jax/plan); no model is built, no run directory written. A
    domain is built only when neither the checkpoint nor the config gives the shapes."""
    note = plan_checks(cfg)
    from derl_jax.plan.report import plan_from_config, turn_shape

    given = has_field(cfg, "domain.max_prompt_tokens") or turn_shape(cfg) is not None
    needs_domain = not (str(getattr(cfg.policy, "checkpoint", "") or "").strip() and given)
    if needs_domain and note:
        raise InputError(note)
    try:
        result = plan_from_config(cfg, accelerators, compile, domain=build.build_domain(cfg) if needs_domain else None,
                                  devices=devices)
    except (ValueError, OSError) as err:  # an unknown accelerator, a checkpoint without config.json
        raise InputError(str(err)) from err
    if note:
        print(f"(not needed for the plan, but a run needs it: {note})")
    print(result["table"])
    return result


def export_policies(cfg: Any, workdir: str, policy: str | None = None) -> list[str]:
    """--mode=export: the config's checks (a domain's missing data or engines only matter when a
    scratch policy needs the domain's vocabulary), the policy's files, then
    `export.export_run`; prints and returns the directories written."""
    from derl_jax.experiment import export

    note = plan_checks(cfg)
    if note and not str(getattr(cfg.policy, "checkpoint", "") or "").strip():
        raise InputError(note)
    check_policy_files(cfg)
    written = export.export_run(cfg, workdir, policy)
    for path in written:
        print(f"exported {path}")
    return written


def run(cfg: Any, workdir: str, mode: str, expression: str | None = None, *, progress: bool = True,
        accelerators: Sequence[str] = DEFAULT_ACCELERATORS, plan_compile: bool = False,
        plan_devices: Sequence[int] = (), optimizer_factory: OptimizerFactory | None = None,
        policy: str | None = None) -> Any:
    """Check the inputs, lock `workdir`, build the domain and the inner loop, run `mode`; returns its result.

    optimizer_factory: `(cfg, grammar, mesh) -> MetaOptimizer` replacing the methods' own
    Meta-Optimizer in this process (tests and embedding code). policy: --mode=export's `.npz` file.
    """
    import jax  # noqa: F401  (before the checks: which process this is decides who writes and locks)

    if policy is not None and mode != "export":
        raise InputError(f"--policy applies to --mode=export only, not --mode={mode}")
    if mode == "plan":
        return plan_run(cfg, accelerators, plan_compile, plan_devices)
    if mode == "export":
        if expression is not None:
            raise InputError("--expression applies to --mode=final only; --mode=export trains nothing")
        return export_policies(cfg, workdir, policy)
    checked = check_inputs(cfg, workdir, mode, expression)
    levels = checked_levels(cfg) if mode == "compare" else ()
    lock = run_dir.exclusive(workdir) if primary_process() else contextlib.nullcontext()  # one lock per run
    with lock:
        if levels:
            write_run_config(cfg, workdir)
            return compare.compare_per_level(cfg, workdir, levels, progress=progress, optimizer_factory=optimizer_factory)
        domain = build.build_domain(cfg)
        check_mesh_rows(cfg, domain.rollout)
        if checked.expression is not None:
            check_expression(checked.expression, domain.primitive_names, domain.outcome_index)
        write_run_config(cfg, workdir)   # once the data are read and checked: an input error leaves nothing
        base_params, evaluator = build.build_inner(domain, cfg, workdir, run_cores(mode))
        if mode == "compare":
            return compare.compare_run(cfg, workdir, domain, base_params, evaluator, progress=progress,
                                       optimizer_factory=optimizer_factory)
        if mode == "search":
            result = protocol.search_method(cfg.outer.strategy, cfg, domain, evaluator, workdir, int(cfg.seed),
                                            base_params=base_params, optimizer_factory=optimizer_factory,
                                            progress=progress)
            print(f"search finished: best {result.best_text!r} (validation {result.best_score:.4f}); results in {workdir}")
            return result
        final = protocol.run_final(checked.expression, domain, evaluator, workdir, int(cfg.seed), base_params=base_params)
        print(f"final policy for {final.expression!r}: test accuracy {final.test:.4f}; "
              f"written to {workdir}/{protocol.FINAL_RESULT_FILE}"
              + (f", the policy to {workdir}/{protocol.FINAL_POLICY_HF_DIR}/"
                 if os.path.isdir(os.path.join(workdir, protocol.FINAL_POLICY_HF_DIR)) else ""))
        return final


def write_run_config(cfg: Any, workdir: str) -> None:
    """`<workdir>/config.json`: the config the run was started with (search, final, compare);
    written by the primary process only."""
    from derl_jax.checkpoint import atomic_write_json
    from derl_jax.logging import CONFIG_FILE, to_jsonable

    if not primary_process():
        return

    os.makedirs(workdir, exist_ok=True)
    as_dict = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    atomic_write_json(os.path.join(workdir, CONFIG_FILE), to_jsonable(as_dict, "config"), indent=2)


def launch(cfg: Any, mode: str, *, workdir: str | None = None, expression: str | None = None,
           progress: bool = True, accelerators: Sequence[str] = DEFAULT_ACCELERATORS, plan_compile: bool = False,
           plan_devices: Sequence[int] = (), compile_cache: str | None = None,
           environ: Mapping[str, str] | None = None, command: str = "", policy: str | None = None) -> Any:
    """`run` in a fresh process, as the command line starts it: one XLA host device per core where
    the run can use them, several processes joined when the environment asks for it, the
    persistent compilation cache (`--compile_cache`, `runtime.compile_cache_dir`), then `run`;
    a finished run leaves `run_info.json` in its workdir (`command`, the commit, the date, the
    machine, the versions and the wall time), which the results pages quote (not `export`,
    which leaves the run directory as it was, but for the Hugging Face directories it adds)."""
    from derl_jax.parallel import maybe_initialize_distributed

    environ = os.environ if environ is None else environ
    make_host_devices(cfg, mode, environ)
    maybe_initialize_distributed()
    workdir = workdir or default_workdir(cfg)
    if mode not in ("plan", "export"):
        import jax

        note = memory_note(platform_devices(environ)[0].platform, environ)  # a missing platform stops here
        if note and primary_process():
            print(note)
        use_compile_cache(compile_cache_dir(compile_cache, workdir, environ, jax.process_count()))
    started, info = time.monotonic(), run_info(command, mode)
    result = run(cfg, workdir, mode, expression, progress=progress, accelerators=accelerators,
                 plan_compile=plan_compile, plan_devices=plan_devices, policy=policy)
    if mode not in ("plan", "export") and primary_process():
        record_run(workdir, info, started)
    return result
