"""The `alfworld` domain: ALFWorld's engine (TextWorld PDDL games) as a multi-turn ("env") domain on the host.

Config block `domain` (configs/alfworld.py):
  kind="alfworld"; data_dir: ALFWorld's json_2.1.1 directory, environment variables expanded
  ("" = generated games, see problems.py); level: "L0" | "L1" | "L2" (splits.py); kinds: the
  task kinds played; held_out_kinds: the kinds L2 evaluates on (and does not train on);
  num_train / num_test: games per kind for training / evaluation (with a data directory 0 =
  all of the split, N = N drawn at random); split_seed: the seed of those draws and of the
  generated games; max_turns
  per episode; history: the prompt window W; obs_length / action_length: tokens per
  observation / action; description_length: tokens of the task line in the task prompt;
  num_workers: worker processes (0 = every game in this process); self_guide (default False):
  the policy writes a self-assessment word before each action (Self-Guide,
  derl_jax/domains/selfguide.py; it counts among the action_length tokens and the engine never
  sees it), mapped to the internal rewards self_rewards (default (0.1, 0.0, -0.1)); adds the
  primitive g_sg.
Token ids: with `config.policy.tokenizer` or `config.policy.checkpoint` the policy's own
tokenizer (`scienceworld.subword`); otherwise a word vocabulary (`scienceworld.vocab`) of
ALFWorld's grammar, the action verbs, numbers 1..99 and every game's goal and entity names.
Policy block options read by the warm-start corpus: sft_perturb_rate (default 0.3); sft_expert:
"planner" (default: ALFWorld's planner, which knows where everything is) or "search" (finds the
task's object by visiting the places in the admissible list's order, then the planner;
`ExpertGame`).

A split is a TokenDataset: prompts = <bos> + "Your task is to: <goal>." (left padded), context
= {"game": i32[M]} (index into env.games: training games first). Primitives: the agent family
(outcome, phase_first, phase_middle, phase_last), outcome first, then g_sg with self_guide.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Sequence

import numpy as np

import primitives.agent  # noqa: F401  (registers the agent primitives)
from derl_jax.config import (ConfigError, InputError, choice, config_value, int_at_least, held_out_split,
                             optional_fraction)
from derl_jax.domains import agent_prompt, selfguide
from derl_jax.domains.alfworld import problems as P
from derl_jax.domains.alfworld import rules
from derl_jax.domains.alfworld.engine import game_logic
from derl_jax.domains.alfworld.env import NOTHING, AlfWorldEnv, require_engine
from derl_jax.domains.alfworld.splits import LEVELS, data_problem, expand_data_dir, level_games
from derl_jax.domains.base import Domain, TokenDataset
from derl_jax.domains.registry import register_domain
from derl_jax.domains.scienceworld import corpus as sw_corpus
from derl_jax.domains.scienceworld.domain import tokenizer_directory
from derl_jax.domains.scienceworld.vocab import Vocabulary, words
from primitives import registry
from primitives.agent import AGENT_PRIMITIVES

DEFAULT_PERTURB_RATE = 0.3
EXPERTS = ("planner", "search")   # policy.sft_expert: the corpus's expert (ExpertGame)
DEFAULT_ADMISSIBLE_LENGTH = 256   # ours: tokens of the admissible-actions line of an agent prompt
VERBS = "go to take from move to open close use heat clean cool with examine look inventory"
_ENTITY = re.compile(r"^\s*(\w+?)_bar_\S*\s+-\s+(?:object|receptacle)\s*$", re.MULTILINE)


def task_text(game: P.GameSpec) -> str:
    """The task line of a game's prompt: "Your task is to: <goal>."."""
    return f"Your task is to: {game.goal}."


def entity_names(game: P.GameSpec) -> set[str]:
    """The type names of a game's objects and receptacles as ALFWorld names them ("apple", "sinkbasin")."""
    if isinstance(game.source, dict):
        problem = game.source["pddl_problem"]
    else:
        with open(game.source) as f:
            problem = json.load(f)["pddl_problem"]
    return {name.lower() + ("basin" if "basin" in line.lower() else "")
            for name, line in ((m.group(1), m.group(0)) for m in _ENTITY.finditer(problem))}


