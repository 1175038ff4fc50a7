"""How rare a top-class reward is under random search, per level of the composed symbols tasks.

    python -m benchmarks.symbols_rarity --levels=easy,medium,hard --proposals=2000 --train=30 \\
        --workdir=runs/symbols_rarity --out=benchmarks/results/symbols_rarity.json

For each level (a preset of configs/symbols_compose.py, or `--config` for another file):

1. Proposals. The random-search strategy (the cold-started Meta-Optimizer, frozen:
   `derl_jax.methods.baselines.RandomSearchStrategy`) proposes `--proposals` expressions in
   batches of `--batch` (independent samples: the batch size sets only the speed), with the
   search keys of `--seed`; each is classified by the
   construction's rule (`derl_jax.domains.symbols_classes.reward_class`; an invalid proposal is
   "other"). Reported: the share of each class and p_top with a 95% Wilson interval.
2. The rule checked. `--train` proposals (as many of each class as the sample allows, up to an
   equal share, the rest drawn at random) each train one candidate policy on the inner-training
   split exactly as a search candidate does (`protocol.fixed_validation_score`, the level's
   `inner.steps`), and so does the reference top reward (the sum of the aligned primitives).
   A proposal *agrees* when it is top-class and its validation exact match is at least half the
   reference's, or it is not top-class and its score is below that. Reported: the agreement rate.

Writes `<workdir>/symbols_rarity.json` (and `--out`): per level the primitive names, class
counts, p_top, the trained proposals with class and score, the agreement, and seconds; and
`<workdir>/<level>/proposals.json`, every proposal with its class.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections import Counter
from typing import Sequence

import numpy as np

CLASSES = ("top", "partial", "decoy", "other")


def wilson(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval of a binomial proportion."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def sample_proposals(cfg, names: Sequence[str], count: int, seed: int, workdir: str, batch: int = 200) -> list[str]:
    """`count` texts from the frozen cold-started Meta-Optimizer (random search's distribution)."""
    import jax

    from derl_jax.experiment.protocol import meta_grammar, run_keys
    from derl_jax.outer import make_strategy

    strategy = make_strategy("random", cfg, meta_grammar(cfg, len(names)), tuple(names), outcome_index=0,
                             workdir=workdir)
    key = run_keys(seed)["search"]
    state = strategy.init(jax.random.fold_in(key, 0))
    texts: list[str] = []
    for call in range(math.ceil(count / batch)):
        proposed, _ = strategy.propose(state, jax.random.fold_in(key, call + 1), batch)
        texts.extend(proposed)
    return texts[:count]


def is_valid(text: str, names: Sequence[str]) -> bool:
    """Whether `text` is a reward the search would train (parses, finite on the probe points)."""
    from derl_jax.experiment.protocol import compile_checked

    try:
        compile_checked(text, tuple(names), 0)
    except ValueError:
        return False
    return True


def pick_for_training(texts: Sequence[str], classes: Sequence[str], count: int, seed: int) -> list[int]:
    """Indices of `count` distinct proposals: up to count/4 of each class, the rest at random."""
    rng = np.random.default_rng(seed)
    first = {}
    for index, text in enumerate(texts):
        first.setdefault(text, index)
    distinct = sorted(first.values())
    chosen: list[int] = []
    for name in CLASSES:
        of_class = [i for i in distinct if classes[i] == name]
        take = min(len(of_class), count // len(CLASSES))
        chosen += [int(i) for i in rng.choice(of_class, size=take, replace=False)] if take else []
    rest = [i for i in distinct if i not in set(chosen) and classes[i] in CLASSES]
    more = min(len(rest), count - len(chosen))
    chosen += [int(i) for i in rng.choice(rest, size=more, replace=False)] if more else []
    return chosen


def train_scores(cfg, domain, expressions: Sequence[str], seed: int, workdir: str) -> list[float]:
    """Validation exact match of one candidate training per expression (as a search candidate)."""
    from derl_jax.experiment import build
    from derl_jax.experiment.protocol import fixed_validation_score, run_keys, split_train

    base_params, evaluator = build.build_inner(domain, cfg, workdir)
    inner_train, validation = split_train(domain.train, int(cfg.outer.split_seed))
    key = run_keys(seed)["fixed_validation"]
    return [fixed_validation_score(text, domain, evaluator, key, base_params, inner_train, validation)
            for text in expressions]


def measure_level(config: str, proposals: int, train: int, seed: int, workdir: str, batch: int = 200,
                  overrides: Sequence[str] = ()) -> dict:
    from benchmarks.symbols_reference import load_config
    from derl_jax.domains.symbols_classes import ALIGNED, reward_class
    from derl_jax.experiment import build

    start = time.time()
    cfg = load_config(config, seed, list(overrides))
    names = build.primitive_names(cfg)
    kept = os.path.join(workdir, "proposals.json")
    texts = []
    if os.path.exists(kept):   # proposals sampled before (same primitives, at least as many): not sampled again
        with open(kept, encoding="utf-8") as handle:
            saved = json.load(handle)
        if saved["primitives"] == list(names) and len(saved["texts"]) >= proposals:
            texts = saved["texts"][:proposals]
    if not texts:
        texts = sample_proposals(cfg, names, proposals, seed, workdir, batch)
    classes = [reward_class(names, text) for text in texts]
    os.makedirs(workdir, exist_ok=True)
    with open(kept, "w", encoding="utf-8") as handle:
        json.dump({"primitives": list(names), "texts": texts, "classes": classes}, handle)
    counts = Counter(classes)
    p_top = counts["top"] / len(texts)
    row = {"config": config, "primitives": list(names), "proposals": len(texts),
           "counts": {c: counts.get(c, 0) for c in CLASSES}, "p_top": p_top,
           "p_top_interval": list(wilson(counts["top"], len(texts))),
           "distinct": len(set(texts)), "examples": {c: sorted({t for t, k in zip(texts, classes) if k == c})[:8]
                                                   for c in CLASSES},
           "sample_seconds": time.time() - start}
    print(f"{config}: {names} p_top {p_top:.4f} {row['counts']} ({row['sample_seconds']:.0f} s)", flush=True)
    if train:
        domain = build.build_domain(cfg)
        valid = [is_valid(text, names) for text in texts]   # an invalid proposal trains nothing (score 0)
        chosen = pick_for_training([t if v else "" for t, v in zip(texts, valid)],
                                   [c if v else "invalid" for c, v in zip(classes, valid)], train, seed)
        chosen = [i for i in chosen if valid[i]]
        reference = "+".join(f"g{i + 1}" for i, name in enumerate(names) if name in ALIGNED)
        scores = train_scores(cfg, domain, [reference] + [texts[i] for i in chosen], seed, workdir)
        threshold = 0.5 * scores[0]
        trained = [{"text": texts[i], "class": classes[i], "validation": s} for i, s in zip(chosen, scores[1:])]
        agree = [(t["class"] == "top") == (t["validation"] >= threshold) for t in trained]
        row.update(reference={"text": reference, "validation": scores[0]}, threshold=threshold, trained=trained,
                   agreement=float(np.mean(agree)) if agree else None, seconds=time.time() - start)
        print(f"  reference {reference}: {scores[0]:.3f}; agreement {row['agreement']:.3f} over {len(agree)}",
              flush=True)
    return row


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/symbols_compose.py")
    parser.add_argument("--levels", default="easy,medium,hard", help="presets of --config, ','-separated")
    parser.add_argument("--proposals", type=int, default=2000)
    parser.add_argument("--train", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--workdir", default="runs/symbols_rarity")
    parser.add_argument("--out", default="")
    parser.add_argument("--override", action="append", default=[],
                        help="passed to every level's config, e.g. --override=--config.domain.decoys=0")
    args = parser.parse_args(argv)
    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    payload = {"proposals": args.proposals, "train": args.train, "seed": args.seed, "overrides": args.override,
               "levels": {}}
    for name in [s.strip() for s in args.levels.split(",") if s.strip()]:
        payload["levels"][name] = measure_level(f"{args.config}:{name}", args.proposals, args.train, args.seed,
                                                os.path.join(workdir, name), args.batch, args.override)
        for path in [os.path.join(workdir, "symbols_rarity.json")] + ([args.out] if args.out else []):
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(payload, handle, indent=2)


if __name__ == "__main__":
    main()
