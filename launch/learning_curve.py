"""A learning curve of one reward: greedy test success after 0, 10, 20, ... inner steps, over seeds.

    python launch/learning_curve.py --config=configs/household.py --expression=g1 \\
        --steps=0,10,20,30,40 --seeds=0,1,2 --workdir=runs/household_curve

Config overrides work as in launch/run.py (`--config.inner.loss_agg=seq_mean_token_mean`).
Finished points are kept in --workdir and skipped when the command is run again
(derl_jax/experiment/curve.py); curve.json, curve.png and run_info.json (the command, commit,
machine and wall time) are written at the end.
"""

from __future__ import annotations

import sys
import time

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file, e.g. configs/household.py.")
_EXPRESSION = flags.DEFINE_string("expression", "g1", "The reward expression every point trains with.")
_STEPS = flags.DEFINE_list("steps", ["0", "10", "20", "30", "40"], "Inner steps of the points (0: the base policy).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds of each point.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the points and the curve are written.")
_LABEL = flags.DEFINE_string("label", None, "The curve's name in the plot (default: the expression).")


def main(argv: list[str]) -> None:
    from derl_jax.config import InputError
    from derl_jax.experiment.checks import validate_config
    from derl_jax.experiment.curve import learning_curve
    from derl_jax.experiment.build import primitive_names
    from derl_jax.experiment.run import check_expression
    from derl_jax.experiment.runtime import record_run, run_info

    if len(argv) > 1 or _CONFIG.value is None or not _WORKDIR.value:
        sys.exit(f"{argv[0]}: error: needs --config and --workdir (and no positional arguments)")
    try:
        steps, seeds = [int(v) for v in _STEPS.value], [int(v) for v in _SEEDS.value]
        validate_config(_CONFIG.value)
        expression = check_expression(_EXPRESSION.value, primitive_names(_CONFIG.value),
                                      domain=str(_CONFIG.value.domain.kind))   # aliases read as names
        started, info = time.monotonic(), run_info(" ".join(["python", "launch/learning_curve.py", *sys.argv[1:]]),
                                                   "curve")
        curve = learning_curve(_CONFIG.value, _WORKDIR.value, expression, steps, seeds,
                               label=_LABEL.value or _EXPRESSION.value)
    except (InputError, ValueError) as err:
        sys.exit(f"{argv[0]}: error: {str(err).splitlines()[0]}")
    record_run(_WORKDIR.value, info, started)
    for count, mean, low, high in zip(curve["steps"], curve["mean"], curve["ci95_low"], curve["ci95_high"]):
        print(f"steps {count:4d}: test {100 * mean:6.2f}% [{100 * low:6.2f}, {100 * high:6.2f}]")


if __name__ == "__main__":
    app.run(main)
