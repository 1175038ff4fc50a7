"""The base policy: a tiny Qwen2-style decoder warm-started by supervised fine-tuning.

Every method of a comparison starts its inner policies from the same base policy. It is
trained with teacher forcing on the supervised corpus the domain provides (`Domain.corpus`;
for arithmetic a mix of well- and badly-formatted solutions of the training problems), the
loss counting completion tokens (and their EOS) only. Any domain with a corpus and a
tokenizer with `encode_batch` gets a base policy this way. The whole run
is one jitted `lax.scan` over steps and depends only on its inputs and the seed.

    graphdef, params = base_policy(domain, cfg.policy, cache_dir, seed=0)

`base_policy` builds the policy once and stores it in `cache_dir` as an `.npz` file written
atomically; the file name is a hash of everything the result depends on (the encoded corpus,
the model and SFT configs, the seed and `SFT_CODE_VERSION`), so a changed setting builds a
new policy and an unchanged one loads the stored arrays.

The corpus leaves out the caller's held-out training rows (a run holds out its validation
rows, so validation scores measure held-out accuracy); the test split never reaches the base
policy.

A multi-turn domain with the whole history (`Domain.history == "full"`) trains on episodes,
as its inner loop does: the turns of an episode, whose prompts each continue the one before
with its action, are packed into one token stream (`pack_corpus`) and every step takes a few
episodes, each read once (`stream_nll`), about `sft_batch_size` turns in all.

Shapes: M corpus examples, Tp prompt tokens (left padded, BOS first), T completion tokens
(right padded, EOS after the text), B batch size.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import warnings
import zipfile
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct

from derl_jax.checkpoint import atomic_write, atomic_write_json
from derl_jax.config import field_error
from derl_jax.domains.base import FULL_HISTORY, Domain
from derl_jax.models.sampling import sequence_logprobs
from derl_jax.models.streams import stream_logprobs
from derl_jax.models.transformer import ModelConfig, abstract_model, default_compute_dtype, init_params, tiny_config
from derl_jax.parallel import host_description

# Bump when a change to this module changes the policy it builds for the same inputs.
SFT_CODE_VERSION = 1   # episodes packed as streams (full history) are new data, so they make new keys
CACHE_PREFIX = "base_policy_"
_LOSSES_KEY = "__sft_losses__"
_POLICY_FIELDS = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Supervised warm start.

    steps: optimizer steps (0 keeps the random initialisation).
    learning_rate: peak AdamW learning rate; linear warmup over `warmup_fraction` of the
      steps, then cosine decay to `final_lr_fraction` of the peak.
    batch_size: examples per step, drawn without replacement within a step (with
      replacement only when the corpus is smaller than the batch).
    seed: parameter initialisation and batch order.
    """

    steps: int
    learning_rate: float
    batch_size: int
    seed: int = 0
    warmup_fraction: float = 0.1
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.0

    def __post_init__(self):
        if not isinstance(self.steps, int) or self.steps < 0:
            raise field_error(self, "steps", "must be an int >= 0")
        if not self.learning_rate > 0:
            raise field_error(self, "learning_rate", "must be > 0")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise field_error(self, "batch_size", "must be an int >= 1")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise field_error(self, "warmup_fraction", "must be in [0, 1)")
        if not 0.0 <= self.final_lr_fraction <= 1.0:
            raise field_error(self, "final_lr_fraction", "must be in [0, 1]")
        if self.weight_decay < 0:
            raise field_error(self, "weight_decay", "must be >= 0")


@struct.dataclass
class SFTData:
    """A tokenized corpus of M (prompt, completion) pairs."""

    prompts: jax.Array          # i32[M, Tp]
    prompt_mask: jax.Array      # bool[M, Tp]
    completions: jax.Array      # i32[M, T]
    completion_mask: jax.Array  # bool[M, T], True on the text and its EOS

    @property
    def size(self) -> int:
        return int(self.prompts.shape[0])


