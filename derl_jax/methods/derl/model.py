"""The Meta-Optimizer's language-model side: prompt, backbones, constrained sampling and log-probs.

* `meta_prompt` — the chat instruction of the hf backbone.
* `scratch_backbone` / `hf_backbone` -> `Backbone`: what differs between the two
  Meta-Optimizers (model, prompt tokens, decoding constraint, symbol token table).
* `constrained_decode` — n samples of the shared prompt under the constraint, one jitted scan.
* `constrained_logprobs` — the same constrained distribution, teacher-forced, for training.

Both score only the M output-embedding rows of the tokens the symbols use (`output_rows`).
Shapes: n samples, T completion tokens, Tp prompt tokens, M symbol tokens, D hidden size.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from derl_jax.expr.grammar import Grammar
from derl_jax.methods.derl.settings import MetaConfig
from derl_jax.methods.derl.hf_constraint import (
    TokenTrieConstraint,
    identity_token_table,
    make_trie_constraint,
    max_completion_tokens,
    tokenizer_token_table,
)
from derl_jax.models.attention import KVCache, init_cache
from derl_jax.models.transformer import (
    ModelConfig,
    abstract_model,
    apply_hidden,
    init_params,
    merge_model,
    tiny_config,
)

EXCLUDED_LOGIT = -1e30  # finite: excluded tokens get probability 0 with finite gradients


# ----------------------------------------------------------------------------- prompts


# What the instruction says the expression may use, per operator set (derl_jax.expr.parse.OPERATOR_SETS).
LANGUAGE_LINES = {
    "extended": ("You may also use u, the fraction of training done (0 at the start, 1 at the end), "
                 "numbers, + - * / and ** (exponent 1, 2, 3 or 0.5), parentheses, min(a,b), max(a,b), "
                 "abs(a) and clip(x,lo,hi).\n"),
    "paper": "Combine them with numbers, + - * / and parentheses only.\n",
}


def meta_prompt(num_primitives: int, primitive_descriptions: Sequence[str] = (), task_description: str = "",
                operators: str = "extended") -> list[dict]:
    """Chat messages asking the LM for one reward expression over g1..g{num_primitives} in the
    operator set `operators` (its line of `LANGUAGE_LINES`)."""
    if operators not in LANGUAGE_LINES:
        raise ValueError(f"meta_prompt: operators must be one of {tuple(LANGUAGE_LINES)}, got {operators!r}")
    if primitive_descriptions and len(primitive_descriptions) != num_primitives:
        raise ValueError(
            f"meta_prompt: {len(primitive_descriptions)} primitive descriptions for {num_primitives} primitives"
        )
    if primitive_descriptions:
        signals = "\n".join(f"- g{i + 1}: {text}" for i, text in enumerate(primitive_descriptions))
    else:
        signals = "\n".join(f"- g{i + 1}: reward signal number {i + 1}" for i in range(num_primitives))
    task = f"Task: {task_description.strip()}\n\n" if task_description.strip() else ""
    instruction = (
        f"{task}Design a reward function for reinforcement-learning training of a policy. "
        f"It combines these atomic reward signals, each a number per rollout:\n{signals}\n"
        f"{LANGUAGE_LINES[operators]}"
        "Answer with the expression only, for example g1+0.5*g2."
    )
    return [
        {"role": "system", "content": "You are an expert in reward design for reinforcement learning."},
        {"role": "user", "content": instruction},
    ]


# ----------------------------------------------------------------------------- backbones


@dataclasses.dataclass(frozen=True)
class Backbone:
    """What differs between the scratch and hf Meta-Optimizers.

    prompt: i32[Tp] prompt tokens shared by every sample; constraint: the decoding
    constraint (its `token_ids` are the M tokens symbols use); max_new_tokens: T, enough
    for any sample; symbol_tokens[s]: token ids of grammar symbol s (empty for <pad>, <bos>);
    decode(emitted tokens i32[T']) -> text; initial_params(key) -> params (random for
    scratch, the checkpoint's for hf).
    """

    graphdef: Any
    model_config: ModelConfig
    prompt: np.ndarray
    constraint: TokenTrieConstraint
    eos_id: int
    pad_id: int
    max_new_tokens: int
    symbol_tokens: tuple
    decode: Callable[[np.ndarray], str]
    initial_params: Callable[[jax.Array], Any]


def scratch_backbone(cfg: MetaConfig, grammar: Grammar) -> Backbone:
    """Tiny transformer over the grammar's symbols; prompt [<bos>]."""
    model_config = tiny_config(
        grammar.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_layers, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        max_position=grammar.max_length + 8,
    )
    table = identity_token_table(grammar)
    constraint = make_trie_constraint(grammar, table, grammar.vocab_size)
    graphdef, _ = abstract_model(model_config)
    return Backbone(
        graphdef=graphdef, model_config=model_config, prompt=np.asarray([grammar.bos_id], np.int32),
        constraint=constraint, eos_id=grammar.eos_id, pad_id=grammar.pad_id,
        max_new_tokens=grammar.max_length, symbol_tokens=tuple(tuple(t) if t else () for t in table),
        decode=grammar.decode, initial_params=lambda key: init_params(model_config, key)[1],
    )


def hf_backbone(cfg: MetaConfig, grammar: Grammar) -> Backbone:
    """Local Hugging Face Qwen2 checkpoint and tokenizer, chat prompt, token-trie constraint."""
    from derl_jax.models.hf import load_hf_checkpoint
    from derl_jax.models.hf_tokenizer import HFTokenizer

    tokenizer = HFTokenizer.from_directory(cfg.hf_tokenizer or cfg.hf_path)
    model_config, params = load_hf_checkpoint(cfg.hf_path, cfg.hf_param_dtype)
    if tokenizer.vocab_size > model_config.vocab_size:
        raise ValueError(
            f"hf backbone: the tokenizer in {cfg.hf_tokenizer or cfg.hf_path!r} has {tokenizer.vocab_size} tokens, "
            f"more than the {model_config.vocab_size} of the checkpoint {cfg.hf_path!r}"
        )
    table = tokenizer_token_table(grammar, tokenizer.encode, tokenizer.eos_id, decode=tokenizer.decode)
    constraint = make_trie_constraint(grammar, table, model_config.vocab_size)
    messages = meta_prompt(grammar.num_primitives, cfg.primitive_descriptions, cfg.task_description, grammar.operators)
    prompt = np.asarray(tokenizer.encode(tokenizer.apply_chat_template(messages)), np.int32)
    max_new_tokens = max_completion_tokens(grammar, constraint.trie)
    if prompt.size + max_new_tokens > model_config.max_position:
        raise ValueError(
            f"hf backbone: prompt ({prompt.size} tokens) plus {max_new_tokens} completion tokens exceed the "
            f"checkpoint's max_position_embeddings={model_config.max_position}"
        )

    def decode(tokens: np.ndarray) -> str:
        return tokenizer.decode(tokens, skip_special_tokens=True)

    return Backbone(
        graphdef=abstract_model(model_config)[0], model_config=model_config, prompt=prompt, constraint=constraint,
        eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id, max_new_tokens=max_new_tokens,
        symbol_tokens=tuple(tuple(t) if t else () for t in table), decode=decode,
        initial_params=lambda key: params,
    )


# ----------------------------------------------------------------------------- log-probabilities


def output_rows(graphdef: nnx.GraphDef, params: nnx.State, token_ids: jax.Array) -> jax.Array:
    """[M, D]: the output-embedding rows of `token_ids` i32[M] (tied embedding or lm_head)."""
    model = merge_model(graphdef, params)
    if model.lm_head is None:
        table = jnp.take(model.embed.embedding[...], token_ids, axis=0)
    else:
        table = jnp.take(model.lm_head.kernel[...], token_ids, axis=1).T
    return table.astype(model.config.compute_dtype)


def constrained_logprobs(
    graphdef: nnx.GraphDef, params: nnx.State, prompt: jax.Array, tokens: jax.Array, mask: jax.Array,
    allowed: jax.Array, compact: jax.Array, token_ids: jax.Array, temperature: float | jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Teacher-forced (logp f32[n, T], entropy f32[n, T]) of `tokens` under the constrained distribution.

    prompt: i32[Tp] shared by all rows; tokens: i32[n, T]; mask: bool[n, T] (a prefix per row);
    allowed: bool[n, T, M] the constraint's allowed set before each token (`replay`);
    compact: i32[n, T] each token's index in `token_ids` i32[M]. logp[i, t] =
    log softmax over allowed tokens of (logits / temperature) at tokens[i, t]; both outputs
    are 0 where mask is False.
    """
    rows, length = tokens.shape
    prompt_length = prompt.shape[0]
    full = jnp.concatenate([jnp.broadcast_to(prompt, (rows, prompt_length)), tokens], axis=1).astype(jnp.int32)
    token_mask = jnp.concatenate([jnp.ones((rows, prompt_length), bool), mask.astype(bool)], axis=1)
    total = prompt_length + length
    causal = jnp.arange(total)[None, :] <= jnp.arange(total)[:, None]
    positions = jnp.broadcast_to(jnp.arange(total, dtype=jnp.int32), (rows, total))
    # positions prompt_length - 1 .. total - 2 predict the tokens: the last length + 1 but the final one
    hidden, _ = apply_hidden(graphdef, params, full, positions, token_mask[:, None, :] & causal[None],
                             last=length + 1)
    predicting = hidden[:, :length]
    logits = jnp.einsum("btd,md->btm", predicting, output_rows(graphdef, params, token_ids),
                        preferred_element_type=jnp.float32) / temperature
    log_probs = jax.nn.log_softmax(jnp.where(allowed, logits, EXCLUDED_LOGIT), axis=-1)
    logp = jnp.take_along_axis(log_probs, jnp.maximum(compact, 0)[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.where(allowed, jnp.exp(log_probs) * log_probs, 0.0), axis=-1)
    mask = mask.astype(bool)
    return jnp.where(mask, logp, 0.0), jnp.where(mask, entropy, 0.0)


def constrained_decode(
    graphdef: nnx.GraphDef, params: nnx.State, prompt: jax.Array, constraint: TokenTrieConstraint, key: jax.Array,
    temperature: float | jax.Array, *, num_samples: int, max_new_tokens: int, eos_id: int, pad_id: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Sample `num_samples` completions of the shared `prompt` i32[Tp] under `constraint`.

    Returns (tokens i32[n, T], mask bool[n, T], logp f32[n, T]): tokens are LM ids, `pad_id`
    after a row's `eos_id`; mask is True up to and including EOS; logp is the log-prob under
    the constrained distribution at `temperature` (0 where masked), i.e. what
    `constrained_logprobs` recomputes. Step i draws with fold_in(key, i), so the same key
    gives the same samples (a low temperature approaches greedy decoding).

    Unlike the general sampler (`models.sampling.sample`, which scores the whole vocabulary
    and masks it with `constraint.allowed`), this one prefills the shared prompt once and
    scores only the M tokens the constraint can ever allow: the same distribution, but M
    logits per step instead of V (26 instead of 151,936 for Qwen).
    """
    model_config = merge_model(graphdef, params).config
    prompt_length = prompt.shape[0]
    cache = init_cache(model_config, 1, prompt_length + max_new_tokens)
    hidden, cache = apply_hidden(graphdef, params, prompt[None].astype(jnp.int32),
                                 jnp.arange(prompt_length, dtype=jnp.int32)[None], None, cache, 0, last=1)
    cache = KVCache(k=jnp.repeat(cache.k, num_samples, axis=1), v=jnp.repeat(cache.v, num_samples, axis=1))
    rows = output_rows(graphdef, params, constraint.token_ids)  # [M, D]

    def choose(last_hidden, state, done, step_key):
        logits = jnp.einsum("bd,md->bm", last_hidden, rows, preferred_element_type=jnp.float32)
        allowed = constraint.allowed_compact(state) | done[:, None]
        scaled = jnp.where(allowed, logits, -jnp.inf) / temperature
        choice = jax.random.categorical(step_key, scaled, axis=-1)
        logp = jnp.take_along_axis(jax.nn.log_softmax(scaled, axis=-1), choice[:, None], axis=-1)[:, 0]
        live = ~done
        emitted = jnp.where(live, constraint.token_ids[choice], pad_id).astype(jnp.int32)
        done = done | (live & (emitted == eos_id))
        return emitted, jnp.where(live, logp, 0.0), live, done, constraint.advance(state, emitted)

    first_hidden = jnp.broadcast_to(hidden[:, -1], (num_samples, hidden.shape[-1]))
    emitted, logp, live, done, state = choose(first_hidden, constraint.init(num_samples),
                                              jnp.zeros((num_samples,), bool), jax.random.fold_in(key, 0))

    def step(carry, index):
        cache, previous, done, state = carry
        at = prompt_length + index - 1
        positions = jnp.full((num_samples, 1), at, jnp.int32)
        hidden, cache = apply_hidden(graphdef, params, previous[:, None], positions, None, cache, at)
        emitted, logp, live, done, state = choose(hidden[:, 0], state, done, jax.random.fold_in(key, index))
        return (cache, emitted, done, state), (emitted, logp, live)

    _, rest = jax.lax.scan(step, (cache, emitted, done, state), jnp.arange(1, max_new_tokens, dtype=jnp.int32))
    tokens, logps, mask = (jnp.concatenate([head[:, None], tail.T], axis=1)
                           for head, tail in zip((emitted, logp, live), rest))
    return tokens, mask, logps
