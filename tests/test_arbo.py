"""The history-driven searches' common parts: the schedule, the history and its queries, the
structural proposer and `history_search`, the `arbo` config block and the ablation names.

No model is trained: the fake oracle of `arbo_fakes` scores an expression by how it ranks two
probes and makes per-primitive curves from fixed trajectories.
"""

import dataclasses

import jax
import numpy as np
import pytest

from arbo_fakes import NAMES, STEPS, TRAJECTORY, fake_records, run_rounds
from derl_jax.config import ConfigError
from derl_jax.expr.ast import primitive_indices
from derl_jax.expr.canonical import canonical
from derl_jax.expr.check import check_text
from derl_jax.expr.parse import parse
from derl_jax.methods.arbo import history as hist
from derl_jax.methods.arbo import proposer as prop
from derl_jax.methods.arbo.schedule import Schedule, modes, next_mode
from derl_jax.methods.arbo.settings import arbo_block, read_settings
from derl_jax.outer import CandidateRecord, make_strategy


# --------------------------------------------------------------------------- schedule


@pytest.mark.parametrize("schedule, acceptance, expected", [
    (Schedule("adaptive", 1, 2, 1), [1, 0, 0, 0, 1, 0], "EXXEXXX"),
    (Schedule("adaptive", 1, 2, 2), [1, 0, 0, 0, 0, 0, 0], "EXXEEXXE"),
    (Schedule("adaptive", 1, 2, 2), [1, 0, 0, 1, 0], "EXXEXX"),     # acceptance ends re-exploration early
    (Schedule("adaptive", 1, 2, 1), [0, 0, 0], "EEEE"),             # no incumbent: keep exploring
    (Schedule("adaptive", 3, 1, 1), [1, 1, 1, 0], "EEEXE"),
    (Schedule("adaptive", 0, 1, 0), [1, 0, 0, 0], "EXXXX"),         # nu = 0: never re-explore
    (Schedule("explore_only"), [1, 1, 0], "EEEE"),
    (Schedule("exploit_only", 0), [0, 1, 0, 0], "EEXXX"),
])
def test_schedule_mode_sequence(schedule, acceptance, expected):
    got = "".join("E" if m == "explore" else "X" for m in modes([bool(a) for a in acceptance], schedule))
    assert got == expected
    assert next_mode([bool(a) for a in acceptance], schedule) == ("explore" if expected[-1] == "E" else "exploit")


def test_schedule_rejects_bad_settings():
    with pytest.raises(ValueError, match="patience"):
        Schedule("adaptive", 1, 0, 1)
    with pytest.raises(ValueError, match="kind"):
        Schedule("greedy")


# --------------------------------------------------------------------------- history


def _record(i, j, text, score, valid=True, reason=None, curves=None):
    return CandidateRecord(i, j, text, text, valid, reason, score, curves or {})


def test_history_acceptance_incumbent_views_and_json(tmp_path):
    h = hist.History()
    rounds = [[("g1", 0.2), ("g2", 0.0, False, "constant")], [("g1+g2", 0.1), ("g1+g3", 0.2)],
              [("g1*g2", 0.5), ("g3", 0.4)]]
    for r, group in enumerate(rounds):
        records = [_record(r, j, *spec, curves={"reward_mean": np.arange(100, dtype=np.float32)}) for j, spec in enumerate(group)]
        proposals = [hist.Proposal(rec.text, 0 if r else None, "op") for rec in records]
        h = hist.append_round(h, records, proposals, "explore", hist.Belief(r, (f"d{r}",), ()))
    assert hist.acceptance_record(h) == (True, False, True)   # a tie with the incumbent is no improvement
    assert hist.incumbent(h).text == "g1*g2" and hist.incumbent(h, before_round=2).text == "g1"
    assert [entry.parent for entry in h.lineage] == [None, None, 0, 0, 0, 0]
    assert len(h.observations[0].curves["reward_mean"]) == hist.MAX_CURVE_POINTS
    assert h.observations[0].curves["reward_mean"][-1] == 99.0
    scores_only = hist.visible(h, "scores")
    assert all(o.curves == {} for o in scores_only) and scores_only[1].reason == "invalid"
    assert [o.text for o in hist.visible(h, scope="incumbent")] == ["g1*g2"]
    assert hist.from_json(hist.to_json(h)) == h
    hist.save(h, tmp_path)
    assert hist.load(tmp_path) == h and hist.load(tmp_path / "nothing") is None
    with pytest.raises(ValueError, match="no candidate 9"):
        hist.find(h.observations, 9)


