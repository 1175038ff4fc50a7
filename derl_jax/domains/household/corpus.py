"""The supervised warm-start corpus: turns of expert episodes with random actions mixed in.

`sft_corpus(tasks, seed, perturb_rate)` plays every task once with the perturbed expert
(expert.py) through the jitted, vmapped environment and returns one (prompt, action) pair per
turn taken: the prompt as `build_prompt` writes it (BOS, the task, the last W actions and the
observations they led to, or with window "full" every turn so far; no padding) and the action's
tokens (tag first, no padding, no EOS). With the full history and a prompt budget, the turns
whose prompt exceeds it are left out, as the rollout ends an episode there. Perturbed turns
keep their random action and tag, so the corpus mixes correct and incorrect behaviour at about
`perturb_rate`. With a self-guide environment every action starts with the expert's
self-assessment (selfguide.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from derl_jax.domains.base import FULL_HISTORY
from derl_jax.domains.household import vocab
from derl_jax.domains.household.actions import truncate_at_eos
from derl_jax.domains.household.env import HouseholdEnv
from derl_jax.domains.household.expert import perturbed_policy, rollout
from derl_jax.domains.household.prompt import History, build_prompt, push_history, start_history, task_prompt
from derl_jax.domains.household.selfguide import with_assessment
from derl_jax.domains.household.tasks import Task, to_device

DEFAULT_WINDOW = 2
PLAY_BUCKET = 1024   # the largest batch of episodes one compiled `play` of `sft_corpus` serves
SMALLEST_PLAY = 16


def episode_prompts(description: jax.Array, obs: jax.Array, actions: jax.Array, window: int,
                    length: int | None = None):
    """(tokens i32[S, P], mask bool[S, P]): the prompt of every turn of one episode.

    description i32[D]; obs i32[S+1, O] (obs[t] seen at turn t); actions i32[S, A]; P as
    `build_prompt` sets it from `length`.
    """
    task_tokens = task_prompt(description, obs[0])

    def turn(history: History, step):
        action, next_obs = step
        return push_history(history, action, next_obs), build_prompt(task_tokens, history, length)

    _, prompts = jax.lax.scan(turn, start_history(window, obs[0], actions.shape[1]), (actions, obs[1:]))
    return prompts


@functools.partial(jax.jit, static_argnames=("env", "window", "length"))
def play(tasks: Task, key: jax.Array, perturb_rate: jax.Array, env: HouseholdEnv, window: int = DEFAULT_WINDOW,
         length: int | None = None):
    """Play every task once with the expert perturbed at `perturb_rate` (f32[], traced: one compiled
    function serves every rate), vmapped over the M tasks under jit.

    Returns (prompts i32[M, S, P] (P: `build_prompt` of `length`), prompt_mask bool[M, S, P], actions i32[M, S, A] cut at eos,
    episodes) where episodes is `expert.rollout`'s dict.
    """
    policy = perturbed_policy(perturb_rate)
    if env.self_guide:   # each action starts with the expert's self-assessment
        policy = with_assessment(policy)
    episodes = rollout(env, tasks, key, policy)
    prompts, prompt_mask = jax.vmap(episode_prompts, in_axes=(0, 0, 0, None, None))(
        tasks.description, episodes["obs"], episodes["actions"], window, length)
    return prompts, prompt_mask, truncate_at_eos(episodes["actions"]), episodes


def play_rows(count: int) -> int:
    """Episodes `sft_corpus` plays for `count` tasks (the rest repeat the last task): the next
    power of two from SMALLEST_PLAY up to PLAY_BUCKET, then the next multiple of PLAY_BUCKET, so
    a few compiled sizes serve every corpus. The first `count` episodes do not depend on it:
    `jax.random.split`'s keys are the same prefix whatever their number (threefry partitionable,
    JAX's default), and every episode is played by itself under vmap."""
    if count > PLAY_BUCKET:
        return -(-count // PLAY_BUCKET) * PLAY_BUCKET
    return max(SMALLEST_PLAY, 1 << max(count - 1, 0).bit_length())


def renaming_tables(seed: int, episodes: int) -> np.ndarray:
    """i32[episodes, V]: per episode a word-id map that permutes the entity names within each
    stratum (food, dishes, tools, small items, lamps; closed and open receptacles) and keeps
    every other word, appliances included. Stratum by stratum the permuted names afford the
    same actions, so a renamed episode is still a correct one; seen and unseen types mix."""
    rng = np.random.default_rng([int(seed), 7])
    groups = [[vocab.ID[n] for n, spec in vocab.OBJECT_TYPES.items() if spec[0] == stratum]
              for stratum in sorted({spec[0] for spec in vocab.OBJECT_TYPES.values()})]
    groups += [[vocab.ID[n] for n, spec in vocab.RECEPTACLE_TYPES.items() if spec[0] == stratum]
               for stratum in ("closed", "open")]
    tables = np.tile(np.arange(vocab.SELF_GUIDE_VOCAB_SIZE, dtype=np.int32), (episodes, 1))
    for episode in range(episodes):
        for ids in groups:
            tables[episode, ids] = rng.permutation(ids)
    return tables


def sft_corpus(tasks: Task, seed: int, perturb_rate: float, *, env: HouseholdEnv | None = None,
               window: int | str = DEFAULT_WINDOW, length: int | None = None,
               rename: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
    """(prompt i32[p], action i32[a]) per turn taken, episodes in task order, turns in order; p <=
    `length` when given (the rollout's prompt budget: a window is cut to it, a "full" history
    turn beyond it is left out). `rename`: every episode's prompts and actions rename its
    entities consistently (`renaming_tables`), so names are read from the prompt, not memorised."""
    if not 0.0 <= perturb_rate <= 1.0:
        raise ValueError(f"household sft_corpus: perturb_rate must be in [0, 1], got {perturb_rate}")
    env = env or HouseholdEnv()
    full = window == FULL_HISTORY
    count = tasks.size
    rows = np.minimum(np.arange(play_rows(count)), count - 1)
    prompts, prompt_mask, actions, episodes = jax.device_get(
        play(to_device(tasks.take(rows)), jax.random.PRNGKey(seed), jnp.float32(perturb_rate), env,
             int(env.max_turns) if full else int(window), None if full or length is None else int(length)))
    tables = renaming_tables(seed, count) if rename else None
    corpus = []
    for episode in range(count):
        for turn in np.flatnonzero(episodes["step_mask"][episode]):
            if full and length is not None and prompt_mask[episode, turn].sum() > length:
                break   # the rollout ends the episode before this turn
            action = actions[episode, turn]
            prompt, action = (prompts[episode, turn][prompt_mask[episode, turn]].astype(np.int32),
                              action[action != vocab.PAD_ID].astype(np.int32))
            if tables is not None:
                prompt, action = tables[episode][prompt], tables[episode][action]
            corpus.append((prompt, action))
    return corpus
