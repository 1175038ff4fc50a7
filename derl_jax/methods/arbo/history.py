"""The evaluation history of a history-driven reward search, and the queries over it.

Two owners, kept apart:

* observations (the oracle's): one `Observation` per evaluated candidate — text, canonical
  form, validity and failure reason, validation score, per-step inner-training curves.
  Only `append_round`, called from `Strategy.update` with the search loop's records, adds
  them; no query or tool can change them.
* the searcher's own state: `Belief` (diagnoses and intended next steps in words, plus a
  JSON `notes` dict the writer keeps for itself), overwritten every round, and `Lineage`
  (which candidate each proposal refines, or that it opens a new branch).

`History` is an immutable value; `to_json`/`from_json` are exact inverses (the strategy puts
it in the search checkpoint) and `save`/`load` keep it in `<run dir>/arbo/history.json`,
written atomically, so the searcher's workspace survives a kill.

The query functions (`incumbent`, `acceptance_record`, `visible`, `list_candidates`,
`candidate_curves`, `render_*`) are what both the structural proposer and the agent's tools
read. `visible` applies the history ablations: `level="scores"` hides curves and failure
reasons; `scope="incumbent"` shows only the best candidate so far (greedy refinement),
`scope="retrieved"` only the k candidates most similar to it (`retrieve`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from typing import Any, Mapping, Sequence

import numpy as np

from derl_jax.checkpoint import atomic_write_json
from derl_jax.outer.strategy import CandidateRecord

HISTORY_DIR = "arbo"
HISTORY_FILE = "history.json"
FORMAT = 1
MAX_CURVE_POINTS = 64
LEVELS = ("full", "scores")
SCOPES = ("all", "incumbent", "retrieved")
RETRIEVE_K = 4
TOKEN = re.compile(r"g\d+|[A-Za-z_]+|\d+(?:\.\d*)?(?:e-?\d+)?|\*\*|[-+*/(),]")
NO_BRANCH = None  # Lineage.parent of a candidate that opens a new branch


@dataclasses.dataclass(frozen=True)
class Observation(CandidateRecord):
    """One evaluated candidate: the search loop's `CandidateRecord` as the history keeps it, plus
    `id`, its position in the history. `iteration` is the round it was proposed in (also `round`).

    curves: name -> per-step values, a tuple of floats (at most `MAX_CURVE_POINTS`, evenly spaced
    over the run, first and last step included); empty when the candidate was not trained.
    reason: why it was rejected or scored nothing (None when valid and scored).
    duplicate_of: id of the earlier observation whose training this one shares (None: its own).
    """

    id: int = dataclasses.field(kw_only=True)

    @property
    def round(self) -> int:
        return self.iteration

    @property
    def scored(self) -> bool:
        """Valid and trained to a finite score: it can be (or beat) the incumbent."""
        return self.valid and not self.reason


@dataclasses.dataclass(frozen=True)
class Lineage:
    """How candidate `id` came about: `parent` is the candidate it refines (None: a new branch),
    `mode` the scheduled mode ("explore"/"exploit"), `operator` the edit that made it."""

    id: int
    parent: int | None
    mode: str
    operator: str
    note: str = ""


@dataclasses.dataclass(frozen=True)
class Belief:
    """The searcher's diagnoses and intended next steps, written in round `round` (-1: none)."""

    round: int = -1
    diagnoses: tuple[str, ...] = ()
    next_steps: tuple[str, ...] = ()
    notes: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def text(self) -> str:
        if self.round < 0:
            return "(no belief written yet)"
        lines = [f"Belief written in round {self.round}.", "Diagnoses:"]
        lines += [f"- {d}" for d in self.diagnoses] or ["- (none)"]
        lines += ["Next steps:"] + ([f"- {s}" for s in self.next_steps] or ["- (none)"])
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Proposal:
    """What the searcher says about one proposed text (becomes its `Lineage`)."""

    text: str
    parent: int | None
    operator: str
    note: str = ""