@struct.dataclass
class SFTStreams:
    """A tokenized corpus of M episodes, each one token stream (`derl_jax.models.streams.Stream`
    layout: token t at slot t) holding up to S completions.

    tokens i32[M, C], valid bool[M, C]: the stream (BOS, the first prompt, then each completion
    without its EOS and what the next prompt adds); starts i32[M, S]: the prompt length of each
    turn; completions i32[M, S, T], completion_mask bool[M, S, T]: each turn's completion and
    EOS (turns an episode does not have are all False).
    """

    tokens: jax.Array
    valid: jax.Array
    starts: jax.Array
    completions: jax.Array
    completion_mask: jax.Array

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def turns(self) -> int:
        """Completions held, summed over the episodes."""
        return int(np.asarray(self.completion_mask).any(axis=-1).sum())


# ----------------------------------------------------------------------------- configs


def _field(cfg: Any, name: str, where: str) -> Any:
    try:
        return cfg[name] if isinstance(cfg, Mapping) else getattr(cfg, name)
    except (KeyError, AttributeError):
        raise ValueError(f"{where}: policy config has no field {name!r}") from None


def _optional_field(cfg: Any, name: str, default: Any) -> Any:
    if isinstance(cfg, Mapping) or hasattr(cfg, "get"):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def policy_model_config(domain: Domain, policy_cfg: Any) -> ModelConfig:
    """The policy's ModelConfig: sizes from `policy_cfg` (a `config.policy` block; optional
    param_dtype, compute_dtype (absent: float32; "": float32 on CPU, bfloat16 on
    accelerators) and remat), vocabulary from the domain's
    tokenizer, positions enough for the longest prompt plus completion."""
    sizes = {name: int(_field(policy_cfg, name, "policy_model_config")) for name in _POLICY_FIELDS}
    max_position = int(domain.prompt_length) + int(domain.max_new_tokens)
    compute = _optional_field(policy_cfg, "compute_dtype", "float32")
    compute = str(compute) if compute else default_compute_dtype()
    return tiny_config(domain.tokenizer.vocab_size, max_position=max_position,
                       param_dtype=str(_optional_field(policy_cfg, "param_dtype", "") or "") or "float32",
                       dtype=compute, remat=bool(_optional_field(policy_cfg, "remat", False)), **sizes)


def sft_config_from(policy_cfg: Any, seed: int = 0) -> SFTConfig:
    """SFTConfig from a `config.policy` block (sft_steps, sft_lr, sft_batch_size)."""
    return SFTConfig(
        steps=int(_field(policy_cfg, "sft_steps", "sft_config_from")),
        learning_rate=float(_field(policy_cfg, "sft_lr", "sft_config_from")),
        batch_size=int(_field(policy_cfg, "sft_batch_size", "sft_config_from")),
        seed=int(seed),
    )


# ----------------------------------------------------------------------------- data


def domain_corpus(domain: Domain, seed: int, holdout_rows: Sequence[int] = (),
                  options: Any = None) -> list[tuple[str, str]]:
    """(prompt, completion) texts of the domain's supervised corpus (`Domain.corpus`), leaving
    out the training rows `holdout_rows`; `options` is the `config.policy` block."""
    if domain.corpus is None:
        raise ValueError(f"domain {domain.name!r} provides no supervised corpus for the warm start; "
                         f"set config.policy.sft_steps=0 or load a checkpoint (config.policy.checkpoint)")
    corpus = list(domain.corpus(int(seed), holdout_rows, {} if options is None else options))
    if not corpus:
        raise ValueError(f"domain {domain.name!r}: the supervised corpus is empty")
    return corpus