def grammar_words() -> set[str]:
    """Words of ALFWorld's feedback texts and command templates (placeholders dropped)."""
    grammar = game_logic()["grammar"]
    texts = re.findall(r'"rhs": "(.*?)"', grammar) + re.findall(r'template :: "(.*?)"', grammar)
    return {w for text in texts for w in words(re.sub(r"\{.*?\}|#.*?#|\\n", " ", text))}


def make_vocabulary(games: Sequence[P.GameSpec], assessments: bool = False) -> Vocabulary:
    """The word vocabulary of `games` (module docstring), with the self-assessment words last when
    `assessments`; depends only on ALFWorld, the games and that option."""
    met = grammar_words() | set(words(VERBS)) | {str(n) for n in range(1, 100)} | set(words(NOTHING))
    for game in games:
        met |= set(words(task_text(game))) | entity_names(game)
    return Vocabulary(met, P.KINDS, assessments=assessments)


def make_dataset(games: Sequence[P.GameSpec], first: int, vocab, description_length: int) -> TokenDataset:
    """prompts i32[M, D+1] (<bos> + task line, left padded), context {"game": i32[M]} = first, first+1, ..."""
    cut = [vocab.decode(vocab.tokens(task_text(g))[:description_length]) for g in games]
    prompts, mask = vocab.encode_batch(cut, description_length + 1, left_pad=True, add_bos=True)
    return TokenDataset(prompts=prompts, prompt_mask=mask,
                        context={"game": np.arange(first, first + len(games), dtype=np.int32)})


def make_alfworld_domain(cfg: Any, tokenizer_dir: str = "", agent: bool = False) -> Domain:
    """The ALFWorld Domain of config block `cfg` (`config.domain`); starts the worker processes.
    With `agent` (a pretrained policy; `tokenizer_dir` its tokenizer) the agent prompt
    (`derl_jax.domains.agent_prompt`): rows of obs_length + admissible_length tokens, answers of
    action_length tokens, task prompts in the chat template, and the planner's turns written in
    it as the cold-start corpus."""
    if agent:
        return make_agent_domain(cfg, tokenizer_dir)
    kinds, held_out = tuple(cfg.kinds), tuple(cfg.get("held_out_kinds", ()))
    train, test = level_games(str(cfg.level), kinds, held_out, int(cfg.num_train), int(cfg.num_test),
                              str(cfg.get("data_dir", "") or ""), int(cfg.get("split_seed", 0)))
    if tokenizer_dir:
        from derl_jax.domains.scienceworld.subword import SubwordTable
        from derl_jax.models.hf_tokenizer import HFTokenizer

        vocab = SubwordTable(HFTokenizer.from_directory(tokenizer_dir), P.KINDS)
    else:
        vocab = make_vocabulary(train + test, assessments=selfguide.enabled(cfg))
    env = AlfWorldEnv(train + test, int(cfg.num_workers), vocab=vocab, obs_length=int(cfg.obs_length),
                      action_length=int(cfg.action_length), max_turns=int(cfg.max_turns),
                      self_guide=selfguide.enabled(cfg), self_rewards=selfguide.self_rewards(cfg))
    atexit.register(env.close)
    length = int(cfg.description_length)
    domain = Domain(
        name="alfworld",
        primitives=registry.resolve("agent", selfguide.primitive_names(AGENT_PRIMITIVES, cfg)),
        outcome_index=0,
        train=make_dataset(train, 0, vocab, length),
        test=make_dataset(test, len(train), vocab, length),
        tokenizer=vocab,
        max_new_tokens=env.action_length,
        eos_id=vocab.eos_id,
        pad_id=vocab.pad_id,
        rollout="env",
        env=env,
        history=int(cfg.history),
        info={"level": str(cfg.level), "kinds": list(kinds), "held_out_kinds": list(held_out),
              "data_dir": expand_data_dir(cfg.get("data_dir", "")),
              "train_games": [[g.kind, g.goal] for g in train], "test_games": [[g.kind, g.goal] for g in test],
              "vocab_size": vocab.vocab_size, "description_length": length},
    )
    return dataclasses.replace(domain, corpus=functools.partial(supervised_corpus, domain))