@dataclasses.dataclass(frozen=True)
class History:
    """Observations and lineage of `rounds` finished rounds, and the latest belief."""

    observations: tuple[Observation, ...] = ()
    lineage: tuple[Lineage, ...] = ()
    belief: Belief = Belief()
    rounds: int = 0


# --------------------------------------------------------------------------- appending (search loop only)


def thin_curve(values: Any, max_points: int = MAX_CURVE_POINTS) -> tuple[float, ...]:
    """f32[steps] -> at most `max_points` evenly spaced values (first and last kept)."""
    row = np.asarray(values, np.float64).reshape(-1)
    if row.size > max_points:
        row = row[np.unique(np.linspace(0, row.size - 1, max_points).round().astype(int))]
    return tuple(float(v) for v in row)


def append_round(history: History, records: Sequence[Any], proposals: Sequence[Proposal], mode: str,
                 belief: Belief | None) -> History:
    """`history` plus one round: `records` (the search loop's CandidateRecords, in order),
    the lineage of the `proposals` that produced them, and the belief written this round
    (None: keep the previous one)."""
    if len(records) != len(proposals):
        raise ValueError(f"append_round: {len(records)} records but {len(proposals)} proposals")
    start = len(history.observations)
    observations, lineage = [], []
    for offset, (record, proposal) in enumerate(zip(records, proposals)):
        cid = start + offset
        duplicate = record.duplicate_of
        observations.append(Observation(
            id=cid, iteration=history.rounds, index=int(record.index), text=str(record.text),
            canonical=record.canonical, valid=bool(record.valid), reason=record.reason or None,
            score=float(record.score), curves={str(k): thin_curve(v) for k, v in dict(record.curves).items()},
            duplicate_of=None if duplicate is None else start + int(duplicate)))
        parent = proposal.parent if proposal.parent is not None and 0 <= proposal.parent < start else None
        lineage.append(Lineage(cid, parent, mode, proposal.operator, proposal.note))
    return History(observations=history.observations + tuple(observations), lineage=history.lineage + tuple(lineage),
                   belief=history.belief if belief is None else belief, rounds=history.rounds + 1)


# --------------------------------------------------------------------------- queries


def incumbent(history: History, before_round: int | None = None) -> Observation | None:
    """The highest-scoring scored candidate (ties: the earliest), optionally of rounds < before_round."""
    best = None
    for obs in history.observations:
        if before_round is not None and obs.round >= before_round:
            break
        if obs.scored and (best is None or obs.score > best.score):
            best = obs
    return best


def acceptance_record(history: History) -> tuple[bool, ...]:
    """Per finished round: did it produce a new incumbent (the first scored candidate counts)?"""
    accepted, best = [], None
    by_round: list[list[Observation]] = [[] for _ in range(history.rounds)]
    for obs in history.observations:
        by_round[obs.round].append(obs)
    for group in by_round:
        scores = [o.score for o in group if o.scored]
        top = max(scores, default=None)
        improved = top is not None and (best is None or top > best)
        accepted.append(improved)
        if improved:
            best = top
    return tuple(accepted)


def expression_tokens(text: str) -> frozenset[str]:
    """The tokens of an expression text and its adjacent token pairs (what `similarity` compares)."""
    tokens = TOKEN.findall(text)
    return frozenset(tokens) | frozenset(f"{a} {b}" for a, b in zip(tokens, tokens[1:]))


def similarity(a: str, b: str) -> float:
    """Jaccard similarity of two expressions' `expression_tokens` (1: the same tokens and pairs)."""
    left, right = expression_tokens(a), expression_tokens(b)
    return len(left & right) / len(left | right) if left | right else 1.0