def encode_corpus(tokenizer: Any, corpus: Sequence[tuple[str, str]], prompt_length: int,
                  completion_length: int) -> SFTData:
    """Tokenize (prompt, completion) pairs: BOS + prompt left padded to `prompt_length`,
    completion + EOS right padded to `completion_length` (too long a text is an error)."""
    if not corpus:
        raise ValueError("encode_corpus: the corpus is empty")
    prompts, prompt_mask = tokenizer.encode_batch([p for p, _ in corpus], prompt_length, left_pad=True, add_bos=True)
    completions, completion_mask = tokenizer.encode_batch(
        [c for _, c in corpus], completion_length, left_pad=False, add_eos=True)
    return SFTData(prompts=jnp.asarray(prompts), prompt_mask=jnp.asarray(prompt_mask),
                   completions=jnp.asarray(completions), completion_mask=jnp.asarray(completion_mask))


def trim_padding(data: SFTData) -> SFTData:
    """`data` without the prompt columns that are padding in every row (prompts are left padded)
    and the completion columns past every row's EOS: i32[M, Tp'] and i32[M, T'] with Tp' <= Tp,
    T' <= T. The loss is the same (positions are ranks among a row's real tokens), its cost
    smaller."""
    prompt_used = np.asarray(data.prompt_mask).any(axis=0)
    completion_used = np.asarray(data.completion_mask).any(axis=0)
    first = int(np.argmax(prompt_used)) if prompt_used.any() else data.prompts.shape[1] - 1
    last = int(np.flatnonzero(completion_used)[-1]) + 1 if completion_used.any() else 1
    return SFTData(prompts=data.prompts[:, first:], prompt_mask=data.prompt_mask[:, first:],
                   completions=data.completions[:, :last], completion_mask=data.completion_mask[:, :last])


def pack_corpus(tokenizer: Any, corpus: Sequence[tuple[str, str]], capacity: int,
                completion_length: int) -> SFTStreams:
    """Pack (prompt, completion) pairs into episode streams of `capacity` slots: a pair whose
    prompt (BOS added) begins with the previous pair's prompt and completion continues its
    stream, any other pair starts a new one (so pairs of unrelated prompts are one stream each).
    A stream that would not fit, or a completion longer than `completion_length` with its
    EOS, is an error."""
    if not corpus:
        raise ValueError("pack_corpus: the corpus is empty")
    streams: list[tuple[list[int], list[int], list[list[int]]]] = []   # (tokens, starts, completions)
    for prompt, completion in corpus:
        prompt_ids = tokenizer.encode(prompt, add_bos=True)
        said = tokenizer.encode(completion)
        if len(said) + 1 > completion_length:
            raise ValueError(f"pack_corpus: completion {completion!r} has {len(said) + 1} tokens with its EOS, "
                             f"more than {completion_length}")
        if not streams or prompt_ids[: len(streams[-1][0])] != streams[-1][0]:
            streams.append(([], [], []))
        tokens, starts, completions = streams[-1]
        starts.append(len(prompt_ids))
        completions.append(said + [tokenizer.eos_id])
        tokens[:] = prompt_ids + said
        if len(tokens) > capacity:
            raise ValueError(f"pack_corpus: an episode of {len(tokens)} tokens does not fit a stream of {capacity}")
    turns = max(len(starts) for _, starts, _ in streams)
    count = len(streams)
    packed = SFTStreams(tokens=np.full((count, capacity), tokenizer.pad_id, np.int32),
                        valid=np.zeros((count, capacity), bool), starts=np.zeros((count, turns), np.int32),
                        completions=np.full((count, turns, completion_length), tokenizer.pad_id, np.int32),
                        completion_mask=np.zeros((count, turns, completion_length), bool))
    for row, (tokens, starts, completions) in enumerate(streams):
        packed.tokens[row, : len(tokens)], packed.valid[row, : len(tokens)] = tokens, True
        packed.starts[row, : len(starts)] = starts
        for turn, ids in enumerate(completions):
            packed.completions[row, turn, : len(ids)], packed.completion_mask[row, turn, : len(ids)] = ids, True
    return jax.tree_util.tree_map(jnp.asarray, packed)


def episodes_per_step(data: SFTStreams, turns_per_step: int) -> int:
    """Episodes a step of `train_sft` on packed streams takes to see about `turns_per_step` turns."""
    return max(1, round(turns_per_step * data.size / max(data.turns, 1)))


