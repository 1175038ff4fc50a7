"""The `scienceworld` domain: ScienceWorld's engine as a multi-turn ("env") domain on the host.

Config block `domain` (configs/scienceworld.py):
  kind="scienceworld"; tasks: ScienceWorld task names; level: "L0" | "L1" | "L2" (splits.py);
  held_out_tasks: the tasks L2 evaluates on (and does not train on); num_train / num_test:
  variations per task for training / evaluation (0 = all of ScienceWorld's list, N = N drawn
  at random with split_seed); simplifications: the engine's ("easy");
  max_turns per episode; history: the prompt window W; obs_length / action_length: words per
  observation / action; description_length: words of the task description in the task prompt;
  num_workers: JVMs (each holds many games, see env.py); self_guide (default False): the policy
  writes a self-assessment word before each action (Self-Guide, derl_jax/domains/selfguide.py;
  it counts among the action_length tokens and the engine never sees it), mapped to the
  internal rewards self_rewards (default (0.1, 0.0, -0.1) for progress+ / progress= /
  progress-); adds the primitive g_sg.
Token ids: with `config.policy.tokenizer` or `config.policy.checkpoint` (a local Hugging Face
directory) the policy's own tokenizer (subword.py); otherwise the word vocabulary below.
Policy block options read by the warm-start corpus: sft_perturb_rate (share of harmless random
actions mixed into the gold paths, default 0.3).

Building the domain starts the JVMs and surveys every split row once (description, first
observation, the engine's words; the gold path's observations for training rows): the word
vocabulary is the words met there (`vocab.Vocabulary`), so it depends only on the engine and
the config. A split is a TokenDataset: prompts = <bos> + the variation's task description
(left padded), context = {"task": i32[M] (index into domain.tasks), "variation": i32[M]}.
Primitives: the agent family (outcome, phase_first, phase_middle, phase_last), outcome first,
then g_sg with self_guide.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
from typing import Any, Sequence

import numpy as np

import primitives.agent  # noqa: F401  (registers the agent primitives)
from derl_jax.config import (ConfigError, InputError, choice, config_value, int_at_least, held_out_split,
                             optional_fraction)
from derl_jax.domains import agent_prompt, selfguide
from derl_jax.domains.base import Domain, TokenDataset
from derl_jax.domains.registry import register_domain
from derl_jax.domains.scienceworld import corpus as sw_corpus
from derl_jax.domains.scienceworld.engine import require_engine
from derl_jax.domains.scienceworld.splits import LEVELS, level_split
from derl_jax.domains.scienceworld.vocab import Vocabulary, words
from primitives import registry
from primitives.agent import AGENT_PRIMITIVES

DEFAULT_PERTURB_RATE = 0.3
DEFAULT_ADMISSIBLE_LENGTH = 256   # ours: tokens of the admissible-actions line of an agent prompt
SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                   "noElectricalAction")


def survey_row(worker, task: str, variation: int, simplifications: str, gold: bool) -> tuple[str, set[str]]:
    """(task description, words met) of one task variation: its description, first observation
    and the engine's object and action words, and with `gold` every observation of its gold path."""
    worker.load(task, variation, simplifications, gold_path=gold)
    description = worker.task_description()
    met = set(words(description)) | set(words(worker.reset(describe_task=False)))
    for phrase in worker.vocabulary():
        met.update(words(phrase))
    for action in worker.gold_actions() if gold else ():
        met.update(words(action))
        met.update(words(worker.step(action)[0]))
    return description, met


def make_dataset(descriptions: Sequence[str], rows: dict[str, np.ndarray], vocab: Vocabulary,
                 description_length: int) -> TokenDataset:
    """prompts i32[M, D+1] (<bos> + description, left padded), context {"task", "variation"} i32[M]."""
    cut = [vocab.decode(vocab.tokens(text)[:description_length]) for text in descriptions]
    prompts, mask = vocab.encode_batch(cut, description_length + 1, left_pad=True, add_bos=True)
    return TokenDataset(prompts=prompts, prompt_mask=mask,
                        context={"task": np.asarray(rows["task"], np.int32), "variation": np.asarray(rows["variation"], np.int32)})


tokenizer_directory = agent_prompt.tokenizer_directory


