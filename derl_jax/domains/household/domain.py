"""The `household` domain: the JAX household environment as a multi-turn ("env") domain.

Config block `domain` (configs/household.py):
  kind="household"; level: "L0" | "L1" | "L2" | "L2-seen"; seed: task generation and seen/unseen split;
  num_train, num_test: tasks per split; held_out_kinds: the two kinds L2 tests on (indices
  into tasks.KINDS); max_turns: turns per episode; history: what a turn's prompt holds besides
  the task, "window" (the last `window` turns, read after the task every turn) or "full" (every turn since
  reset, one token stream per episode read once; see derl_jax.rl.rollout); window: W (default 2;
  an int `history` is read as a window of that many turns);
  prompt_budget (default 0: room for the whole history): the most tokens of a turn's prompt,
  0 or >= the task prompt's 77; a longer window loses its oldest tokens, a full-history episode
  ends before a turn whose prompt would not fit (rollout and corpus alike);
  self_guide (default False): the policy writes a self-assessment word before each action
  (Self-Guide, see derl_jax/domains/selfguide.py and selfguide.py here), mapped to the internal
  rewards self_rewards (default (0.1, 0.0, -0.1) for progress+ / progress= / progress-); adds
  the primitive g_sg.
Policy block options read by the warm-start corpus: sft_perturb_rate (share of random
actions mixed into the expert's turns, default 0.3), sft_extra_tasks (fresh training-type
tasks played besides the training split, default 0), sft_rename (every episode renames its
entities consistently within their strata, so names are copied from the prompt; default off).

A split is a TokenDataset: prompts = <bos> + the task description + the observation at reset
(the room's receptacles; left padded), context = the
`Task` fields per row (what `HouseholdEnv.reset` reads). Primitives: the agent family
(outcome, phase_first, phase_middle, phase_last), outcome first.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

import primitives.agent  # noqa: F401  (registers the agent primitives)
from derl_jax.config import ConfigError, choice, config_value, int_at_least, int_tuple, optional_fraction
from derl_jax.domains import agent_prompt, selfguide
from derl_jax.domains.base import FULL_HISTORY, Domain, TokenDataset
from derl_jax.domains.household import corpus as household_corpus
from derl_jax.domains.household import tasks as T
from derl_jax.domains.household import vocab
from derl_jax.domains.household.env import TASK_FIELDS, HouseholdEnv
from derl_jax.domains.household.prompt import TASK_PROMPT_LENGTH, task_prompt
from derl_jax.domains.household.text_env import HouseholdTextEnv, expert_turns
from derl_jax.domains.registry import register_domain
from primitives import registry
from primitives.agent import AGENT_PRIMITIVES

DEFAULT_PERTURB_RATE = 0.3


@jax.jit
def _task_prompts(description: jax.Array, tasks: T.Task) -> jax.Array:
    """i32[M, D+O+1]: each task's description and first room (one compiled program per M)."""
    rooms, _ = jax.vmap(HouseholdEnv().reset, in_axes=(None, 0))(jax.random.PRNGKey(0), tasks)
    return jax.vmap(task_prompt)(description, rooms)


def make_dataset(tasks: T.Task) -> TokenDataset:
    """The TokenDataset of a task batch: task prompts i32[M, D+O+1] and the Task fields as context."""
    prompts = np.asarray(_task_prompts(jnp.asarray(tasks.description), T.to_device(tasks)))
    context = {name: jnp.asarray(getattr(tasks, name)) for name in TASK_FIELDS}
    return TokenDataset(prompts=jnp.asarray(prompts), prompt_mask=jnp.asarray(prompts != vocab.PAD_ID),
                        context=context)


def tasks_of(dataset: TokenDataset) -> T.Task:
    """The Task batch (NumPy) held in a split's context."""
    return T.Task(**{name: np.asarray(dataset.context[name]) for name in TASK_FIELDS})


def make_household_domain(cfg: Any, tokenizer_dir: str = "") -> Domain:
    """The household Domain of config block `cfg` (`config.domain`); with `tokenizer_dir` (a
    Hugging Face tokenizer directory) the agent-prompt domain of a pretrained policy (`agent_domain`)."""
    held_out = tuple(int(k) for k in cfg.get("held_out_kinds", T.DEFAULT_HELD_OUT_KINDS))
    train, test = T.level_splits(str(cfg.level), int(cfg.seed), int(cfg.num_train), int(cfg.num_test), held_out)
    if tokenizer_dir:
        return agent_domain(cfg, tokenizer_dir, train, test, held_out)
    self_guide = selfguide.enabled(cfg)
    env = HouseholdEnv(max_turns=int(cfg.max_turns), self_guide=self_guide, self_rewards=selfguide.self_rewards(cfg))
    train_kinds, test_kinds, unseen = T.level_kinds(str(cfg.level), held_out)
    domain = Domain(
        name="household",
        primitives=registry.resolve("agent", household_primitive_names(cfg)),
        outcome_index=0,
        train=make_dataset(train),
        test=make_dataset(test),
        tokenizer=vocab.WordVocab(self_guide=self_guide),
        max_new_tokens=env.action_length,
        eos_id=vocab.EOS_ID,
        pad_id=vocab.PAD_ID,
        rollout="env",
        env=env,
        history=domain_history(cfg),
        prompt_budget=int(cfg.get("prompt_budget", 0)),
        info={"level": str(cfg.level), "seed": int(cfg.seed), "train_kinds": [T.KINDS[k] for k in train_kinds],
              "test_kinds": [T.KINDS[k] for k in test_kinds], "test_unseen": unseen,
              "type_split": dataclasses.asdict(T.type_split(int(cfg.seed)))},
    )
    return dataclasses.replace(domain, corpus=functools.partial(supervised_corpus, domain))


