"""The Meta-Optimizer: a language model that writes reward expressions under the grammar.

    optimizer = MetaOptimizer(cfg, grammar)        # cfg: a run config (reads cfg.meta) or its meta block
    state = optimizer.init(key)                    # model + cold-start SFT; deterministic in key
    sample = optimizer.sample(state, key, n)       # n expressions, sample.texts
    state, metrics = optimizer.update(state, sample, scores)   # GRPO on validation scores f32[n]

Backbones (`cfg.meta.backbone`):

  scratch  a tiny Qwen2-style transformer (`models.transformer`) with random init whose
           vocabulary IS the grammar's symbol vocabulary; the prompt is `[<bos>]`.
  hf       a pretrained Hugging Face Qwen2 checkpoint from the local directory `hf_path`
           (Qwen2.5-0.5B-Instruct in the paper) with its tokenizer (`hf_tokenizer`, default
           `hf_path`), prompted through the chat template with a fixed instruction that
           describes g1..gk, `u` and the operators (`meta_model.meta_prompt`). Each grammar symbol is
           written as its own token sequence and sampling runs under the token-trie
           constraint of `derl_jax.methods.derl.hf_constraint`; `<eos>` is the end-of-turn token.

Both backbones (`derl_jax.methods.derl.model`) share everything else: sampling is one jitted
`constrained_decode` under the constraint (every sample ends with `<eos>` and its text
parses, by the grammar's guarantee); all training uses the *constrained* distribution, i.e. the log-softmax over the
tokens the constraint allows at each step, at the sampling temperature: exactly the
distribution samples are drawn from. Only the output-embedding rows of the M tokens the
symbols use are multiplied, in sampling and in training, so a 151,936-token vocabulary
costs M (a few dozen) logits per position. (The constraint also works with the general
`models.sampling.sample` over the full vocabulary, which gives the same distribution at
V / M times the cost.)

Cold start (inside `init`): SFT with Adam on `cold_start_corpus` texts from
`derl_jax.methods.derl.corpus.cold_start_corpus` (corpus seed `cold_start_seed`), written exactly as
the constraint writes them (for hf: as the assistant's reply to the instruction), for
`cold_start_steps` steps of `cold_start_batch_size` sequences drawn with replacement from
the key. The fine-tuned parameters become both the policy and the frozen reference.

Update (GRPO, `derl_jax.rl.grpo`): the n samples form ONE group; advantages are
(score - mean) / (std + 1e-6) over the group (all equal scores give exactly 0, so
ill-defined expressions, which arrive with score 0, stay in the group and only pull when
others score higher). Old log-probs are recomputed with the current parameters (the ratio
starts at 1 even where sampling and teacher forcing round differently), the reference
log-probs come from `ref_params`, and `epochs` full-batch AdamW steps minimise the clipped
surrogate plus `kl` * k3-KL to the reference. With all scores equal the policy-gradient
term is exactly zero and the result does not depend on the common score; the step still
applies the KL pull toward the reference and Adam's momentum from earlier steps. (Even
when params equal the reference, the KL gradient is rounding noise rather than exactly 0,
because the reference log-probs come from a separately compiled forward pass, and Adam
rescales it to a step of up to `lr` per parameter.)

Config fields (`MetaConfig`; a run's `meta` block uses the same flat names, see
configs/arith.py): backbone; hidden_size, intermediate_size, num_layers, num_heads,
num_kv_heads, head_dim (scratch model); hf_path, hf_tokenizer, hf_param_dtype,
task_description, primitive_descriptions (hf); temperature; cold_start_corpus,
cold_start_steps, cold_start_lr, cold_start_batch_size, cold_start_seed; lr, kl, kl_kind,
epochs, clip_eps, max_grad_norm, loss_agg (GRPO); and, checked against the grammar,
max_symbols, max_depth, max_decimals, num_primitives.

Shapes: n samples, T completion tokens (`max_new_tokens`), Tp prompt tokens, M tokens the
symbols use, D hidden size.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from derl_jax.expr.grammar import Grammar
from derl_jax.methods.derl.corpus import cold_start_corpus
from derl_jax.methods.derl.settings import MetaConfig
from derl_jax.methods.derl.model import constrained_decode, constrained_logprobs, hf_backbone, scratch_backbone
from derl_jax.rl.grpo import group_advantages, grpo_update, make_optimizer
from derl_jax.parallel import gather_to_host, put_global
from derl_jax.rl.placement import optimizer_state_shardings, place_params

_UPDATE_STREAM = 0x5EED  # folded into the cold-start seed to key the update minibatch order
REPLAY_CHUNK = 64  # rows per call of the jitted constraint replay (one compiled shape)


# ----------------------------------------------------------------------------- config


# ----------------------------------------------------------------------------- state and samples


@struct.dataclass
class MetaState:
    """params: the LM parameters; opt_state: AdamW state of the GRPO updates; ref_params:
    the cold-started parameters (frozen, for the KL term); step: i32[] updates done."""

    params: Any
    opt_state: Any
    ref_params: Any
    step: jax.Array


@struct.dataclass
class MetaSample:
    """n sampled expressions.

    texts:   the decoded expressions (list[str], length n)
    symbols: i32[n, T] the emitted tokens (grammar symbol ids for the scratch backbone, LM
             token ids for hf), `<eos>` included, padding after it
    mask:    bool[n, T] True on emitted tokens up to and including `<eos>`
    logp:    f32[n, T] their log-probabilities under the sampling distribution (constrained,
             at the sampling temperature); 0 where mask is False
    """

    texts: list = struct.field(pytree_node=False)
    symbols: jax.Array
    mask: jax.Array
    logp: jax.Array


# ----------------------------------------------------------------------------- the optimizer


class MetaOptimizer:
    """The Meta-Optimizer of one run (module docstring): `init`, `sample`, `update`.

    cfg: a run config with a `meta` block, the block itself, or a MetaConfig. grammar: the
    expression grammar (`derl_jax.experiment.protocol.meta_grammar`). The hf backbone loads its
    checkpoint and tokenizer here, once.
    """

    def __init__(self, cfg: Any, grammar: Grammar, mesh: Any = None):
        """mesh: a ('cand', 'data', 'model') mesh (`derl_jax.parallel.make_mesh`) to hold the
        backbone on, its weights split over 'model' as the inner loop's policy is (for a
        backbone larger than one device); sampling and updates then run as sharded steps.
        The mesh may span several processes (a multi-host job): every process then calls
        every method with the same arguments, as the search does. None: the default device."""
        if not isinstance(grammar, Grammar):
            raise TypeError(f"MetaOptimizer: grammar must be a derl_jax.expr.grammar.Grammar, got {type(grammar).__name__}")
        self.config = MetaConfig.from_config(cfg)
        self.config.check_grammar(grammar)
        self.grammar = grammar
        build = scratch_backbone if self.config.backbone == "scratch" else hf_backbone
        self.backbone = build(self.config, grammar)
        self.optimizer = make_optimizer(self.config.grpo(group_size=1))
        self._sample_fn = jax.jit(self._sample_tokens, static_argnames=("num_samples",))
        self._replay_fn = jax.jit(self.backbone.constraint.replay)
        self._update_fn = jax.jit(self._update)
        self._cold_start_fn = jax.jit(self._cold_start, static_argnames=("steps",))
        self._logprob_fn = jax.jit(self._logprobs)
        self.mesh = mesh

    def place(self, params: Any) -> Any:
        """`params` on `self.mesh` by the transformer's sharding metadata (unchanged without a mesh)."""
        return params if self.mesh is None else place_params(params, self.mesh)

    def _replicated(self, tree: Any) -> Any:
        """`tree`'s arrays copied whole to every device of `self.mesh` (unchanged without a
        mesh): the inputs of a step whose parameters live on the mesh, which may span processes."""
        if self.mesh is None:
            return tree
        return put_global(tree, jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec()))

    # --------------------------------------------------------------- corpus and cold start

    @functools.cached_property
    def corpus(self) -> list[str]:
        """The cold-start texts (deterministic in `cold_start_seed`; every one encodable by the grammar)."""
        cfg = self.config
        return cold_start_corpus(self.grammar.num_primitives, cfg.cold_start_corpus, cfg.cold_start_seed, grammar=self.grammar)

    def encode_text(self, text: str) -> list[int]:
        """The tokens the constraint writes `text` as, `<eos>` included (ValueError if the grammar rejects it)."""
        tokens: list[int] = []
        for symbol in self.grammar.encode(text):
            tokens.extend(self.backbone.symbol_tokens[symbol])
        return tokens

    def encode_texts(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(tokens i32[len, T], mask bool[len, T]) of `texts`, padded to the completion length T."""
        length = self.backbone.max_new_tokens
        tokens = np.full((len(texts), length), self.backbone.pad_id, np.int32)
        mask = np.zeros((len(texts), length), bool)
        for row, text in enumerate(texts):
            ids = self.encode_text(text)
            tokens[row, : len(ids)] = ids
            mask[row, : len(ids)] = True
        return tokens, mask

    def allowed_masks(self, tokens: Any) -> jax.Array:
        """bool[rows, T, M]: the constraint's allowed set before each token of `tokens` i32[rows, T].

        The constraint is replayed in chunks of REPLAY_CHUNK rows so that one compiled shape
        serves every batch size."""
        tokens = np.asarray(gather_to_host(tokens), np.int32)
        rows = tokens.shape[0]
        padded = np.full((-(-rows // REPLAY_CHUNK) * REPLAY_CHUNK, tokens.shape[1]), self.backbone.pad_id, np.int32)
        padded[:rows] = tokens
        chunks = [self._replay_fn(jnp.asarray(padded[i : i + REPLAY_CHUNK])) for i in range(0, len(padded), REPLAY_CHUNK)]
        return jnp.concatenate(chunks, axis=0)[:rows]

    def _model_logprobs(self, params, tokens, mask, allowed, temperature):
        constraint = self.backbone.constraint
        return constrained_logprobs(
            self.backbone.graphdef, params, jnp.asarray(self.backbone.prompt), tokens, mask,
            allowed, constraint.compact_index(tokens), constraint.token_ids, temperature,
        )

    def _cold_start(self, params, key, tokens, mask, allowed, *, steps):
        cfg = self.config
        optimizer = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(cfg.cold_start_lr))
        batch_size = min(cfg.cold_start_batch_size, tokens.shape[0])
        rows = jax.random.randint(key, (steps, batch_size), 0, tokens.shape[0])
        constraint = self.backbone.constraint
        compact = constraint.compact_index(tokens)
        prompt = jnp.asarray(self.backbone.prompt)

        def loss_fn(params, index):
            logp, _ = constrained_logprobs(self.backbone.graphdef, params, prompt, tokens[index], mask[index],
                                           allowed[index], compact[index], constraint.token_ids, 1.0)
            return -jnp.sum(logp) / jnp.maximum(jnp.sum(mask[index]), 1)

        def step(carry, index):
            params, opt_state = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, index)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        (params, _), losses = jax.lax.scan(step, (params, optimizer.init(params)), rows)
        return params, losses

    def cold_start(self, params: Any, key: jax.Array) -> tuple[Any, jax.Array]:
        """(fine-tuned params, per-step SFT loss f32[cold_start_steps]): teacher-forced NLL per
        token of the corpus under the constrained distribution at temperature 1."""
        tokens, mask = self.encode_texts(self.corpus)
        steps = self.config.cold_start_steps
        if steps == 0:
            return params, jnp.zeros((0,), jnp.float32)
        inputs = self._replicated((key, tokens, mask, self.allowed_masks(tokens)))
        return self._cold_start_fn(params, *inputs, steps=steps)

    def init(self, key: jax.Array) -> MetaState:
        """Initial parameters (random for scratch, the checkpoint for hf), then the cold-start
        SFT; the result is both `params` and the frozen `ref_params`. Deterministic in `key`."""
        param_key, sft_key = jax.random.split(key)
        params, _ = self.cold_start(self.place(self.backbone.initial_params(param_key)), sft_key)
        params = self.place(params)
        if self.mesh is None:
            opt_state = self.optimizer.init(params)
        else:  # moments where their parameters are, step counts on every device of the mesh
            shardings = optimizer_state_shardings(self.optimizer, params, self.mesh)
            opt_state = jax.jit(self.optimizer.init, out_shardings=shardings)(params)
        return MetaState(params=params, opt_state=opt_state, ref_params=params,
                         step=self._replicated(np.zeros((), np.int32)))

    # --------------------------------------------------------------- sampling

    def _sample_tokens(self, params, key, temperature, *, num_samples):
        backbone = self.backbone
        return constrained_decode(
            backbone.graphdef, params, jnp.asarray(backbone.prompt), backbone.constraint, key, temperature,
            num_samples=num_samples, max_new_tokens=backbone.max_new_tokens, eos_id=backbone.eos_id,
            pad_id=backbone.pad_id,
        )

    def sample(self, state: MetaState, key: jax.Array, n: int, *, temperature: float | None = None) -> MetaSample:
        """n expressions sampled under the grammar at `temperature` (default: the config's;
        one compiled function per n, any temperature). Same key, same texts."""
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"MetaOptimizer.sample: n must be a positive int, got {n!r}")
        temperature = self.config.temperature if temperature is None else temperature
        if not temperature > 0:
            raise ValueError(f"MetaOptimizer.sample: temperature must be > 0, got {temperature!r}")
        key, temperature = self._replicated((key, np.float32(temperature)))
        tokens, mask, logp = self._sample_fn(state.params, key, temperature, num_samples=int(n))
        host_tokens, host_mask = gather_to_host((tokens, mask))
        texts = [self.backbone.decode(row[keep]) for row, keep in zip(host_tokens, host_mask)]
        return MetaSample(texts=texts, symbols=tokens, mask=mask, logp=logp)

    def _logprobs(self, params, tokens, mask, allowed, temperature):
        return self._model_logprobs(params, tokens, mask, allowed, temperature)[0]

    def logprobs(self, params: Any, sample: MetaSample, temperature: float | None = None) -> jax.Array:
        """f32[n, T]: log-probs of `sample`'s tokens under `params` (constrained, at `temperature`,
        default the config's); 0 where sample.mask is False."""
        temperature = self.config.temperature if temperature is None else temperature
        inputs = self._replicated((sample.symbols, sample.mask, self.allowed_masks(sample.symbols), np.float32(temperature)))
        return self._logprob_fn(params, *inputs)

    # --------------------------------------------------------------- GRPO update

    def _update(self, state: MetaState, batch: dict, scores):
        num_samples = batch["tokens"].shape[0]
        cfg = self.config.grpo(group_size=num_samples)
        constraint = self.backbone.constraint
        batch = dict(batch, advantages=group_advantages(scores, num_samples))
        prompt = jnp.asarray(self.backbone.prompt)

        def logprob_fn(params, rows):
            return constrained_logprobs(self.backbone.graphdef, params, prompt, rows["tokens"], rows["mask"],
                                        rows["allowed"], constraint.compact_index(rows["tokens"]),
                                        constraint.token_ids, self.config.temperature)

        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(self.config.cold_start_seed), _UPDATE_STREAM),
                                 state.step)
        params, opt_state, metrics = grpo_update(state.params, state.opt_state, batch, key, logprob_fn,
                                                 self.optimizer, cfg)
        metrics = dict(metrics, score_mean=jnp.mean(scores), score_std=jnp.std(scores), score_max=jnp.max(scores),
                       advantage_abs_mean=jnp.mean(jnp.abs(batch["advantages"])))
        new_state = MetaState(params=params, opt_state=opt_state, ref_params=state.ref_params, step=state.step + 1)
        return new_state, metrics

    def update(self, state: MetaState, sample: MetaSample, scores: Any) -> tuple[MetaState, dict[str, jax.Array]]:
        """One GRPO step on `sample` scored `scores` f32[n] (one group; invalid expressions score 0).

        `sample` must come from `sample(state, ...)` at the config's temperature: log-probs
        are recomputed at that temperature and treated as the behaviour policy's.

        Returns (new state, metrics: loss, pg_loss, kl, entropy, clip_fraction, grad_norm,
        score_mean, score_std, score_max, advantage_abs_mean — scalars, means over the epochs;
        devices: how many devices hold the parameters, the mesh's size when there is one).
        """
        values = np.asarray(scores, np.float32)
        rows = int(sample.symbols.shape[0])
        if values.shape != (rows,):
            raise ValueError(f"MetaOptimizer.update: scores must have shape ({rows},) like the sample, got {values.shape}")
        if not np.all(np.isfinite(values)):
            raise ValueError(f"MetaOptimizer.update: scores must be finite (ill-defined expressions score 0), got {values}")
        if sample.symbols.shape[1] != self.backbone.max_new_tokens:
            raise ValueError(
                f"MetaOptimizer.update: the sample has {sample.symbols.shape[1]} tokens per row, this optimizer "
                f"writes {self.backbone.max_new_tokens}; it was not drawn by this optimizer"
            )
        tokens, mask, allowed, temperature, values = self._replicated(
            (sample.symbols, sample.mask, self.allowed_masks(sample.symbols), np.float32(self.config.temperature), values))
        batch = {
            "tokens": tokens,
            "mask": mask,
            "allowed": allowed,
            # one compiled forward (shared with `logprobs`) gives both; recomputing the old
            # log-probs makes the first ratio exactly 1
            "old_logp": self._logprob_fn(state.params, tokens, mask, allowed, temperature),
            "ref_logp": self._logprob_fn(state.ref_params, tokens, mask, allowed, temperature),
        }
        new_state, metrics = self._update_fn(state, batch, values)
        new_state = new_state.replace(params=self.place(new_state.params))
        devices = len(jax.tree_util.tree_leaves(new_state.params)[0].sharding.device_set)
        return new_state, dict(metrics, devices=devices)
