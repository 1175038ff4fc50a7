"""Eureka's loop: one LLM call per round from a fixed prompt, n sampled rewards, a reward reflection.

Round 0 sends [system, task message]: the task, the reward language, the primitives (each with
its function's source) and the request for one reward expression in a ```reward block. Each
later round continues from the best candidate of the latest round that scored one (Eureka goes
on from an iteration's best sample, and repeats an iteration whose samples all failed):
[system, task message, assistant: that candidate's reward, user: its reward reflection]. The
reflection is the candidate's validation score and its curves from inner training (the
reward's mean, each primitive's mean value, the GRPO statistics: `CandidateRecord.curves` as
the history keeps them), then the request for an improved reward.

One `backend.complete(messages, n, seed)` call samples the round's n replies (no tools). Each
reply is read by `extract_expression`; a reply without one, or with one that does not parse,
becomes an invalid candidate all the same (its text as found, "" when none), whose reason the
search's checker records, and the lineage note says what was read. An answer that is not a
chat completion (asked twice) leaves the round's n candidates empty and invalid; an endpoint
that stays down through the backend's retries (`EndpointDown`) stops the search before the
round is charged. The model is `config.arbo.agent`'s
(an OpenAI-compatible endpoint or a local checkpoint); `config.arbo.task` names the task.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import jax

from derl_jax.methods.arbo import history as hist
from derl_jax.methods.arbo.schedule import EXPLOIT, EXPLORE
from derl_jax.methods.arbo.settings import describe_backend, make_backend, read_settings, run_seed
from derl_jax.methods.arbo.sources import domain_kind
from derl_jax.methods.arbo.strategy import ArboState, HistoryStrategy, RoundPlan, save_transcript
from derl_jax.methods.arbo.tools import LANGUAGE, MAX_NOTE
from derl_jax.outer.registry import register_strategy
from derl_jax.outer.strategy import StrategyContext
from primitives.registry import with_names

FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|$)", re.DOTALL)
ASSIGNMENT = re.compile(r"\breward\s*[=:]|^\s*r\s*=|^\s*return\b", re.IGNORECASE)
REFLECTION_POINTS = 10
BACKEND_TRIES = 2

SYSTEM = ("You are a reward engineer. You write reward functions that let reinforcement learning train a "
          "language-model policy to solve its task. Answer with one reward expression in a ```reward block.")


def _assigned(line: str) -> str:
    """What follows the last `reward =` / `reward:` of a line (or a leading `r =` / `return`), else ""."""
    ends = [match.end() for match in ASSIGNMENT.finditer(line)]
    return line[ends[-1]:].strip() if ends else ""


def extract_expression(reply: str) -> tuple[str, str]:
    """(expression text, how it was found) from a reply: the last `reward = ...` line of the first
    fenced block, else that block's last non-empty line; without a block, the reply's last
    `reward = ...` line (also in a sentence: "I would use reward = g1*g2"); ("", "no expression
    in the reply") when there is none."""
    block = FENCE.search(reply)
    body = block.group(1) if block else reply
    lines = [line.strip() for line in body.splitlines() if line.strip() and not line.strip().startswith("#")]
    assigned = [text for text in map(_assigned, lines) if text]
    if assigned:
        found, how = assigned[-1], "the reward line" + (" of the code block" if block else "")
    elif block and lines:
        found, how = lines[-1], "the code block"
    else:
        return "", "no expression in the reply"
    return found.rstrip(";").strip(), f"read from {how}"


def task_message(primitive_names: Sequence[str], outcome_index: int, task: str, sources: Mapping[str, str]) -> str:
    """The fixed first user message: the task, the reward language, the primitives and their code."""
    prims = []
    for i, name in enumerate(primitive_names):
        role = " (the task outcome)" if i == outcome_index else ""
        code = sources.get(f"primitives/{name}.py", "").strip()
        prims.append(f"g{i + 1} = {name}{role}" + (f"\n```python\n{code}\n```" if code else ""))
    return ("Write a reward function for reinforcement learning (GRPO) of a language-model policy"
            + (f" on {task}" if task else "") + ". The reward is one arithmetic expression over these primitives "
            "(each scores one aspect of a rollout, one value per rollout):\n\n" + "\n\n".join(prims)
            + f"\n\nusing {LANGUAGE}. The policy trained with your reward is scored by its accuracy on a validation "
            "split. Answer with the expression in a ```reward block.")


def reflection(obs: hist.Observation) -> str:
    """The reward reflection of one evaluated candidate: its score and its inner-training curves."""
    curves = hist.render_curves(obs, points=REFLECTION_POINTS).splitlines()[1:]
    return (f"We trained a policy with this reward. Its validation accuracy is {obs.score:.4f}.\n"
            "During training, the mean of each quantity over the rollouts, at evenly spaced steps "
            "(name: first -> last (min, max): values):\n" + "\n".join(curves) + "\n\n"
            "Analyse this feedback and write an improved reward. A primitive whose values barely move gives the "
            "policy nothing to learn from: rescale it, rewrite it or drop it; a term far larger than the others "
            "drowns them: rescale it; if the accuracy stays low, consider a different reward altogether. "
            "Answer with the new expression in a ```reward block.")


def reflected(history: hist.History) -> hist.Observation | None:
    """The best scored candidate of the latest round that has one (None before any)."""
    for round_index in range(history.rounds - 1, -1, -1):
        scored = [o for o in history.observations if o.round == round_index and o.scored]
        if scored:
            return max(scored, key=lambda o: (o.score, -o.id))
    return None


def messages_for(history: hist.History, first: str) -> tuple[list[dict], hist.Observation | None]:
    """The round's conversation and the candidate it reflects on (module docstring)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first}]
    best = reflected(history)
    if best is not None:
        messages += [{"role": "assistant", "content": f"```reward\n{best.text}\n```"},
                     {"role": "user", "content": reflection(best)}]
    return messages, best


@register_strategy("eureka")
class EurekaStrategy(HistoryStrategy):
    """Eureka's sampling and reward reflection (module docstring)."""

    proposer = "eureka"

    def __init__(self, primitive_names: Sequence[str], outcome_index: int = 0, *, backend: Any,
                 sources: Mapping[str, str] = (), **kwargs):
        super().__init__(primitive_names, outcome_index, **kwargs)
        self.backend = backend
        self.sources = dict(sources)

    @classmethod
    def from_config(cls, name: str, context: StrategyContext) -> "EurekaStrategy":
        from derl_jax.methods.arbo.sources import primitive_sources

        settings = read_settings(context.cfg, method=name)
        return cls(context.primitive_names, context.outcome_index,
                   backend=make_backend(settings.agent, run_seed(context.cfg)),
                   sources=primitive_sources(context.cfg, context.primitive_names, context.outcome_index),
                   task=settings.task, workdir=context.workdir, about={"backend": describe_backend(settings.agent)},
                   domain=domain_kind(context.cfg))

    @classmethod
    def check_config(cls, cfg: Any, name: str) -> None:
        read_settings(cfg, method=name)

    def mode(self, state: ArboState) -> str:
        return EXPLORE if reflected(state.history) is None else EXPLOIT

    def propose(self, state: ArboState, key: Any, n: int) -> tuple[list[str], RoundPlan]:
        from derl_jax.methods.arbo.agent import BackendError

        first = task_message(self.primitive_names, self.outcome_index, self.task, self.sources)
        messages, best = messages_for(state.history, first)
        seed = int(jax.random.randint(key, (), 0, 2**30))
        replies, errors, stopped = None, 0, ""
        while replies is None and errors < BACKEND_TRIES:
            try:
                replies = list(self.backend.complete(messages, n, seed + errors))
            except BackendError as err:
                errors, stopped = errors + 1, str(err)
        replies = (replies or []) + [None] * (n - len(replies or []))
        proposals = []
        for reply in replies[:n]:
            text, how = extract_expression(reply) if reply is not None else ("", f"no reply: {stopped}")
            text = with_names(text, self.domain, self.primitive_names) if self.domain else text
            proposals.append(hist.Proposal(text, None if best is None else best.id, "eureka", how[:MAX_NOTE]))
        stats = {"eureka_replies": float(sum(r is not None for r in replies[:n])),
                 "eureka_extracted": float(sum(bool(p.text) for p in proposals)),
                 "eureka_backend_errors": float(errors)}
        if self.workdir is not None:
            save_transcript(self.workdir, state.history.rounds, messages, {
                **self.describe(), "seed": seed, "replies": [r for r in replies[:n]], "stopped": stopped})
        mode = EXPLORE if best is None else EXPLOIT
        return [p.text for p in proposals], RoundPlan(mode, tuple(proposals), None, stats)