# ----------------------------------------------------------------------------- training


def completion_nll(graphdef: nnx.GraphDef, params: nnx.State, batch: SFTData | SFTStreams) -> jax.Array:
    """f32[]: mean negative log-likelihood per completion token (EOS included) of `batch` (pairs,
    or episode streams read once each)."""
    if isinstance(batch, SFTStreams):
        logp, _ = stream_logprobs(graphdef, params, batch.tokens, batch.valid, batch.starts, batch.completions,
                                  batch.completion_mask)
    else:
        logp, _ = sequence_logprobs(graphdef, params, batch.prompts, batch.prompt_mask,
                                    batch.completions, batch.completion_mask)
    return -jnp.sum(logp) / jnp.maximum(jnp.sum(batch.completion_mask), 1)


def sft_optimizer(cfg: SFTConfig) -> optax.GradientTransformation:
    """AdamW under warmup + cosine decay, after a global-norm clip at 1."""
    warmup = int(cfg.warmup_fraction * cfg.steps)
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=warmup,
        decay_steps=max(cfg.steps, warmup + 1), end_value=cfg.learning_rate * cfg.final_lr_fraction)
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=cfg.weight_decay))


def sft_step(graphdef: nnx.GraphDef, data: SFTData, key: jax.Array, cfg: SFTConfig,
             optimizer: optax.GradientTransformation):
    """The scan body of `train_sft`: ((params, opt_state), step index) -> ((params, opt_state),
    loss of the step's batch before its update); step s draws its rows with `fold_in(key, s)`."""
    replace = cfg.batch_size > data.size
    grad_fn = jax.value_and_grad(lambda p, batch: completion_nll(graphdef, p, batch))

    def step(carry, index):
        params, opt_state = carry
        rows = jax.random.choice(jax.random.fold_in(key, index), data.size, (cfg.batch_size,), replace=replace)
        loss, grads = grad_fn(params, jax.tree_util.tree_map(lambda x: x[rows], data))
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    return step


@functools.partial(jax.jit, static_argnames=("graphdef", "cfg"))
def _sft_scan(graphdef: nnx.GraphDef, params: nnx.State, data: SFTData, key: jax.Array, cfg: SFTConfig):
    optimizer = sft_optimizer(cfg)
    step = sft_step(graphdef, data, key, cfg, optimizer)
    (params, _), losses = jax.lax.scan(step, (params, optimizer.init(params)), jnp.arange(cfg.steps))
    return params, losses


def train_sft(graphdef: nnx.GraphDef, params: nnx.State, data: SFTData | SFTStreams, cfg: SFTConfig
              ) -> tuple[nnx.State, jax.Array]:
    """Run `cfg.steps` supervised steps in one jitted scan -> (params, losses f32[steps]); a
    step's batch is `cfg.batch_size` rows of `data` (pairs, or episode streams).

    The loss of step s is measured on its batch before that step's update. Step s draws
    its batch with `fold_in(key(cfg.seed + 1), s)`, so the run is deterministic; one
    compilation serves every call with the same graphdef, config and data shapes.
    """
    if cfg.steps == 0:
        return params, jnp.zeros((0,), jnp.float32)
    # the seed only makes the key, so runs that differ in it share one compilation
    return _sft_scan(graphdef, params, data, jax.random.key(cfg.seed + 1), dataclasses.replace(cfg, seed=0))


# ----------------------------------------------------------------------------- cache


def _array_digest(tree: Any) -> str:
    digest = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(tree):
        host = np.ascontiguousarray(np.asarray(leaf))
        digest.update(f"{host.dtype}{host.shape}".encode())
        digest.update(host.tobytes())
    return digest.hexdigest()


def cache_key(model_cfg: ModelConfig, sft_cfg: SFTConfig, data: SFTData, domain_name: str) -> str:
    """sha256 hex digest of everything the trained base policy depends on."""
    description = {
        "code_version": SFT_CODE_VERSION,
        "domain": domain_name,
        "model": dataclasses.asdict(model_cfg),
        "sft": dataclasses.asdict(sft_cfg),
        "data": _array_digest(data),
    }
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()