def make_agent_domain(cfg: Any, tokenizer_dir: str) -> Domain:
    """The agent-prompt ALFWorld Domain (`make_alfworld_domain` with `agent`)."""
    kinds, held_out = tuple(cfg.kinds), tuple(cfg.get("held_out_kinds", ()))
    train, test = level_games(str(cfg.level), kinds, held_out, int(cfg.num_train), int(cfg.num_test),
                              str(cfg.get("data_dir", "") or ""), int(cfg.get("split_seed", 0)))
    table = agent_prompt.load_table(tokenizer_dir, P.KINDS)
    prompt = agent_prompt.AgentPrompt(table, "alfworld", int(cfg.obs_length),
                                      int(cfg.get("admissible_length", DEFAULT_ADMISSIBLE_LENGTH)),
                                      selfguide.enabled(cfg), int(cfg.action_length))
    env = AlfWorldEnv(train + test, int(cfg.num_workers), vocab=table, obs_length=int(cfg.obs_length),
                      action_length=int(cfg.action_length), max_turns=int(cfg.max_turns),
                      self_guide=selfguide.enabled(cfg), self_rewards=selfguide.self_rewards(cfg), prompt=prompt)
    atexit.register(env.close)

    def dataset(games: Sequence[P.GameSpec], first: int) -> TokenDataset:
        ids = [prompt.task_ids(g.goal) for g in games]
        prompts, mask = table.encode_batch(ids, max(len(i) for i in ids), left_pad=True)
        return TokenDataset(prompts=prompts, prompt_mask=mask,
                            context={"game": np.arange(first, first + len(games), dtype=np.int32)})

    domain = Domain(
        name="alfworld", primitives=registry.resolve("agent", selfguide.primitive_names(AGENT_PRIMITIVES, cfg)),
        outcome_index=0, train=dataset(train, 0), test=dataset(test, len(train)), tokenizer=table,
        max_new_tokens=env.action_length, eos_id=table.eos_id, pad_id=table.pad_id, rollout="env", env=env,
        history=int(cfg.history),
        info={"level": str(cfg.level), "kinds": list(kinds), "held_out_kinds": list(held_out),
              "data_dir": expand_data_dir(cfg.get("data_dir", "")), "prompt_style": "agent",
              "train_games": [[g.kind, g.goal] for g in train], "test_games": [[g.kind, g.goal] for g in test],
              "vocab_size": table.vocab_size},
    )
    return dataclasses.replace(domain, corpus=functools.partial(agent_corpus, domain))


def _played_over_workers(env: Any, num_rows: int, play_rows: Any) -> list:
    """The turns of `num_rows` episodes, row r played by worker r % workers (`play_rows(worker)`
    returns that worker's episodes in row order), flattened in row order."""
    with ThreadPoolExecutor(env.workers.size) as pool:
        per_worker = list(pool.map(play_rows, range(env.workers.size)))
    episodes = [None] * num_rows
    for worker, played in enumerate(per_worker):
        episodes[worker::env.workers.size] = played
    return [pair for episode in episodes for pair in episode]


