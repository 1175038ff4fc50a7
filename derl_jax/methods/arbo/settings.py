"""The `arbo` config block (read by `arbo`, `history_search` and `eureka`) and the ablation presets.

    config.arbo.schedule          "adaptive" | "explore_only" | "exploit_only"
    config.arbo.initial_explore   rounds explored first (>= 0)
    config.arbo.patience          mu: unaccepted exploit rounds before re-exploring (>= 1)
    config.arbo.reexplore         nu: at most this many re-exploration rounds (>= 0)
    config.arbo.belief            the searcher reads and writes its belief (bool)
    config.arbo.observations      "full" | "scores" (curves and failure reasons hidden) |
                                  "none" (no scores either; the agent only)
    config.arbo.history           "all" | "incumbent" (only the best so far) |
                                  "retrieved" (only the `retrieve_k` most similar to it)
    config.arbo.retrieve_k        the retriever's k (>= 1)
    config.arbo.framework         the agent works inside the schedule and keeps a belief (bool;
                                  False: neither, the agent only)
    config.arbo.task              a few words about the task, for the prompts
                                  ("" = config.meta.task_description when there is one)
    config.arbo.agent.backend     "openai" | "local"
    config.arbo.agent.url         OpenAI-compatible endpoint base, e.g. http://127.0.0.1:8000/v1
    config.arbo.agent.model       model name sent to the endpoint
    config.arbo.agent.api_key_env environment variable holding the API key ("" for none)
    config.arbo.agent.checkpoint  local Hugging Face chat checkpoint directory (backend "local")
    config.arbo.agent.tokenizer   its tokenizer directory ("" = the checkpoint's)
    config.arbo.agent.temperature, max_tokens, timeout_s, max_turns
    config.arbo.agent.max_tries   tries of each request to the endpoint before the run stops (>= 1)
    config.arbo.agent.retry_base_s, retry_max_s
                                  the backoff between tries: base_s * 2**k seconds, at most
                                  max_s, with seeded jitter (`derl_jax.methods.arbo.endpoint`)

A run without an `arbo` block uses `default_config()`. The ablations are also strategy names:
`arbo_ablation:<name>` (`AGENT_ABLATIONS`) and `history_search_ablation:<name>`
(`STRUCTURAL_ABLATIONS`) apply their preset over the block.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import ml_collections

from derl_jax.config import ConfigError, boolean, choice, config_value, has_field, int_at_least, number
from derl_jax.methods.arbo.proposer import View
from derl_jax.methods.arbo.schedule import KINDS, Schedule

BACKENDS = ("openai", "local")
OBSERVATIONS = ("full", "scores", "none")
HISTORIES = ("all", "incumbent", "retrieved")  # the View scopes
AGENT_ABLATIONS = {
    "no_belief": {"belief": False},
    "no_observations": {"observations": "none"},
    "scores_only": {"observations": "scores"},
    "retriever": {"history": "retrieved"},
    "explore_only": {"schedule": "explore_only"},
    "exploit_only": {"schedule": "exploit_only"},
    "no_framework": {"framework": False},
}
STRUCTURAL_ABLATIONS = {
    "no_belief": {"belief": False},
    "scores_only": {"observations": "scores"},
    "explore_only": {"schedule": "explore_only"},
    "exploit_only": {"schedule": "exploit_only"},
    # the greedy refinement `eureka` ran before it became Eureka's LLM loop
    "greedy": {"schedule": "exploit_only", "initial_explore": 0, "history": "incumbent", "belief": False},
}


def default_config() -> ml_collections.ConfigDict:
    """The `arbo` block's defaults."""
    return ml_collections.ConfigDict({
        "schedule": "adaptive", "initial_explore": 1, "patience": 2, "reexplore": 1,
        "belief": True, "observations": "full", "history": "all", "retrieve_k": 4, "framework": True, "task": "",
        "agent": {"backend": "openai", "url": "http://127.0.0.1:8000/v1", "model": "", "api_key_env": "",
                  "checkpoint": "", "tokenizer": "", "temperature": 0.7, "max_tokens": 1024, "timeout_s": 120.0,
                  "max_turns": 24, "max_tries": 6, "retry_base_s": 1.0, "retry_max_s": 60.0},
    })