def _flat_arrays(params: Any) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(path): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}


def save_policy(path: str, params: nnx.State, losses: jax.Array) -> None:
    """Write params (keyed by tree path) and the SFT losses to `path` (.npz) atomically."""
    arrays = _flat_arrays(params)
    if _LOSSES_KEY in arrays:
        raise ValueError(f"save_policy: a parameter path collides with {_LOSSES_KEY!r}")
    arrays[_LOSSES_KEY] = np.asarray(losses, np.float32)
    atomic_write(path, lambda handle: np.savez(handle, **arrays))


def load_policy(path: str, model_cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State, np.ndarray]:
    """(graphdef, params, SFT losses) stored by `save_policy` for a model of `model_cfg`."""
    graphdef, template = abstract_model(model_cfg)
    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    with np.load(path) as stored:
        leaves = []
        for key_path, spec in leaves_with_paths:
            name = jax.tree_util.keystr(key_path)
            if name not in stored:
                raise ValueError(f"load_policy: {path} has no parameter {name}")
            value = stored[name]
            if value.shape != spec.shape or value.dtype != spec.dtype:
                raise ValueError(
                    f"load_policy: {path} parameter {name} is {value.dtype}{list(value.shape)}, "
                    f"the model needs {spec.dtype}{list(spec.shape)}")
            leaves.append(jnp.asarray(value))
        losses = np.asarray(stored[_LOSSES_KEY])
    return graphdef, jax.tree_util.tree_unflatten(treedef, leaves), losses


def load_arrays_into(path: str, params: nnx.State) -> nnx.State:
    """`params` with every leaf replaced by the array `save_policy` stored under its tree path
    (same shapes and dtypes)."""
    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(params)
    with np.load(path) as stored:
        leaves = []
        for key_path, leaf in leaves_with_paths:
            name = jax.tree_util.keystr(key_path)
            if name not in stored or stored[name].shape != leaf.shape or stored[name].dtype != leaf.dtype:
                raise ValueError(f"load_arrays_into: {path} has no parameter {name} of {leaf.dtype}{list(leaf.shape)}")
            leaves.append(jnp.asarray(stored[name]))
    return jax.tree_util.tree_unflatten(treedef, leaves)


def cold_start(domain: Domain, graphdef: nnx.GraphDef, params: nnx.State, policy_cfg: Any,
               cache_dir: str | os.PathLike, *, seed: int = 0, holdout_rows: Sequence[int] = (),
               source: str = "") -> nnx.State:
    """A pretrained policy's params after `policy_cfg.sft_steps` supervised steps on the domain's
    corpus (for the agent domains: expert turns written in the agent prompt with the reasoning
    tags, `derl_jax.domains.agent_prompt`), the cold start the DERL paper gives its agent
    policies (RLVMR's). Cached in `cache_dir` under a hash of the checkpoint `source`, its model
    config, the SFT config and the encoded corpus; with 0 steps `params` as given."""
    from derl_jax.models.transformer import config_of

    sft_cfg = sft_config_from(policy_cfg, seed)
    if sft_cfg.steps == 0:
        return params
    corpus = domain_corpus(domain, seed, holdout_rows, policy_cfg)
    data = trim_padding(encode_corpus(domain.tokenizer, corpus, int(domain.prompt_length),
                                      int(domain.max_new_tokens)))
    description = {"code_version": SFT_CODE_VERSION, "domain": domain.name, "source": str(source),
                   "model": repr(config_of(graphdef, params)), "sft": dataclasses.asdict(sft_cfg),
                   "data": _array_digest(data)}
    key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()
    path = os.path.join(os.fspath(cache_dir), f"cold_start_{key[:24]}.npz")
    if os.path.exists(path):
        try:
            return load_arrays_into(path, params)
        except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as err:
            warnings.warn(f"cold_start: cached policy {path} is unreadable ({type(err).__name__}: {err}); "
                          f"training it again", stacklevel=2)
    params, losses = train_sft(graphdef, params, data, sft_cfg)
    os.makedirs(os.fspath(cache_dir), exist_ok=True)
    save_policy(path, params, losses)
    losses = np.asarray(losses, np.float64)
    atomic_write_json(path[: -len(".npz")] + ".json", {
        **description, "cache_key": key, "corpus_size": data.size,
        "first_loss": float(losses[0]), "final_loss": float(losses[-1]),
        "built_on": host_description()})
    return params