def retrieve(history: History, k: int = RETRIEVE_K) -> tuple[Observation, ...]:
    """The k observations most similar (`similarity` of canonical forms, else texts) to the
    incumbent, which is one of them; ties go to the newer. Without an incumbent: the k latest.
    In history order."""
    best = incumbent(history)
    if best is None:
        return history.observations[-k:] if k > 0 else ()
    form = lambda o: o.canonical or o.text  # noqa: E731
    ranked = sorted(history.observations, key=lambda o: (o.id != best.id, -similarity(form(o), form(best)), -o.id))
    return tuple(sorted(ranked[:k], key=lambda o: o.id))


def visible(history: History, level: str = "full", scope: str = "all", k: int = RETRIEVE_K) -> tuple[Observation, ...]:
    """The observations a searcher with this view sees (module docstring); `k` is the
    retriever's (scope "retrieved")."""
    if level not in LEVELS:
        raise ValueError(f"history level must be one of {LEVELS}, got {level!r}")
    if scope not in SCOPES:
        raise ValueError(f"history scope must be one of {SCOPES}, got {scope!r}")
    if scope == "incumbent":
        best = incumbent(history)
        shown = () if best is None else (best,)
    elif scope == "retrieved":
        shown = retrieve(history, k)
    else:
        shown = history.observations
    if level == "scores":
        shown = tuple(dataclasses.replace(o, curves={}, reason=None if o.valid else "invalid") for o in shown)
    return tuple(shown)


def find(observations: Sequence[Observation], cid: Any) -> Observation:
    """The observation with id `cid`; ValueError naming the ids that exist otherwise."""
    if isinstance(cid, bool) or not isinstance(cid, (int, np.integer)):
        raise ValueError(f"candidate id must be an integer, got {cid!r}")
    for obs in observations:
        if obs.id == int(cid):
            return obs
    ids = [o.id for o in observations]
    shown = f"{ids[0]}..{ids[-1]}" if ids else "none yet"
    raise ValueError(f"no candidate {cid} in the history (ids: {shown})")


def list_candidates(observations: Sequence[Observation], lineage: Sequence[Lineage] = ()) -> list[dict]:
    """One summary dict per observation: id, round, text, canonical, valid, reason, score, parent."""
    parents = {entry.id: entry.parent for entry in lineage}
    return [{"id": o.id, "round": o.round, "text": o.text, "canonical": o.canonical, "valid": o.valid,
             "reason": o.reason, "score": o.score, "parent": parents.get(o.id)} for o in observations]


def candidate_curves(observation: Observation) -> dict[str, np.ndarray]:
    """name -> f32[points] curves of one candidate ({} when not trained or hidden)."""
    return {name: np.asarray(values, np.float32) for name, values in observation.curves.items()}


def reward_curve(curves: Mapping[str, Any]) -> np.ndarray | None:
    """The mean-reward curve (`reward_mean` or `reward`), or None."""
    for name in ("reward_mean", "reward"):
        if name in curves:
            return np.asarray(curves[name], np.float32)
    return None


def primitive_curve(curves: Mapping[str, Any], index: int, name: str) -> np.ndarray | None:
    """Primitive `index`'s mean-value curve (`primitive/<name>`, or `primitive/g<i>`), or None."""
    for key in (f"primitive/{name}", f"primitive/g{index + 1}"):
        if key in curves:
            return np.asarray(curves[key], np.float32)
    return None


def render_candidates(observations: Sequence[Observation], lineage: Sequence[Lineage] = (), limit: int = 40) -> str:
    """A text table of the last `limit` candidates, best first marked with '*'."""
    if not observations:
        return "no candidates evaluated yet"
    best = max((o for o in observations if o.scored), key=lambda o: o.score, default=None)
    rows = list_candidates(observations, lineage)[-limit:]
    lines = [f"{len(observations)} candidates ({len(rows)} shown); id round score parent text [reason]"]
    for row in rows:
        mark = "*" if best is not None and row["id"] == best.id else " "
        parent = "-" if row["parent"] is None else str(row["parent"])
        reason = f"  [{row['reason']}]" if row["reason"] else ""
        lines.append(f"{mark}{row['id']:>4} {row['round']:>3} {row['score']:.4f} {parent:>5} {row['text']}{reason}")
    return "\n".join(lines)


