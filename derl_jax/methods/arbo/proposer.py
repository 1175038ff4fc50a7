"""The structural proposer: explicit diagnoses of the history turned into edits of reward expressions.

    proposals, belief = propose_structural(history, mode, key, n, primitive_names, view=View())

Reads the history only through the query functions of `derl_jax.methods.arbo.history` (the
same ones the agent's tools call), under a `View` (the history ablations).

exploit (refine the incumbent): the incumbent is split into weighted terms
(`0.5*g2 + g1*(1-u)` -> [(0.5, g2), (1, g1*(1-u))]) and diagnosed from its curves:

  flat       a primitive of the expression whose curve never moves (range < `FLAT_RANGE`):
             saturated (mean > 0.9: no signal left) -> drop its term; stuck low -> double its
             weight, or swap in a primitive the expression does not use (terms holding the
             outcome primitive are never dropped, and the outcome is never swapped out);
  dominant   a non-outcome term carrying more than `DOMINANT_SHARE` of the reward (its mean
             |contribution| over training, evaluated on the primitives' mean curves) ->
             halve it, or anneal it with (1-u);
  plateau    the reward curve gains less than `PLATEAU_GAIN` of its range in the second half
             of training -> add an unused primitive at weight 0.25, double the outcome term,
             or anneal the shaping terms;
  failure    refinements of the incumbent that failed last round (invalid, non-finite): the
             operator that made them is ranked last this round.

Every other single edit (halve/double/drop a term, add an unused primitive, halve/double one
constant) follows at lower priority. explore (a fresh structure): one of the `TEMPLATES` over a random subset of the
primitives, favouring primitives whose curves moved somewhere in the history and templates
tried least often.

The belief, in words (diagnoses, next steps), is rewritten every round; its `notes` keep
per-operator credit `[tries, wins]` (a win: the child beat its parent, or for a new branch,
the incumbent before its round), which ranks operators when `view.belief` is on. Proposals
always parse and pass `check_text`; already-seen canonical forms are skipped while novel
ones remain. Deterministic given the history and the key.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import jax
import numpy as np

from derl_jax.expr.ast import Binary, Expr, Num, Prim, Unary, Var, primitive_indices
from derl_jax.expr.canonical import canonical
from derl_jax.expr.check import check_text
from derl_jax.expr.parse import ExpressionError, parse, to_text
from derl_jax.expr.vm import evaluate_numpy
from derl_jax.methods.arbo import history as hist
from derl_jax.methods.arbo.schedule import EXPLOIT, EXPLORE

FLAT_RANGE = 0.02
SATURATED = 0.9
DOMINANT_SHARE = 0.7
PLATEAU_GAIN = 0.05
ADD_WEIGHT = 0.25
TEMPLATES = ("sum", "gate", "anneal", "min", "product")
EXPLORE_WEIGHTS = (0.1, 0.25, 0.5, 1.0)
MAX_DRAWS_PER_PROPOSAL = 40


@dataclasses.dataclass(frozen=True)
class View:
    """What the searcher may read: `level` ("full"/"scores"; the agent's workspace also knows
    "none"), `scope` ("all"/"incumbent"/"retrieved", with `k` the retriever's k), `belief`
    (read and use its own belief and credit)."""

    level: str = "full"
    scope: str = "all"
    belief: bool = True
    k: int = hist.RETRIEVE_K

    def observations(self, history: hist.History) -> tuple[hist.Observation, ...]:
        """The visible observations; with level "none" those of "scores", whose scores the
        workspace then leaves out."""
        return hist.visible(history, "scores" if self.level == "none" else self.level, self.scope, self.k)


@dataclasses.dataclass(frozen=True)
class Edit:
    expr: Expr
    operator: str
    note: str
    priority: float


# --------------------------------------------------------------------------- terms


def _scale_of(expr: Expr) -> tuple[float, Expr | None]:
    if isinstance(expr, Num):
        return expr.value, None
    if isinstance(expr, Binary) and expr.op == "*":
        if isinstance(expr.left, Num):
            c, body = _scale_of(expr.right)
            return expr.left.value * c, body
        if isinstance(expr.right, Num):
            c, body = _scale_of(expr.left)
            return expr.right.value * c, body
    if isinstance(expr, Binary) and expr.op == "/" and isinstance(expr.right, Num) and expr.right.value != 0:
        c, body = _scale_of(expr.left)
        return c / expr.right.value, body
    return 1.0, expr


def split_terms(expr: Expr, sign: float = 1.0) -> list[tuple[float, Expr | None]]:
    """Top-level sum of `expr` as [(weight, body)] (body None: a constant term)."""
    if isinstance(expr, Binary) and expr.op in "+-":
        right_sign = sign if expr.op == "+" else -sign
        return split_terms(expr.left, sign) + split_terms(expr.right, right_sign)
    if isinstance(expr, Unary):
        return split_terms(expr.operand, -sign)
    weight, body = _scale_of(expr)
    return [(sign * weight, body)]


def _round(value: float) -> float:
    return float(f"{value:.4g}")


def join_terms(terms: Sequence[tuple[float, Expr | None]]) -> Expr | None:
    """The sum of weighted terms (zero weights dropped; None when nothing is left)."""
    total: Expr | None = None
    for weight, body in terms:
        weight = _round(weight)
        if weight == 0:
            continue
        magnitude = abs(weight)
        node = Num(magnitude) if body is None else body if magnitude == 1 else Binary("*", Num(magnitude), body)
        if total is None:
            total = node if weight > 0 else Unary("neg", node)
        else:
            total = Binary("+" if weight > 0 else "-", total, node)
    return total


def anneal(body: Expr) -> Expr:
    """`body*(1-u)`."""
    return Binary("*", body, Binary("-", Num(1.0), Var()))


def _replace_prim(expr: Expr, old: int, new: Prim) -> Expr:
    if isinstance(expr, Prim):
        return new if expr.index == old else expr
    if isinstance(expr, Unary):
        return Unary(expr.op, _replace_prim(expr.operand, old, new))
    if isinstance(expr, Binary):
        return Binary(expr.op, _replace_prim(expr.left, old, new), _replace_prim(expr.right, old, new))
    if hasattr(expr, "args"):
        return dataclasses.replace(expr, args=tuple(_replace_prim(a, old, new) for a in expr.args))
    return expr


def scale_constant(expr: Expr, target: int, factor: float, counter: list[int] | None = None) -> Expr:
    """`expr` with its `target`-th constant (pre-order, exponents excluded) multiplied by `factor`."""
    counter = [0] if counter is None else counter
    if isinstance(expr, Num):
        hit = counter[0] == target
        counter[0] += 1
        return Num(_round(expr.value * factor)) if hit else expr
    if isinstance(expr, Unary):
        return Unary(expr.op, scale_constant(expr.operand, target, factor, counter))
    if isinstance(expr, Binary):
        left = scale_constant(expr.left, target, factor, counter)
        right = expr.right if expr.op == "**" else scale_constant(expr.right, target, factor, counter)
        return Binary(expr.op, left, right)
    if hasattr(expr, "args"):
        return dataclasses.replace(expr, args=tuple(scale_constant(a, target, factor, counter) for a in expr.args))
    return expr


def count_constants(expr: Expr) -> int:
    """Constants `scale_constant` can reach."""
    counter = [0]
    scale_constant(expr, -1, 1.0, counter)
    return counter[0]


def _prim(index: int) -> Prim:
    return Prim(index, f"g{index + 1}")


# --------------------------------------------------------------------------- diagnoses


def term_shares(terms, curves: Mapping, names: Sequence[str]) -> list[float] | None:
    """Mean |weight*body| of each term over training on the primitives' mean curves, as shares."""
    columns = [hist.primitive_curve(curves, i, name) for i, name in enumerate(names)]
    used = set().union(*(primitive_indices(b) for _, b in terms if b is not None)) if terms else set()
    if any(columns[i] is None for i in used) or not used:
        return None
    steps = len(columns[next(iter(used))])
    prims = np.stack([c if c is not None and len(c) == steps else np.zeros(steps, np.float32) for c in columns], 1)
    progress = np.linspace(0.0, 1.0, steps)
    sizes = []
    for weight, body in terms:
        if body is None:
            sizes.append(abs(weight))
            continue
        values = [evaluate_numpy(body, prims[t:t + 1], progress[t])[0] for t in range(steps)]
        sizes.append(abs(weight) * float(np.nanmean(np.abs(values))))
    total = sum(sizes)
    return [s / total for s in sizes] if total > 0 else None


def diagnose(incumbent: hist.Observation, terms, names: Sequence[str], outcome: int) -> list[tuple[str, str, str]]:
    """[(kind, subject, evidence)] for the incumbent (module docstring); empty without curves."""
    found = []
    curves = incumbent.curves
    used = sorted(set().union(*(primitive_indices(b) for _, b in terms if b is not None)))
    for i in used:
        curve = hist.primitive_curve(curves, i, names[i])
        if curve is None or not np.isfinite(curve).all():
            continue
        spread, level = float(curve.max() - curve.min()), float(curve.mean())
        if spread < FLAT_RANGE:
            state = "saturated" if level > SATURATED else "stuck"
            found.append(("flat", f"g{i + 1}", f"g{i + 1} ({names[i]}) never moved on candidate {incumbent.id}: "
                                              f"{curve[0]:.3g} -> {curve[-1]:.3g}, {state}"))
    shares = term_shares(terms, curves, names) if len(terms) > 1 else None
    for t, share in enumerate(shares or ()):
        weight, body = terms[t]
        if share > DOMINANT_SHARE and (body is None or outcome not in primitive_indices(body)):
            text = to_text(join_terms([terms[t]]))
            found.append(("dominant", str(t), f"term {text} carries {share:.0%} of candidate {incumbent.id}'s reward"))
    reward = hist.reward_curve(curves)
    if reward is not None and reward.size >= 4 and np.isfinite(reward).all():
        spread = float(reward.max() - reward.min())
        late = float(reward[-1] - reward[reward.size // 2])
        if spread < 1e-6 or late < PLATEAU_GAIN * spread:
            found.append(("plateau", "reward", f"reward of candidate {incumbent.id} plateaued: "
                                               f"{reward[reward.size // 2]:.3g} -> {reward[-1]:.3g} over the second half"))
    return found


def exploit_edits(expr: Expr, diagnoses, names: Sequence[str], outcome: int) -> list[Edit]:
    """Diagnosis-driven edits (priority 2) then every other single edit (priority 1)."""
    terms = split_terms(expr)
    used = set().union(*(primitive_indices(b) for _, b in terms if b is not None))
    unused = [i for i in range(len(names)) if i not in used]
    has_outcome = [b is not None and outcome in primitive_indices(b) for _, b in terms]
    edits: list[Edit] = []

    def with_term(t, weight=None, body=None):
        new = list(terms)
        old_weight, old_body = new[t]
        new[t] = (old_weight if weight is None else weight, old_body if body is None else body)
        return join_terms(new)

    def add(expr_, operator, note, priority):
        if expr_ is not None:
            edits.append(Edit(expr_, operator, note, priority))

    for kind, subject, _ in diagnoses:
        if kind == "flat":
            i = int(subject[1:]) - 1
            for t, (weight, body) in enumerate(terms):
                if body is None or i not in primitive_indices(body):
                    continue
                if not has_outcome[t]:
                    add(join_terms(terms[:t] + terms[t + 1:]), "drop_flat", f"drop {subject}'s term", 2.0)
                    add(with_term(t, weight=2 * weight), "boost_flat", f"double {subject}'s term", 2.0)
                for j in unused if i != outcome else ():  # the outcome itself is never swapped out
                    add(with_term(t, body=_replace_prim(body, i, _prim(j))), "swap_flat", f"swap {subject} for g{j + 1}", 2.0)
        elif kind == "dominant":
            t = int(subject)
            weight, body = terms[t]
            add(with_term(t, weight=weight / 2), "damp_dominant", f"halve term {t}", 2.0)
            if body is not None:
                add(with_term(t, body=anneal(body)), "anneal_dominant", f"anneal term {t} with (1-u)", 2.0)
        elif kind == "plateau":
            for j in unused:
                add(join_terms(terms + [(ADD_WEIGHT, _prim(j))]), "add_term", f"add {ADD_WEIGHT}*g{j + 1}", 2.0)
            for t in range(len(terms)):
                if has_outcome[t]:
                    add(with_term(t, weight=2 * terms[t][0]), "boost_outcome", "double the outcome term", 2.0)
            shaping = [(w, anneal(b) if b is not None and not has_outcome[t] else b) for t, (w, b) in enumerate(terms)]
            if any(not o for o in has_outcome):
                add(join_terms(shaping), "anneal_shaping", "anneal every shaping term with (1-u)", 2.0)
    for t, (weight, body) in enumerate(terms):
        if not has_outcome[t]:
            add(with_term(t, weight=weight / 2), "halve_term", f"halve term {t}", 1.0)
            add(with_term(t, weight=weight * 2), "double_term", f"double term {t}", 1.0)
            add(join_terms(terms[:t] + terms[t + 1:]), "drop_term", f"drop term {t}", 1.0)
    for j in unused:
        add(join_terms(terms + [(ADD_WEIGHT, _prim(j))]), "add_term", f"add {ADD_WEIGHT}*g{j + 1}", 1.0)
    for c in range(count_constants(expr)):
        for factor in (0.5, 2.0):
            add(scale_constant(expr, c, factor), "scale_constant", f"constant {c} times {factor:g}", 0.5)
    if not any(has_outcome):
        add(join_terms(terms + [(1.0, _prim(outcome))]), "add_outcome", f"add g{outcome + 1}", 1.5)
    return edits


# --------------------------------------------------------------------------- explore


def fresh_structure(rng: np.random.Generator, template: str, num_primitives: int, outcome: int,
                    prim_weights: np.ndarray) -> str:
    """One random expression text of `template` (module docstring)."""
    others = [i for i in range(num_primitives) if i != outcome]
    o = f"g{outcome + 1}"
    if not others:
        return o if template == "sum" else f"{o}*(1+{rng.choice(EXPLORE_WEIGHTS)}*u)"
    p = prim_weights[others] / prim_weights[others].sum()
    count = int(rng.integers(1, min(3, len(others)) + 1))
    picked = [f"g{i + 1}" for i in rng.choice(others, size=count, replace=False, p=p)]
    w = [float(rng.choice(EXPLORE_WEIGHTS)) for _ in range(3)]
    if template == "sum":
        return o + "".join(f"+{w[k % 3]:g}*{g}" for k, g in enumerate(picked))
    if template == "gate":
        return f"{o}*(1+{w[0]:g}*{picked[0]})"
    if template == "anneal":
        return f"{o}+{w[0]:g}*(1-u)*{picked[0]}"
    if template == "min":
        second = picked[1] if len(picked) > 1 else o
        return f"{o}+{w[0]:g}*min({picked[0]},{second})"
    rest = f"+{w[1]:g}*{picked[1]}" if len(picked) > 1 else ""
    return f"{o}*{picked[0]}{rest}"


def _moving_weights(observations, names) -> np.ndarray:
    """Per primitive: 1 if its curve moved in some trained candidate, 0.25 if it never did,
    1 when nothing was observed."""
    moved = np.zeros(len(names), bool)
    seen = np.zeros(len(names), bool)
    for obs in observations:
        for i, name in enumerate(names):
            curve = hist.primitive_curve(obs.curves, i, name)
            if curve is not None and np.isfinite(curve).all():
                seen[i] = True
                moved[i] |= float(curve.max() - curve.min()) >= FLAT_RANGE
    return np.where(seen & ~moved, 0.25, 1.0)


# --------------------------------------------------------------------------- credit and the round


def key_rng(key) -> np.random.Generator:
    """A NumPy generator seeded by a JAX key (typed or raw)."""
    key = jax.numpy.asarray(key) if not isinstance(key, jax.Array) else key
    data = jax.random.key_data(key) if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    return np.random.default_rng(np.asarray(data, np.uint32).reshape(-1).tolist())


def update_credit(history: hist.History, credit: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    """`credit` plus the last finished round's children: op -> [tries, wins]."""
    credit = {op: list(v) for op, v in credit.items()}
    if history.rounds == 0:
        return credit
    last = history.rounds - 1
    before = hist.incumbent(history, before_round=last)
    by_id = {o.id: o for o in history.observations}
    for entry in history.lineage:
        child = by_id[entry.id]
        if child.round != last:
            continue
        target = by_id[entry.parent].score if entry.parent is not None else (before.score if before else None)
        won = child.scored and (target is None or child.score > target)
        tries, wins = credit.get(entry.operator, [0, 0])
        credit[entry.operator] = [tries + 1, wins + int(won)]
    return credit


def _failed_operators(history: hist.History, observations, parent_id: int) -> dict[str, str]:
    """operator -> failure reason, for last round's children of `parent_id` that failed."""
    shown = {o.id: o for o in observations}
    failed = {}
    for entry in history.lineage:
        child = shown.get(entry.id)
        if child is not None and entry.parent == parent_id and child.round == history.rounds - 1 and not child.scored:
            failed[entry.operator] = child.reason or "invalid"
    return failed


def _checked(text: str, names, outcome: int) -> str | None:
    """The canonical form of `text` when it passes `check_text`, else None."""
    tree, validity = check_text(text, names, outcome_index=outcome)
    return canonical(tree) if tree is not None and validity.ok else None


def propose_structural(history: hist.History, mode: str, key, n: int, primitive_names: Sequence[str],
                       outcome_index: int = 0, view: View = View(),
                       avoid: Sequence[str] = ()) -> tuple[list[hist.Proposal], hist.Belief]:
    """n proposals for this round and the belief written with them (module docstring).

    avoid: canonical forms to treat as already seen (what an agent committed this round).
    """
    if mode not in (EXPLORE, EXPLOIT):
        raise ValueError(f"propose_structural: mode must be {EXPLORE!r} or {EXPLOIT!r}, got {mode!r}")
    names = tuple(primitive_names)
    rng = key_rng(key)
    observations = view.observations(history)
    credit = update_credit(history, history.belief.notes.get("credit", {})) if view.belief else {}
    seen = {o.canonical for o in observations if o.canonical} | set(avoid)
    best = max((o for o in observations if o.scored), key=lambda o: o.score, default=None)
    proposals: list[hist.Proposal] = []
    diagnoses_text: list[str] = []
    steps: list[str] = []

    def bonus(op: str) -> float:
        tries, wins = credit.get(op, (0, 0))
        return (wins + 1) / (tries + 2)

    if mode == EXPLOIT and best is not None:
        try:
            expr = parse(best.text, names)
        except ExpressionError:
            expr = None
        if expr is not None:
            found = diagnose(best, split_terms(expr), names, outcome_index)
            failed = _failed_operators(history, observations, best.id)
            diagnoses_text += [evidence for _, _, evidence in found]
            diagnoses_text += [f"{op} on candidate {best.id} failed last round: {why}" for op, why in sorted(failed.items())]
            edits = exploit_edits(expr, found, names, outcome_index)
            ranked = sorted(
                ((e.priority + bonus(e.operator) - 3.0 * (e.operator in failed) + 0.5 * rng.random(), k, e)
                 for k, e in enumerate(edits)), key=lambda item: (-item[0], item[1]))
            for _, _, edit in ranked:
                if len(proposals) == n:
                    break
                text = to_text(edit.expr)
                key_text = _checked(text, names, outcome_index)
                if key_text is not None and key_text not in seen:
                    seen.add(key_text)
                    proposals.append(hist.Proposal(text, best.id, edit.operator, edit.note))
            steps.append(f"refine candidate {best.id} ({best.text}, score {best.score:.4f}) with "
                         + ", ".join(sorted({p.operator for p in proposals})) if proposals else
                         f"candidate {best.id} has no untried single edits left; explore around it")
    if len(proposals) < n:
        prim_weights = _moving_weights(observations, names)
        never = [f"g{i + 1}" for i in range(len(names)) if prim_weights[i] < 1]
        if never:
            diagnoses_text.append(f"{', '.join(never)} never moved in any observed candidate: sampled less often")
        shown = {o.id for o in observations}
        counts = {t: sum(e.operator == f"explore_{t}" and e.id in shown for e in history.lineage) for t in TEMPLATES}
        template_scores = np.array([bonus(f"explore_{t}") - 0.1 * counts[t] for t in TEMPLATES])
        draws = 0
        while len(proposals) < n and draws < MAX_DRAWS_PER_PROPOSAL * n:
            draws += 1
            p = np.exp(4.0 * (template_scores - template_scores.max()))
            template = TEMPLATES[int(rng.choice(len(TEMPLATES), p=p / p.sum()))]
            text = fresh_structure(rng, template, len(names), outcome_index, prim_weights)
            key_text = _checked(text, names, outcome_index)
            if key_text is None or (key_text in seen and draws < MAX_DRAWS_PER_PROPOSAL * n // 2):
                continue  # late in the search a repeated structure is better than none
            seen.add(key_text)
            proposals.append(hist.Proposal(text, None, f"explore_{template}", f"fresh {template} structure"))
            template_scores[TEMPLATES.index(template)] -= 0.1
        steps.append(f"open new branches with {', '.join(sorted({p.operator for p in proposals if p.parent is None}))}")
    if len(proposals) < n:
        raise RuntimeError(f"propose_structural: found only {len(proposals)} of {n} valid proposals")
    notes = {"credit": credit} if view.belief else {}
    belief = hist.Belief(round=history.rounds, diagnoses=tuple(diagnoses_text), next_steps=tuple(steps), notes=notes)
    return proposals, belief
