"""The warm-start corpus: the engine's gold paths with harmless random actions mixed in.

`play(worker, task, variation, ...)` loads one task variation with its gold path and plays it:
before each gold action, with probability `perturb_rate`, a random action that changes nothing
in the world (a word string the engine does not parse, `look at` something, `inventory`, `look
around`) with a random tag; then the gold action with a correct tag (`tags.correct_tags`,
preferring plan, then reflect, explore, act). Every turn gives one (prompt, action) pair; the
prompt has the multi-turn rollout's layout (`derl_jax.domains.env.turn_prompts`):

    <bos> description   a_{t-W} o_{t-W+1}   ...   a_{t-1} o_t

with the description cut to the task prompt's words, actions and observations cut to the
environment's lengths exactly as the adapter encodes them, and padding dropped. So the corpus
shows the policy what the rollout shows it.

With Self-Guide (`self_guide=True`) every action starts with the expert's self-assessment of
the step before it (`selfguide.assessment_after`): progress+ when that step raised the
engine's score (ScienceWorld's score; ALFWorld's count of subgoals reached), progress- when
its action failed (`tags.failed`, or not parsed) or the score fell, progress= otherwise and
on the first turn. A random action keeps that sensible word; only the action is random.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from derl_jax.domains import selfguide
from derl_jax.domains.scienceworld import tags as T
from derl_jax.domains.scienceworld.vocab import Vocabulary

PREFERRED_TAGS = (T.PLAN, T.REFLECT, T.EXPLORE, T.ACT)
HARMLESS = ("inventory", "look around")


def corpus_rows(domain_name: str, train_size: int, holdout_rows: Sequence[int], options, default_rate: float
                ) -> tuple[float, list[int]]:
    """(perturb rate, training rows to play) of an engine domain's warm-start corpus: the
    `sft_perturb_rate` of `options` (a mapping or None; `default_rate` when absent), and every
    row of the `train_size` training rows except `holdout_rows`."""
    rate = float((options or {}).get("sft_perturb_rate", default_rate))
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"config.policy.sft_perturb_rate must be in [0, 1], got {rate}")
    held_out = {int(row) for row in np.asarray(holdout_rows, np.int64).reshape(-1)}
    keep = [row for row in range(train_size) if row not in held_out]
    if not keep:
        raise ValueError(f"{domain_name} corpus: no training rows are left for the supervised corpus")
    return rate, keep


def random_action(rng: np.random.Generator, vocab: Vocabulary, objects: Sequence[str]) -> str:
    """A random action that leaves the world as it was (module docstring), tag included."""
    tag = T.TAGS[rng.integers(len(T.TAGS))]
    kind = rng.integers(3)
    if kind == 0 and objects:
        action = f"look at {objects[rng.integers(len(objects))]}"
    elif kind == 1:
        action = HARMLESS[rng.integers(len(HARMLESS))]
    else:  # words the engine cannot parse as an action
        action = f"xyzzy {objects[rng.integers(len(objects))] if objects else 'xyzzy'}"
    return f"{tag} {action}"


def correct_tag(tracker: T.TagTracker, action: str, observation: str) -> str:
    """The preferred tag among those that agree with the step."""
    agree = T.correct_tags(tracker, action, observation)
    return next(tag for tag in PREFERRED_TAGS if tag in agree)


def play(worker, task: str, variation: int, seed: int, perturb_rate: float, vocab: Vocabulary, *,
         description_length: int, obs_length: int, action_length: int, window: int, max_turns: int,
         simplifications: str = "easy", phrasing: T.Phrasing = T.SCIENCEWORLD,
         self_guide: bool = False) -> list[tuple[str, str]]:
    """(prompt text, action text) per turn of one perturbed gold episode (module docstring);
    turns whose action would not fit in `action_length - 1` tokens (room for eos) are played
    but not kept. With `self_guide` each action text starts with the expert's assessment word."""
    rng = np.random.default_rng([int(seed), int(variation), sum(map(ord, task))])
    worker.load(task, variation, simplifications, gold_path=True)
    gold = worker.gold_actions()
    objects = sorted(w for w in worker.vocabulary() if w.isalpha() and len(w) > 2)
    task_ids = vocab.tokens(worker.task_description())[:description_length]
    first = worker.reset(describe_task=False)   # the prompt carries the description
    slots = [([], [])] * (window - 1) + [([], _ids(vocab.encode(first, obs_length), vocab))]
    tracker = T.TagTracker(visited={T.start_location(first)} - {None}, phrasing=phrasing)
    score, pairs, word = 0.0, [], selfguide.ASSESSMENTS[selfguide.NEUTRAL]
    plan = with_detours(gold, rng, perturb_rate)
    for step in itertools.islice(plan, max_turns):
        text = random_action(rng, vocab, objects) if step is None else None
        if text is None:   # the gold action: step it, then pick its tag from what it did
            observation, new_score, completed = worker.step(step)
            text = f"{correct_tag(tracker, step, observation)} {step}"
        else:
            tag, action = T.split_tag(text)
            observation, new_score, completed = worker.step(action)
        tag, action = T.split_tag(text)
        T.score_step(tracker, tag, action, observation, new_score > score)
        text = f"{word} {text}" if self_guide else text
        word = selfguide.ASSESSMENTS[selfguide.assessment_after(new_score - score, tracker.last_failed)]
        score = new_score
        action_ids = _ids(vocab.encode(text, action_length), vocab)
        if len(vocab.tokens(text)) < action_length:
            prompt = task_ids + [i for action_part, obs_part in slots for i in action_part + obs_part]
            pairs.append((vocab.decode(prompt), vocab.decode(action_ids)))
        slots = slots[1:] + [(action_ids, _ids(vocab.encode(observation, obs_length), vocab))]
        if completed:
            break
    return pairs


