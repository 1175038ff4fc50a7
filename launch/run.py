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
(`--config.outer.iterations=3`); the config is validated before anything is built and a bad
value stops the run with a message naming the field.

What is built from the config: the domain (`config.domain.kind`), the base policy
(`derl_jax.rl.inner.base_policy(domain, cfg, workdir)`), the inner-loop evaluator
(`derl_jax.rl.inner.make_evaluator(domain, cfg)`) and the strategies
(`derl_jax.meta.strategies.make_strategy`, whose Meta-Optimizer is
`derl_jax.meta.optimizer.MetaOptimizer(cfg, grammar)`).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from typing import Any

from absl import app, flags, logging
from ml_collections import config_flags

from derl_jax.meta import protocol
from derl_jax.meta.search import read_search_result
from derl_jax.parallel import maybe_initialize_distributed

MODES = ("search", "final", "compare")
DOMAIN_BUILDERS = {"arith": "derl_jax.domains.arith:make_arith_domain"}

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file, e.g. configs/arith.py:smoke.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config.name>).")
_MODE = flags.DEFINE_enum("mode", "search", list(MODES), "What to run.")
_EXPRESSION = flags.DEFINE_string("expression", None, "final mode: the reward expression (default: the search result in --workdir).")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show progress bars (only on a terminal).")
flags.mark_flags_as_required(["config"])

# Replaceable by embedding code (and tests): the Meta-Optimizer factory handed to strategies;
# None means `derl_jax.meta.optimizer.MetaOptimizer`.
OPTIMIZER_FACTORY = None


@dataclasses.dataclass(frozen=True)
class Components:
    """What a run needs besides the config: the domain, the base policy, the inner-loop evaluator."""

    domain: Any
    base_params: Any
    evaluator: Any


def build_domain(cfg: Any):
    """The domain named by `config.domain.kind`."""
    kind = cfg.domain.kind
    if kind not in DOMAIN_BUILDERS:
        raise protocol.ConfigError(f"config.domain.kind must be one of {tuple(DOMAIN_BUILDERS)}, got {kind!r}")
    module_name, function_name = DOMAIN_BUILDERS[kind].split(":")
    return getattr(importlib.import_module(module_name), function_name)(cfg.domain)


def build_components(cfg: Any, workdir: str) -> Components:
    """Domain, base policy and evaluator from the config (the inner loop lives in derl_jax.rl.inner)."""
    if cfg.domain.kind == "math":
        from derl_jax.domains.math import build_domain_and_evaluator

        return Components(*build_domain_and_evaluator(cfg, workdir))
    from derl_jax.rl import inner

    domain = build_domain(cfg)
    return Components(domain=domain, base_params=inner.base_policy(domain, cfg, workdir), evaluator=inner.make_evaluator(domain, cfg))


def validate(cfg: Any) -> None:
    """Check the config before anything is built; raises `protocol.ConfigError` naming the field."""
    protocol.validate_config(cfg)
    if cfg.domain.kind == "math":
        from derl_jax.domains.math import validate_math_config

        validate_math_config(cfg)


def default_workdir(cfg: Any) -> str:
    return os.path.join("runs", str(cfg.name))


def run(cfg: Any, workdir: str, mode: str, expression: str | None = None, *, progress: bool = True) -> Any:
    """Validate `cfg`, build the components and run `mode` in `workdir`; returns the mode's result."""
    if mode not in MODES:
        raise ValueError(f"run: mode must be one of {MODES}, got {mode!r}")
    validate(cfg)
    if mode == "final" and expression is None:
        expression = read_search_result(workdir)["incumbent"]["text"]
        if expression is None:
            raise ValueError(f"the search in {workdir} found no valid expression; pass --expression")
    if expression is not None:
        protocol.compile_checked(expression, _primitive_names_for(cfg))
    os.makedirs(workdir, exist_ok=True)
    parts = build_components(cfg, workdir)
    if mode == "search":
        result = protocol.search_method(
            cfg.outer.strategy, cfg, parts.domain, parts.evaluator, workdir, int(cfg.seed),
            base_params=parts.base_params, optimizer_factory=OPTIMIZER_FACTORY, progress=progress,
        )
        print(f"search finished: best {result.best_text!r} (validation {result.best_score:.4f}); results in {workdir}")
        return result
    if mode == "final":
        final = protocol.run_final(expression, parts.domain, parts.evaluator, workdir, int(cfg.seed), base_params=parts.base_params)
        print(f"final policy for {final.expression!r}: test accuracy {final.test:.4f}; written to {workdir}/{protocol.FINAL_RESULT_FILE}")
        return final
    payload = protocol.compare(
        cfg, parts.domain, parts.evaluator, workdir, base_params=parts.base_params,
        optimizer_factory=OPTIMIZER_FACTORY, progress=progress,
    )
    with open(os.path.join(workdir, protocol.RESULTS_MD), encoding="utf-8") as handle:
        print(handle.read())
    return payload


def _primitive_names_for(cfg: Any) -> tuple[str, ...]:
    """Primitive names of the configured domain without building its data (for early expression checks)."""
    if cfg.domain.kind == "arith":
        from derl_jax.domains.arith import ARITH_PRIMITIVES

        return tuple(ARITH_PRIMITIVES)
    if cfg.domain.kind == "math":
        from derl_jax.domains.math import resolve_primitives

        return tuple(p.name for p in resolve_primitives(cfg))
    return tuple(build_domain(cfg).primitive_names)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # library INFO lines (checkpointing) would drown the summaries
    maybe_initialize_distributed()
    cfg = _CONFIG.value
    try:
        validate(cfg)
    except ValueError as err:  # protocol.ConfigError and the math domain's MathConfigError
        raise app.UsageError(str(err)) from None
    workdir = _WORKDIR.value or default_workdir(cfg)
    progress = _PROGRESS.value and sys.stderr.isatty()
    run(cfg, workdir, _MODE.value, _EXPRESSION.value, progress=progress)


if __name__ == "__main__":
    app.run(main)
