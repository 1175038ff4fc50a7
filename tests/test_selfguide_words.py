"""Self-Guide in words: a pretrained policy's self-assessment is a sentence inside <assess> tags
ending in a verdict, which the environment turns into the internal reward; a malformed
assessment gives reward 0 and the action still runs."""

from __future__ import annotations

import numpy as np
import pytest

from derl_jax.domains import agent_prompt as AP
from derl_jax.domains import selfguide

REWARDS = (0.5, 0.0, -0.25)   # distinct from the defaults


@pytest.mark.parametrize("sentence, verdict", [
    ("I picked up the mug, which the task needs. Verdict: progress.", 0),
    ("Nothing changed since the last step. verdict: no change", 1),
    ("The drawer would not open, a setback. Verdict: setback!", 2),
    ("  Still looking for the apple. VERDICT:   No Change.  ", 1),
    ("Verdict: progress. Then I dropped it.", -1),      # the verdict must end the sentence
    ("I think it went well.", -1),
    ("Verdict: great.", -1),
    ("", -1),
])
def test_verdicts_are_read_from_sentences(sentence, verdict):
    assert AP.read_verdict(sentence) == verdict


def test_assessment_is_read_beside_the_action():
    good = AP.parse_answer("<assess>I reached the sink. Verdict: progress.</assess>\n"
                           "<planning>Clean it now.</planning>\n<action>clean mug 1 with sinkbasin 1</action>")
    assert good == AP.Answer("plan", "clean mug 1 with sinkbasin 1", True, 0)
    vague = AP.parse_answer("<assess>Hard to say.</assess><monitor>x</monitor><action>look</action>")
    assert vague == AP.Answer("act", "look", True, -1)   # the action still counts
    missing = AP.parse_answer("<monitor>x</monitor><action>look</action>")
    assert missing.assessment == -1 and missing.well_formed
    twice = AP.parse_answer("<assess>Verdict: progress.</assess><assess>Verdict: setback.</assess>"
                            "<monitor>x</monitor><action>look</action>")
    assert twice.assessment == -1 and twice.well_formed
    broken = AP.parse_answer("<assess>The fridge is closed. Verdict: setback.</assess> open it")
    assert broken.assessment == 2 and not broken.well_formed


def test_self_rewards_of_verdicts():
    assessment = np.array([0, 1, 2, -1, 0])
    live = np.array([True, True, True, True, False])
    np.testing.assert_allclose(selfguide.self_reward(assessment, REWARDS, live), [0.5, 0.0, -0.25, 0.0, 0.0])


def test_written_assessments_follow_the_rule():
    for index, sentence in enumerate(AP.ASSESS_SENTENCES):
        assert AP.read_verdict(sentence) == index
        assert f"Verdict: {AP.VERDICTS[index]}." in sentence


def test_household_text_env_rewards_verdicts_and_runs_actions_of_vague_assessments():
    from derl_jax.domains.household import tasks as T
    from derl_jax.domains.household.env import HouseholdEnv
    from derl_jax.domains.household.text_env import HouseholdTextEnv, admissible_actions
    from derl_jax.models.hf_tokenizer import bundled_qwen_tokenizer_dir

    table = AP.load_table(bundled_qwen_tokenizer_dir())
    prompt = AP.AgentPrompt(table, "household", 64, 128, self_guide=True, answer_length=64)
    assert "Verdict: progress." in prompt.suffix_text and "<assess>" in prompt.suffix_text
    env = HouseholdTextEnv(HouseholdEnv(max_turns=3), prompt, 64, self_guide=True, self_rewards=REWARDS)
    tasks, _ = T.level_splits("L0", 0, 5, 1, (4, 5))
    tasks = tasks.take(np.arange(4))
    rows, states = env.reset(np.zeros((4, 2), np.uint32), {n: getattr(tasks, n) for n in T.Task.__dataclass_fields__})
    go = [admissible_actions(s["state"])[0] for s in states]
    assert all(a.startswith("go to ") for a in go)
    texts = [f"<assess>A fine start. Verdict: progress.</assess><explore>x</explore><action>{go[0]}</action>",
             f"<assess>I cannot tell yet.</assess><explore>x</explore><action>{go[1]}</action>",
             f"<assess>I keep failing. Verdict: setback.</assess> {go[2]}",
             f"<explore>x</explore><action>{go[3]}</action>"]
    answers = np.full((4, 64), table.pad_id, np.int32)
    for row, text in enumerate(texts):
        ids = table.tokens(text)
        answers[row, : len(ids)] = ids
    rows, states, _, _, info = env.step(states, answers)
    np.testing.assert_allclose(info["self_reward"], [0.5, 0.0, -0.25, 0.0])
    np.testing.assert_array_equal(info["assessment"], [0, -1, 2, -1])
    np.testing.assert_array_equal(info["valid"], [1, 1, 0, 1])   # a vague assessment does not stop the action
    np.testing.assert_array_equal(info["well_formed"], [1, 1, 0, 1])
    assert env.counts.shares() == {"well_formed": 0.75, "admissible": 0.75}
    shown = table.tokenizer.decode(rows[1][: prompt.step_length])
    assert shown.startswith(f"\nAction: {go[1]}\nObservation: you arrive at")
