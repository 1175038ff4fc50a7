"""Self-Guide on the engine domains (ScienceWorld, ALFWorld): the shared self-assessment module,
the word vocabulary's assessment words, the environments reading the word off the action before
the engine sees it, the host bridge handing the self-rewards to the rollout, the warm-start
corpus writing the words by the rule, the configs; and the `sg_tiny` presets end to end on the
real engines through the launcher's final mode (slow), with the warm-start corpus checked against
the rollout's own prompt layout (the engine domains' one end-to-end run each)."""

from __future__ import annotations

import json
import math

import jax
import ml_collections
import numpy as np
import pytest

from configs import alfworld as alf_config
from configs import scienceworld as sw_config
from derl_jax.config import ConfigError, validate
from derl_jax.domains import selfguide
from derl_jax.domains.alfworld import env as alf_env
from derl_jax.domains.alfworld import rules
from derl_jax.domains.alfworld.problems import GameSpec
from derl_jax.domains.registry import get_domain
from derl_jax.domains.scienceworld import corpus as sw_corpus
from derl_jax.domains.scienceworld import env as sw_env
from derl_jax.domains.scienceworld import tags as T
from derl_jax.domains.scienceworld.splits import sample
from derl_jax.domains.scienceworld.vocab import Vocabulary, words
from derl_jax.experiment import build
from derl_jax.experiment.run import run
from derl_jax.rl.host_env import HostEnvBridge
from derl_jax.selfguide import TrustSchedule, composite_text

PLUS, SAME, MINUS = selfguide.ASSESSMENTS
REWARDS = (0.5, 0.0, -0.25)   # distinct from the defaults


# ----------------------------------------------------------------------------- the shared module


def test_the_word_is_split_off_the_action():
    assert selfguide.split_assessment("progress+ plan go to kitchen") == (0, "plan go to kitchen")
    assert selfguide.split_assessment("  progress= act look") == (1, "act look")
    assert selfguide.split_assessment("progress-") == (2, "")
    assert selfguide.split_assessment("plan go to kitchen") == (-1, "plan go to kitchen")
    assert selfguide.split_assessment("progress+plan look")[0] == -1   # one word, not the assessment
    assert selfguide.split_assessment("plan progress+ look")[0] == -1  # only the first word counts
    assert selfguide.read_action("progress- reflect look", True) == (2, "reflect look")
    assert selfguide.read_action("plan look", True) == (-1, "")        # no word: nothing is played
    assert selfguide.read_action("progress+ plan look", False) == (-1, "progress+ plan look")


def test_the_rule_and_the_self_rewards():
    after = selfguide.assessment_after
    assert after(0.25, False) == selfguide.POSITIVE and after(0.0, False) == selfguide.NEUTRAL
    assert after(0.0, True) == after(-0.5, False) == selfguide.NEGATIVE
    assert after(0.25, True) == selfguide.POSITIVE   # progress wins (the household's order)
    assessment, live = np.array([0, 1, 2, -1, 0]), np.array([True, True, True, True, False])
    np.testing.assert_allclose(selfguide.self_reward(assessment, REWARDS, live), [0.5, 0.0, -0.25, 0.0, 0.0])
    assert selfguide.checked_rewards([1, 0, -1]) == (1.0, 0.0, -1.0)
    for bad in ((0.1, 0.0), "abc", (0.1, float("inf"), 0.0), (0.1, True, 0.0)):
        with pytest.raises(ValueError, match="three finite numbers"):
            selfguide.checked_rewards(bad)


def test_assessment_words_come_last_in_the_word_vocabulary():
    extra = {"kitchen", "apple", "progress"}
    plain, guided = Vocabulary(extra, ()), Vocabulary(extra, (), assessments=True)
    assert guided.words[:-3] == plain.words and guided.words[-3:] == selfguide.ASSESSMENTS
    assert words("progress- plan open door to kitchen.") == ["progress-", "plan", "open", "door", "to", "kitchen", "."]
    ids = guided.tokens("progress- plan go to kitchen")
    assert ids[0] == guided.ids[MINUS] and ids[1:] == plain.tokens("plan go to kitchen")
    assert guided.decode(guided.encode("progress= act look at apple", 8)) == "progress= act look at apple"
    assert plain.tokens("progress+ look")[0] == plain.unk_id   # without the option: an unknown word


