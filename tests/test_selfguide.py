"""Self-Guide: the trust schedule, its reward expression, self-assessment in the household
environment and corpus, the g_sg primitive, the strategy and the config presets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from derl_jax.config import ConfigError
from derl_jax.domains.household import actions as A
from derl_jax.domains.household import tasks as T
from derl_jax.domains.household import vocab
from derl_jax.domains.household.env import HouseholdEnv
from derl_jax.domains.household.expert import expert_action, rollout
from derl_jax.domains.household.selfguide import expert_assessment, with_assessment
from derl_jax.domains.registry import get_domain
from derl_jax.expr.parse import parse
from derl_jax.expr.program import compile_expr
from derl_jax.expr.vm import evaluate
from derl_jax.selfguide import TrustSchedule, composite_text, schedule_from_config, trust, trust_text
from primitives.selfguide import summed_self_reward


def reference_trust(u: float, warmup: float, ramp_end: float, anneal_start: float) -> float:
    """The paper's four phases, written out one by one."""
    if u < warmup:
        return 0.0
    if u < ramp_end:
        return (u - warmup) / (ramp_end - warmup)
    if u <= anneal_start:
        return 1.0
    return (1.0 - u) / (1.0 - anneal_start)


# one compiled VM for every schedule: programs are padded to one length, so only their arrays differ
_evaluate_over_progress = jax.jit(jax.vmap(lambda u, program: evaluate(program, jnp.zeros((1, 1), jnp.float32), u)[0],
                                           in_axes=(0, None)))

SCHEDULES = [(0.2, 0.4, 0.8), (0.0, 0.0, 0.8), (0.2, 0.4, 1.0), (0.0, 0.0, 1.0), (0.1, 0.6, 0.7), (0.0, 0.5, 0.5)]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_trust_matches_the_four_phases_and_its_expression(schedule):
    grid = np.linspace(0.0, 1.0, 41)
    expected = np.array([reference_trust(u, *schedule) for u in grid])
    np.testing.assert_allclose(trust(grid, *schedule), expected, atol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda u: trust(u, *schedule, xp=jnp))(grid), expected, atol=1e-6)
    from_expression = _evaluate_over_progress(jnp.asarray(grid, jnp.float32), compile_expr(parse(trust_text(*schedule))))
    np.testing.assert_allclose(from_expression, expected, atol=1e-6)


def test_trust_at_the_phase_boundaries_and_monotone_pieces():
    w, r, a = 0.2, 0.4, 0.8
    at = lambda u: float(trust(u, w, r, a))  # noqa: E731
    assert at(0.0) == 0.0 and at(w) == 0.0 and at(0.1) == 0.0          # warm-up
    assert at((w + r) / 2) == pytest.approx(0.5)                          # halfway up the ramp
    assert at(r) == pytest.approx(1.0) and at(0.6) == 1.0 and at(a) == 1.0   # full trust
    assert at((a + 1) / 2) == pytest.approx(0.5) and at(1.0) == 0.0       # anneal back to 0
    grid = np.linspace(0.0, 1.0, 201)
    values = trust(grid, w, r, a)
    rising, falling = values[grid <= a], values[grid >= a]
    assert np.all(np.diff(rising) >= -1e-7) and np.all(np.diff(falling) <= 1e-7)
    ramp = (grid > w + 1e-9) & (grid < r - 1e-9)
    np.testing.assert_allclose(np.diff(values[ramp]) / np.diff(grid[ramp]), 1 / (r - w), rtol=1e-4)
    assert float(trust(0.0, 0.0, 0.0, a)) == 1.0          # no warm-up: full trust from the start
    assert float(trust(1.0, w, r, 1.0)) == 1.0            # no annealing: full trust at the end


@pytest.mark.parametrize("schedule, message", [
    ((0.5, 0.4, 0.8), "warmup <= ramp_end"), ((0.2, 0.9, 0.8), "ramp_end <= anneal_start"),
    ((-0.1, 0.4, 0.8), "warmup"), ((0.2, 0.4, 1.5), "anneal_start"), ((0.3, 0.3, 0.8), "zero length"),
])
def test_bad_schedules_are_refused_naming_the_field(schedule, message):
    with pytest.raises(ValueError, match=message):
        TrustSchedule(*schedule)
    cfg = {"trust": dict(zip(("warmup", "ramp_end", "anneal_start"), schedule))}
    with pytest.raises(ValueError, match="config.trust"):
        schedule_from_config(cfg)


