"""The planner's labels for the states a policy reaches (DAgger's relabelling) in the agent prompt.

    env.played = []                       # the env records every episode it plays
    ... play the policy on training games ...
    pairs = relabelled_turns(domain, env.played)   # [(prompt ids, answer ids)] to add to the corpus
    pairs = relabel_played(domain, play)  # the same around `play()`, a rollout (`Domain.relabel`)

The warm-start corpus (`domain.agent_corpus`) shows the planner's path with harmless detours, so
a policy that leaves the path (a `take` where the object is not, a `go to` where it already
stands) meets states the corpus never showed. Here, for every turn t of a played episode (the
game and the policy's (tag, action text) per turn, `AlfWorldEnv.played`), the game is replayed in an
expert game up to that turn: the prompt is the one the policy saw there (task, the last
`window` rows, the admissible actions), and the answer is the planner's next action from that
state (`("plan", slot)`) with the tag that agrees with its outcome (`scienceworld.corpus.
correct_tag`, read from the observation the engine gives the planner's action) and, under
Self-Guide, the assessment of the policy's own last step. A turn whose planner action the
engine does not admit, or whose answer does not fit the answer length, is not kept.

Each turn replays its episode from the start (the engine cannot copy a state): an episode of T
turns costs T (T + 1) / 2 engine steps.
"""

from __future__ import annotations

from typing import Sequence

from derl_jax.domains import selfguide
from derl_jax.domains.agent_prompt import write_answer
from derl_jax.domains.alfworld import rules
from derl_jax.domains.alfworld.env import ECHO_WORDS
from derl_jax.domains.alfworld.expert import ExpertGame, played_over_workers
from derl_jax.domains.scienceworld import tags as T
from derl_jax.domains.scienceworld.corpus import correct_tag


def relabelled_episode(expert, game: int, steps: Sequence[tuple[str | None, str]], prompt, *, window: int,
                       self_guide: bool = False) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) for every turn of one played episode (module docstring).

    expert: an `ExpertGame` (expert.py) on one worker; game: index into the env's games;
    steps: the policy's (tag, action text) per turn as the env read them (tag None where the
    action was not sent to the engine), so the tag rules follow the policy's path as the env did.
    """
    kind = expert.env.games[int(game)].kind
    pairs = []
    for turn in range(len(steps)):
        expert.load(kind, int(game))
        task_ids = prompt.task_ids(expert.task_description())
        first = expert.reset(describe_task=False)
        admissible = expert.admissible()
        rows = [prompt.row(None, first, admissible)]
        tracker = T.TagTracker(visited={T.start_location(first)} - {None}, phrasing=rules.PHRASING)
        score, assessment, won = 0.0, selfguide.NEUTRAL, False
        for tag, action in steps[:turn]:
            observation, new_score, won = expert.step(action)
            T.score_step(tracker, tag, action, observation, new_score > score)
            assessment = selfguide.assessment_after(new_score - score, tracker.last_failed)
            score = new_score
            admissible = expert.admissible()
            rows.append(prompt.row(" ".join(action.split()[:ECHO_WORDS]), observation, admissible))
            if won:
                break
        if won:
            break
        plan = expert.gold_actions()
        if not plan or plan[0] not in admissible:
            continue
        observation, _, _ = expert.step(plan[0])
        answer = prompt.table.tokens(write_answer(correct_tag(tracker, plan[0], observation), plan[0],
                                                  assessment if self_guide else None))
        if not prompt.answer_length or len(answer) < prompt.answer_length:
            pairs.append((task_ids + prompt.window_ids(rows[-window:]), answer))
    return pairs


def relabelled_turns(domain, played: Sequence[tuple[int, Sequence[tuple[str | None, str]]]]
                     ) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) of every turn of every played episode ((game, steps), as
    `AlfWorldEnv.played` records them), in episode order; episode e replays on worker e % W."""
    env = domain.env

    def play_rows(worker: int) -> list[list[tuple[list[int], list[int]]]]:
        expert = ExpertGame(env, worker)
        return [relabelled_episode(expert, game, steps, env.prompt, window=domain.history, self_guide=env.self_guide)
                for game, steps in played[worker::env.workers.size]]

    return played_over_workers(env, len(played), play_rows)


def relabel_played(domain, play) -> list[tuple[list[int], list[int]]]:
    """`relabelled_turns` of the episodes the env plays during `play()` (`Domain.relabel`)."""
    played = domain.env.played = []
    try:
        play()
    finally:
        domain.env.played = None
    return relabelled_turns(domain, played)
