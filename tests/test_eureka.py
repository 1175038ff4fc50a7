"""Eureka-style greedy refinement: ARBO's operators with an incumbent-only history and no belief."""

import jax
import numpy as np

from derl_jax.expr.canonical import canonical
from derl_jax.expr.check import check_text
from derl_jax.methods.arbo import history as hist
from derl_jax.methods.arbo.proposer import View
from derl_jax.methods.arbo.schedule import Schedule
from derl_jax.outer import CandidateRecord, make_strategy
from derl_jax.methods.arbo.strategy import ArboStrategy
from derl_jax.methods.arbo.eureka import EurekaStrategy

NAMES = ("correct", "format", "steps")
STEPS = 8
TRAJECTORY = np.stack([np.linspace(0.1, 0.7, STEPS), np.full(STEPS, 0.98), np.zeros(STEPS)], 1).astype(np.float32)


def records_for(iteration, texts):
    """Fake oracle: score = how much of the reward's response is to g1 (NumPy); curves from TRAJECTORY."""
    out = []
    for j, text in enumerate(texts):
        tree, validity = check_text(text, NAMES)
        assert tree is not None and validity.ok, text
        from derl_jax.expr.vm import evaluate_numpy

        probe = evaluate_numpy(tree, np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], np.float32), 0.5)
        effects = np.abs(probe[1:] - probe[0])
        score = round(float(0.9 * effects[0] / (effects.sum() + 1e-6)), 6)   # share of the reward that is g1
        curves = {"reward_mean": np.linspace(0, 1, STEPS, dtype=np.float32),
                  **{f"primitive/{n}": TRAJECTORY[:, i] for i, n in enumerate(NAMES)}}
        out.append(CandidateRecord(iteration, j, text, canonical(tree), True, None, score, curves))
    return out


def test_eureka_refines_the_incumbent_every_round_and_keeps_no_belief():
    strategy = make_strategy("eureka", {}, None, NAMES)
    assert isinstance(strategy, EurekaStrategy)
    assert strategy.schedule.kind == "exploit_only" and strategy.view == View("full", "incumbent", False)
    state = strategy.init(jax.random.key(0))
    for r in range(4):
        incumbent = hist.incumbent(state.history)
        texts, plan = strategy.propose(state, jax.random.fold_in(jax.random.key(0), r), 4)
        if r == 0:
            assert plan.mode == "explore" and all(p.parent is None for p in plan.proposals)
        else:
            assert plan.mode == "exploit" and all(p.parent == incumbent.id for p in plan.proposals)
        assert plan.belief is None
        records = records_for(r, texts)
        state = strategy.update(state, records, np.array([x.score for x in records], np.float32), plan)
    assert state.history.belief == hist.Belief()
    scores = [o.score for o in state.history.observations]
    assert max(scores[4:]) > max(scores[:4])   # greedy refinement found a better reward


def test_eureka_sees_only_the_incumbent():
    """Two histories with the same incumbent but different other candidates: same proposals."""
    strategy = make_strategy("eureka", {}, None, NAMES)
    best = records_for(0, ["g1+0.5*g2"])[0]
    best = CandidateRecord(0, 0, best.text, best.canonical, True, None, 0.9, best.curves)
    histories = []
    for others in (["g2", "g3+g1"], ["g1", "g1+g2"]):   # the second holds two edits of the incumbent
        records = [best] + [CandidateRecord(0, j + 1, t, canonical(check_text(t, NAMES)[0]), True, None, 0.1, {})
                            for j, t in enumerate(others)]
        proposals = [hist.Proposal(rec.text, None, "explore_sum") for rec in records]
        histories.append(hist.append_round(hist.History(), records, proposals, "explore", None))
    key = jax.random.key(4)
    first, second = (strategy.propose(strategy.init(key).__class__(history=h), key, 5)[0] for h in histories)
    assert first == second
    assert {"g1", "g1+g2"} <= set(first)
    arbo = ArboStrategy(NAMES, schedule=Schedule("exploit_only", 0))   # sees them all: never repeats one
    repeats = arbo.propose(arbo.init(key).__class__(history=histories[1]), key, 5)[0]
    assert not {"g1", "g1+g2"} & set(repeats)