def arbo_block(cfg: Any, ablation: str | None = None, ablations: Mapping[str, Mapping] = AGENT_ABLATIONS,
               method: str = "arbo") -> ml_collections.ConfigDict:
    """`cfg.arbo` over the defaults, with the ablation preset (one of `ablations`) applied;
    ConfigError on a bad field."""
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
        if ablation not in ablations:
            raise ConfigError(f"unknown {method} ablation {ablation!r}; expected one of {sorted(ablations)}")
        block.update(dict(ablations[ablation]))
    wrapped = {"arbo": block}
    choice(wrapped, "arbo.schedule", KINDS)
    int_at_least(wrapped, "arbo.initial_explore", 0)
    int_at_least(wrapped, "arbo.patience", 1)
    int_at_least(wrapped, "arbo.reexplore", 0)
    boolean(wrapped, "arbo.belief")
    choice(wrapped, "arbo.observations", OBSERVATIONS)
    choice(wrapped, "arbo.history", HISTORIES)
    int_at_least(wrapped, "arbo.retrieve_k", 1)
    boolean(wrapped, "arbo.framework")
    choice(wrapped, "arbo.agent.backend", BACKENDS)
    number(wrapped, "arbo.agent.temperature", minimum=0.0, strict=False)
    int_at_least(wrapped, "arbo.agent.max_tokens", 1)
    number(wrapped, "arbo.agent.timeout_s", minimum=0.0, strict=True)
    int_at_least(wrapped, "arbo.agent.max_turns", 1)
    int_at_least(wrapped, "arbo.agent.max_tries", 1)
    number(wrapped, "arbo.agent.retry_base_s", minimum=0.0, strict=False)
    number(wrapped, "arbo.agent.retry_max_s", minimum=0.0, strict=False)
    return block


def check_agent_block(block: Any) -> None:
    """The endpoint or the checkpoint the agent block names is given; ConfigError otherwise."""
    if block.agent.backend == "openai" and not str(block.agent.url).startswith(("http://", "https://")):
        raise ConfigError(f"config.arbo.agent.url must be an http(s) URL, got {block.agent.url!r}")
    if block.agent.backend == "local" and not str(block.agent.checkpoint).strip():
        raise ConfigError("config.arbo.agent.checkpoint must name a local chat checkpoint directory "
                          "when config.arbo.agent.backend='local'")


def check_structural_block(block: Any, method: str) -> None:
    """What only the agent can do is not asked of the structural proposer; ConfigError otherwise."""
    if not block.framework:
        raise ConfigError(f"config.arbo.framework=False removes the schedule the structural proposer of "
                          f"{method!r} works in; it is an ablation of the agent (arbo_ablation:no_framework)")
    if block.observations == "none":
        raise ConfigError(f"config.arbo.observations='none' leaves the structural proposer of {method!r} "
                          "nothing to read; it is an ablation of the agent (arbo_ablation:no_observations)")


@dataclasses.dataclass(frozen=True)
class Settings:
    schedule: Schedule
    view: View
    agent: Any  # the agent block (ConfigDict)
    task: str = ""
    framework: bool = True


def read_settings(cfg: Any, ablation: str | None = None, *, ablations: Mapping[str, Mapping] = AGENT_ABLATIONS,
                  method: str = "arbo", agent: bool = True) -> Settings:
    """The settings of `method` from `cfg.arbo` with `ablation` applied; `agent`: the method
    talks to a model (else it is the structural proposer)."""
    block = arbo_block(cfg, ablation, ablations, method)
    check_agent_block(block) if agent else check_structural_block(block, method)
    schedule = Schedule(block.schedule, block.initial_explore, block.patience, block.reexplore)
    view = View(level=block.observations, scope=block.history, belief=block.belief and block.framework,
                k=int(block.retrieve_k))
    task = str(block.task) or (str(config_value(cfg, "meta.task_description"))
                               if has_field(cfg, "meta.task_description") else "")
    return Settings(schedule, view, block.agent, task, bool(block.framework))


def make_backend(agent: Any, seed: int = 0):
    """The chat backend the agent block names; `seed` seeds the retries' jitter."""
    from derl_jax.methods.arbo.agent import LocalBackend, OpenAIBackend
    from derl_jax.methods.arbo.endpoint import Retry

    if agent.backend == "local":
        return LocalBackend(agent.checkpoint, agent.tokenizer, temperature=agent.temperature,
                            max_new_tokens=agent.max_tokens)
    retry = Retry(int(agent.max_tries), float(agent.retry_base_s), float(agent.retry_max_s), seed=int(seed))
    return OpenAIBackend(agent.url, agent.model, agent.api_key_env, agent.temperature, agent.max_tokens, agent.timeout_s,
                         retry)


def run_seed(cfg: Any) -> int:
    """`config.seed` (0 when the config has none)."""
    return int(config_value(cfg, "seed")) if has_field(cfg, "seed") else 0


def describe_backend(agent: Any) -> str:
    """A line naming the model the agent block points at (for the history file)."""
    if agent.backend == "local":
        return f"local checkpoint {agent.checkpoint}"
    return f"openai endpoint {agent.url} model {agent.model or '(server default)'}"
