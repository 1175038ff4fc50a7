"""The math presets train and select on strict exact match (the paper's g1), math-verify is an
option, and the authors' inner batch is a preset of its own."""

from __future__ import annotations

import numpy as np
import pytest

from configs import gsm8k
from configs import math as math_config
from derl_jax.domains import math as math_domain
from derl_jax.experiment.checks import validate_config
from derl_jax.rl.config import inner_config
from primitives.math import correct, correct_exact

PAPER_PRESETS = [(module, preset) for module in (math_config, gsm8k) for preset in ("default", "mixture", "authors_batch")]
# Hand-written outputs and gold answers: exact match and math-verify equivalence part on the
# first two (0.5 is 1/2; 50% is 0.5 to math-verify) and agree on the rest.
TEXTS = ["so the answer is \\boxed{0.5}", "\\boxed{50\\%}", "\\boxed{\\dfrac{1}{2}}", "#### 1,250", "\\boxed{3}"]
GOLDS = ["\\frac{1}{2}", "0.5", "\\frac{1}{2}", "1250", "4"]
EXACT = [0, 0, 1, 1, 0]
VERIFY = [1, 1, 1, 1, 0]


def test_exact_match_and_math_verify_part_on_hand_written_answers():
    contexts = [{"answer": gold} for gold in GOLDS]
    np.testing.assert_array_equal(correct_exact(TEXTS, contexts), EXACT)
    np.testing.assert_array_equal(correct(TEXTS, contexts), VERIFY)


@pytest.mark.parametrize("module, preset", PAPER_PRESETS, ids=lambda x: getattr(x, "__name__", x))
def test_the_paper_presets_train_and_select_on_exact_match(module, preset):
    cfg = module.get_config(preset)
    assert cfg.domain.reward_match == "exact"
    prims = math_domain.resolve_primitives(cfg)
    assert [p.name for p in prims] == ["correct_exact", "boxed", "steps", "gold_anywhere"]
    # g1 is what the candidates train on and what their validation score (the selection) counts
    contexts = [{"answer": gold} for gold in GOLDS]
    np.testing.assert_array_equal(prims[0].fn(TEXTS, contexts), EXACT)
    cfg.domain.reward_match = "verify"
    assert math_domain.configured_primitive_names(cfg)[0] == "correct"


def test_the_cpu_preset_keeps_math_verify():
    for module in (math_config, gsm8k):
        assert module.get_config("tiny").domain.reward_match == "verify"


def test_the_inner_batch_ours_and_the_authors():
    ours, theirs = math_config.get_config(), math_config.get_config("authors_batch")
    assert (ours.inner.prompts_per_step, ours.inner.minibatches, ours.inner.epochs) == (64, 4, 1)
    assert (theirs.inner.prompts_per_step, theirs.inner.minibatches, theirs.inner.epochs) == (1024, 16, 2)
    assert theirs.inner.prompts_per_step // theirs.inner.minibatches == 64   # 64-prompt minibatches
    assert ours.inner.weight_decay == theirs.inner.weight_decay == 0.01
    # 10 epochs of the 6,000-problem inner-training split, 15 of the 7,500 training problems, at 1,024 per step
    assert (theirs.inner.steps, theirs.final.steps) == (10 * 6, 15 * 8)
    assert (theirs.mesh.cand, theirs.mesh.data, theirs.mesh.model) == (1, 4, 2)
    differs = {k for k, v in theirs.inner.items() if ours.inner[k] != v}
    assert differs == {"prompts_per_step", "minibatches", "epochs", "steps"}
    validate_config(theirs)
    inner = inner_config(theirs, int(theirs.domain.max_new_tokens))
    assert inner.rollouts_per_step == 1024 * 5 and inner.rollouts_per_step % inner.grpo.minibatches == 0
