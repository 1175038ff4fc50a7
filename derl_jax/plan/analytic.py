"""Closed-form memory and FLOP counts of one inner-loop step, from shapes alone.

Everything here is arithmetic on a `ModelConfig` and a `RunShape`; nothing touches a device.

Symbols: L layers, D hidden size, F MLP width, H query heads, Kv key/value heads, Dh head
size, V vocabulary; K candidates, B prompts per step, G samples per prompt, N = B*G rollouts,
Tp prompt tokens, T new tokens, M minibatches, E epochs, U turns per episode (multi-turn
domains: U sampling calls of N rows per step, each turn one update row, N*U rows in all).

FLOPs count matmuls only, 2 per multiply-add, exactly as the model code issues them:

    forward(n tokens, S keys, n_logits rows) =
        n * (2*L*P + 4*L*H*Dh*S + 2*Dh^2) + n_logits * 2*D*V
    P = D*(H + 2*Kv)*Dh + H*Dh*D + 3*D*F        (q/k/v, o, gate/up/down kernels of one layer)

Attention scores and values cost 4*H*Dh per query and key, and every query reads the whole
static cache (S = cache length, masked, not causally skipped); 2*Dh^2 is the rotary-table
matmul. A prefill of p prompts of Tp tokens runs L - 1 layers over all p*Tp tokens, and the
last layer's q/k/v projection over all of them but its attention, output projection and MLP
over the p last positions only (`Transformer.hidden_states(..., last=1)`):

    prefill(p prompts, S keys) = p*Tp * (2*(L-1)*P + 4*(L-1)*H*Dh*S + 2*D*(H + 2*Kv)*Dh + 2*Dh^2)
                                 + p * (2*P - 2*D*(H + 2*Kv)*Dh + 4*H*Dh*S)

Sampling = prefill over the B distinct prompts (all N when U > 1; S = Tp + T, no logits) +
logits of the N rows + (T - 1) decode steps of N rows. A teacher-forced pass over r rows
(`sequence_logprobs`) = prefill of r/g prompts + (T - 1) cached tokens per row (S = Tp + T - 1)
+ T logits per row. One optimizer step on r = N/M rows costs 3x that pass (backward = 2x
forward: every matmul has an input and a weight gradient) minus 2x the rotary term (no
gradient flows into positions); with remat the backward recomputes every layer's forward except
its down projection (whose output no gradient needs). XLA's cost analysis
also counts elementwise ops (1 per element), which this count leaves out.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np

from derl_jax.models.logits import chunk_positions
from derl_jax.models.sampling import PREDRAWN_NOISE_MAX_ELEMENTS, decode_phases
from derl_jax.models.transformer import ModelConfig

OPTIMIZERS = ("adamw", "adam", "sgd")


@dataclasses.dataclass(frozen=True)
class RunShape:
    """The shapes of one inner-loop step of K candidates on a (cand, data, model) mesh.

    turns: sampling calls per step (multi-turn episodes); each turn's (prompt, action) is a row of the update.
    """

    model: ModelConfig
    num_candidates: int = 1                 # K candidates trained by one step
    prompts_per_step: int = 1               # B
    group_size: int = 1                     # G samples per prompt
    prompt_tokens: int = 16                 # Tp tokens of one prompt
    new_tokens: int = 16                    # T tokens sampled per row
    minibatches: int = 1                    # M optimizer steps per epoch
    epochs: int = 1                         # E passes over the update rows
    optimizer: str = "adamw"                # one of OPTIMIZERS
    reference: bool = False                 # runs a reference-policy forward (KL weight > 0)
    chunk_size: int = 0                     # candidates trained at once (0 = all K), as `inner.chunk_size`
    mesh: tuple[int, int, int] = (1, 1, 1)  # (cand, data, model) device counts
    turns: int = 1                          # U sampling calls per step
    host_loop: bool = False                 # host-scored domain: only the candidates in flight live on the devices
    meta: ModelConfig | None = None         # the Meta-Optimizer's model when the run keeps one on the devices

    def __post_init__(self):
        for name in ("num_candidates", "prompts_per_step", "group_size", "prompt_tokens", "new_tokens",
                     "minibatches", "epochs", "turns"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"RunShape.{name} must be a positive integer, got {value!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"RunShape.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.chunk_size < 0 or (self.chunk_size and self.num_candidates % self.chunk_size):
            raise ValueError(
                f"RunShape.chunk_size must be 0 or divide num_candidates={self.num_candidates}, got {self.chunk_size}")
        if len(self.mesh) != 3 or any(int(s) < 1 for s in self.mesh):
            raise ValueError(f"RunShape.mesh must be three positive sizes (cand, data, model), got {self.mesh!r}")
        if self.update_rows % self.minibatches:
            raise ValueError(
                f"RunShape.minibatches={self.minibatches} must divide the {self.update_rows} update rows per step")

    @property
    def rollouts(self) -> int:
        """N = B * G rows of one sampling call."""
        return self.prompts_per_step * self.group_size

    @property
    def update_rows(self) -> int:
        """N * U rows the update trains on per step and candidate."""
        return self.rollouts * self.turns

    @property
    def prefill_group(self) -> int:
        """Rows sharing a prompt in the sampled batch: G for one turn (later turns' prompts differ)."""
        return self.group_size if self.turns == 1 else 1

    @property
    def update_group(self) -> int:
        """Rows in a row of the update that share a prompt (prefilled once): G for one turn and one minibatch."""
        return self.group_size if self.minibatches == 1 and self.turns == 1 else 1

    @property
    def in_flight(self) -> int:
        """Candidates trained at the same time (the chunk, or all K)."""
        return self.chunk_size or self.num_candidates

    @property
    def num_devices(self) -> int:
        return math.prod(self.mesh)

    def replace(self, **changes) -> "RunShape":
        return dataclasses.replace(self, **changes)


def itemsize(dtype_name: str) -> int:
    """Bytes per element of a dtype name ("float32", "bfloat16", ...)."""
    return int(jnp.dtype(dtype_name).itemsize)


# ----------------------------------------------------------------------------- parameters


def param_shapes(config: ModelConfig) -> dict[str, tuple[tuple[int, ...], int | None]]:
    """{parameter path: (shape, index of the dimension the 'model' axis splits, or None)},
    the layout documented in `derl_jax.models.transformer`."""
    d, f, h, kv, dh = (config.hidden_size, config.intermediate_size, config.num_heads, config.num_kv_heads,
                       config.head_dim)
    shapes = {"embed.embedding": ((config.vocab_size, d), 0)}
    for i in range(config.num_layers):
        layer = {
            "input_norm.scale": ((d,), None), "post_attn_norm.scale": ((d,), None),
            "attn.q_proj.kernel": ((d, h * dh), 1), "attn.q_proj.bias": ((h * dh,), 0),
            "attn.k_proj.kernel": ((d, kv * dh), 1), "attn.k_proj.bias": ((kv * dh,), 0),
            "attn.v_proj.kernel": ((d, kv * dh), 1), "attn.v_proj.bias": ((kv * dh,), 0),
            "attn.o_proj.kernel": ((h * dh, d), 0),
            "mlp.gate_proj.kernel": ((d, f), 1), "mlp.up_proj.kernel": ((d, f), 1),
            "mlp.down_proj.kernel": ((f, d), 0),
        }
        if not config.qkv_bias:
            layer = {name: value for name, value in layer.items() if not name.endswith("_proj.bias")}
        if config.qk_norm:
            layer.update({"attn.q_norm.scale": ((dh,), None), "attn.k_norm.scale": ((dh,), None)})
        shapes.update({f"layers.{i}.{name}": value for name, value in layer.items()})
    shapes["final_norm.scale"] = ((d,), None)
    if not config.tie_embeddings:
        shapes["lm_head.kernel"] = ((d, config.vocab_size), 1)
    return shapes


def param_count(config: ModelConfig) -> int:
    """Exact number of parameter elements."""
    return sum(math.prod(shape) for shape, _ in param_shapes(config).values())


def param_bytes(config: ModelConfig, model_axis: int = 1) -> int:
    """Bytes of one copy of the parameters on one device of a `model_axis`-way split
    (a dimension the axis does not divide stays whole, as `param_partition_specs` does)."""
    total = 0
    for shape, split in param_shapes(config).values():
        ways = model_axis if split is not None and shape[split] % model_axis == 0 else 1
        total += math.prod(shape) // ways
    return total * itemsize(config.param_dtype)


def optimizer_bytes(config: ModelConfig, optimizer: str = "adamw", model_axis: int = 1) -> int:
    """Bytes of one policy's optimizer state (`derl_jax.rl.grpo.make_optimizer`) per device:
    adam/adamw keep two moments shaped and typed like the parameters and two int32 step
    counters (Adam's and the learning-rate schedule's); sgd keeps the schedule counter only."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {optimizer!r}")
    if optimizer == "sgd":
        return 4
    return 2 * param_bytes(config, model_axis) + 2 * 4


def kv_cache_bytes(config: ModelConfig, batch: int, length: int) -> int:
    """L x 2 (k, v) x batch x Kv x length x Dh in the compute dtype."""
    return (config.num_layers * 2 * batch * config.num_kv_heads * length * config.head_dim
            * itemsize(config.dtype))


# ----------------------------------------------------------------------------- FLOPs


def layer_matmul_params(config: ModelConfig) -> int:
    """P: multiply-adds per token of one layer's projections."""
    d, f, h, kv, dh = (config.hidden_size, config.intermediate_size, config.num_heads, config.num_kv_heads,
                       config.head_dim)
    return d * (h + 2 * kv) * dh + h * dh * d + 3 * d * f


def layers_flops(config: ModelConfig, tokens: int, keys: int) -> int:
    """Matmul FLOPs of the decoder layers over `tokens` queries reading `keys` cache positions."""
    per_token = 2 * config.num_layers * layer_matmul_params(config)
    per_token += 4 * config.num_layers * config.num_heads * config.head_dim * keys
    return tokens * per_token


def qkv_flops(config: ModelConfig, tokens: int) -> int:
    """Matmul FLOPs of one layer's q/k/v projection over `tokens` tokens."""
    return tokens * 2 * config.hidden_size * (config.num_heads + 2 * config.num_kv_heads) * config.head_dim


def prefill_layers_flops(config: ModelConfig, prompts: int, prompt_tokens: int, keys: int) -> int:
    """Matmul FLOPs of the decoder layers in a prefill of `prompts` prompts: every layer but the
    last over all their tokens; the last one's q/k/v projection over all tokens and the rest
    (attention, output projection, MLP) over each prompt's last position."""
    tokens, one_layer = prompts * prompt_tokens, config.replace(num_layers=1)
    last_layer = qkv_flops(config, tokens) + layers_flops(one_layer, prompts, keys) - qkv_flops(config, prompts)
    return (config.num_layers - 1) * layers_flops(one_layer, tokens, keys) + last_layer


def prefill_flops(config: ModelConfig, prompts: int, prompt_tokens: int, keys: int) -> int:
    """A prefill's matmul FLOPs: its layers and the rotary tables of all its tokens (no logits)."""
    return prefill_layers_flops(config, prompts, prompt_tokens, keys) + rotary_flops(config, prompts * prompt_tokens)


def rotary_flops(config: ModelConfig, tokens: int) -> int:
    return tokens * 2 * config.head_dim ** 2


def logits_flops(config: ModelConfig, rows: int) -> int:
    return rows * 2 * config.hidden_size * config.vocab_size


def forward_flops(config: ModelConfig, tokens: int, keys: int, logit_rows: int) -> int:
    return layers_flops(config, tokens, keys) + rotary_flops(config, tokens) + logits_flops(config, logit_rows)


def sampling_flops(shape: RunShape) -> int:
    """One `sample` call of one candidate (N rows, T new tokens)."""
    config, n, tp, t = shape.model, shape.rollouts, shape.prompt_tokens, shape.new_tokens
    cache = tp + t
    prefill = prefill_flops(config, n // shape.prefill_group, tp, cache) + logits_flops(config, n)
    decode = (t - 1) * forward_flops(config, n, cache, n)
    return prefill + decode


def teacher_forced_flops(config: ModelConfig, rows: int, group: int, prompt_tokens: int, new_tokens: int) -> int:
    """One `sequence_logprobs` forward over `rows` rows whose prompts repeat in groups of `group`."""
    keys = prompt_tokens + new_tokens - 1
    prefill = prefill_flops(config, rows // group, prompt_tokens, keys)
    return prefill + forward_flops(config, rows * (new_tokens - 1), keys, rows * new_tokens)


def update_step_flops(shape: RunShape) -> int:
    """One optimizer step (forward + backward) on N/M rows of one candidate."""
    config = shape.model
    rows = shape.update_rows // shape.minibatches
    group = shape.update_group
    tp, t = shape.prompt_tokens, shape.new_tokens
    forward = teacher_forced_flops(config, rows, group, tp, t)
    tokens = rows // group * tp + rows * (t - 1)
    total = 3 * forward - 2 * rotary_flops(config, tokens)
    if config.remat:  # the backward recomputes each layer but its down projection, whose output it never reads
        keys, prompts = tp + t - 1, rows // group
        total += prefill_layers_flops(config, prompts, tp, keys) + layers_flops(config, rows * (t - 1), keys)
        mlp_tokens = (config.num_layers - 1) * prompts * tp + prompts + config.num_layers * rows * (t - 1)
        total -= 2 * config.hidden_size * config.intermediate_size * mlp_tokens
    if chunk_positions(rows, t, config.vocab_size) < t:  # the backward recomputes each chunk's logits
        total += logits_flops(config, rows * t)
    return total


def step_flops(shape: RunShape) -> dict[str, int]:
    """FLOPs of one inner-loop step over all K candidates: sampling, reference forward,
    E*M optimizer steps, and their total."""
    k = shape.num_candidates
    sampling = k * shape.turns * sampling_flops(shape)
    reference = k * teacher_forced_flops(shape.model, shape.update_rows, shape.prefill_group, shape.prompt_tokens,
                                         shape.new_tokens) if shape.reference else 0
    update = k * shape.epochs * shape.minibatches * update_step_flops(shape)
    return {"sampling": sampling, "reference": reference, "update": update,
            "total": sampling + reference + update}


# ----------------------------------------------------------------------------- per device


def padded_candidates(shape: RunShape) -> int:
    """K rounded up to a multiple of the 'cand' axis (the evaluator pads with copies)."""
    cand = shape.mesh[0]
    return -(-shape.num_candidates // cand) * cand


def _update_rows_per_device(shape: RunShape) -> int:
    return max(shape.update_rows // shape.minibatches // shape.mesh[1], 1)


def layer_buffers_bytes(config: ModelConfig, rows: int, queries: int, keys: int, model: int = 1) -> int:
    """One decoder layer's activations over `rows` rows of `queries` positions reading `keys`
    positions on one device: q/k/v, the attention output, the MLP's gate, up, activated gate
    and product, and two hidden-size buffers (norm, residual) in the compute dtype, and the f32
    attention scores and probabilities [rows, H, queries, keys] (widths and heads split over
    'model' when it divides them; the hidden-size buffers are not split)."""
    width = (2 * config.num_heads + 2 * config.num_kv_heads) * config.head_dim + 4 * config.intermediate_size
    heads = config.num_heads // model if config.num_heads % model == 0 else config.num_heads
    per_query = (width // model + 2 * config.hidden_size) * itemsize(config.dtype)
    return rows * queries * per_query + 2 * rows * heads * queries * keys * 4


def activation_bytes_estimate(shape: RunShape) -> int:
    """A per-candidate, per-device estimate of the update's live layer activations (logits
    apart, `logits_bytes_estimate`): every layer's saved input, plus without remat all of its
    buffers (`layer_buffers_bytes`), with remat those of the one layer the backward recomputes
    at a time. The compiler's figure (`derl_jax.plan.compiled`) replaces it where available."""
    config = shape.model
    rows, length = _update_rows_per_device(shape), shape.prompt_tokens + shape.new_tokens
    saved = config.num_layers * rows * length * config.hidden_size * itemsize(config.dtype)
    buffers = layer_buffers_bytes(config, rows, length, length, shape.mesh[2])
    return saved + (buffers if config.remat else config.num_layers * buffers)


# Bytes per [rows, T, V] element the update keeps live for its logits: the f32 logits and
# their gradient plus part of a third buffer; ours, measured from XLA's memory analysis of the
# compiled update on CPU (2.1 to 2.5 f32 copies for f32 and bf16 compute, docs/scale.md).
LOGITS_BYTES_PER_ELEMENT = 9


def logits_bytes_estimate(shape: RunShape) -> int:
    """Per candidate and device: the update's logits over the whole vocabulary for the completion
    positions of a minibatch that are live at once (`sequence_logprobs` computes f32 [rows, T, V]
    in chunks of `derl_jax.models.logits.chunk_positions` positions of the minibatch's global
    shape, and the backward recomputes one chunk and its gradient at a time;
    `LOGITS_BYTES_PER_ELEMENT`; the vocabulary splits over 'model' when it divides it)."""
    config, model = shape.model, shape.mesh[2]
    ways = model if config.vocab_size % model == 0 else 1
    live = chunk_positions(shape.update_rows // shape.minibatches, shape.new_tokens, config.vocab_size)
    elements = _update_rows_per_device(shape) * live * config.vocab_size
    return LOGITS_BYTES_PER_ELEMENT * elements // ways


# `sample` draws its Gumbel noise f32[T, N, V] in one call while it has at most
# PREDRAWN_NOISE_MAX_ELEMENTS elements, else one [N, V] per step; drawing keeps about 4 such f32
# buffers live (ours, from XLA's memory analysis of the compiled sampler on CPU).
NOISE_BYTES_PER_ELEMENT = 16


def sampling_temp_bytes(shape: RunShape) -> int:
    """Per candidate and device, besides the KV cache: `sample`'s Gumbel noise (live through the
    decode) and the larger of the largest layer of its prefill (the distinct prompts, each reading
    the whole cache) and the decode's copy of the cache's first slots (`decode_phases`: a phase
    that reads fewer slots than the cache holds carries a copy of them)."""
    config, data, model = shape.model, shape.mesh[1], shape.mesh[2]
    rows = -(-shape.rollouts // data)
    draws = rows * config.vocab_size
    if shape.new_tokens * draws <= PREDRAWN_NOISE_MAX_ELEMENTS:
        draws *= shape.new_tokens
    prompts = max(rows // shape.prefill_group, 1)
    length = shape.prompt_tokens + shape.new_tokens
    prefill = layer_buffers_bytes(config, prompts, shape.prompt_tokens, length, model)
    heads_split = model if config.num_kv_heads % model == 0 else 1
    prefix_slots = max([slots for _, _, slots in decode_phases(shape.prompt_tokens, shape.new_tokens, length)
                        if slots < length], default=0)
    prefix = kv_cache_bytes(config, rows, prefix_slots) // heads_split
    return NOISE_BYTES_PER_ELEMENT * draws + max(prefill, prefix)


def meta_bytes(shape: RunShape) -> int:
    """The Meta-Optimizer's bytes per device while a search runs (0 without one): its
    parameters, the frozen reference copy (a separate buffer from its first update on) and its
    AdamW state, placed over the run's mesh with the 'model' split."""
    if shape.meta is None:
        return 0
    model = shape.mesh[2]
    return 2 * param_bytes(shape.meta, model) + optimizer_bytes(shape.meta, "adamw", model)


def trained_copies(shape: RunShape) -> int:
    """Trained policies a device holds at the step's peak: the K/cand outputs of the device
    loop (`train_many` returns every candidate's parameters), or only the candidates in flight
    in the host loop (each wave's policies leave the devices before the next starts)."""
    cand = shape.mesh[0]
    in_flight = max(min(shape.in_flight, padded_candidates(shape)) // cand, 1)
    return in_flight if shape.host_loop else padded_candidates(shape) // cand


def per_device(shape: RunShape) -> dict[str, int]:
    """Bytes per device of one inner-loop step, by kind.

    params: the shared starting policy plus the trained copies (`trained_copies`);
    optimizer: the state of the candidates in flight on the device; gradients: one
    parameter-shaped buffer per candidate in flight; kv_cache: the sampling
    cache of those candidates (rows split over 'data', key/value heads over 'model' when it
    divides them); sampling: `sampling_temp_bytes`, activations and logits:
    `activation_bytes_estimate` and `logits_bytes_estimate`, all for those candidates;
    meta: `meta_bytes`.
    """
    config = shape.model
    cand, data, model = shape.mesh
    in_flight = max(min(shape.in_flight, padded_candidates(shape)) // cand, 1)
    one_policy = param_bytes(config, model)
    heads_split = model if config.num_kv_heads % model == 0 else 1
    kv = kv_cache_bytes(config, -(-shape.rollouts // data), shape.prompt_tokens + shape.new_tokens) // heads_split
    return {
        "params": one_policy * (1 + trained_copies(shape)),
        "optimizer": optimizer_bytes(config, shape.optimizer, model) * in_flight,
        "gradients": one_policy * in_flight,
        "kv_cache": kv * in_flight,
        "sampling": sampling_temp_bytes(shape) * in_flight,
        "activations": activation_bytes_estimate(shape) * in_flight,
        "logits": logits_bytes_estimate(shape) * in_flight,
        "meta": meta_bytes(shape),
    }


def per_device_flops(shape: RunShape) -> dict[str, int]:
    """Step FLOPs per device and piece, assuming the mesh divides the work evenly (K padded)."""
    scale = padded_candidates(shape) / shape.num_candidates / shape.num_devices
    return {name: int(value * scale) for name, value in step_flops(shape).items()}


def peak_bytes_estimate(shape: RunShape) -> int:
    """Analytic peak per device: parameters, optimizer state and the Meta-Optimizer, plus the
    larger of sampling's KV cache and temporaries and the update's gradients, activations and
    logits."""
    sizes = per_device(shape)
    resident = sizes["params"] + sizes["optimizer"] + sizes["meta"]
    update = sizes["gradients"] + sizes["activations"] + sizes["logits"]
    return resident + max(sizes["kv_cache"] + sizes["sampling"], update)


def hbm_bytes_estimate(shape: RunShape) -> dict[str, int]:
    """Bytes one device moves from HBM in one step, per piece (for the roofline): every
    decode step reads the local weights and KV cache; every optimizer step reads the weights
    3 times (forward, recompute or backward, update), reads and writes the optimizer state,
    and writes and reads the activations once."""
    sizes = per_device(shape)
    cand, data, model = shape.mesh
    in_flight = max(min(shape.in_flight, padded_candidates(shape)) // cand, 1)
    rounds = padded_candidates(shape) // cand // in_flight
    weights = param_bytes(shape.model, model) * in_flight
    sampling = shape.turns * shape.new_tokens * (weights + sizes["kv_cache"])
    steps = shape.epochs * shape.minibatches
    moved = sizes["activations"] + sizes["logits"]
    update = steps * (3 * weights + 2 * sizes["optimizer"] + 2 * moved)
    reference = weights + moved if shape.reference else 0
    return {"sampling": rounds * sampling, "reference": rounds * reference, "update": rounds * update}