def base_policy(domain: Domain, policy_cfg: Any, cache_dir: str | os.PathLike, *, seed: int = 0,
                holdout_rows: Sequence[int] = ()) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, params) of the domain's SFT base policy, loaded from `cache_dir` or built there.

    policy_cfg: a `config.policy` block — model sizes, sft_steps, sft_lr, sft_batch_size, and
      whatever the domain's corpus reads (arith: sft_extra_problems, sft_mix). With
      sft_steps == 0 and no corpus the random initialisation is returned (not cached).
    holdout_rows: training rows kept out of the corpus (the outer loop's validation rows).
    A JSON file next to the arrays records the configs, the loss curve's ends and the host it was
    trained on (`built_on`: CPU, cores, backend, JAX version; the rounding depends on them).
    """
    model_cfg = policy_model_config(domain, policy_cfg)
    sft_cfg = sft_config_from(policy_cfg, seed)
    extra = int(_optional_field(policy_cfg, "sft_extra_problems", 0))
    mix = _optional_field(policy_cfg, "sft_mix", None)
    if sft_cfg.steps == 0 and domain.corpus is None:
        return init_params(model_cfg, jax.random.key(seed))
    corpus = domain_corpus(domain, seed, holdout_rows, policy_cfg)
    if domain.rollout == "env" and domain.history == FULL_HISTORY:
        data = pack_corpus(domain.tokenizer, corpus, int(domain.prompt_length) + int(domain.max_new_tokens),
                           int(domain.max_new_tokens))
        sft_cfg = dataclasses.replace(sft_cfg, batch_size=episodes_per_step(data, sft_cfg.batch_size))
    else:
        data = encode_corpus(domain.tokenizer, corpus, int(domain.prompt_length), int(domain.max_new_tokens))
    key = cache_key(model_cfg, sft_cfg, data, domain.name)
    path = os.path.join(os.fspath(cache_dir), f"{CACHE_PREFIX}{key[:24]}.npz")
    if os.path.exists(path):
        try:
            graphdef, params, _ = load_policy(path, model_cfg)
            return graphdef, params
        except (OSError, EOFError, KeyError, ValueError, zipfile.BadZipFile) as err:
            warnings.warn(f"base_policy: cached policy {path} is unreadable ({type(err).__name__}: {err}); "
                          f"building it again", stacklevel=2)
    graphdef, params = init_params(model_cfg, jax.random.key(seed))
    params, losses = train_sft(graphdef, params, data, sft_cfg)
    save_policy(path, params, losses)
    losses = np.asarray(losses, np.float64)
    atomic_write_json(path[: -len(".npz")] + ".json", {
        "cache_key": key,
        "domain": domain.name,
        "model": dataclasses.asdict(model_cfg),
        "sft": dataclasses.asdict(sft_cfg),
        "corpus_size": data.size,
        "corpus_turns": data.turns if isinstance(data, SFTStreams) else data.size,
        "extra_problems": extra,
        "mix": None if mix is None else {str(k): float(v) for k, v in dict(mix).items()},
        "held_out_rows": len(set(int(r) for r in np.asarray(holdout_rows).reshape(-1))),
        "first_loss": float(losses[0]) if losses.size else None,
        "final_loss": float(losses[-1]) if losses.size else None,
        "built_on": host_description(),
    })
    return graphdef, params