# --------------------------------------------------------------------------- structural proposer


def _history_with_incumbent(text, reward=None, trajectory=TRAJECTORY):
    curves = {f"primitive/{n}": trajectory[:, i] for i, n in enumerate(NAMES)}
    curves["reward_mean"] = np.linspace(0, 1, STEPS) if reward is None else reward
    record = CandidateRecord(0, 0, text, text, True, None, 0.5, curves)
    return hist.append_round(hist.History(), [record], [hist.Proposal(text, None, "explore_sum")], "explore", None)


def test_flat_saturated_term_is_dropped():
    h = _history_with_incumbent("g1+0.5*g2")
    proposals, belief = prop.propose_structural(h, "exploit", jax.random.key(0), 4, NAMES)
    assert any("g2 (format) never moved" in d and "saturated" in d for d in belief.diagnoses)
    by_op = {p.operator: p.text for p in proposals}
    assert by_op.get("drop_flat") == "g1"
    assert all(p.parent == 0 for p in proposals)


def test_dominant_term_is_damped_and_plateau_adds_terms():
    flat_late = np.concatenate([np.linspace(0, 1, STEPS // 2), np.ones(STEPS - STEPS // 2)])
    h = _history_with_incumbent("g1+2*g2", reward=flat_late)
    expr = parse("g1+2*g2", NAMES)
    found = prop.diagnose(h.observations[0], prop.split_terms(expr), NAMES, 0)
    kinds = {kind for kind, _, _ in found}
    assert {"dominant", "plateau", "flat"} <= kinds
    # the share of 2*g2 on the mean curves, computed by hand
    share = 2 * TRAJECTORY[:, 1].mean() / (TRAJECTORY[:, 0].mean() + 2 * TRAJECTORY[:, 1].mean())
    shares = prop.term_shares(prop.split_terms(expr), h.observations[0].curves, NAMES)
    np.testing.assert_allclose(shares[1], share, rtol=1e-5)
    proposals, _ = prop.propose_structural(h, "exploit", jax.random.key(1), 12, NAMES)
    texts = {p.operator: canonical(parse(p.text, NAMES)) for p in proposals}
    assert texts["damp_dominant"] == canonical(parse("g1+g2", NAMES))
    assert "add_term" in texts


def test_proposals_parse_are_distinct_and_deterministic():
    state, proposed = run_rounds(make_strategy("history_search", {}, None, NAMES), rounds=4, n=5)
    _, again = run_rounds(make_strategy("history_search", {}, None, NAMES), rounds=4, n=5)
    assert proposed == again
    seen = set()
    for texts in proposed:
        keys = []
        for text in texts:
            tree, validity = check_text(text, NAMES)
            assert tree is not None and validity.ok, text
            keys.append(canonical(tree))
        assert len(set(keys)) == len(keys)
        seen |= set(keys)
    assert len(seen) == 20   # nothing is proposed twice across rounds either
    h = state.history
    modes_seen = [entry.mode for entry in h.lineage[::5]]
    assert modes_seen == list(modes(hist.acceptance_record(h)[:-1], Schedule()))
    for entry in h.lineage:
        if entry.mode == "exploit" and not entry.operator.startswith("explore"):
            assert entry.parent == hist.incumbent(h, before_round=h.observations[entry.id].round).id


def test_failed_operator_is_ranked_last_and_credit_is_kept():
    h = _history_with_incumbent("g1+0.5*g2")
    first, belief = prop.propose_structural(h, "exploit", jax.random.key(0), 1, NAMES)
    op = first[0].operator
    failed = CandidateRecord(1, 0, first[0].text, None, True, "non-finite validation score", 0.0, {})
    h = hist.append_round(h, [failed], first, "exploit", belief)
    again, belief = prop.propose_structural(h, "exploit", jax.random.key(0), 1, NAMES)
    assert again[0].operator != op
    assert any(f"{op} on candidate 0 failed" in d for d in belief.diagnoses)
    assert belief.notes["credit"][op] == [1, 0]


def test_scores_only_view_hides_curves_from_the_proposer():
    h = _history_with_incumbent("g1+0.5*g2")
    _, belief = prop.propose_structural(h, "exploit", jax.random.key(0), 3, NAMES, view=prop.View(level="scores"))
    assert not any("never moved" in d for d in belief.diagnoses)


# --------------------------------------------------------------------------- strategy and config


def test_strategy_checkpoint_restore_gives_the_same_proposals(tmp_path):
    strategy = make_strategy("history_search", {}, None, NAMES, workdir=tmp_path)
    assert strategy.workdir == str(tmp_path)
    state, _ = run_rounds(strategy, rounds=3)
    arrays, data = strategy.checkpoint(state)
    fresh = make_strategy("history_search", {}, None, NAMES)
    restored = fresh.restore(fresh.init(jax.random.key(0)), arrays, data)
    assert restored.history == state.history == hist.load(tmp_path)
    key = jax.random.key(5)
    assert strategy.propose(state, key, 4)[0] == fresh.propose(restored, key, 4)[0]


def test_ablation_names_and_config_errors():
    no_belief = make_strategy("history_search_ablation:no_belief", {}, None, NAMES)
    assert not no_belief.view.belief
    state, _ = run_rounds(no_belief, rounds=2)
    assert state.history.belief == hist.Belief()
    assert make_strategy("history_search_ablation:scores_only", {}, None, NAMES).view.level == "scores"
    assert make_strategy("history_search_ablation:explore_only", {}, None, NAMES).schedule.kind == "explore_only"
    greedy = make_strategy("history_search_ablation:greedy", {}, None, NAMES)
    assert greedy.view == prop.View("full", "incumbent", False) and greedy.schedule == Schedule("exploit_only", 0)
    agent = {name: make_strategy(f"arbo_ablation:{name}", {}, None, NAMES) for name in
             ("no_belief", "no_observations", "scores_only", "retriever", "explore_only", "exploit_only", "no_framework")}
    assert [agent[n].view.level for n in ("no_observations", "scores_only")] == ["none", "scores"]
    assert agent["retriever"].view.scope == "retrieved" and agent["retriever"].view.k == 4
    assert not agent["no_framework"].framework and not agent["no_framework"].view.belief
    assert not agent["no_belief"].view.belief and agent["no_belief"].framework
    assert agent["exploit_only"].schedule.kind == "exploit_only"
    assert read_settings({"arbo": {"patience": 4}}).schedule.patience == 4
    assert read_settings({"arbo": {"history": "retrieved", "retrieve_k": 2}}).view.k == 2
    with pytest.raises(ConfigError, match="config.arbo.patience"):
        arbo_block({"arbo": {"patience": 0}})
    with pytest.raises(ConfigError, match="unknown fields"):
        arbo_block({"arbo": {"proposer": "agent"}})   # the method names the proposer now
    with pytest.raises(ConfigError, match="unknown arbo ablation 'no_history'"):
        arbo_block({}, "no_history")
    with pytest.raises(ConfigError, match="unknown history_search_ablation:no_framework ablation"):
        make_strategy("history_search_ablation:no_framework", {}, None, NAMES)
    with pytest.raises(ConfigError, match="config.arbo.framework"):
        make_strategy("history_search", {"arbo": {"framework": False}}, None, NAMES)
    with pytest.raises(ConfigError, match="config.arbo.observations"):
        make_strategy("history_search", {"arbo": {"observations": "none"}}, None, NAMES)
    with pytest.raises(ConfigError, match="config.arbo.agent.url"):
        make_strategy("arbo", {"arbo": {"agent": {"url": "localhost:8000"}}}, None, NAMES)
    with pytest.raises(ConfigError, match="config.arbo.agent.checkpoint"):
        make_strategy("eureka", {"arbo": {"agent": {"backend": "local"}}}, None, NAMES)
    with pytest.raises(ConfigError, match="config.arbo.retrieve_k"):
        make_strategy("arbo_ablation:retriever", {"arbo": {"retrieve_k": 0}}, None, NAMES)
    # the structural proposer needs no endpoint: a bad url does not stop history_search
    make_strategy("history_search", {"arbo": {"agent": {"url": "localhost:8000"}}}, None, NAMES)


def test_retriever_shows_the_k_candidates_most_like_the_incumbent():
    texts = ["g1+g2", "g3", "g1*g3+0.5*g2", "g1+0.5*g2", "min(g2,g3)"]
    scores = [0.2, 0.1, 0.3, 0.6, 0.05]
    records = [CandidateRecord(0, j, t, canonical(parse(t, NAMES)), True, None, s, {}) for j, (t, s) in
               enumerate(zip(texts, scores))]
    h = hist.append_round(hist.History(), records, [hist.Proposal(t, None, "op") for t in texts], "explore", None)
    assert hist.similarity("g1+0.5*g2", "g1+0.5*g2") == 1.0
    assert hist.similarity("g1+0.5*g2", "g1+g2") > hist.similarity("g1+0.5*g2", "min(g2,g3)")
    shown = [o.text for o in hist.visible(h, scope="retrieved", k=2)]
    assert shown == ["g1*g3+0.5*g2", "g1+0.5*g2"]   # the incumbent and its nearest, in history order
    assert len(hist.visible(h, scope="retrieved", k=10)) == 5
    assert [o.text for o in hist.retrieve(hist.History(observations=h.observations[:0]), 2)] == []
    no_scores = dataclasses.replace(h, observations=tuple(dataclasses.replace(o, valid=False, reason="bad")
                                                          for o in h.observations))
    assert [o.text for o in hist.retrieve(no_scores, 2)] == ["g1+0.5*g2", "min(g2,g3)"]   # no incumbent: the latest


def test_few_primitives_still_give_n_valid_proposals_and_update_checks_texts():
    strategy = make_strategy("history_search", {}, None, ("correct", "format"))
    state = strategy.init(jax.random.key(0))
    texts, plan = strategy.propose(state, jax.random.key(1), 8)
    assert len(texts) == 8 and all(check_text(t, ("correct", "format"))[1].ok for t in texts)
    records = fake_records(0, texts[::-1], names=("correct", "format"))
    records = [CandidateRecord(0, j, r.text, r.canonical, r.valid, r.reason, r.score, r.curves) for j, r in enumerate(records)]
    with pytest.raises(ValueError, match="not the texts this round proposed"):
        strategy.update(state, records, np.array([r.score for r in records], np.float32), plan)


def test_a_flat_outcome_is_never_swapped_out():
    stuck = TRAJECTORY.copy()
    stuck[:, 0] = 0.0   # the outcome never moved
    h = _history_with_incumbent("g1*(1+0.1*g3)", trajectory=stuck)
    proposals, belief = prop.propose_structural(h, "exploit", jax.random.key(0), 6, NAMES)
    assert any("g1 (correct) never moved" in d for d in belief.diagnoses)
    assert all(0 in primitive_indices(parse(p.text, NAMES)) for p in proposals)