# ----------------------------------------------------------------------------- a scripted engine

# The gold path of the scripted task: action -> (answer, score after it or None (unchanged), completed).
GOLD = (("open door to kitchen", "The door is now open.", None, False),
        ("go to kitchen", "You move to the kitchen.", 0.5, False),
        ("eat apple", "The apple is eaten.", 0.25, False),           # the score falls
        ("pick up apple", "You can't do that.", None, False),        # a failed action
        ("focus on apple", "You focus on the apple.", 1.0, True))
ANSWERS = {action: (answer, score, completed) for action, answer, score, completed in GOLD}
FIRST = "This room is called the hallway. You see a door to the kitchen."
SENT: list[str] = []   # every action a scripted engine received


class ScriptedWorker:
    """A stand-in for `scienceworld.engine.Worker` playing one scripted task (GOLD); anything
    else is answered "No known action matches that input." Logs (action, answer, score before,
    score after) per step."""

    task_names = ("find-plant",)

    def __init__(self, step_limit: int = 100):
        self.score, self.log = 0.0, []

    def fork(self):
        return ScriptedWorker()

    def load(self, task, variation, simplifications="easy", gold_path=False):
        self.score, self.log = 0.0, []

    def gold_actions(self):
        return [action for action, *_ in GOLD]

    def vocabulary(self):
        return {"apple", "kitchen", "door"}

    def task_description(self):
        return "Your task is to focus on the apple."

    def reset(self, describe_task=True):
        self.score = 0.0
        return FIRST

    def step(self, action):
        SENT.append(action)
        answer, score, completed = ANSWERS.get(action, ("No known action matches that input.", None, False))
        before, self.score = self.score, self.score if score is None else score
        self.log.append((action, answer, before, self.score))
        return answer, self.score, completed

    def close(self):
        pass


def scripted_vocabulary(assessments: bool = True) -> Vocabulary:
    texts = [FIRST, "Your task is to focus on the apple.", "No known action matches that input. xyzzy"]
    texts += [f"{action} {answer}" for action, answer, *_ in GOLD]
    return Vocabulary({w for text in texts for w in words(text)}, ScriptedWorker.task_names, assessments=assessments)


def expected_words(log) -> list[str]:
    """The rule replayed on the engine's log: '=' first, then the word after each step."""
    return [SAME] + [selfguide.ASSESSMENTS[selfguide.assessment_after(after - before, T.failed(answer))]
                     for _, answer, before, after in log[:-1]]


def play(worker, vocab, rate: float, self_guide: bool, seed: int = 0):
    return sw_corpus.play(worker, "find-plant", 0, seed, rate, vocab, description_length=16, obs_length=32,
                          action_length=32, window=2, max_turns=30, self_guide=self_guide)


def test_the_corpus_writes_the_expert_word_by_the_rule():
    vocab, worker = scripted_vocabulary(), ScriptedWorker()
    pairs = play(worker, vocab, 0.0, True)
    assert [c.split()[0] for _, c in pairs] == [SAME, SAME, PLUS, MINUS, MINUS] == expected_words(worker.log)
    for seed in range(3):   # random actions (failed ones among them) keep a sensible word
        pairs = play(worker, vocab, 0.5, True, seed)
        assert len(pairs) == len(worker.log) > len(GOLD)
        assert [c.split()[0] for _, c in pairs] == expected_words(worker.log)
        # without self_guide the same episode is written, with no word anywhere
        plain = play(ScriptedWorker(), scripted_vocabulary(False), 0.5, False, seed)
        strip = lambda text: " ".join(w for w in text.split() if w not in selfguide.ASSESSMENTS)  # noqa: E731
        assert [(strip(p), strip(c)) for p, c in pairs] == plain
        assert not any(w in selfguide.ASSESSMENTS for p, c in plain for w in (p + " " + c).split())
    assert {c.split()[0] for _, c in pairs} == set(selfguide.ASSESSMENTS)


