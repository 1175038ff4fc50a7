"""DERL on the composed symbols tasks `symbols_compose(m, D)`: known answers whose top rewards are rare.

The answer composes m aspects of the prompt string (reverse; then upper case; then a `!`
terminator), each with one aligned dense primitive, next to D decoys
(`derl_jax/domains/symbols_compose.py`, docs/domains/symbols.md). A reward is top-class when
it uses every aligned primitive and no harmful decoy (`derl_jax/domains/symbols_classes.py`);
the levels set (m, D) so that one random-search proposal is top-class with probability 0.11
(easy), 0.020 (medium) and 0.003 (hard), as measured by benchmarks/symbols_rarity.py (the table
in docs/domains/symbols.md). One candidate costs what a symbols candidate costs (the
same model, inner run and completion length plus one token).

Presets (`--config=configs/symbols_compose.py:<preset>`): easy, medium (the default), hard, smoke.

    python launch/run.py --config=configs/symbols_compose.py:medium --mode=final --expression="g2+g3" \\
        --workdir=runs/compose_medium_top          # about 2 CPU-minutes, most of it the warm start
    python launch/run.py --config=configs/symbols_compose.py:hard --mode=compare --config.outer.iterations=20 \\
        --config.compare.methods="('derl','random')" --workdir=runs/compose_hard

Fields beyond configs/symbols.py's: domain.aspects (m), domain.decoys (D), domain.base_policy_band,
policy.sft_upper_rate and policy.sft_end_rate (the warm start's per-position rates of the upper
case and per-answer rate of `!`).
"""

from __future__ import annotations

import ml_collections

from configs import common
from configs import symbols

# (aspects m, decoys D) per level, chosen by the measured share of top-class random-search proposals
# (2,000 each, benchmarks/results/symbols_rarity.json): easy 0.11, medium 0.020, hard 0.003
LEVELS = {"easy": (2, 1), "medium": (2, 4), "hard": (3, 4)}
# the base policy's sampled means over 512 inner-training prompts (derl_jax/rl/base_band.py): measured
# on seeds 0-4 (benchmarks/symbols_compose_reference.py, 2026-12-04, docs/domains/symbols.md) easy/medium order
# 0.452-0.472, case 0.363-0.380, exact 0.000; hard (2026-12-05, benchmarks/results/symbols_compose_reference_hard.json)
# order 0.465-0.490, case 0.365-0.385, end 0.285-0.326, exact 0.000; ours: about 0.04 either side, exact as in
# configs/symbols.py
BANDS = {"easy": {"order": (0.42, 0.51), "case": (0.33, 0.42), "exact": (0.0, 0.03)},
         "medium": {"order": (0.42, 0.51), "case": (0.33, 0.42), "exact": (0.0, 0.03)},
         "hard": {"order": (0.43, 0.53), "case": (0.33, 0.42), "end": (0.25, 0.37), "exact": (0.0, 0.03)}}
RATE = 0.4   # the warm-start corpus's per-aspect rate (ours; `level` says why)
# ours: the `!` rate of m = 3 (hard); at 0.4 a reward without `end` reached `!` by drift (fewer-aspects
# test exact match 0.156 against the top reward's 0.300, seeds 0-4); at 0.3 0.171 against 0.577 (seeds 0-4,
# 3 keys each; benchmarks/results/symbols_compose_reference_hard.json)
END_RATE_HARD = 0.3


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The config of preset `arg`: "easy", "medium" (None or empty), "hard" or "smoke"."""
    return common.preset({"default": medium, "easy": easy, "medium": medium, "hard": hard, "smoke": smoke}, arg,
                         "configs/symbols_compose.py")


def level(name: str) -> ml_collections.ConfigDict:
    """The symbols default preset with the composed domain of level `name`."""
    cfg = symbols.default()
    aspects, decoys = LEVELS[name]
    cfg.name = f"symbols_compose_{name}"
    # symbols' strings; one more generated token than symbols for the `!` terminator
    cfg.domain.update(kind="symbols_compose", aspects=aspects, decoys=decoys, max_new_tokens=9)
    cfg.domain.base_policy_band = dict(BANDS[name])
    # ours: every aspect's rate below 1/2, so greedy decoding gets no aspect right, yet close enough to
    # it that an aligned dense reward flips each aspect within the 64 inner steps (at 0.2, the symbols
    # corpus's rate, the top reward reached validation exact match 0.012 (m = 2) and 0.036 (m = 3))
    cfg.policy.update(sft_reverse_rate=RATE, sft_upper_rate=RATE, sft_end_rate=END_RATE_HARD if aspects == 3 else RATE)
    return cfg


def easy() -> ml_collections.ConfigDict:
    return level("easy")


def medium() -> ml_collections.ConfigDict:
    return level("medium")


def hard() -> ml_collections.ConfigDict:
    return level("hard")


def smoke() -> ml_collections.ConfigDict:
    """The medium level at toy sizes (tests)."""
    cfg = common.toy_search(medium())
    cfg.name = "symbols_compose_smoke"
    cfg.domain.update(num_train=40, num_test=20)
    cfg.domain.base_policy_band = {}   # the toy warm start has no declared difficulty
    cfg.policy.update(**common.TOY_MODEL, sft_steps=20, sft_batch_size=16, sft_extra_strings=0)
    cfg.inner.update(prompts_per_step=4, group_size=2)
    return cfg
