"""What a domain provides to the inner and outer loops.

A domain names its data splits, how prompts are encoded, its ordered primitive list
(`g1`..`gk`), how a rollout is produced (single-turn sampling scored on device or on the
host, or multi-turn episodes against an environment), its validation metric and the
supervised corpus of its warm-start policy. A domain module registers a builder under its
name (`derl_jax.domains.registry`). Token domains keep every split as fixed-shape arrays so
the whole inner loop can run under `jit`.

Shapes: M examples, Tp prompt tokens (left padded), N rollouts in a batch, T generated tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from derl_jax.domains.env import window_room
from primitives.registry import Primitive


@struct.dataclass
class TokenDataset:
    """One split of a token domain.

    prompts:     i32[M, Tp]  left-padded prompt tokens.
    prompt_mask: bool[M, Tp] True on real prompt tokens.
    context:     mapping of arrays with leading axis M (gold answer tokens, numbers, ...),
                 handed to device primitives row by row with the matching rollouts.
    """

    prompts: jax.Array
    prompt_mask: jax.Array
    context: Mapping[str, jax.Array]

    @property
    def size(self) -> int:
        return int(self.prompts.shape[0])

    def take(self, indices) -> "TokenDataset":
        """Rows `indices` of every array (NumPy or jnp indices; works under jit)."""
        return jax.tree_util.tree_map(lambda x: x[indices], self)

    def split(self, fraction: float, seed: int) -> tuple["TokenDataset", "TokenDataset"]:
        """Shuffle with `seed` and cut into (first `fraction`, rest); e.g. 0.8 -> inner-train, validation."""
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"split fraction must be in (0, 1), got {fraction}")
        order = np.random.default_rng(seed).permutation(self.size)
        cut = int(round(fraction * self.size))
        if cut == 0 or cut == self.size:
            raise ValueError(f"split of {self.size} examples at {fraction} leaves an empty part")
        return self.take(np.sort(order[:cut])), self.take(np.sort(order[cut:]))


ROLLOUT_KINDS = ("device", "host", "env")
FULL_HISTORY = "full"   # Domain.history: every turn since reset (an int W: the last W turns)
REWARD_CLASSES = ("top", "partial", "decoy", "other")  # Domain.reward_class
INNER_TRAIN_FRACTION = 0.8  # the outer loop's 8:2 cut of the training split into inner-train and validation


def split_train(train_set: TokenDataset, seed: int) -> tuple[TokenDataset, TokenDataset]:
    """(inner-training split, validation split): an 8:2 shuffle-and-cut of `train_set` with `seed`."""
    return train_set.split(INNER_TRAIN_FRACTION, seed)


@dataclasses.dataclass(frozen=True)
class Domain:
    """Everything the inner and outer loops need from a domain (no model).

    name: the registry name. primitives: ordered; the i-th is `g{i+1}` in reward expressions.
    outcome_index: the primitive that is task success: the validation metric (greedy pass@1)
      and `outcome`.
    train, test: the splits; the outer loop cuts validation out of `train` itself.
    tokenizer: encode_batch / decode_batch over the domain's vocabulary; eos_id, pad_id.
    max_new_tokens: T, tokens per completion (multi-turn: per action).
    rollout: how rollouts are produced (`derl_jax.rl.rollout`):
      "device" single-turn sampling, device primitives read rollout = {"tokens": i32[N, T],
               "mask": bool[N, T]} (mask True up to and including EOS) and the split's context rows;
      "host"   single-turn sampling, host primitives read decoded texts and `contexts(dataset)`;
      "env"    multi-turn episodes against `env` (`derl_jax.domains.env`); prompts hold the
               task, then the actions and observations of `history`; primitives read
               step_scores f32[N, S], step_mask bool[N, S], success f32[N].
    history: "env" only: an int W >= 1, the last W turns (a window, read after the task every turn), or
      "full" (FULL_HISTORY), every turn since reset (one token stream per episode, each token
      read once); see `derl_jax.rl.rollout`.
    prompt_budget: "env" only, the most tokens of a turn's prompt (0 = room for the whole
      history); a longer window loses its oldest tokens (`derl_jax.domains.env.turn_prompts`), a
      full-history episode ends before a turn whose prompt would not fit.
    stop_ids: tokens that end a completion (default: eos only). bucket_sizes: allowed prompt
      lengths for host rollouts (() = the split's width).
    corpus: optional `corpus(seed, holdout_rows, options) -> [(prompt text, completion text)]`,
      the supervised corpus of the warm-start base policy (`derl_jax.rl.sft`); holdout_rows
      are training rows to leave out, options the `config.policy` block.
    info: anything else worth recording (split sizes, levels, ...).
    base_policy_band: {primitive name: (low, high)}, a known-answer domain's declared difficulty:
      the mean of each named primitive over completions sampled from the warm-started base policy
      must lie in [low, high], else the run is refused (`derl_jax.rl.base_band`); {} = no band.
    aligned_indices: primitives besides the outcome that are outcome-aligned by construction
      (symbols: `position`, the dense share of correctly reversed letters). The Fig. 4 structure
      rule (`derl_jax.expr.structure`) counts a reward that rises with any of them as valid.
    classifier: optional `classifier(expression text) -> "top" | "partial" | "decoy" | "other"`,
      the reward's class known from the domain's construction (`reward_class`); None where the
      domain has no such ranking.
    """

    name: str
    primitives: tuple[Primitive, ...]
    outcome_index: int
    train: TokenDataset
    test: TokenDataset
    tokenizer: Any
    max_new_tokens: int
    eos_id: int
    pad_id: int
    rollout: str = "device"
    stop_ids: tuple[int, ...] = ()
    bucket_sizes: tuple[int, ...] = ()
    env: Any = None
    history: int | str = 2
    prompt_budget: int = 0
    corpus: Callable[[int, Sequence[int], Any], list[tuple[str, str]]] | None = None
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    base_policy_band: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    aligned_indices: tuple[int, ...] = ()
    classifier: Callable[[str], str | None] | None = None

    def __post_init__(self):
        if self.rollout not in ROLLOUT_KINDS:
            raise ValueError(f"domain {self.name!r}: rollout must be one of {ROLLOUT_KINDS}, got {self.rollout!r}")
        kind = "host" if self.rollout == "host" else "device"
        check_primitive_kinds(self.primitives, kind, f"domain {self.name!r}")
        if not 0 <= self.outcome_index < len(self.primitives):
            raise ValueError(f"domain {self.name!r}: outcome_index {self.outcome_index} is not one of its "
                             f"{len(self.primitives)} primitives")
        wrong = [i for i in self.aligned_indices if not 0 <= i < len(self.primitives) or i == self.outcome_index]
        if wrong:
            raise ValueError(f"domain {self.name!r}: aligned_indices {wrong} must be primitives other than the outcome "
                             f"(0..{len(self.primitives) - 1}, outcome {self.outcome_index})")
        if self.rollout == "env" and (self.env is None or not is_history(self.history)):
            raise ValueError(f"domain {self.name!r}: rollout 'env' needs an env and a history of an int >= 1 or "
                             f"{FULL_HISTORY!r}, got {self.history!r}")
        if self.prompt_budget and not (self.rollout == "env" and self.prompt_budget >= self._task_width):
            raise ValueError(f"domain {self.name!r}: prompt_budget {self.prompt_budget} needs rollout 'env' and "
                             f"room for the task prompt's {self._task_width} tokens")
        unknown = sorted(set(self.base_policy_band) - set(self.primitive_names))
        if unknown or any(not 0.0 <= lo <= hi <= 1.0 for lo, hi in self.base_policy_band.values()):
            raise ValueError(f"domain {self.name!r}: base_policy_band must map its primitives to (low, high) with "
                             f"0 <= low <= high <= 1, got {dict(self.base_policy_band)}")
        if not self.stop_ids:
            object.__setattr__(self, "stop_ids", (int(self.eos_id),))

    @property
    def primitive_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.primitives)

    @property
    def _task_width(self) -> int:
        return max(int(self.train.prompts.shape[1]), int(self.test.prompts.shape[1]))

    @property
    def prompt_length(self) -> int:
        """Tokens of the longest prompt the policy sees (multi-turn: task plus history, at most
        `prompt_budget`)."""
        width = self._task_width
        if self.rollout == "env":
            turn = int(self.env.action_length) + int(self.env.obs_length)
            if self.history == FULL_HISTORY:   # o_0, then every turn but the last one's action and observation
                width += int(self.env.obs_length) + (int(self.env.max_turns) - 1) * turn
            else:
                width += window_room(self.env, int(self.history))
        return min(width, self.prompt_budget) if self.prompt_budget else width

    @property
    def validation_metric(self) -> str:
        """The name of the primitive greedy pass@1 is measured with."""
        return self.primitives[self.outcome_index].name

    def reward_class(self, expression: str) -> str | None:
        """"top" | "partial" | "decoy" | "other": the class of reward `expression` known from the
        domain's construction (`REWARD_CLASSES`); None where the domain declares no classifier
        (endpoints that need it are then not measurable)."""
        if self.classifier is None:
            return None
        found = self.classifier(expression)
        if found is not None and found not in REWARD_CLASSES:
            raise ValueError(f"domain {self.name!r}: reward_class({expression!r}) gave {found!r}, "
                             f"expected one of {REWARD_CLASSES}")
        return found

    def primitive_values(self, rollout: Mapping[str, jax.Array], context: Mapping[str, jax.Array]) -> jax.Array:
        """f32[N, P]: every (device) primitive on every rollout (jit-compatible)."""
        cols = [jnp.asarray(p.fn(rollout, context), jnp.float32) for p in self.primitives]
        return jnp.stack(cols, axis=-1)

    def success(self, rollout: Mapping[str, jax.Array], context: Mapping[str, jax.Array]) -> jax.Array:
        """f32[N]: the validation metric of each rollout (the outcome primitive)."""
        return jnp.asarray(self.primitives[self.outcome_index].fn(rollout, context), jnp.float32)

    def contexts(self, dataset: TokenDataset) -> list[dict[str, Any]]:
        """Per row of `dataset`, the context host primitives read (default: each context array's row)."""
        host = {name: np.asarray(jax.device_get(value)) for name, value in dataset.context.items()}
        return [{name: value[row] for name, value in host.items()} for row in range(dataset.size)]


TokenDomain = Domain


def reward_classifier(domain: Any) -> Callable[[str], str | None] | None:
    """`domain.reward_class` where the domain declares a classifier, else None (the endpoints
    that need one are then not measurable)."""
    return domain.reward_class if getattr(domain, "classifier", None) is not None else None


def is_history(value: Any) -> bool:
    """Whether `value` is a `Domain.history`: an int W >= 1 or "full"."""
    if isinstance(value, str):
        return value == FULL_HISTORY
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 1


def check_primitive_kinds(prims: Sequence[Primitive], kind: str, where: str) -> None:
    """Raise naming the primitives of `prims` that are not of `kind`."""
    wrong = [p.name for p in prims if p.kind != kind]
    if wrong:
        raise ValueError(f"{where}: primitives {wrong} are not of kind {kind!r}")