def rows(count: int) -> dict[str, np.ndarray]:
    """`count` episodes of the scripted task's variation 0."""
    return {"task": np.zeros(count, np.int32), "variation": np.zeros(count, np.int32)}


def test_scienceworld_env_strips_the_word_before_the_engine(monkeypatch):
    monkeypatch.setattr(sw_env, "Worker", ScriptedWorker)
    monkeypatch.setattr(sw_env, "require_engine", lambda: None)
    vocab = scripted_vocabulary()
    texts = ["progress+ plan go to kitchen", "progress- explore go to kitchen", "plan go to kitchen"]
    actions = np.stack([vocab.encode(text, 8) for text in texts])
    SENT.clear()
    with sw_env.ScienceWorldEnv(("find-plant",), 2, vocab=vocab, obs_length=16, action_length=8, max_turns=2,
                                self_guide=True, self_rewards=REWARDS) as env:
        _, states = env.reset(np.zeros((3, 2), np.uint32), rows(3))
        _, states, reward, done, info = env.step(states, actions)
        assert sorted(SENT) == ["go to kitchen", "go to kitchen"]   # the third had no word: not played
        assert info["assessment"].tolist() == [0, 2, -1]
        np.testing.assert_allclose(info["self_reward"], [0.5, -0.25, 0.0])
        np.testing.assert_allclose(reward, [0.5, 0.5, 0.0])
        assert info["step_score"][2] == 0.0 and info["valid"][2] == 0.0 and states[2].tracker.last_failed
        _, states, _, done, info = env.step(states, actions)       # the last turn
        assert done.all()
        _, _, _, _, info = env.step(states, actions)               # after the end: nothing
        np.testing.assert_allclose(info["self_reward"], 0.0)
        assert info["assessment"].tolist() == [-1, -1, -1]
    SENT.clear()
    with sw_env.ScienceWorldEnv(("find-plant",), 1, vocab=vocab, obs_length=16, action_length=8, max_turns=2) as env:
        _, states = env.reset(np.zeros((1, 2), np.uint32), rows(1))
        _, _, _, _, info = env.step(states, actions[:1])
        assert SENT == ["progress+ plan go to kitchen"] and "self_reward" not in info   # no tag read: the option is off


def test_alfworld_env_strips_the_word_before_the_engine(monkeypatch):
    monkeypatch.setattr(alf_env, "require_engine", lambda: None)
    vocab = Vocabulary({"cabinet", "apple", "1", "arrive", "at"}, (), assessments=True)
    spec = GameSpec("pick_and_place_simple", "apple", "cabinet", "", "put an apple in cabinet", source={})
    env = alf_env.AlfWorldEnv([spec], 0, vocab=vocab, obs_length=16, action_length=10, max_turns=3, self_guide=True,
                              self_rewards=REWARDS)
    sent = []

    def engine(calls):
        sent.extend(op for _, op in calls)
        return ["You are in the middle of a room." if op[0] == "start" else
                ("You arrive at cabinet 1.", False) if op[0] == "step" else None for _, op in calls]

    monkeypatch.setattr(env, "_run", engine)
    _, states = env.reset(np.zeros((3, 2), np.uint32), {"game": np.zeros(3, np.int32)})
    texts = ["progress= explore go to cabinet 1", "progress+ plan go to cabinet 1", "plan go to cabinet 1"]
    _, states, _, _, info = env.step(states, np.stack([vocab.encode(text, 10) for text in texts]))
    commands = [op[2] for op in sent if op[0] == "step"]
    assert commands == ["go to cabinet 1", "go to cabinet 1"]   # the third had no word: not played
    assert info["assessment"].tolist() == [1, 0, -1]
    np.testing.assert_allclose(info["self_reward"], [0.0, 0.5, 0.0])
    assert info["step_score"].tolist() == [1.0, 1.0, 0.0]   # the first turn: plan and explore (a new place) are right
    assert info["valid"][2] == 0.0 and states[2].tracker.last_failed
    env.close()


