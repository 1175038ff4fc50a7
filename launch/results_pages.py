"""Regenerate the results pages (docs/results/*.md) from the kept runs in docs/results/runs/.

    python launch/results_pages.py                                             # every page
    python launch/results_pages.py --collect=runs/arith --name=arith_default   # keep a finished compare first
    python launch/results_pages.py --collect=runs/curves --name=my_curves --first=token_mean
                                   # keep a folder of learning curves (one subfolder per curve)

A page holds `<!-- generated: <name> -->` ... `<!-- end generated -->` blocks; each is rewritten
from the kept run `<name>` (derl_jax/experiment/pages.py).
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

RESULTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "results")

_COLLECT = flags.DEFINE_string("collect", None, "A finished compare's workdir to keep under docs/results/runs/.")
_NAME = flags.DEFINE_string("name", None, "The kept run's name (with --collect).")
_FIRST = flags.DEFINE_string("first", None, "With --collect of a folder of learning curves: the curve the others "
                             "are compared against (default: the first by name).")
_RESULTS = flags.DEFINE_string("results_dir", RESULTS_DIR, "The results pages' folder.")


def main(argv: list[str]) -> None:
    from derl_jax.experiment import pages

    if len(argv) > 1:
        sys.exit(f"{argv[0]}: error: unexpected arguments {argv[1:]}")
    if _COLLECT.value is not None:
        if not _NAME.value:
            sys.exit(f"{argv[0]}: error: --collect needs --name")
        try:
            print("kept", pages.collect(_COLLECT.value, os.path.join(_RESULTS.value, pages.RUNS_DIR), _NAME.value,
                                        _FIRST.value))
        except (OSError, ValueError) as err:
            sys.exit(f"{argv[0]}: error: {err}")
    try:
        changed = pages.regenerate_all(_RESULTS.value)
    except (OSError, ValueError) as err:
        sys.exit(f"{argv[0]}: error: {err}")
    for page in changed:
        print("regenerated", page)


if __name__ == "__main__":
    app.run(main)