def agent_corpus(domain: Domain, seed: int, holdout_rows: Sequence[int] = (), options: Any = None
                 ) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, answer ids): the planner's turns of each training row except `holdout_rows`
    in the agent prompt (`scienceworld.corpus.play_agent`)."""
    rate, keep = sw_corpus.corpus_rows("alfworld", domain.train.size, holdout_rows, options, DEFAULT_PERTURB_RATE)
    env, games = domain.env, domain.train.context["game"]
    search = expert_kind(options) == "search"

    def play_rows(worker: int) -> list[list[tuple[list[int], list[int]]]]:
        expert = ExpertGame(env, worker, search=search)
        return [sw_corpus.play_agent(expert, env.games[int(games[row])].kind, int(games[row]), int(seed), rate,
                                     env.prompt, window=domain.history, max_turns=env.max_turns,
                                     phrasing=rules.PHRASING, self_guide=env.self_guide)
                for row in keep[worker::env.workers.size]]

    return _played_over_workers(env, len(keep), play_rows)


class ExpertGame:
    """One game played by an expert, behind the engine interface `scienceworld.corpus.play`
    uses: `load(kind, game)` starts game `game` of the env, `gold_actions()` is the planner's plan
    from the start, `step` answers (observation, subgoals completed so far, won).

    With `search`, the expert does not use the planner's knowledge of where the task's object
    is: `gold_actions()` is an iterator that, until the object has been seen where the agent
    stands, opens the place it stands at when that is closed, else goes to the first place in
    the admissible list it has not visited; from then on (or when every place was visited) it
    takes the planner's next action from the current state."""

    def __init__(self, env: AlfWorldEnv, worker: int, search: bool = False):
        self.env, self.worker, self.slot, self.search = env, worker, -1, search
        self.game: P.GameSpec | None = None
        self.first, self.subgoals = "", 0
        self.visited: set[str] = set()
        self.here, self.here_closed, self.found = "", False, False

    def load(self, task: str, variation: int, simplifications: str = "", gold_path: bool = True) -> None:
        del task, simplifications, gold_path
        if self.slot >= 0:
            self.env.workers.run(self.worker, [("stop", self.slot)])
        self.slot, self.game, self.subgoals = next(self.env._slots), self.env.games[int(variation)], 0
        self.first = self.env.workers.run(self.worker, [("start", self.slot, int(variation), True)])[0]
        self.visited, self.here, self.here_closed, self.found = set(), "", False, False

    def gold_actions(self) -> list[str] | Iterator[str]:
        if self.search:   # each action computed when it is asked for, from the state reached
            return iter(self._search_action, None)
        return self.env.workers.run(self.worker, [("plan", self.slot)])[0]

    def _search_action(self) -> str | None:
        """The search expert's next action (class docstring); None once the planner has none."""
        if not self.found:
            admissible = self.admissible()
            if self.here_closed and f"open {self.here}" in admissible:
                return f"open {self.here}"
            unvisited = [a[len("go to "):] for a in admissible
                         if a.startswith("go to ") and a[len("go to "):] not in self.visited]
            if unvisited:
                return f"go to {unvisited[0]}"
        plan = self.env.workers.run(self.worker, [("plan", self.slot)])[0]
        return plan[0] if plan else None

    def admissible(self) -> list[str]:
        return self.env.workers.run(self.worker, [("admissible", self.slot)])[0]

    def vocabulary(self) -> set[str]:
        return entity_names(self.game)

    def task_description(self) -> str:
        return task_text(self.game)

    def reset(self, describe_task: bool = False) -> str:
        return self.env.first_observation(self.first) if not describe_task else self.first

    def step(self, action: str) -> tuple[str, float, bool]:
        command = " ".join(action.lower().split())
        if not rules.well_formed(command):
            return NOTHING, float(self.subgoals), False
        observation, won = self.env.workers.run(self.worker, [("step", self.slot, command, False)])[0]
        g = self.game
        if self.search:
            self._track(command, observation)
        self.subgoals += rules.subgoal(g.kind, g.obj, g.recep, g.toggle, observation)
        return observation, float(self.subgoals), won

    def _track(self, command: str, observation: str) -> None:
        """The search's state after `command`: where the agent stands, whether that place is
        closed, whether the task's object has been seen there."""
        if command.startswith("go to ") and observation.startswith("You arrive at"):
            self.here = command[len("go to "):]
            self.visited.add(self.here)
            self.here_closed = f"The {self.here} is closed." in observation
        elif command == f"open {self.here}":
            self.here_closed = False
        if re.search(rf"\b{re.escape(self.game.obj)} \d+\b", observation) or command.startswith("take "):
            self.found = True