def make_scienceworld_domain(cfg: Any, tokenizer_dir: str = "", agent: bool = False) -> Domain:
    """The ScienceWorld Domain of config block `cfg` (`config.domain`); starts the JVMs. Token ids
    are the policy's tokenizer's when `tokenizer_dir` names one (subword.py), else the word
    vocabulary built from the survey. With `agent` (a pretrained policy) the agent prompt
    (`derl_jax.domains.agent_prompt`): rows of obs_length + admissible_length tokens, answers of
    action_length tokens, task prompts in the chat template, and the gold paths' turns written in
    it as the cold-start corpus."""
    from derl_jax.domains.scienceworld.env import ScienceWorldEnv

    tasks, simplifications, self_guide = tuple(cfg.tasks), str(cfg.simplifications), selfguide.enabled(cfg)
    env = ScienceWorldEnv(tasks, int(cfg.num_workers), vocab=Vocabulary((), tasks), obs_length=int(cfg.obs_length),
                          action_length=int(cfg.action_length), max_turns=int(cfg.max_turns),
                          simplifications=simplifications, describe_task=False, self_guide=self_guide,
                          self_rewards=selfguide.self_rewards(cfg))
    atexit.register(env.close)
    try:
        train, test = level_split(env.workers[0], tasks, str(cfg.level), tuple(cfg.get("held_out_tasks", ())),
                                  int(cfg.num_train), int(cfg.num_test), int(cfg.get("split_seed", 0)))
        rows = [(int(t), int(v), True) for t, v in zip(train["task"], train["variation"])]
        rows += [(int(t), int(v), False) for t, v in zip(test["task"], test["variation"])]
        surveyed = env.per_worker(lambda b: survey_row(env.workers[b % len(env.workers)], tasks[rows[b][0]],
                                                        rows[b][1], simplifications, rows[b][2]),
                                   [b % len(env.workers) for b in range(len(rows))])
    except BaseException:
        env.close()
        raise
    if agent:
        env.vocab = agent_prompt.load_table(tokenizer_dir, tasks)
        env.prompt = agent_prompt.AgentPrompt(env.vocab, "scienceworld", int(cfg.obs_length),
                                              int(cfg.get("admissible_length", DEFAULT_ADMISSIBLE_LENGTH)),
                                              self_guide, int(cfg.action_length))
        env.obs_length, env.prompt_layout = env.prompt.row_length, env.prompt.layout
    elif tokenizer_dir:
        from derl_jax.domains.scienceworld.subword import SubwordTable
        from derl_jax.models.hf_tokenizer import HFTokenizer

        env.vocab = SubwordTable(HFTokenizer.from_directory(tokenizer_dir), tasks)
    else:
        env.vocab = Vocabulary(set().union(*(met for _, met in surveyed)), tasks, assessments=self_guide)
    descriptions = [description for description, _ in surveyed]
    length = int(cfg.description_length)
    if agent:
        return agent_domain(cfg, env, descriptions, train, test)
    domain = Domain(
        name="scienceworld",
        primitives=registry.resolve("agent", selfguide.primitive_names(AGENT_PRIMITIVES, cfg)),
        outcome_index=0,
        train=make_dataset(descriptions[:len(train["task"])], train, env.vocab, length),
        test=make_dataset(descriptions[len(train["task"]):], test, env.vocab, length),
        tokenizer=env.vocab,
        max_new_tokens=env.action_length,
        eos_id=env.vocab.eos_id,
        pad_id=env.vocab.pad_id,
        rollout="env",
        env=env,
        history=int(cfg.history),
        info={"level": str(cfg.level), "tasks": list(tasks), "held_out_tasks": list(cfg.get("held_out_tasks", ())),
              "train_variations": {k: v.tolist() for k, v in train.items()},
              "test_variations": {k: v.tolist() for k, v in test.items()},
              "vocab_size": env.vocab.vocab_size, "description_length": length},
    )
    return dataclasses.replace(domain, corpus=functools.partial(supervised_corpus, domain))


def agent_domain(cfg: Any, env, descriptions: Sequence[str], train: dict, test: dict) -> Domain:
    """The agent-prompt ScienceWorld Domain (`make_scienceworld_domain` with `agent`)."""
    def dataset(texts: Sequence[str], rows: dict) -> TokenDataset:
        ids = [env.prompt.task_ids(text) for text in texts]
        prompts, mask = env.vocab.encode_batch(ids, max(len(i) for i in ids), left_pad=True)
        return TokenDataset(prompts=prompts, prompt_mask=mask, context={
            "task": np.asarray(rows["task"], np.int32), "variation": np.asarray(rows["variation"], np.int32)})

    count = len(train["task"])
    domain = Domain(
        name="scienceworld", primitives=registry.resolve("agent", selfguide.primitive_names(AGENT_PRIMITIVES, cfg)),
        outcome_index=0, train=dataset(descriptions[:count], train), test=dataset(descriptions[count:], test),
        tokenizer=env.vocab, max_new_tokens=env.action_length, eos_id=env.vocab.eos_id, pad_id=env.vocab.pad_id,
        rollout="env", env=env, history=int(cfg.history),
        info={"level": str(cfg.level), "tasks": list(env.task_names), "prompt_style": "agent",
              "held_out_tasks": list(cfg.get("held_out_tasks", ())),
              "train_variations": {k: v.tolist() for k, v in train.items()},
              "test_variations": {k: v.tolist() for k, v in test.items()}, "vocab_size": env.vocab.vocab_size},
    )
    return dataclasses.replace(domain, corpus=functools.partial(agent_corpus, domain))


