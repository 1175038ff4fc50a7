"""The planner's relabelling of the states a policy reaches on ALFWorld (domains/alfworld/relabel.py),
on the real engine with the agent prompt over the real Qwen2.5 tokenizer."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

pytest.importorskip("alfworld")

from benchmarks.cold_start_share import engine_config  # noqa: E402
from derl_jax.domains import agent_prompt as AP  # noqa: E402
from derl_jax.domains.alfworld.domain import agent_corpus  # noqa: E402
from derl_jax.domains.alfworld.expert import ExpertGame  # noqa: E402
from derl_jax.domains.alfworld.relabel import relabelled_turns  # noqa: E402
from derl_jax.experiment import build  # noqa: E402

pytestmark = pytest.mark.slow
MAX_TURNS = 4


@pytest.fixture(scope="module")
def domain():
    args = argparse.Namespace(domain="alfworld", num_train=2, num_val=0, num_test=1, max_turns=MAX_TURNS, window=1,
                              tokenizer="")
    built = build.build_domain(engine_config(args))
    yield built
    built.env.close()


def plan_of(domain, game: int) -> list[str]:
    expert = ExpertGame(domain.env, 0)
    expert.load(domain.env.games[game].kind, game)
    return expert.gold_actions()


def answer_action(domain, answer_ids) -> str:
    return AP.parse_answer(domain.tokenizer.decode(answer_ids)).action


def test_relabelling_the_planners_own_path_gives_the_unperturbed_corpus(domain):
    games = [int(g) for g in domain.train.context["game"]]
    played = [(game, [("plan", action) for action in plan_of(domain, game)[:MAX_TURNS]]) for game in games]
    relabelled = relabelled_turns(domain, played)
    corpus = agent_corpus(domain, 0, (), {"sft_perturb_rate": 0.0})
    assert len(relabelled) == len(corpus) == sum(len(steps) for _, steps in played)
    for (prompt, answer), (want_prompt, want_answer) in zip(relabelled, corpus):
        assert list(prompt) == list(want_prompt) and list(answer) == list(want_answer)


def test_off_path_turns_get_the_planners_next_action_in_the_prompt_the_policy_saw(domain):
    env, game = domain.env, 0
    plan = plan_of(domain, game)
    first_target = plan[0]
    assert first_target.startswith("go to ")
    # the policy walks to the wrong place, then writes a malformed answer, then follows the plan
    obs, states = env.reset(np.zeros((1, 2), np.uint32), {"game": np.array([game], np.int32)})
    wrong = next(a for a in states[0].admissible if a.startswith("go to ") and a != first_target)
    answers = [AP.write_answer("explore", wrong), "I am not sure what to do", AP.write_answer("plan", first_target),
               AP.write_answer("act", "look")]
    rows = [obs[0]]
    env.played = []
    for text in answers:
        ids = np.array([env.prompt.table.encode(text, env.action_length)], np.int32)
        obs, states, _, done, _ = env.step(states, ids)
        rows.append(obs[0])
    played, env.played = env.played, None
    assert len(played) == 1 and played[0][0] == game
    assert played[0][1] == [("explore", wrong), (None, "I am not sure what to do"), ("plan", first_target),
                            ("act", "look")]

    pairs = relabelled_turns(domain, played)
    task_ids = env.prompt.task_ids(env.games[game].goal)
    assert len(pairs) == MAX_TURNS
    for turn, (prompt, answer) in enumerate(pairs):   # the prompt the rollout built from the env's rows
        assert list(prompt) == task_ids + env.prompt.window_ids(rows[turn:turn + 1])
    labels = [answer_action(domain, answer) for _, answer in pairs]
    assert labels[0] == first_target                  # from the start: the plan's first action
    assert labels[1] == labels[2] == first_target     # at the wrong place, and after the malformed answer
    after = plan_of_after(domain, game, [wrong, "I am not sure what to do", first_target])
    assert labels[3] == after[0] != first_target
    for (prompt, _), label in zip(pairs, labels):     # every label is one the prompt lists as admissible
        assert label in domain.tokenizer.decode(prompt).split("Admissible actions now: [")[-1]


def plan_of_after(domain, game: int, actions: list[str]) -> list[str]:
    expert = ExpertGame(domain.env, 0)
    expert.load(domain.env.games[game].kind, game)
    expert.reset()
    for action in actions:
        expert.step(action)
    return expert.gold_actions()