def render_curves(observation: Observation, points: int = 8) -> str:
    """Each curve of one candidate as `name: first -> last (min, max): p0 p1 ...` over `points` samples."""
    head = f"candidate {observation.id}: {observation.text}  score {observation.score:.4f}"
    if not observation.curves:
        why = observation.reason or "no curves recorded"
        return f"{head}\n(no curves: {why})"
    lines = [head]
    for name, values in sorted(observation.curves.items()):
        row = np.asarray(values, np.float64)
        finite = row[np.isfinite(row)]
        if finite.size == 0:
            lines.append(f"{name}: not finite")
            continue
        picked = row[np.unique(np.linspace(0, row.size - 1, min(points, row.size)).round().astype(int))]
        lines.append(f"{name}: {row[0]:.4g} -> {row[-1]:.4g} (min {finite.min():.4g}, max {finite.max():.4g}): "
                     + " ".join(f"{v:.3g}" for v in picked))
    return "\n".join(lines)


# --------------------------------------------------------------------------- JSON and files


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def to_json(history: History) -> dict:
    """A JSON-able dict (non-finite curve values become null)."""
    return {
        "format": FORMAT,
        "rounds": history.rounds,
        "observations": [_observation_to_json(o) for o in history.observations],
        "lineage": [dataclasses.asdict(entry) for entry in history.lineage],
        "belief": {"round": history.belief.round, "diagnoses": list(history.belief.diagnoses),
                   "next_steps": list(history.belief.next_steps), "notes": dict(history.belief.notes)},
    }


def _observation_to_json(o: Observation) -> dict:
    return {"id": o.id, "round": o.round, "index": o.index, "text": o.text, "canonical": o.canonical,
            "valid": o.valid, "reason": o.reason, "score": o.score,
            "curves": {k: [_number(v) for v in vs] for k, vs in o.curves.items()}, "duplicate_of": o.duplicate_of}


def _observation_from_json(o: Mapping[str, Any]) -> Observation:
    fields = {k: v for k, v in o.items() if k != "round"}
    curves = {k: tuple(math.nan if v is None else float(v) for v in vs) for k, vs in o["curves"].items()}
    return Observation(**{**fields, "iteration": o["round"], "curves": curves})


def from_json(data: Mapping[str, Any]) -> History:
    """The inverse of `to_json`; ValueError on another format."""
    if data.get("format") != FORMAT:
        raise ValueError(f"history: unknown format {data.get('format')!r} (expected {FORMAT})")
    observations = tuple(_observation_from_json(o) for o in data["observations"])
    belief = data["belief"]
    return History(
        observations=observations,
        lineage=tuple(Lineage(**entry) for entry in data["lineage"]),
        belief=Belief(round=int(belief["round"]), diagnoses=tuple(belief["diagnoses"]),
                      next_steps=tuple(belief["next_steps"]), notes=dict(belief["notes"])),
        rounds=int(data["rounds"]),
    )


def history_path(run_dir: str | os.PathLike) -> str:
    return os.path.join(os.fspath(run_dir), HISTORY_DIR, HISTORY_FILE)


def save(history: History, run_dir: str | os.PathLike, about: Mapping[str, Any] | None = None) -> str:
    """Write `<run_dir>/arbo/history.json` atomically; returns the path. `about` (e.g. the method
    and its proposer) is written beside the history's own keys; `load` leaves it out."""
    path = history_path(run_dir)
    atomic_write_json(path, {**dict(about or {}), **to_json(history)}, indent=None)
    return path


def load(run_dir: str | os.PathLike) -> History | None:
    """The history saved in `run_dir`, or None when there is none."""
    path = history_path(run_dir)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        try:
            data = json.load(handle)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from err
    return from_json(data)