def agent_corpus(domain: Domain, seed: int, holdout_rows: Sequence[int] = (), options: Any = None
                 ) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids): the perturbed gold path's turns of each training row except
    `holdout_rows` in the agent prompt (corpus.play_agent)."""
    rate, keep = sw_corpus.corpus_rows("scienceworld", domain.train.size, holdout_rows, options, DEFAULT_PERTURB_RATE)
    env, context = domain.env, domain.train.context

    def play(b: int) -> list[tuple[list[int], list[int]]]:
        row = keep[b]
        return sw_corpus.play_agent(env.workers[b % len(env.workers)], env.task_names[int(context["task"][row])],
                                    int(context["variation"][row]), int(seed), rate, env.prompt, window=domain.history,
                                    max_turns=env.max_turns, simplifications=env.simplifications,
                                    self_guide=env.self_guide)

    episodes = env.per_worker(play, [b % len(env.workers) for b in range(len(keep))])
    return [pair for episode in episodes for pair in episode]


def supervised_corpus(domain: Domain, seed: int, holdout_rows: Sequence[int] = (), options: Any = None
                      ) -> list[tuple[str, str]]:
    """(prompt, completion) texts: every turn of the perturbed gold path (corpus.py) of each training
    row except `holdout_rows`. Prompts carry no <bos> (the encoder adds it), completions no <eos>."""
    rate, keep = sw_corpus.corpus_rows("scienceworld", domain.train.size, holdout_rows, options, DEFAULT_PERTURB_RATE)
    env, context = domain.env, domain.train.context
    settings = dict(description_length=int(domain.info["description_length"]), obs_length=env.obs_length,
                    action_length=env.action_length, window=domain.history, max_turns=env.max_turns,
                    simplifications=env.simplifications, self_guide=env.self_guide)

    def play(b: int) -> list[tuple[str, str]]:
        row = keep[b]
        return sw_corpus.play(env.workers[b % len(env.workers)], env.task_names[int(context["task"][row])],
                              int(context["variation"][row]), int(seed), rate, env.vocab, **settings)

    episodes = env.per_worker(play, [b % len(env.workers) for b in range(len(keep))])
    return [pair for episode in episodes for pair in episode]


def validate_scienceworld_config(cfg: Any) -> None:
    """Raise ConfigError naming the first bad field of `config.domain`; InputError saying what to
    install when Java or the scienceworld package is missing (before anything starts)."""
    choice(cfg, "domain.level", LEVELS)
    for field, least in (("num_train", 0), ("num_test", 0), ("max_turns", 1), ("history", 1), ("obs_length", 8),
                         ("action_length", 4), ("description_length", 8), ("num_workers", 1)):
        int_at_least(cfg, f"domain.{field}", least)
    if "split_seed" in config_value(cfg, "domain"):
        int_at_least(cfg, "domain.split_seed", 0)
    tasks = config_value(cfg, "domain.tasks")
    if isinstance(tasks, str) or not tasks or not all(isinstance(t, str) for t in tasks) or len(set(tasks)) != len(tasks):
        raise ConfigError(f"config.domain.tasks must be a tuple of distinct ScienceWorld task names, got {tasks!r}")
    simplifications = config_value(cfg, "domain.simplifications")
    if not isinstance(simplifications, str) or any(s not in SIMPLIFICATIONS for s in simplifications.split(",") if s):
        raise ConfigError(f"config.domain.simplifications must be comma-separated names of {SIMPLIFICATIONS}, "
                          f"got {simplifications!r}")
    held_out_split(cfg, "domain.tasks", "domain.held_out_tasks", "tasks")
    selfguide.validate_fields(cfg)
    agent_prompt.validate_prompt_fields(cfg)
    if "admissible_length" in config_value(cfg, "domain"):
        int_at_least(cfg, "domain.admissible_length", 16)
    optional_fraction(cfg, "policy.sft_perturb_rate", DEFAULT_PERTURB_RATE)
    try:
        require_engine()
    except InputError as err:
        raise InputError(f"config.domain.kind='scienceworld': {err}") from None
    from scienceworld.constants import ID2TASK

    unknown = [t for t in tasks if t not in ID2TASK.values()]
    if unknown:
        raise ConfigError(f"config.domain.tasks: unknown ScienceWorld tasks {unknown}; known: {', '.join(ID2TASK.values())}")


@register_domain("scienceworld", primitive_names=lambda cfg: selfguide.primitive_names(AGENT_PRIMITIVES, cfg.domain),
                 validate=validate_scienceworld_config)
def build_scienceworld_domain(cfg: Any) -> Domain:
    return make_scienceworld_domain(cfg.domain, tokenizer_directory(cfg), agent_prompt.agent_style(cfg))