class CountingEnv:
    """A batched host environment whose self-reward is the action's first token / 10; row 0 ends
    after its first step."""

    host, obs_length, action_length, max_turns = True, 2, 2, 2

    def __init__(self, self_guide: bool):
        self.self_guide = self_guide

    def reset(self, keys, tasks):
        return np.zeros((len(keys), 2), np.int32), [int(row) for row in tasks["row"]]

    def step(self, states, actions):
        info = {"step_score": np.ones(len(states), np.float32), "success": np.zeros(len(states), np.float32),
                "self_reward": actions[:, 0].astype(np.float32) / 10}
        done = np.array([row == 0 for row in states])
        return np.zeros((len(states), 2), np.int32), states, np.zeros(len(states), np.float32), done, info


def test_the_host_bridge_hands_over_the_self_rewards():
    bridge = HostEnvBridge(CountingEnv(self_guide=True))
    keys = jax.random.split(jax.random.key(0), 3)
    _, handles = jax.vmap(bridge.reset)(jax.random.key_data(keys), {"row": np.arange(3, dtype=np.int32)})
    actions = np.array([[1, 0], [2, 0], [3, 0]], np.int32)
    _, handles, _, done, info = jax.vmap(bridge.step)(handles, actions)
    np.testing.assert_allclose(info["self_reward"], [0.1, 0.2, 0.3], atol=1e-7)
    _, _, _, done, info = jax.vmap(bridge.step)(handles, actions + 1)
    np.testing.assert_allclose(info["self_reward"], [0.0, 0.3, 0.4], atol=1e-7)   # row 0 had ended
    plain = HostEnvBridge(CountingEnv(self_guide=False))
    _, handles = jax.vmap(plain.reset)(jax.random.key_data(keys), {"row": np.arange(3, dtype=np.int32)})
    assert "self_reward" not in jax.vmap(plain.step)(handles, actions)[4]


# ----------------------------------------------------------------------------- configs


@pytest.mark.parametrize("module", [sw_config, alf_config], ids=["scienceworld", "alfworld"])
def test_self_guide_fields_and_presets(module):
    spec = get_domain(module.get_config("tiny").domain.kind)
    tiny, guided = module.get_config("tiny"), module.get_config("sg_tiny")
    assert spec.primitive_names(tiny) == ("outcome", "phase_first", "phase_middle", "phase_last")
    assert spec.primitive_names(guided) == spec.primitive_names(tiny) + ("g_sg",)
    assert guided.compare.methods == ("outcome", "self_guide", "self_guide_no_warmup", "self_guide_no_anneal")
    assert module.get_config("self_guide").domain.self_guide and not module.get_config().domain.self_guide
    validate(guided)
    for field, value in (("self_guide", 1), ("self_rewards", (0.1, 0.0)), ("self_rewards", (0.1, float("nan"), 0.0))):
        cfg = module.get_config("sg_tiny")
        cfg.domain = ml_collections.ConfigDict({**cfg.domain.to_dict(), field: value})   # no type locking
        with pytest.raises(ConfigError, match=f"config.domain.{field}"):
            validate(cfg)
    tiny.inner.self_reward_credit = "turn"   # per-turn credit needs the self-rewards
    with pytest.raises(ConfigError, match="self_reward_credit='turn'.*self_guide=True"):
        validate(tiny)
    guided.inner.self_reward_credit = "turn"
    validate(guided)


# ----------------------------------------------------------------------------- end to end on the engines

# lambda(u) = 1 at u = 0 and 0 at u = 1: the two steps of the tiny presets' final policy see both
SCHEDULE = TrustSchedule(warmup=0.0, ramp_end=0.0, anneal_start=0.5)