AGENT_OBS_LENGTH, AGENT_ADMISSIBLE_LENGTH, AGENT_ANSWER_LENGTH = 96, 192, 48   # ours: tokens a row / answer fits


def agent_domain(cfg: Any, tokenizer_dir: str, train: T.Task, test: T.Task, held_out: tuple[int, ...]) -> Domain:
    """The household for a pretrained policy: the agent prompt (`derl_jax.domains.agent_prompt`)
    in the policy's tokenizer, the environment behind it on the host (`text_env.HouseholdTextEnv`),
    and the perturbed expert's turns written in it as the cold-start corpus. Config fields:
    obs_length / admissible_length (tokens of a row's step text / admissible line), answer_length
    (tokens of an answer: assessment, reasoning and action), window (W)."""
    self_guide = selfguide.enabled(cfg)
    table = agent_prompt.load_table(tokenizer_dir)
    prompt = agent_prompt.AgentPrompt(table, "household", int(cfg.get("obs_length", AGENT_OBS_LENGTH)),
                                      int(cfg.get("admissible_length", AGENT_ADMISSIBLE_LENGTH)), self_guide,
                                      int(cfg.get("answer_length", AGENT_ANSWER_LENGTH)))
    env = HouseholdTextEnv(HouseholdEnv(max_turns=int(cfg.max_turns)), prompt,
                           int(cfg.get("answer_length", AGENT_ANSWER_LENGTH)), self_guide=self_guide,
                           self_rewards=selfguide.self_rewards(cfg))

    def dataset(tasks: T.Task) -> TokenDataset:
        texts = [prompt.task_ids(env.task_text(d)) for d in np.asarray(tasks.description)]
        prompts, mask = table.encode_batch(texts, max(len(t) for t in texts), left_pad=True)
        return TokenDataset(prompts=jnp.asarray(prompts), prompt_mask=jnp.asarray(mask),
                            context={name: jnp.asarray(getattr(tasks, name)) for name in TASK_FIELDS})

    train_kinds, test_kinds, unseen = T.level_kinds(str(cfg.level), held_out)
    history = domain_history(cfg)
    if history == FULL_HISTORY:
        raise ConfigError("config.domain.history: the agent prompt of a pretrained policy needs a window "
                          "(history='window'), not 'full'")
    domain = Domain(
        name="household", primitives=registry.resolve("agent", household_primitive_names(cfg)), outcome_index=0,
        train=dataset(train), test=dataset(test), tokenizer=table, max_new_tokens=env.action_length,
        eos_id=table.eos_id, pad_id=table.pad_id, rollout="env", env=env, history=history,
        info={"level": str(cfg.level), "seed": int(cfg.seed), "train_kinds": [T.KINDS[k] for k in train_kinds],
              "test_kinds": [T.KINDS[k] for k in test_kinds], "test_unseen": unseen, "prompt_style": "agent",
              "type_split": dataclasses.asdict(T.type_split(int(cfg.seed)))},
    )
    return dataclasses.replace(domain, corpus=functools.partial(agent_corpus, domain))