def _ids(row: np.ndarray, vocab: Vocabulary) -> list[int]:
    return [int(i) for i in row if i != vocab.pad_id]


def with_detours(gold, rng: np.random.Generator, perturb_rate: float):
    """The gold actions with a detour (None) before each with probability `perturb_rate`: a list
    for a list of gold actions, drawn up front; lazily for an iterator whose next action depends
    on the state the previous ones reached (`alfworld.domain.ExpertGame` with search)."""
    detoured = (a for g in gold for a in ([None] if rng.random() < perturb_rate else []) + [g])
    return list(detoured) if isinstance(gold, list) else detoured


def play_agent(worker, task: str, variation: int, seed: int, perturb_rate: float, prompt, *, window: int,
               max_turns: int, simplifications: str = "easy", phrasing: T.Phrasing = T.SCIENCEWORLD,
               self_guide: bool = False) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) per turn of one perturbed gold episode in the agent prompt
    (`derl_jax.domains.agent_prompt`) of a pretrained policy: the task prompt, then the last
    `window` observation rows (`AgentPrompt.row`: the action taken, the engine's answer, the
    actions it admits now, `worker.admissible()`) and the prompt's tail, exactly as the rollout
    writes them; the answer holds the tag that agrees with the step (`correct_tag`), a short
    reasoning and the action (`agent_prompt.write_answer`), with the expert's assessment
    sentence first under Self-Guide. Before each gold action, with probability `perturb_rate`,
    a harmless admissible action (look, inventory, examine) is taken instead; the gold action
    follows. Turns whose answer would not fit the policy's answer length are played, not kept.
    A gold action the engine does not admit (ScienceWorld's gold paths open doors that its easy
    simplification has already opened) is played silently: the world stays on the gold path, but
    the turn is neither taught nor shown, so every taught action is one the prompt could list."""
    from derl_jax.domains.agent_prompt import write_answer

    rng = np.random.default_rng([int(seed), int(variation), sum(map(ord, task))])
    worker.load(task, variation, simplifications, gold_path=True)
    gold = worker.gold_actions()
    task_ids = prompt.task_ids(worker.task_description())
    first = worker.reset(describe_task=False)
    admissible = worker.admissible()
    rows = [prompt.row(None, first, admissible)]
    tracker = T.TagTracker(visited={T.start_location(first)} - {None}, phrasing=phrasing)
    score, pairs, assessment, turns = 0.0, [], selfguide.NEUTRAL, 0
    plan = with_detours(gold, rng, perturb_rate)
    for step in plan:
        if turns == max_turns:
            break
        if step is None:
            harmless = [a for a in admissible if a.split()[:1] in (["look"], ["inventory"], ["examine"])]
            step = harmless[rng.integers(len(harmless))] if harmless else HARMLESS[0]
        elif step not in admissible:   # played silently (docstring)
            _, score, completed = worker.step(step)
            if completed:
                break
            admissible = worker.admissible()
            continue
        turns += 1
        observation, new_score, completed = worker.step(step)
        kind = correct_tag(tracker, step, observation)
        T.score_step(tracker, kind, step, observation, new_score > score)
        answer = prompt.table.tokens(write_answer(kind, step, assessment if self_guide else None))
        if not prompt.answer_length or len(answer) < prompt.answer_length:
            pairs.append((task_ids + prompt.window_ids(rows[-window:]), answer))
        assessment = selfguide.assessment_after(new_score - score, tracker.last_failed)
        score = new_score
        admissible = [] if completed else worker.admissible()
        rows.append(prompt.row(step, observation, admissible))
        if completed:
            break
    return pairs