def run_sg_tiny(module, monkeypatch, tmp_path):
    """The `sg_tiny` preset's final mode with the Self-Guide reward -> (cfg, built domain, result)."""
    built = []
    real_build = build.build_domain
    monkeypatch.setattr(build, "build_domain", lambda cfg: built.append(real_build(cfg)) or built[-1])
    cfg = module.get_config("sg_tiny")
    cfg.domain.self_rewards = REWARDS
    expression = composite_text(get_domain(cfg.domain.kind).primitive_names(cfg), SCHEDULE)
    assert expression == "g1+clip((1-u)/0.5,0,1)*g5"
    final = run(cfg, str(tmp_path), "final", expression, progress=False)
    result = json.loads((tmp_path / "final_result.json").read_text())
    assert result["expression"] == expression and result["seed"] == 0 and result["test"] == final.test
    assert 0.0 <= result["test"] <= 1.0 and result["test"] * 2 == round(result["test"] * 2)   # 2 test episodes
    curves = {name: np.asarray(values) for name, values in result["curves"].items()}
    assert all(values.shape == (cfg.final.steps,) and np.isfinite(values).all() for values in curves.values())
    lam = np.array([1.0, 0.0])   # lambda(0), lambda(1)
    np.testing.assert_allclose(curves["reward_mean"], curves["primitive/outcome"] + lam * curves["primitive/g_sg"],
                               atol=1e-5)
    bound = cfg.domain.max_turns * max(abs(r) for r in REWARDS)
    assert (np.abs(curves["primitive/g_sg"]) <= bound).all()
    for name in ("outcome", "phase_first", "phase_middle", "phase_last"):
        assert ((0 <= curves[f"primitive/{name}"]) & (curves[f"primitive/{name}"] <= 1)).all()
    assert (0 < curves["response_length"]).all() and (curves["response_length"] <= cfg.domain.action_length).all()
    recorded = json.loads((tmp_path / "domain.json").read_text())
    assert recorded["domain"] == cfg.domain.kind
    return cfg, built[0], recorded


def replay_gold_prompts(domain, context):
    """Play the unperturbed warm-start corpus of training row 0 (the gold path or the planner's
    plan, each action after its assessment word and reasoning tag): its prompts are exactly what
    the rollout builds from the environment's answers, every turn is tagged as the rules say, and
    the episode succeeds -> (number of turns, the last step's reward and info)."""
    from derl_jax.domains.env import turn_prompts

    env, vocab = domain.env, domain.tokenizer
    pairs = domain.corpus(0, list(range(1, domain.train.size)), {"sft_perturb_rate": 0.0})
    assert all(c.split()[0] in selfguide.ASSESSMENTS and c.split()[1] in ("plan", "explore", "reflect", "act")
               for _, c in pairs)
    obs, states = env.reset(np.zeros((1, 2), np.uint32), context)
    task = np.asarray(domain.train.prompts[:1])
    window_actions = np.full((1, 1, env.action_length), vocab.pad_id, np.int32)
    window_obs = obs[:, None]
    for turn, (prompt, completion) in enumerate(pairs):
        rollout_prompt, rollout_mask = turn_prompts(task, task != vocab.pad_id, window_actions, window_actions != vocab.pad_id,
                                                    window_obs, window_obs != vocab.pad_id)
        rollout_ids = np.asarray(rollout_prompt)[0][np.asarray(rollout_mask)[0]]
        corpus_ids = vocab.encode_batch([prompt], domain.prompt_length, left_pad=True, add_bos=True)[0][0]
        assert corpus_ids[corpus_ids != vocab.pad_id].tolist() == rollout_ids.tolist(), f"turn {turn}"
        action = vocab.encode(completion, env.action_length)[None]
        obs, states, reward, done, info = env.step(states, action)
        assert info["step_score"].tolist() == [1.0], f"turn {turn}: {completion!r} is tagged as the rules say"
        window_actions, window_obs = action[:, None], obs[:, None]
    assert done.tolist() == [True] and info["success"].tolist() == [1.0]
    return len(pairs), reward, info