def supervised_corpus(domain: Domain, seed: int, holdout_rows: Sequence[int] = (), options: Any = None
                      ) -> list[tuple[str, str]]:
    """(prompt, completion) texts: every turn of the expert's episode with harmless random actions mixed
    in (`scienceworld.corpus.play`) of each training row except `holdout_rows`. Prompts carry no
    <bos> (the encoder adds it), completions no <eos>."""
    rate, keep = sw_corpus.corpus_rows("alfworld", domain.train.size, holdout_rows, options, DEFAULT_PERTURB_RATE)
    env, games = domain.env, domain.train.context["game"]
    search = expert_kind(options) == "search"
    settings = dict(description_length=int(domain.info["description_length"]), obs_length=env.obs_length,
                    action_length=env.action_length, window=domain.history, max_turns=env.max_turns,
                    phrasing=rules.PHRASING, self_guide=env.self_guide)

    def play_rows(worker: int) -> list[list[tuple[str, str]]]:
        expert = ExpertGame(env, worker, search=search)
        return [sw_corpus.play(expert, env.games[int(games[row])].kind, int(games[row]), int(seed), rate, env.vocab,
                               **settings) for row in keep[worker::env.workers.size]]

    return _played_over_workers(env, len(keep), play_rows)


def expert_kind(options: Any) -> str:
    """The corpus's expert, `sft_expert` of the `config.policy` block `options` (a mapping or None)."""
    return str((options or {}).get("sft_expert", "planner"))


def validate_alfworld_config(cfg: Any) -> None:
    """Raise ConfigError naming the first bad field of `config.domain`; InputError saying what to
    install when the alfworld package is missing, or where to put the data (before anything starts)."""
    choice(cfg, "domain.level", LEVELS)
    raw_dir = str(config_value(cfg, "domain").get("data_dir", "") or "")
    for field, least in (("num_train", 0 if raw_dir else 1), ("num_test", 0 if raw_dir else 1), ("max_turns", 1),
                         ("history", 1), ("obs_length", 8), ("action_length", 4), ("description_length", 8),
                         ("num_workers", 0), ("split_seed", 0)):
        int_at_least(cfg, f"domain.{field}", least)
    kinds = config_value(cfg, "domain.kinds")
    if isinstance(kinds, str) or not kinds or len(set(kinds)) != len(kinds) or any(k not in P.KINDS for k in kinds):
        raise ConfigError(f"config.domain.kinds must be a tuple of distinct ALFWorld task kinds of {P.KINDS}, got {kinds!r}")
    held_out_split(cfg, "domain.kinds", "domain.held_out_kinds", "kinds")
    selfguide.validate_fields(cfg)
    agent_prompt.validate_prompt_fields(cfg)
    if "admissible_length" in config_value(cfg, "domain"):
        int_at_least(cfg, "domain.admissible_length", 16)
    optional_fraction(cfg, "policy.sft_perturb_rate", DEFAULT_PERTURB_RATE)
    expert = expert_kind(config_value(cfg, "policy"))
    if expert not in EXPERTS:
        raise ConfigError(f"config.policy.sft_expert must be one of {EXPERTS}, got {expert!r}")
    try:
        require_engine()
    except InputError as err:
        raise InputError(f"config.domain.kind='alfworld': {err}") from None
    if raw_dir:
        wrong = data_problem(expand_data_dir(raw_dir),
                             ("train", "valid_seen" if cfg.domain.level == "L0" else "valid_unseen"))
        if wrong:
            raise InputError(f"config.domain.data_dir={raw_dir!r}: {wrong}; put ALFWorld's json_2.1.1 directory there "
                             "(train/, valid_seen/, valid_unseen/ with a game.tw-pddl per game, as `alfworld-download` "
                             "writes it under $ALFWORLD_DATA), or set data_dir='' to play generated games")


@register_domain("alfworld", primitive_names=lambda cfg: selfguide.primitive_names(AGENT_PRIMITIVES, cfg.domain),
                 validate=validate_alfworld_config)
def build_alfworld_domain(cfg: Any) -> Domain:
    return make_alfworld_domain(cfg.domain, tokenizer_directory(cfg), agent_prompt.agent_style(cfg))