@pytest.mark.slow
def test_composite_text_weights_g_sg_by_the_schedule():
    names = ("outcome", "phase_first", "phase_middle", "phase_last", "g_sg")
    assert composite_text(names) == "g1+clip(min((u-0.2)/0.2,(1-u)/0.2),0,1)*g5"
    assert composite_text(names, TrustSchedule(0.0, 0.0, 1.0)) == "g1+g5"
    program = compile_expr(parse(composite_text(names, TrustSchedule(0.1, 0.6, 0.7)), names))
    prims = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
    grid = np.array([0.0, 0.35, 0.65, 0.85, 1.0], np.float32)
    got = jax.jit(jax.vmap(lambda u: evaluate(program, jnp.asarray(prims), u)))(grid)
    for row, u in enumerate(grid):
        expected = prims[:, 0] + reference_trust(float(u), 0.1, 0.6, 0.7) * prims[:, 4]
        np.testing.assert_allclose(got[row], expected, atol=1e-5)
    with pytest.raises(ValueError, match="g_sg"):
        composite_text(names[:4])


# ----------------------------------------------------------------------------- vocabulary and environment


def test_assessment_words_extend_the_vocabulary_without_moving_ids():
    base, guided = vocab.WordVocab(), vocab.WordVocab(self_guide=True)
    assert base.vocab_size == vocab.VOCAB_SIZE == len(vocab.WORDS)
    assert guided.vocab_size == vocab.VOCAB_SIZE + 3 and vocab.ID["apple"] < vocab.VOCAB_SIZE
    ids = guided.encode("progress- plan go to cabinet 1")
    assert ids[0] == vocab.ASSESSMENT_IDS[2] and ids[1:] == base.encode("plan go to cabinet 1")
    assert guided.decode(ids) == "progress- plan go to cabinet 1"
    with pytest.raises(ValueError, match="progress\\+"):
        base.encode("progress+ look")
    with pytest.raises(ValueError, match="outside"):
        base.decode([int(vocab.ASSESSMENT_IDS[0])])


@pytest.fixture(scope="module")
def tasks():
    train, _ = T.level_splits("L0", 3, 12, 6)
    return train


def first_task(tasks):
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x[0]), T.to_device(tasks))


@pytest.mark.slow
def test_env_reads_the_assessment_and_reports_its_reward(tasks):
    rewards = (0.5, -0.25, -1.0)
    env = HouseholdEnv(max_turns=4, self_guide=True, self_rewards=rewards)
    assert env.action_length == A.ACTION_LENGTH + 1 and HouseholdEnv().action_length == A.ACTION_LENGTH
    task = first_task(tasks)
    _, state = env.reset(jax.random.PRNGKey(0), task)
    words = vocab.WordVocab(self_guide=True)
    step = jax.jit(env.step)
    for index, word in enumerate(vocab.ASSESSMENTS):
        action = jnp.asarray(words.encode_padded(f"{word} plan look", env.action_length))
        _, _, _, _, info = step(state, action)
        assert float(info["self_reward"]) == pytest.approx(rewards[index]) and int(info["assessment"]) == index
        assert float(info["well_formed"]) == 1.0 and float(info["valid"]) == 1.0
    # No assessment word: malformed, no self-reward; the plain action is read one token late.
    _, _, _, _, info = step(state, jnp.asarray(words.encode_padded("plan look", env.action_length)))
    assert float(info["self_reward"]) == 0.0 and int(info["assessment"]) == -1 and float(info["well_formed"]) == 0.0
    # A finished episode earns nothing.
    done_state = state.replace(done=jnp.bool_(True))
    _, _, _, _, info = step(done_state, jnp.asarray(words.encode_padded("progress+ plan look", env.action_length)))
    assert float(info["self_reward"]) == 0.0
    # Without the option the info is as before.
    _, plain_state = HouseholdEnv(max_turns=4).reset(jax.random.PRNGKey(0), task)
    _, _, _, _, plain = jax.jit(HouseholdEnv(max_turns=4).step)(plain_state, jnp.asarray(
        vocab.WordVocab().encode_padded("plan look", A.ACTION_LENGTH)))
    assert "self_reward" not in plain and float(plain["well_formed"]) == 1.0


@pytest.mark.slow
def test_expert_with_assessments_solves_every_task_and_assesses_sensibly(tasks):
    env = HouseholdEnv(max_turns=30, self_guide=True)
    policy = with_assessment(expert_action)
    episodes = jax.device_get(jax.jit(lambda t, k: rollout(env, t, k, policy))(T.to_device(tasks), jax.random.PRNGKey(1)))
    np.testing.assert_array_equal(episodes["success"], 1.0)
    # Replay: the word of each turn follows the rule on the state the turn started from.
    step = jax.jit(env.step)
    for row in range(2):
        task = jax.tree_util.tree_map(lambda x: jnp.asarray(x[row]), T.to_device(tasks))
        _, state = env.reset(jax.random.PRNGKey(0), task)
        for turn in np.flatnonzero(episodes["step_mask"][row]):
            action = episodes["actions"][row, turn]
            expected = 0 if bool(state.subgoal_done) else 2 if bool(state.last_failed) else 1
            assert int(expert_assessment(state)) == expected
            assert action[0] == vocab.ASSESSMENT_IDS[expected]
            _, state, _, _, info = step(state, jnp.asarray(action))
            assert float(info["self_reward"]) == pytest.approx((0.1, 0.0, -0.1)[expected])
        assert bool(state.success)


