"""Command line of derl_jax: parse the flags, then `derl_jax.experiment.run.launch`.

    python launch/run.py --config=configs/arith.py:smoke --mode=compare
    python launch/run.py --config=configs/arith.py --mode=search --config.outer.strategy=derl_pop
    python launch/run.py --config=configs/arith.py --mode=final --expression="g1+0.5*g2"
    python launch/run.py --config=configs/household.py --mode=plan
    python launch/run.py --config=configs/arith.py --mode=export --workdir=runs/arith   # kept final policies
    python launch/run.py --list                 # every registered domain, method and primitive

Modes: search (the outer loop of config.outer.strategy), final (a fresh policy trained with
--expression or the search's best, then tested), compare (every method x seed of
config.compare, then the report), plan (memory, FLOPs and step time; nothing is built),
export (the kept final_policy.npz files under --workdir, or --policy=FILE.npz, as Hugging Face
directories beside them; docs/checkpoints.md).

--workdir defaults to runs/<config.name>. Library log lines below WARNING are hidden unless
--verbosity is given. Every config field can be overridden (`--config.outer.iterations=3`).
A bad input prints one line `launch/run.py: error: ...` naming the flag, field or file and
exits with status 2 (--debug adds the traceback); internal errors keep their tracebacks. A
search that cannot go on (its proposer's endpoint stays down) prints one line and exits with
status 3; rerunning the same command resumes from its last checkpoint.
The library is imported after the flags are parsed, so a mistyped flag is reported at once.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from typing import NoReturn, Sequence

from absl import app, flags, logging
from ml_collections import config_flags

MODES = ("search", "final", "compare", "plan", "export")
SCRIPT = "launch/run.py"
EXIT_USER_ERROR = 2
EXIT_STOPPED = 3
HELP_FLAGS = ("-?", "-h", "--help", "-help", "--helpshort", "-helpshort", "--helpfull", "-helpfull", "--helpxml")

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file, e.g. configs/arith.py:smoke.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (default: runs/<config.name>).")
_MODE = flags.DEFINE_enum("mode", "search", list(MODES), "What to run.")
_EXPRESSION = flags.DEFINE_string("expression", None, "final mode: the reward expression (default: the search "
                                  "result in --workdir).")
_POLICY = flags.DEFINE_string("policy", None, "export mode: the .npz policy file to export (default: every "
                              "final_policy.npz under --workdir).")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show progress bars (only on a terminal).")
_DEBUG = flags.DEFINE_bool("debug", False, "Show the traceback of a user error too.")
_ACCELERATOR = flags.DEFINE_list("accelerator", ["h100", "h200"], "--mode=plan: accelerators to plan for (h100, "
                                 "h200, a100, v5e, v5p, or name:peak_flops:bandwidth:memory).")
_COMPILE_CACHE = flags.DEFINE_string(
    "compile_cache", None, "Directory of XLA's persistent compilation cache (default: $JAX_COMPILATION_CACHE_DIR, "
    "else <workdir>/compile_cache in a single-process job; --compile_cache= turns it off).")
_PLAN_COMPILE = flags.DEFINE_bool("plan_compile", False, "--mode=plan: also compile the step's pieces on fake CPU "
                                  "devices for the compiler's memory figures.")
_PLAN_DEVICES = flags.DEFINE_list("plan_devices", [], "--mode=plan: device counts to plan for, each with the first "
                                  "mesh that fits (default: the configured mesh).")
_LIST = flags.DEFINE_bool("list", False, "Print every registered domain, method and primitive, then exit.")


def user_error(message: str, *, debug: bool = False) -> NoReturn:
    """Print `launch/run.py: error: <first line>` (after the traceback when `debug`) and exit 2."""
    if debug and sys.exc_info()[0] is not None:
        traceback.print_exc()
    first_line = message.strip().splitlines()[0] if message.strip() else "invalid input"
    print(f"{SCRIPT}: error: {first_line}", file=sys.stderr)
    sys.exit(EXIT_USER_ERROR)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's flag parsing with each failure turned into one line naming the flag."""
    if any(arg.split("=", 1)[0] in HELP_FLAGS for arg in argv[1:]) or "--list" in argv[1:]:
        return flags.FLAGS(argv)  # absl prints the help and exits; --list needs no config
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
        lines = [line for line in str(err).splitlines() if line.strip()]
        if "Traceback (most recent call last)" in str(err):
            user_error(f"--config={config_arg}: {lines[-1].strip()}", debug=debug)
        user_error(lines[0].removeprefix("flag "), debug=debug)
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


def _override_error(argv: Sequence[str], err: BaseException) -> str:
    """`--config.a.b=...` naming a field the config does not have."""
    names = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", str(err.args[0]) if err.args else "")
    missing = names[0] if names else ""
    for arg in argv[1:]:
        flag = arg.split("=", 1)[0].lstrip("-")
        if flag.startswith("config.") and missing in flag.split(".")[1:]:
            return f"--{flag}: {flag.rsplit('.', 1)[0]} has no field {missing!r}"
    return f"a --config.* override names a field the config does not have ({missing!r})"


def _plan_devices(values: Sequence[str]) -> tuple[int, ...]:
    """--plan_devices as positive ints (one line naming the flag otherwise)."""
    if not all(v.strip().isdigit() and int(v) > 0 for v in values):
        user_error(f"--plan_devices must be positive device counts, e.g. 8,64; got {','.join(values)!r}")
    return tuple(int(v) for v in values)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        user_error(f"unexpected arguments {argv[1:]}; flags take the form --name=value")
    if _LIST.value:
        from derl_jax.experiment.catalog import describe

        print(describe())
        return
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # library INFO lines (checkpointing) would drown the summaries
    from derl_jax.config import InputError
    from derl_jax.experiment.run import launch
    from derl_jax.outer.search import SearchStopped

    try:
        launch(_CONFIG.value, _MODE.value, workdir=_WORKDIR.value, expression=_EXPRESSION.value,
               progress=_PROGRESS.value and sys.stderr.isatty(), accelerators=_ACCELERATOR.value,
               plan_compile=_PLAN_COMPILE.value, plan_devices=_plan_devices(_PLAN_DEVICES.value),
               compile_cache=_COMPILE_CACHE.value, command=" ".join(["python", SCRIPT, *sys.argv[1:]]),
               policy=_POLICY.value)
    except InputError as err:
        user_error(str(err), debug=_DEBUG.value)
    except SearchStopped as err:
        if _DEBUG.value:
            traceback.print_exc()
        print(f"{SCRIPT}: stopped: {str(err).strip().splitlines()[0]}; rerun the same command to resume "
              "from the last checkpoint", file=sys.stderr)
        sys.exit(EXIT_STOPPED)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
