"""The agent's tools over the history: list candidates, show curves, read/write the belief, commit.

    workspace = Workspace(history, view, primitive_names, outcome_index, wanted=n)
    reply = workspace.call("show_curves", '{"candidate": 3}')     # always a string, never raises

Every tool reads through the query functions of `derl_jax.methods.arbo.history` under the
searcher's `View` (so the ablations hide the same things from the agent as from the
structural proposer); with `view.belief` off the belief tools are not offered. The
observations cannot be changed through any tool. A call with an unknown name, arguments that
are not a JSON object, a missing or mistyped argument, or a candidate that does not parse or
fails `check_text` gets an answer starting with "error:" that the agent reads and can act on.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

from derl_jax.expr.canonical import canonical
from derl_jax.expr.check import check_text
from derl_jax.methods.arbo import history as hist
from derl_jax.methods.arbo.proposer import View

MAX_NOTE = 200


def _function(name: str, description: str, properties: dict, required: Sequence[str] = ()) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(required)}}}


LIST_CANDIDATES = _function("list_candidates", "Table of evaluated candidates: id, round, validation score, "
                            "parent id, expression, failure reason. '*' marks the best.", {})
SHOW_CURVES = _function("show_curves", "Inner-training curves of one candidate (mean reward, each primitive's "
                        "mean value, training statistics).", {"candidate": {"type": "integer"}}, ["candidate"])
READ_BELIEF = _function("read_belief", "Your diagnoses and intended next steps as last written.", {})
WRITE_BELIEF = _function("write_belief", "Overwrite your belief: diagnoses and intended next steps, one per line.",
                         {"diagnoses": {"type": "string"}, "next_steps": {"type": "string"}}, ["diagnoses", "next_steps"])
COMMIT = _function("commit_candidate", "Commit one reward expression for evaluation. parent: the id of the "
                   "candidate it refines, or null for a new branch.",
                   {"expression": {"type": "string"}, "parent": {"type": ["integer", "null"]},
                    "note": {"type": "string"}}, ["expression"])


@dataclasses.dataclass
class Workspace:
    """One round's tool state: what the agent sees, its belief, and what it has committed."""

    history: hist.History
    view: View
    primitive_names: tuple[str, ...]
    outcome_index: int = 0
    wanted: int = 1
    belief: hist.Belief | None = None
    committed: list[hist.Proposal] = dataclasses.field(default_factory=list)
    errors: int = 0

    def __post_init__(self):
        self.primitive_names = tuple(self.primitive_names)
        self.observations = self.view.observations(self.history)
        self.lineage = self.history.lineage if self.view.scope == "all" else ()
        if self.belief is None and self.view.belief:
            self.belief = self.history.belief
        self.committed_keys: list[str] = []

    def tool_specs(self) -> list[dict]:
        belief_tools = [READ_BELIEF, WRITE_BELIEF] if self.view.belief else []
        return [LIST_CANDIDATES, SHOW_CURVES, *belief_tools, COMMIT]

    @property
    def done(self) -> bool:
        return len(self.committed) >= self.wanted

    def call(self, name: Any, arguments: Any) -> str:
        """Run tool `name` with `arguments` (a JSON object text or a dict); errors come back as text."""
        try:
            return self._call(name, arguments)
        except ToolError as err:
            self.errors += 1
            return f"error: {err}"

    def _call(self, name: Any, arguments: Any) -> str:
        tools = {spec["function"]["name"] for spec in self.tool_specs()}
        if name not in tools:
            raise ToolError(f"unknown tool {name!r}; the tools are {sorted(tools)}")
        args = _arguments(arguments)
        if name == "list_candidates":
            return hist.render_candidates(self.observations, self.lineage)
        if name == "show_curves":
            try:
                return hist.render_curves(hist.find(self.observations, _get(args, "candidate", int)))
            except ValueError as err:
                raise ToolError(str(err)) from None
        if name == "read_belief":
            return self.belief.text()
        if name == "write_belief":
            lines = [_get(args, key, str) for key in ("diagnoses", "next_steps")]
            diagnoses, steps = (tuple(s.strip() for s in text.splitlines() if s.strip()) for text in lines)
            self.belief = hist.Belief(round=self.history.rounds, diagnoses=diagnoses, next_steps=steps)
            return "belief written"
        return self._commit(args)

    def _commit(self, args: dict) -> str:
        if self.done:
            raise ToolError(f"all {self.wanted} candidates of this round are committed")
        text = _get(args, "expression", str).strip()
        parent = args.get("parent")
        note = args.get("note", "")
        if parent is not None:
            try:
                parent = hist.find(self.observations, parent).id
            except ValueError as err:
                raise ToolError(f"parent: {err}") from None
        if not isinstance(note, str):
            raise ToolError(f"note must be a string, got {type(note).__name__}")
        tree, validity = check_text(text, self.primitive_names, outcome_index=self.outcome_index)
        if tree is None or not validity.ok:
            detail = f" ({validity.detail})" if validity.detail else ""
            raise ToolError(f"expression {text!r} is not a valid reward: {validity.reason}{detail}")
        key = canonical(tree)
        if key in self.committed_keys:
            raise ToolError(f"expression {text!r} repeats a candidate committed this round")
        self.committed_keys.append(key)
        self.committed.append(hist.Proposal(text, parent, "agent", note[:MAX_NOTE]))
        return f"committed {len(self.committed)} of {self.wanted}"


class ToolError(ValueError):
    """A tool call the agent got wrong; its message goes back to the agent."""


def _arguments(arguments: Any) -> dict:
    if isinstance(arguments, dict):
        return arguments
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if not isinstance(arguments, str):
        raise ToolError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError as err:
        raise ToolError(f"arguments are not valid JSON ({err.msg} at {err.pos}): {arguments[:120]!r}") from None
    if not isinstance(value, dict):
        raise ToolError(f"arguments must be a JSON object, got {arguments[:120]!r}")
    return value


def _get(args: dict, key: str, kind: type) -> Any:
    if key not in args:
        raise ToolError(f"missing argument {key!r}")
    value = args[key]
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ToolError(f"argument {key!r} must be {'an integer' if kind is int else 'a string'}, got {value!r}")
    return value
