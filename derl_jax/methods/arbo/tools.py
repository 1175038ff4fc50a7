"""The agent's workspace: files over the history, and the tools that read, write and submit.

    workspace = Workspace(history, view, primitive_names, wanted=n, sources=source_files(cfg, names))
    reply = workspace.call("read_file", '{"path": "evaluation_log.md"}')   # always a string, never raises

Files (what `list_files` shows; all read-only but the last two):

  task.md                  the task, the reward language, the primitives, what a score is
  env/<module>.py          the source of the module that builds the domain (`sources`)
  primitives/<name>.py     the source of each primitive's function
  evaluation_log.md        the oracle's log: one line per candidate (id, round, score, parent,
                           expression, failure reason)
  candidates/<id>.md       one evaluated candidate: expression, lineage and the agent's note,
                           score, failure reason, its inner-training curves
  analysis.md              the agent's own notes, kept across rounds (writable)
  belief.md                the agent's diagnoses and intended next steps, rewritten every round
                           (writable; a line "Next steps:" separates the two)

The oracle's files follow the searcher's `View`, so the ablations hide the same things from
the agent as from the structural proposer: `level="scores"` drops curves and failure reasons,
`level="none"` drops the evaluation log and every score, curve and reason (the candidates'
files keep the expression and its lineage); `scope` keeps only the incumbent or the retrieved
candidates. With `view.belief` off, analysis.md and belief.md do not exist.

Tools: `list_files`, `read_file(path, start, lines)`, `write_file(path, content)`,
`submit_candidate(expression, parent, note)`. A call with an unknown name, arguments that are
not a JSON object, a missing or mistyped argument, or a file that does not exist or is
read-only gets an answer starting with "error:" that the agent reads and can act on. Every
submitted expression is a candidate of the round and is charged like any method's proposal
(budgets are equal by construction): one that does not parse, fails `check_text`, or repeats
one already submitted or evaluated takes its slot all the same (the search scores it 0, or
shares or repeats the training as it does for every method), and the answer says so, starting
with "error:". The observations cannot be changed through any tool.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any, Mapping, Sequence

from derl_jax.expr.canonical import canonical
from derl_jax.expr.check import check_text
from derl_jax.methods.arbo import history as hist
from derl_jax.methods.arbo.proposer import View

MAX_NOTE = 200
MAX_FILE_CHARS = 20_000
READ_LINES = 200          # lines `read_file` returns unless asked for fewer
CURVE_POINTS = 16         # points of each curve in a candidate's file
TASK_FILE, LOG_FILE = "task.md", "evaluation_log.md"
ANALYSIS_FILE, BELIEF_FILE = "analysis.md", "belief.md"
NEXT_STEPS = re.compile(r"^\W*next steps?\b\W*", re.IGNORECASE)
LANGUAGE = ("numbers, + - * / ** (constant exponents), min(a,b), max(a,b), abs(a), clip(x,lo,hi), and "
            "u = the fraction of inner training done (0 on the first step, 1 on the last)")


def _function(name: str, description: str, properties: dict, required: Sequence[str] = ()) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": list(required)}}}


LIST_FILES = _function("list_files", "List the workspace's files with their sizes and whether you may write them.", {})
READ_FILE = _function("read_file", f"Read a file, {READ_LINES} lines at a time from line `start` (1-based).",
                      {"path": {"type": "string"}, "start": {"type": "integer"}, "lines": {"type": "integer"}}, ["path"])
WRITE_FILE = _function("write_file", f"Overwrite {ANALYSIS_FILE} (your notes) or {BELIEF_FILE} (diagnoses, then a line "
                       "'Next steps:' and what you intend to do next).",
                       {"path": {"type": "string"}, "content": {"type": "string"}}, ["path", "content"])
SUBMIT = _function("submit_candidate", "Submit one reward expression for evaluation. parent: the id of the "
                   "candidate it refines, or null for a new branch; note: a few words on why.",
                   {"expression": {"type": "string"}, "parent": {"type": ["integer", "null"]},
                    "note": {"type": "string"}}, ["expression"])


def task_text(primitive_names: Sequence[str], outcome_index: int = 0, task: str = "") -> str:
    """task.md: what is searched for, the reward language and the primitives."""
    prims = "\n".join(f"- g{i + 1} = {name}" + (" (the task outcome)" if i == outcome_index else "")
                      for i, name in enumerate(primitive_names))
    return ("# Task\n\nFind a reward function for reinforcement learning (GRPO) of a language-model policy"
            + (f" on {task}" if task else "") + ".\n\nA reward is one arithmetic expression over the primitives\n"
            f"{prims}\nusing {LANGUAGE}. Each primitive's code is in primitives/<name>.py, the domain's in env/.\n\n"
            "Each candidate trains one policy from the same start; its score is the trained policy's accuracy on "
            "the validation split (0 when the expression was rejected or training failed). The search keeps the "
            "highest-scoring candidate.\n")


def belief_from_text(text: str, round_index: int, analysis: str | None) -> hist.Belief:
    """belief.md as a `Belief`: lines before a "Next steps" line are diagnoses, after it next
    steps (bullets and headings stripped); the text itself and the analysis go into `notes`."""
    diagnoses: list[str] = []
    steps: list[str] = []
    target = diagnoses
    for line in text.splitlines():
        stripped = line.strip()
        if NEXT_STEPS.match(stripped):
            target, stripped = steps, NEXT_STEPS.sub("", stripped)
        stripped = stripped.lstrip("-*# ").strip()
        if stripped and stripped.lower().rstrip(":") != "diagnoses":
            target.append(stripped)
    notes = {"belief": text}
    if analysis is not None:
        notes["analysis"] = analysis
    return hist.Belief(round=round_index, diagnoses=tuple(diagnoses), next_steps=tuple(steps), notes=notes)


@dataclasses.dataclass
class Workspace:
    """One round's files and tool state: what the agent sees, what it wrote and submitted."""

    history: hist.History
    view: View
    primitive_names: tuple[str, ...]
    outcome_index: int = 0
    wanted: int = 1
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)
    task: str = ""
    submitted: list[hist.Proposal] = dataclasses.field(default_factory=list)
    errors: int = 0
    belief_written: bool = False
    domain: str | None = None   # its primitives' aliases in a submission are read as their names

    def __post_init__(self):
        self.primitive_names = tuple(self.primitive_names)
        self.observations = self.view.observations(self.history)
        self.lineage = {entry.id: entry for entry in self.history.lineage}
        notes = self.history.belief.notes if self.view.belief else {}
        self.analysis = str(notes.get("analysis", ""))
        self.belief_text = str(notes.get("belief", "")) or (self.history.belief.text() if self.view.belief else "")
        self.analysis_written = False
        self._keys: list[str] = []
        self._files = self._render()

    # ----------------------------------------------------------------------- files

    @property
    def scores_shown(self) -> bool:
        return self.view.level != "none"

    def _render(self) -> dict[str, str]:
        files = {TASK_FILE: task_text(self.primitive_names, self.outcome_index, self.task)}
        files.update(self.sources)
        if self.scores_shown:
            files[LOG_FILE] = self._log()
        for obs in self.observations:
            files[f"candidates/{obs.id}.md"] = self._candidate(obs)
        return files

    def _log(self) -> str:
        lineage = [self.lineage[o.id] for o in self.observations if o.id in self.lineage]
        return hist.render_candidates(self.observations, lineage, limit=len(self.observations) or 1) + "\n"

    def _candidate(self, obs: hist.Observation) -> str:
        entry = self.lineage.get(obs.id)
        origin = "opens a new branch" if entry is None or entry.parent is None else f"refines candidate {entry.parent}"
        lines = [f"# candidate {obs.id}", f"expression: {obs.text}", f"canonical: {obs.canonical or '-'}",
                 f"round {obs.round}" + (f", {entry.mode}" if entry is not None else "") + f", {origin}"]
        if entry is not None:
            lines.append(f"proposed by: {entry.operator}" + (f" ({entry.note})" if entry.note else ""))
        if obs.duplicate_of is not None:
            lines.append(f"trained once with candidate {obs.duplicate_of} (the same canonical form)")
        if self.scores_shown:
            lines.append(f"score: {obs.score:.4f}")
            if obs.reason:
                lines.append(f"failure: {obs.reason}")
            if obs.curves:
                lines += ["", "inner-training curves (name: first -> last (min, max): values at evenly spaced steps):"]
                lines += hist.render_curves(obs, points=CURVE_POINTS).splitlines()[1:]
        return "\n".join(lines) + "\n"

    def files(self) -> dict[str, str]:
        """Every file's current text, the writable ones included."""
        files = dict(self._files)
        if self.view.belief:
            files[ANALYSIS_FILE] = self.analysis
            files[BELIEF_FILE] = self.belief_text
        return files

    @property
    def writable(self) -> tuple[str, ...]:
        return (ANALYSIS_FILE, BELIEF_FILE) if self.view.belief else ()

    def listing(self) -> str:
        """`list_files`' answer."""
        rows = []
        for path, text in self.files().items():
            count = len(text.splitlines())
            rows.append(f"{path}  ({count} lines, {'writable' if path in self.writable else 'read-only'})")
        return "\n".join(rows)

    # ----------------------------------------------------------------------- tools

    def tool_specs(self) -> list[dict]:
        return [LIST_FILES, READ_FILE, *([WRITE_FILE] if self.view.belief else []), SUBMIT]

    @property
    def done(self) -> bool:
        return len(self.submitted) >= self.wanted

    @property
    def belief(self) -> hist.Belief | None:
        """The belief to keep after this round (None: nothing was written, keep the previous)."""
        if not self.view.belief or not (self.belief_written or self.analysis_written):
            return None
        if self.belief_written:
            return belief_from_text(self.belief_text, self.history.rounds, self.analysis)
        old = self.history.belief
        return dataclasses.replace(old, notes={**old.notes, "analysis": self.analysis})

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
        if name == "list_files":
            return self.listing()
        if name == "read_file":
            return self._read(_get(args, "path", str), args.get("start", 1), args.get("lines", READ_LINES))
        if name == "write_file":
            return self._write(_get(args, "path", str), _get(args, "content", str))
        return self._submit(args)

    def _read(self, path: str, start: Any, count: Any) -> str:
        files = self.files()
        if path not in files:
            raise ToolError(f"no file {path!r}; list_files shows the files")
        start, count = (_integer(value, key) for key, value in (("start", start), ("lines", count)))
        lines = files[path].splitlines()
        if not lines:
            return f"{path} is empty"
        if not 1 <= start <= len(lines):
            raise ToolError(f"start must be between 1 and {len(lines)} (the lines of {path}), got {start}")
        if count < 1:
            raise ToolError(f"lines must be at least 1, got {count}")
        end = min(len(lines), start + min(count, READ_LINES) - 1)
        return f"{path}: lines {start}-{end} of {len(lines)}\n" + "\n".join(lines[start - 1:end])

    def _write(self, path: str, content: str) -> str:
        if path not in self.writable:
            what = "a file you may read" if path in self.files() else "not a file of the workspace"
            raise ToolError(f"{path!r} is {what}, not one you may write; you may write {list(self.writable)}")
        if len(content) > MAX_FILE_CHARS:
            raise ToolError(f"content has {len(content)} characters; at most {MAX_FILE_CHARS}")
        if path == BELIEF_FILE:
            self.belief_text, self.belief_written = content, True
        else:
            self.analysis, self.analysis_written = content, True
        return f"{path} written ({len(content.splitlines())} lines)"

    def _submit(self, args: dict) -> str:
        if self.done:
            raise ToolError(f"all {self.wanted} candidates of this round are submitted")
        text = _get(args, "expression", str).strip()
        if self.domain:
            from primitives.registry import with_names

            text = with_names(text, self.domain, self.primitive_names)
        parent = args.get("parent")
        note = args.get("note", "")
        if parent is not None:
            try:
                parent = hist.find(self.observations, parent).id
            except ValueError as err:
                raise ToolError(f"parent: {err}") from None
        if not isinstance(note, str):
            raise ToolError(f"note must be a string, got {type(note).__name__}")
        problem = self._screen(text)
        self.submitted.append(hist.Proposal(text, parent, "agent", note[:MAX_NOTE]))
        done = f"submitted {len(self.submitted)} of {self.wanted}"
        if problem:
            raise ToolError(f"{problem}; it is charged all the same ({done})")
        return done

    def _screen(self, text: str) -> str:
        """What is wrong with submitting `text` ("" when nothing): invalid, or a repeat."""
        tree, validity = check_text(text, self.primitive_names, outcome_index=self.outcome_index)
        if tree is None or not validity.ok:
            detail = f" ({validity.detail})" if validity.detail else ""
            return f"expression {text!r} is not a valid reward: {validity.reason}{detail}"
        key = canonical(tree)
        if key in self._keys:
            return f"expression {text!r} repeats a candidate submitted this round"
        self._keys.append(key)
        shown = next((o for o in self.observations if o.canonical == key), None)
        if shown is not None:
            return f"expression {text!r} repeats candidate {shown.id} ({shown.text})"
        if any(o.canonical == key for o in self.history.observations):
            return f"expression {text!r} repeats a candidate evaluated earlier"
        return ""


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


def _integer(value: Any, key: str) -> int:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ToolError(f"argument {key!r} must be an integer, got {value!r}")
    return value


def _get(args: dict, key: str, kind: type) -> Any:
    if key not in args:
        raise ToolError(f"missing argument {key!r}")
    if kind is int:
        return _integer(args[key], key)
    value = args[key]
    if not isinstance(value, kind):
        raise ToolError(f"argument {key!r} must be a string, got {value!r}")
    return value