def replay_corpus(domain, stepped):
    """Play the warm-start corpus of training row 0 (random actions mixed in) through the
    environment; check each completion's word against the rule (on the environment's own record
    of the step before) and its self-reward against the word, and that the engine never
    received a word. `stepped()` -> the commands the engine received so far."""
    env, vocab = domain.env, domain.tokenizer
    pairs = domain.corpus(0, list(range(1, domain.train.size)), {"sft_perturb_rate": 0.5})
    written = [completion.split()[0] for _, completion in pairs]
    assert set(written) <= set(selfguide.ASSESSMENTS) and len(set(written)) >= 2, written
    _, states = env.reset(np.zeros((1, 2), np.uint32), {k: np.asarray(v)[:1] for k, v in domain.train.context.items()})
    expected, score = selfguide.NEUTRAL, 0.0
    for turn, (_, completion) in enumerate(pairs):
        assert selfguide.ASSESSMENTS.index(completion.split()[0]) == expected, f"turn {turn}: {completion!r}"
        before = len(stepped())
        _, states, _, _, info = env.step(states, vocab.encode(completion, env.action_length)[None])
        assert info["assessment"].tolist() == [expected]
        assert info["self_reward"].tolist() == [pytest.approx(REWARDS[expected])]
        assert not any(w in selfguide.ASSESSMENTS for command in stepped()[before:] for w in command.split())
        tracker, new_score = states[0].tracker, float(info["score"][0])
        change = 1.0 if tracker.subgoal_done else min(new_score - score, 0.0)
        expected, score = selfguide.assessment_after(change, tracker.last_failed), new_score


@pytest.mark.slow
def test_scienceworld_sg_tiny_end_to_end(monkeypatch, tmp_path):
    sw_env.require_engine()   # the agents extra and Java are part of the test environment
    _, domain, recorded = run_sg_tiny(sw_config, monkeypatch, tmp_path)
    assert domain.primitive_names[-1] == "g_sg" and domain.tokenizer.words[-3:] == selfguide.ASSESSMENTS
    dev = domain.env.workers[0].variations("find-non-living-thing", "dev")   # L0 tests on 2 of ScienceWorld's dev variations
    assert recorded["test_variations"]["variation"] == sample(dev, 2, 0, 1, 0) and set(recorded["test_variations"]["variation"]) < set(dev)
    context = {name: np.asarray(value)[:1] for name, value in domain.train.context.items()}
    turns, _, info = replay_gold_prompts(domain, context)
    assert turns == 5 and math.isclose(info["score"][0], 1.0)
    sent = []
    for worker in domain.env.workers:   # the games of the replay are forks of the first JVM's worker
        fork = worker.fork

        def spying_fork(fork=fork):
            game = fork()
            step = game.step
            game.step = lambda action: sent.append(action) or step(action)
            return game

        worker.fork = spying_fork
    domain.env._idle = [[] for _ in domain.env.workers]   # no game of the run is reused
    replay_corpus(domain, lambda: sent)
    assert sent
    domain.env.close()
    assert domain.env.workers == []


@pytest.mark.slow
def test_alfworld_sg_tiny_end_to_end(monkeypatch, tmp_path):
    _, domain, recorded = run_sg_tiny(alf_config, monkeypatch, tmp_path)
    assert domain.primitive_names[-1] == "g_sg" and domain.tokenizer.words[-3:] == selfguide.ASSESSMENTS
    assert len(recorded["train_games"]) == 6 and len(recorded["test_games"]) == 2
    turns, reward, _ = replay_gold_prompts(domain, {"game": np.zeros(1, np.int32)})
    assert 3 <= turns <= domain.env.max_turns and reward.tolist() == [1.0]
    sent, run_all = [], domain.env.workers.run_all

    def spying(ops_of):
        sent.extend(op[2] for ops in ops_of.values() for op in ops if op[0] == "step")
        return run_all(ops_of)

    domain.env.workers.run_all = spying
    replay_corpus(domain, lambda: sent)
    assert sent and rules.well_formed(sent[0])
    domain.env.close()
