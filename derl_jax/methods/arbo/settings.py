"""The `arbo` config block (read by the `arbo` and `eureka` strategies) and the ablation presets.

    config.arbo.proposer          "structural" | "agent"
    config.arbo.schedule          "adaptive" | "explore_only" | "exploit_only"
    config.arbo.initial_explore   rounds explored first (>= 0)
    config.arbo.patience          mu: unaccepted exploit rounds before re-exploring (>= 1)
    config.arbo.reexplore         nu: at most this many re-exploration rounds (>= 0)
    config.arbo.belief            the searcher reads and writes its belief (bool)
    config.arbo.observations      "full" | "scores" (curves and failure reasons hidden)
    config.arbo.task              a few words about the task, for the agent's prompt
                                  ("" = config.meta.task_description when there is one)
    config.arbo.agent.backend     "openai" | "local"
    config.arbo.agent.url         OpenAI-compatible endpoint base, e.g. http://127.0.0.1:8000/v1
    config.arbo.agent.model       model name sent to the endpoint
    config.arbo.agent.api_key_env environment variable holding the API key ("" for none)
    config.arbo.agent.checkpoint  local Hugging Face chat checkpoint directory (backend "local")
    config.arbo.agent.tokenizer   its tokenizer directory ("" = the checkpoint's)
    config.arbo.agent.temperature, max_tokens, timeout_s, max_turns

A run without an `arbo` block uses `default_config()`. The ablations (`ABLATIONS`) are also
strategy names: `arbo_ablation:no_belief` is `arbo` with `belief=False`, and so on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from derl_jax.config import ConfigError, boolean, choice, config_value, has_field, int_at_least, number
from derl_jax.methods.arbo.proposer import View
from derl_jax.methods.arbo.schedule import KINDS, Schedule

PROPOSERS = ("structural", "agent")
BACKENDS = ("openai", "local")
OBSERVATIONS = ("full", "scores")
ABLATIONS = {
    "no_belief": {"belief": False},
    "scores_only": {"observations": "scores"},
    "explore_only": {"schedule": "explore_only"},
    "exploit_only": {"schedule": "exploit_only"},
}


def default_config() -> ml_collections.ConfigDict:
    """The `arbo` block's defaults."""
    return ml_collections.ConfigDict({
        "proposer": "structural", "schedule": "adaptive", "initial_explore": 1, "patience": 2, "reexplore": 1,
        "belief": True, "observations": "full", "task": "",
        "agent": {"backend": "openai", "url": "http://127.0.0.1:8000/v1", "model": "", "api_key_env": "",
                  "checkpoint": "", "tokenizer": "", "temperature": 0.7, "max_tokens": 1024, "timeout_s": 120.0,
                  "max_turns": 24},
    })


def arbo_block(cfg: Any, ablation: str | None = None) -> ml_collections.ConfigDict:
    """`cfg.arbo` over the defaults, with the ablation preset applied; ConfigError on a bad field."""
    block = default_config()
    if has_field(cfg, "arbo"):
        given = config_value(cfg, "arbo")
        given = given.to_dict() if hasattr(given, "to_dict") else dict(given)
        agent = given.pop("agent", {}) or {}
        unknown = sorted(set(given) - set(block)) + sorted(f"agent.{k}" for k in set(agent) - set(block.agent))
        if unknown:
            raise ConfigError(f"config.arbo has unknown fields {unknown}; known: {sorted(block)}")
        block.update(given)
        block.agent.update(dict(agent))
    if ablation is not None:
        if ablation not in ABLATIONS:
            raise ConfigError(f"unknown arbo ablation {ablation!r}; expected one of {sorted(ABLATIONS)}")
        block.update(ABLATIONS[ablation])
    wrapped = {"arbo": block}
    choice(wrapped, "arbo.proposer", PROPOSERS)
    choice(wrapped, "arbo.schedule", KINDS)
    int_at_least(wrapped, "arbo.initial_explore", 0)
    int_at_least(wrapped, "arbo.patience", 1)
    int_at_least(wrapped, "arbo.reexplore", 0)
    boolean(wrapped, "arbo.belief")
    choice(wrapped, "arbo.observations", OBSERVATIONS)
    choice(wrapped, "arbo.agent.backend", BACKENDS)
    number(wrapped, "arbo.agent.temperature", minimum=0.0, strict=False)
    int_at_least(wrapped, "arbo.agent.max_tokens", 1)
    number(wrapped, "arbo.agent.timeout_s", minimum=0.0, strict=True)
    int_at_least(wrapped, "arbo.agent.max_turns", 1)
    if block.proposer == "agent":
        if block.agent.backend == "openai" and not str(block.agent.url).startswith(("http://", "https://")):
            raise ConfigError(f"config.arbo.agent.url must be an http(s) URL, got {block.agent.url!r}")
        if block.agent.backend == "local" and not str(block.agent.checkpoint).strip():
            raise ConfigError("config.arbo.agent.checkpoint must name a local chat checkpoint directory "
                              "when config.arbo.agent.backend='local'")
    return block


@dataclasses.dataclass(frozen=True)
class Settings:
    schedule: Schedule
    view: View
    proposer: str
    agent: Any  # the agent block (ConfigDict)
    task: str = ""


def read_settings(cfg: Any, ablation: str | None = None) -> Settings:
    block = arbo_block(cfg, ablation)
    schedule = Schedule(block.schedule, block.initial_explore, block.patience, block.reexplore)
    view = View(level=block.observations, scope="all", belief=block.belief)
    task = str(block.task) or (str(config_value(cfg, "meta.task_description"))
                               if has_field(cfg, "meta.task_description") else "")
    return Settings(schedule, view, block.proposer, block.agent, task)


def make_backend(agent: Any):
    """The chat backend the agent block names."""
    from derl_jax.methods.arbo.agent import LocalBackend, OpenAIBackend

    if agent.backend == "local":
        return LocalBackend(agent.checkpoint, agent.tokenizer, temperature=agent.temperature,
                            max_new_tokens=agent.max_tokens)
    return OpenAIBackend(agent.url, agent.model, agent.api_key_env, agent.temperature, agent.max_tokens, agent.timeout_s)
