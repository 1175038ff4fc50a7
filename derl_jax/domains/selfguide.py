"""Self-Guide's self-assessment, shared by the agent domains (household, ScienceWorld, ALFWorld).

With a domain's `self_guide` option the policy writes, before each tagged action, one word
assessing its progress so far (the Self-Guide paper's guidance z_t, written from the history
and the current observation before a_t):

    progress+   the last step made progress (household: a subgoal was reached; the engines:
                their score rose);
    progress-   the last step was a setback (its action failed, or the engine's score fell);
    progress=   otherwise (the first turn included).

The environment reads the word off the action, acts on the rest, and reports the word's
internal reward r_sg_t (`self_rewards`, default +0.1 / 0 / -0.1) as info["self_reward"]; an
action without the word is malformed (it does nothing and its self-reward is 0). The domain
then has the primitive `g_sg` (primitives/selfguide.py), the episode's summed self-reward.
The warm-start corpora write the expert's word by the rule above (`assess`).

A pretrained policy (the agent prompt, `derl_jax.domains.agent_prompt`) writes the assessment in
words instead: one sentence inside `<assess>…</assess>` ending in a verdict, "Verdict:
progress." / "Verdict: no change." / "Verdict: setback." (progress+ / progress= / progress-),
before its reasoning and action. The environment reads the verdict (`agent_prompt.read_verdict`)
and rewards it as above; a malformed assessment (none, two, or no verdict at its end) earns 0
and the action still runs. The three-word form stays for scratch word-level policies.
"""

from __future__ import annotations

import math
import re
from typing import Any, Sequence

import numpy as np

import primitives.selfguide  # noqa: F401  (registers g_sg)
from derl_jax.config import ConfigError, boolean, config_value, is_number
from derl_jax.selfguide import SELF_REWARD_PRIMITIVE

ASSESSMENTS = ("progress+", "progress=", "progress-")
POSITIVE, NEUTRAL, NEGATIVE = range(len(ASSESSMENTS))
DEFAULT_SELF_REWARDS = (0.1, 0.0, -0.1)
# One word of the word vocabularies (a tokenizer's text pattern lists it before its others).
ASSESSMENT_PATTERN = r"progress[-+=]"
_LEADING = re.compile(rf"^\s*({ASSESSMENT_PATTERN})(?=\s|$)")


def enabled(domain_cfg: Any) -> bool:
    """The `self_guide` option of a `config.domain` block (False when absent)."""
    return bool(domain_cfg.get("self_guide", False))


def self_rewards(domain_cfg: Any) -> tuple[float, float, float]:
    """The `self_rewards` of a `config.domain` block (DEFAULT_SELF_REWARDS when absent)."""
    return checked_rewards(domain_cfg.get("self_rewards", DEFAULT_SELF_REWARDS))


def primitive_names(base: Sequence[str], domain_cfg: Any) -> tuple[str, ...]:
    """`base` primitives, plus the summed self-reward `g_sg` when `self_guide` is on."""
    return tuple(base) + ((SELF_REWARD_PRIMITIVE,) if enabled(domain_cfg) else ())


def checked_rewards(values: Any, where: str = "self_rewards") -> tuple[float, float, float]:
    """The three internal rewards as floats; ValueError unless they are three finite numbers."""
    if (isinstance(values, str) or not hasattr(values, "__len__") or len(values) != len(ASSESSMENTS)
            or not all(is_number(v) and math.isfinite(float(v)) for v in values)):
        raise ValueError(f"{where} must be three finite numbers (for {', '.join(ASSESSMENTS)}), got {values!r}")
    return tuple(float(v) for v in values)


def validate_fields(cfg: Any) -> None:
    """ConfigError naming `config.domain.self_guide` or `.self_rewards` when present and wrong."""
    domain = config_value(cfg, "domain")
    if "self_guide" in domain:
        boolean(cfg, "domain.self_guide")
    if "self_rewards" in domain:
        try:
            checked_rewards(domain["self_rewards"], "config.domain.self_rewards")
        except ValueError as err:
            raise ConfigError(str(err)) from None


def assess(progressed, setback, xp: Any = np):
    """i32[...]: the index into ASSESSMENTS of the expert's word after a step that `progressed`
    (bool[...]) or was a `setback` (bool[...]); progress wins. `xp`: numpy or jax.numpy."""
    return xp.where(progressed, POSITIVE, xp.where(setback, NEGATIVE, NEUTRAL)).astype(xp.int32)


def assessment_after(score_change: float, failed: bool) -> int:
    """The expert's word (index) after an engine step: + when the score rose, - when it fell or
    the action failed, = otherwise."""
    return int(assess(score_change > 0, score_change < 0 or failed))


def split_assessment(text: str) -> tuple[int, str]:
    """'progress+ plan go to kitchen' -> (0, 'plan go to kitchen'); (-1, text) when `text` does
    not start with an assessment word."""
    match = _LEADING.match(text)
    if not match:
        return -1, text
    return ASSESSMENTS.index(match.group(1)), text[match.end():].strip()


def read_action(text: str, self_guide: bool) -> tuple[int, str]:
    """(assessment index, what the environment acts on) of a decoded action: without
    `self_guide` (-1, text); with it the text after the word, or "" (malformed) when the word
    is missing."""
    if not self_guide:
        return -1, text
    index, rest = split_assessment(text)
    return index, rest if index >= 0 else ""


def self_reward(assessment, rewards: Sequence[float], live, xp: Any = np):
    """f32[...]: the internal reward of each assessment index i32[...] (0 where it is -1 or the
    episode is not `live` bool[...])."""
    values = xp.asarray(rewards, xp.float32)[xp.maximum(assessment, 0)]
    return xp.where(live & (assessment >= 0), values, 0.0).astype(xp.float32)