def agent_corpus(domain: Domain, seed: int, holdout_rows: Sequence[int] = (), options: Any = None
                 ) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids) of the perturbed expert's turns on the training tasks except
    `holdout_rows`, in the agent prompt (`text_env.expert_turns`); `options.sft_perturb_rate`
    is the share of random admissible actions."""
    rate = float((options or {}).get("sft_perturb_rate", DEFAULT_PERTURB_RATE))
    held = {int(row) for row in np.asarray(holdout_rows, np.int64).reshape(-1)}
    train = tasks_of(domain.train)
    keep = np.array([row for row in range(train.size) if row not in held], np.int64)
    if not len(keep):
        raise ValueError("household corpus: no tasks are left for the supervised corpus")
    return expert_turns(domain.env, train.take(keep), int(seed), rate, int(domain.history))


HISTORIES = ("window", FULL_HISTORY)
DEFAULT_WINDOW = 2


def domain_history(domain_cfg: Any) -> int | str:
    """`Domain.history` of a `config.domain` block: "full", or the window W (from `window` when
    history is "window"; an int history is itself the window)."""
    history = domain_cfg.get("history", "window")
    if isinstance(history, str):
        return FULL_HISTORY if history == FULL_HISTORY else int(domain_cfg.get("window", DEFAULT_WINDOW))
    return int(history)


def household_primitive_names(domain_cfg: Any) -> tuple[str, ...]:
    """The agent primitives, plus the summed self-reward `g_sg` when `self_guide` is on."""
    return selfguide.primitive_names(AGENT_PRIMITIVES, domain_cfg)


def supervised_corpus(domain: Domain, seed: int, holdout_rows: Sequence[int] = (), options: Any = None
                      ) -> list[tuple[str, str]]:
    """(prompt, completion) texts: every turn of the perturbed expert on the training tasks except
    `holdout_rows`, plus `options.sft_extra_tasks` fresh tasks of the training kinds and seen types
    that are in neither split. Prompts carry no <bos> (the encoder adds it), completions no <eos>."""
    options = {} if options is None else options
    rate = float(options.get("sft_perturb_rate", DEFAULT_PERTURB_RATE))
    extra = int(options.get("sft_extra_tasks", 0))
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"config.policy.sft_perturb_rate must be in [0, 1], got {rate}")
    if extra < 0:
        raise ValueError(f"config.policy.sft_extra_tasks must be >= 0, got {extra}")
    train, test = tasks_of(domain.train), tasks_of(domain.test)
    held_out = {int(row) for row in np.asarray(holdout_rows, np.int64).reshape(-1)}
    outside = sorted(row for row in held_out if not 0 <= row < train.size)
    if outside:
        raise ValueError(f"household corpus: holdout_rows {outside[:5]} are outside the {train.size} training rows")
    keep = np.array([row for row in range(train.size) if row not in held_out], np.int64)
    parts = [train.take(keep)] if len(keep) else []
    if extra:
        taken = frozenset(T.fingerprint(task, row) for task in (train, test) for row in range(task.size))
        kinds = sorted({int(k) for k in np.asarray(train.kind)})
        parts.append(T.generate_tasks(domain.info["seed"], extra, kinds, T.type_split(domain.info["seed"]),
                                      unseen=False, exclude=taken, stream=2 + int(seed)))
    if not parts:
        raise ValueError("household corpus: no tasks are left for the supervised corpus")
    tasks = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *parts)
    words = vocab.WordVocab(self_guide=domain.env.self_guide)
    pairs = household_corpus.sft_corpus(tasks, int(seed), rate, env=domain.env, window=domain.history,
                                         length=domain.prompt_length, rename=bool(options.get("sft_rename", False)))
    return [(words.decode(prompt), words.decode(action)) for prompt, action in pairs]


def validate_household_config(cfg: Any) -> None:
    """Raise ConfigError naming the first bad field of `config.domain` (and the corpus options)."""
    int_at_least(cfg, "domain.seed", 0)
    choice(cfg, "domain.level", T.LEVELS)
    int_at_least(cfg, "domain.num_train", 5)
    int_at_least(cfg, "domain.num_test", 1)
    int_at_least(cfg, "domain.max_turns", 1)
    history = config_value(cfg, "domain.history")
    if isinstance(history, str):
        if history not in HISTORIES:
            raise ConfigError(f"config.domain.history must be one of {HISTORIES} (or an int window), got {history!r}")
        if "window" in config_value(cfg, "domain"):
            int_at_least(cfg, "domain.window", 1)
    else:
        int_at_least(cfg, "domain.history", 1)
    if "prompt_budget" in config_value(cfg, "domain"):
        budget = int_at_least(cfg, "domain.prompt_budget", 0)
        if 0 < budget < TASK_PROMPT_LENGTH:
            raise ConfigError(f"config.domain.prompt_budget must be 0 (the whole window) or at least the task "
                              f"prompt's {TASK_PROMPT_LENGTH} tokens, got {budget}")
    held_out = int_tuple(cfg, "domain.held_out_kinds", minimum=0, allowed=range(len(T.KINDS)))
    if len(held_out) != 2:
        raise ConfigError(f"config.domain.held_out_kinds must name two kinds of 0..5 {T.KINDS}, got {held_out}")
    selfguide.validate_fields(cfg)
    agent_prompt.validate_prompt_fields(cfg)
    policy = config_value(cfg, "policy")
    optional_fraction(cfg, "policy.sft_perturb_rate", DEFAULT_PERTURB_RATE)
    if "sft_extra_tasks" in policy:
        int_at_least(cfg, "policy.sft_extra_tasks", 0)
    if not isinstance(policy.get("sft_rename", False), bool):
        raise ConfigError(f"config.policy.sft_rename must be True or False, got {policy.get('sft_rename')!r}")


@register_domain("household", primitive_names=lambda cfg: household_primitive_names(cfg.domain),
                 validate=validate_household_config)
def build_household_domain(cfg: Any) -> Domain:
    return make_household_domain(cfg.domain, agent_prompt.tokenizer_directory(cfg) if agent_prompt.agent_style(cfg)
                                 else "")