def test_g_sg_sums_the_taken_steps_self_rewards():
    rng = np.random.default_rng(3)
    rewards = rng.choice([0.1, 0.0, -0.1], size=(5, 7)).astype(np.float32)
    mask = np.arange(7)[None, :] < rng.integers(0, 8, size=(5, 1))
    got = summed_self_reward({"self_rewards": rewards, "step_mask": mask}, None)
    expected = [sum(float(rewards[n, t]) for t in range(7) if mask[n, t]) for n in range(5)]
    np.testing.assert_allclose(got, expected, atol=1e-6)
    with pytest.raises(KeyError, match="self_guide=True"):
        summed_self_reward({"step_mask": mask}, None)


# ----------------------------------------------------------------------------- domain, corpus, configs


def domain_config(**domain):
    from configs import household

    cfg = household.get_config("sg_smoke")
    cfg.domain.update(num_train=10, num_test=4, max_turns=5, **domain)
    return cfg


@pytest.mark.slow
def test_self_guide_domain_and_corpus():
    cfg = domain_config()
    spec = get_domain("household")
    spec.validate(cfg)
    domain = spec.build(cfg)
    assert domain.primitive_names == spec.primitive_names(cfg) == (
        "outcome", "phase_first", "phase_middle", "phase_last", "g_sg")
    assert domain.max_new_tokens == domain.env.action_length == 9 and domain.tokenizer.vocab_size == vocab.VOCAB_SIZE + 3
    texts = domain.corpus(0, [], {"sft_perturb_rate": 0.3})
    assert texts and all(completion.split()[0] in vocab.ASSESSMENTS for _, completion in texts)
    assert {completion.split()[0] for _, completion in texts} == set(vocab.ASSESSMENTS)
    # The completions fit the policy's tokens per turn with their eos (as the warm start encodes them).
    _, mask = domain.tokenizer.encode_batch([c for _, c in texts], domain.max_new_tokens, left_pad=False, add_eos=True)
    assert mask.sum(axis=1).max() <= domain.max_new_tokens
    off = spec.build(domain_config(self_guide=False))
    assert off.primitive_names == ("outcome", "phase_first", "phase_middle", "phase_last") and off.max_new_tokens == 8


@pytest.mark.parametrize("field, value", [("self_guide", 1), ("self_rewards", (0.1, 0.0)),
                                          ("self_rewards", (0.1, float("nan"), 0.0))])
def test_bad_self_guide_fields_are_named(field, value):
    import ml_collections

    cfg = domain_config()
    block = cfg.domain.to_dict()
    block[field] = value
    cfg.domain = ml_collections.ConfigDict(block)   # a plain block: no type locking of the preset's fields
    with pytest.raises(ConfigError, match=f"config.domain.{field}"):
        get_domain("household").validate(cfg)


@pytest.mark.parametrize("preset", ["self_guide", "sg_smoke"])
def test_ablation_presets_pass_every_check_and_propose_their_reward(preset):
    from configs import household
    from derl_jax.config import validate
    from derl_jax.experiment.checks import validate_config
    from derl_jax.outer import make_strategy

    cfg = household.get_config(preset)
    validate(cfg)
    validate_config(cfg)
    names = get_domain("household").primitive_names(cfg)
    assert "g_sg" in names
    proposed = {}
    for method in cfg.compare.methods:
        strategy = make_strategy(method, cfg, None, names)
        proposed[method] = strategy.propose(strategy.init(None), None, 1)[0][0]
    assert proposed == {"outcome": "g1", "self_guide": "g1+clip(min((u-0.2)/0.2,(1-u)/0.2),0,1)*g5",
                        "self_guide_no_warmup": "g1+clip((1-u)/0.2,0,1)*g5",
                        "self_guide_no_anneal": "g1+clip((u-0.2)/0.2,0,1)*g5"}
    assert get_domain("household").primitive_names(household.get_config("default")) == names[:4]


def test_self_guide_method_needs_the_self_assessment():
    from configs import household
    from derl_jax.experiment.checks import validate_config

    cfg = household.get_config("self_guide")
    cfg.domain.self_guide = False
    cfg.meta.primitive_descriptions = ()  # the preset's lines name the self-assessment primitive too
    with pytest.raises(ConfigError, match="self_guide=True"):
        validate_config(cfg)
    cfg = household.get_config("self_guide")
    cfg.trust.ramp_end = 0.1
    with pytest.raises(ConfigError, match="config.trust"):
        validate_config(cfg)
