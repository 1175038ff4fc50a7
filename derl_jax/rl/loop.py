"""The DERL inner loop: K policies trained by GRPO under K reward programs in one compiled call.

    loop = make_inner_loop(domain, graphdef, InnerConfig(...))
    params, metrics = loop.train(params, program, key, dataset)            # one policy
    params, metrics = loop.train_many(params, programs, keys, dataset)     # K policies
    scores = loop.accuracy_many(params, val_set)                           # f32[K]

`train` is a pure function whose whole run is ONE `lax.scan` over steps. Step s:

    pick B prompts (from fold_in(key, s)) -> repeat each G times (rows [b*G, (b+1)*G) share
    prompt b, run through the model once per group) -> sample completions at `temperature`
    with the KV cache -> primitive values
    f32[B*G, P] -> reward = evaluate(program, prims, u = s / steps) -> NaN/inf rewards set to 0
    and counted -> group advantages -> reference log-probs under the frozen initial policy
    (for the KL penalty or the KL metric) -> `grpo_update` (epochs x minibatches optimizer
    steps; the importance ratio's old log-probs are the sampler's, at `temperature`).

Reward expressions are data (`Program` arrays), so `train_many` — `jax.vmap` of `train` over
the stacked programs and keys, the policy shared (one initial policy for every candidate)
or stacked [K, ...] — compiles once for any set of K expressions. With `chunk_size = c > 0`
it runs K/c chunks one after another (`lax.map` over chunks, c candidates vmapped inside),
trading parallelism for memory; candidate k sits in chunk k % (K/c), so a `cand`-sharded
axis stays sharded inside every chunk.

Sharding: with a mesh (axes 'cand', 'data', 'model', see `derl_jax.parallel`) the candidate
axis runs over 'cand' (the vmap is told `spmd_axis_name='cand'`) and every batch of prompts
and rollouts inside a policy's loop is constrained to 'data'.

`InnerEvaluator` is what the outer loop calls (`derl_jax.evaluator.CandidateEvaluator`).
Batched dispatch pads K up to a multiple of the chunk size and of the 'cand' axis with
copies (dropped afterwards), places the inputs on the mesh and reuses one compiled function
per padded K. Loop dispatch calls the compiled single-policy `train` once per candidate
(asynchronously): one compilation for every K, and on a CPU host it is as fast as one
batched call or faster (benchmarks/bench_inner.py), so `make_evaluator` picks it there.

Validation metric: greedy pass@1, the domain's success primitive on greedy completions.

Shapes: K candidates, M examples in a split, B prompts per step, G group size, N = B*G
rollouts, Tp prompt tokens, T = max_new_tokens, P primitives, S steps.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from derl_jax.domains.base import TokenDataset, TokenDomain
from derl_jax.expr.program import Program
from derl_jax.expr.vm import evaluate
from derl_jax.evaluator import CandidateResults
from derl_jax.models.sampling import sample, sequence_logprobs
from derl_jax.models.transformer import abstract_model, config_of, param_partition_specs
from derl_jax.parallel import CAND_AXIS, DATA_AXIS, make_mesh
from derl_jax.rl import sft
from derl_jax.rl.grpo import GRPOConfig, group_advantages, grpo_update, make_optimizer, sanitize_rewards

BASE_POLICY_DIR = "base_policy"
DISPATCH_MODES = ("batched", "loop")
_GREEDY_KEY_SEED = 0  # greedy decoding ignores the key; sample() still takes one


# ----------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True)
class InnerConfig:
    """Hyper-parameters of one inner GRPO run (mirrors `config.inner`).

    steps: S GRPO steps; prompts_per_step: B; group_size: G (copied into `grpo.group_size`).
    max_new_tokens: T; temperature, top_k: how rollouts are sampled (top_k 0 = all tokens).
    grpo: learning rate, KL weight and kind, epochs, minibatches, clip range, advantage
      normalisation, loss aggregation, gradient clip.
    chunk_size: candidates trained together per chunk (0 = all K vmapped at once).
    eval_batch_size: prompts per greedy-evaluation batch.
    kl_metric: with grpo.kl_coef == 0, still compute the reference policy's log-probs to
      report the KL to it (one extra forward pass per step); without it the metrics have no
      "kl" entry. With kl_coef > 0 the reference log-probs are always computed.
    common_random_numbers: `InnerEvaluator.evaluate_candidates` trains every candidate of a
      call with the same key (the same prompt order and sampling noise), so their validation
      scores differ by their rewards, not by luck; when False candidate k gets
      `jax.random.split(key, K)[k]`.
    """

    steps: int
    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    grpo: GRPOConfig = dataclasses.field(default_factory=GRPOConfig)
    chunk_size: int = 0
    eval_batch_size: int = 64
    kl_metric: bool = True
    common_random_numbers: bool = True

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"InnerConfig.{name}={getattr(self, name)!r}: {why}")

        for name in ("steps", "prompts_per_step", "group_size", "max_new_tokens", "eval_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                bad(name, "must be an int >= 1")
        for name in ("top_k", "chunk_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                bad(name, "must be an int >= 0")
        if not self.temperature > 0:
            bad("temperature", "must be > 0")
        if not isinstance(self.grpo, GRPOConfig):
            bad("grpo", "must be a GRPOConfig")
        object.__setattr__(self, "grpo", dataclasses.replace(self.grpo, group_size=int(self.group_size)))
        rollouts = self.prompts_per_step * self.group_size
        if rollouts % self.grpo.minibatches:
            bad("grpo", f"minibatches={self.grpo.minibatches} must divide the {rollouts} rollouts per step")

    @property
    def uses_reference(self) -> bool:
        """Whether each step computes the reference policy's log-probs."""
        return self.grpo.kl_coef > 0 or self.kl_metric

    @property
    def rollouts_per_step(self) -> int:
        """N = B * G."""
        return self.prompts_per_step * self.group_size

    def replace(self, **changes) -> "InnerConfig":
        return dataclasses.replace(self, **changes)


def _block_value(block: Any, name: str, default: Any = dataclasses.MISSING) -> Any:
    if isinstance(block, Mapping) or hasattr(block, "get"):
        if name in block:
            return block[name]
    elif hasattr(block, name):
        return getattr(block, name)
    if default is dataclasses.MISSING:
        raise ValueError(f"inner_config_from_run: config.inner has no field {name!r}")
    return default


def inner_config_from_run(cfg: Any, domain: TokenDomain, *, steps: int | None = None) -> InnerConfig:
    """InnerConfig from a run config's `inner` block (see configs/arith.py).

    Required: steps, prompts_per_step, group_size, lr, kl, chunk_size, temperature.
    Optional (defaults in brackets): top_k [0], eval_batch_size [64], kl_metric [True],
    epochs [1], minibatches [1], kl_kind ["k3"], eps [0.2], normalize_std [True], loss_agg
    ["token_mean"], max_grad_norm [1.0], common_random_numbers [True]. T comes from the domain; `steps` overrides the
    block's (final training uses `config.final.steps`).
    """
    block = cfg["inner"] if isinstance(cfg, Mapping) or hasattr(cfg, "get") else cfg.inner
    eps = float(_block_value(block, "eps", 0.2))
    max_grad_norm = _block_value(block, "max_grad_norm", 1.0)
    grpo = GRPOConfig(
        learning_rate=float(_block_value(block, "lr")),
        kl_coef=float(_block_value(block, "kl")),
        kl_kind=str(_block_value(block, "kl_kind", "k3")),
        epochs=int(_block_value(block, "epochs", 1)),
        minibatches=int(_block_value(block, "minibatches", 1)),
        eps_low=eps,
        eps_high=eps,
        normalize_std=bool(_block_value(block, "normalize_std", True)),
        loss_agg=str(_block_value(block, "loss_agg", "token_mean")),
        max_grad_norm=None if max_grad_norm is None else float(max_grad_norm),
    )
    return InnerConfig(
        steps=int(_block_value(block, "steps") if steps is None else steps),
        prompts_per_step=int(_block_value(block, "prompts_per_step")),
        group_size=int(_block_value(block, "group_size")),
        max_new_tokens=int(domain.max_new_tokens),
        temperature=float(_block_value(block, "temperature")),
        top_k=int(_block_value(block, "top_k", 0)),
        grpo=grpo,
        chunk_size=int(_block_value(block, "chunk_size")),
        eval_batch_size=int(_block_value(block, "eval_batch_size", 64)),
        kl_metric=bool(_block_value(block, "kl_metric", True)),
        common_random_numbers=bool(_block_value(block, "common_random_numbers", True)),
    )


# ----------------------------------------------------------------------------- helpers


def params_candidate_axis(graphdef: nnx.GraphDef, params: Any) -> int | None:
    """0 when every leaf of `params` carries a leading candidate axis K, None when `params`
    is one policy (leaf shapes as the model's); anything else is an error."""
    _, template = abstract_model(config_of(graphdef, params))
    got = [np.ndim(leaf) for leaf in jax.tree_util.tree_leaves(params)]
    want = [len(leaf.shape) for leaf in jax.tree_util.tree_leaves(template)]
    if got == want:
        return None
    if len(got) == len(want) and all(g == w + 1 for g, w in zip(got, want)):
        return 0
    raise ValueError(
        f"params leaves have ranks {got}; one policy has ranks {want}, a stack of policies one more each")


def _leading_size(tree: Any, where: str) -> int:
    sizes = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in jax.tree_util.tree_leaves(tree)}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(f"{where}: leaves must share one leading candidate axis, got leading sizes {sizes}")
    return sizes.pop()


def map_candidates(fn: Callable, in_axes: tuple, chunk_size: int, spmd_axis_name: str | None) -> Callable:
    """`jax.vmap(fn, in_axes)` over a candidate axis, or in chunks of `chunk_size`.

    Chunked: K (a multiple of chunk_size) becomes K / chunk_size sequential chunks
    (`lax.map`), each vmapping chunk_size candidates; candidate k goes to chunk
    k % (K / chunk_size), position k // (K / chunk_size), so a 'cand'-sharded K axis maps
    onto the within-chunk axis. Results come back in the original order.
    """
    vmapped = jax.vmap(fn, in_axes=in_axes, spmd_axis_name=spmd_axis_name)
    if not chunk_size:
        return vmapped

    def chunked(*args):
        mapped = [i for i, axis in enumerate(in_axes) if axis == 0]
        num = _leading_size([args[i] for i in mapped], "map_candidates")
        if num % chunk_size:
            raise ValueError(f"map_candidates: {num} candidates do not split into chunks of chunk_size={chunk_size}")
        chunks = num // chunk_size

        def to_chunks(x):
            return jnp.swapaxes(x.reshape(chunk_size, chunks, *x.shape[1:]), 0, 1)

        def from_chunks(y):
            return jnp.swapaxes(y, 0, 1).reshape(num, *y.shape[2:])

        def one_chunk(chunk_args):
            full = list(args)
            for i, value in zip(mapped, chunk_args):
                full[i] = value
            return vmapped(*full)

        chunked_args = tuple(jax.tree_util.tree_map(to_chunks, args[i]) for i in mapped)
        return jax.tree_util.tree_map(from_chunks, jax.lax.map(one_chunk, chunked_args))

    return chunked


def _repeat_rows(tree: Any, times: int) -> Any:
    """Every row repeated `times` times, copies adjacent: [M, ...] -> [M*times, ...]."""
    return jax.tree_util.tree_map(lambda x: jnp.repeat(x, times, axis=0), tree)


# ----------------------------------------------------------------------------- the loop


@dataclasses.dataclass(frozen=True)
class InnerLoop:
    """Pure functions of one inner-loop setup (jit them; see the module docstring).

    train(params, program, key, dataset) -> (params, metrics name -> [S])
    train_many(params [K,...] or shared, programs Program[K], keys [K], dataset)
        -> (params [K, ...], metrics name -> [K, S])
    accuracy(params, dataset) -> f32[]           greedy pass@1
    accuracy_many(params [K, ...], dataset) -> f32[K]
    metric_names: the keys of `metrics`.

    When `train_many` continues a stack of policies, jit it with `donate_argnums=0`: the
    stack is replaced by its trained version.
    """

    cfg: InnerConfig
    train: Callable
    train_many: Callable
    accuracy: Callable
    accuracy_many: Callable
    metric_names: tuple[str, ...]


def metric_names(domain: TokenDomain, cfg: InnerConfig) -> tuple[str, ...]:
    """Per-step metrics of `train`: mean (sanitized) reward, each primitive's mean, the
    number of non-finite rewards, GRPO statistics (KL to the reference when computed) and
    the mean response length."""
    kl = ("kl",) if cfg.uses_reference else ()
    return ("reward_mean", *(f"primitive/{name}" for name in domain.primitive_names), "nonfinite",
            *kl, "entropy", "clip_fraction", "loss", "grad_norm", "response_length")


def make_inner_loop(domain: TokenDomain, graphdef: nnx.GraphDef, cfg: InnerConfig,
                    mesh: Mesh | None = None) -> InnerLoop:
    """The inner loop of `domain`'s policy (`graphdef`) under `cfg`, optionally on `mesh`."""
    if not isinstance(cfg, InnerConfig):
        raise TypeError(f"make_inner_loop: cfg must be an InnerConfig, got {type(cfg).__name__}")
    if mesh is not None:
        data_size = mesh.shape[DATA_AXIS]
        if cfg.rollouts_per_step % data_size:
            raise ValueError(
                f"make_inner_loop: {cfg.rollouts_per_step} rollouts per step do not split over the "
                f"'data' mesh axis of size {data_size}")
    batch, group, steps = cfg.prompts_per_step, cfg.group_size, cfg.steps
    optimizer = make_optimizer(cfg.grpo)
    spmd_axis = CAND_AXIS if mesh is not None else None
    names = metric_names(domain, cfg)

    def over_data(x):
        if mesh is None:
            return x
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(DATA_AXIS)))

    def generate(params, prompts, prompt_mask, key, greedy, group_size=1):
        return sample(graphdef, params, prompts, prompt_mask, key, max_new_tokens=cfg.max_new_tokens,
                      eos_id=domain.eos_id, pad_id=domain.pad_id, temperature=cfg.temperature,
                      top_k=cfg.top_k, greedy=greedy, group_size=group_size)

    # rows [b*G, (b+1)*G) share prompt b; the update keeps that order only with one minibatch
    update_groups = group if cfg.grpo.minibatches == 1 else 1

    def completion_logprobs(params, update_batch, group_size=update_groups):
        return sequence_logprobs(graphdef, params, update_batch["prompts"], update_batch["prompt_mask"],
                                 update_batch["completions"], update_batch["mask"], cfg.temperature,
                                 group_size=group_size)

    def train(params, program: Program, key, dataset: TokenDataset):
        num_examples = dataset.size
        reference = params

        def step(carry, index):
            params, opt_state = carry
            prompt_key, sample_key, update_key = jax.random.split(jax.random.fold_in(key, index), 3)
            rows = jax.random.choice(prompt_key, num_examples, (batch,), replace=batch > num_examples)
            chosen = _repeat_rows(dataset.take(rows), group)
            prompts, prompt_mask = over_data(chosen.prompts), over_data(chosen.prompt_mask)
            context = jax.tree_util.tree_map(over_data, dict(chosen.context))
            out = generate(params, prompts, prompt_mask, sample_key, greedy=False, group_size=group)
            rollout = {"tokens": out.tokens, "mask": out.mask}
            prims = domain.primitive_values(rollout, context)
            progress = index.astype(jnp.float32) / steps
            rewards, nonfinite = sanitize_rewards(evaluate(program, prims, progress))
            advantages = group_advantages(rewards, group, normalize_std=cfg.grpo.normalize_std)
            update_batch = {"prompts": prompts, "prompt_mask": prompt_mask, "completions": out.tokens,
                            "mask": out.mask, "advantages": advantages}
            if cfg.top_k == 0:
                update_batch["old_logp"] = out.sampling_logprobs
            else:  # the top-k filtered sampling distribution is not the one the update differentiates
                update_batch["old_logp"] = completion_logprobs(params, update_batch, group)[0]
            if cfg.uses_reference:
                update_batch["ref_logp"] = completion_logprobs(reference, update_batch, group)[0]
            update_batch = jax.lax.stop_gradient(update_batch)
            params, opt_state, update = grpo_update(params, opt_state, update_batch, update_key,
                                                    completion_logprobs, optimizer, cfg.grpo)
            metrics = {"reward_mean": jnp.mean(rewards)}
            metrics.update({f"primitive/{name}": jnp.mean(prims[:, j])
                            for j, name in enumerate(domain.primitive_names)})
            metrics.update(nonfinite=nonfinite, kl=update["kl"], entropy=update["entropy"],
                           clip_fraction=update["clip_fraction"], loss=update["loss"],
                           grad_norm=update["grad_norm"],
                           response_length=jnp.mean(out.lengths.astype(jnp.float32)))
            return (params, opt_state), {name: metrics[name] for name in names}

        (params, _), metrics = jax.lax.scan(step, (params, optimizer.init(params)), jnp.arange(steps))
        return params, metrics

    def accuracy(params, dataset: TokenDataset):
        num_examples = dataset.size
        data_size = 1 if mesh is None else mesh.shape[DATA_AXIS]
        per_batch = min(cfg.eval_batch_size, num_examples)
        per_batch = -(-per_batch // data_size) * data_size
        num_batches = -(-num_examples // per_batch)
        positions = jnp.arange(num_batches * per_batch).reshape(num_batches, per_batch)
        batches = dataset.take(jnp.minimum(positions, num_examples - 1))
        greedy_key = jax.random.key(_GREEDY_KEY_SEED)

        def successes(args):
            chunk, valid = args
            out = generate(params, over_data(chunk.prompts), over_data(chunk.prompt_mask), greedy_key, greedy=True)
            context = jax.tree_util.tree_map(over_data, dict(chunk.context))
            success = domain.success({"tokens": out.tokens, "mask": out.mask}, context)
            return jnp.sum(jnp.where(valid, success, 0.0))

        total = jnp.sum(jax.lax.map(successes, (batches, positions < num_examples)))
        return total / num_examples

    def train_many(params, programs: Program, keys, dataset: TokenDataset):
        axis = params_candidate_axis(graphdef, params)
        stacked = {"programs": programs, "keys": keys} if axis is None else {"programs": programs, "keys": keys,
                                                                              "params": params}
        _leading_size(stacked, "train_many")  # one K for everything stacked
        return map_candidates(train, (axis, 0, 0, None), cfg.chunk_size, spmd_axis)(params, programs, keys, dataset)

    def accuracy_many(params, dataset: TokenDataset):
        if params_candidate_axis(graphdef, params) != 0:
            raise ValueError("accuracy_many: params must be stacked along a leading candidate axis K")
        return map_candidates(accuracy, (0, None), cfg.chunk_size, spmd_axis)(params, dataset)

    return InnerLoop(cfg=cfg, train=train, train_many=train_many, accuracy=accuracy,
                     accuracy_many=accuracy_many, metric_names=names)


# ----------------------------------------------------------------------------- evaluator


def padded_count(count: int, chunk_size: int, cand_size: int) -> int:
    """Smallest multiple of lcm(chunk_size or 1, cand_size) that is >= count."""
    unit = math.lcm(max(chunk_size, 1), cand_size)
    return -(-count // unit) * unit


def _take_rows(tree: Any, rows: np.ndarray) -> Any:
    return jax.tree_util.tree_map(lambda x: x[rows], tree)


class InnerEvaluator:
    """The inner loop as the outer loop uses it (`derl_jax.evaluator.CandidateEvaluator`).

    evaluate_candidates(programs Program[K], init_params, key, train_set, val_set)
        -> CandidateResults(scores np.f32[K], curves name -> np.f32[K, S], params [K, ...])
    train_final(program, init_params, key, train_set) -> (params, curves name -> np.f32[S_final])
    accuracy(params, dataset) -> float

    Candidate k trains with `candidate_keys(key, K)[k]`: `key` itself under
    `cfg.common_random_numbers`, else `jax.random.split(key, K)[k]`. K is padded with copies up to a
    multiple of the chunk size and of the mesh's 'cand' axis; jitted functions are made once
    per (loop, params structure) and compile once per padded K (see `cache_sizes`).
    """

    def __init__(self, domain: TokenDomain, graphdef: nnx.GraphDef, cfg: InnerConfig, *,
                 final_steps: int | None = None, mesh: Mesh | None = None, dispatch: str = "batched",
                 compiler_options: Mapping[str, Any] | None = None):
        """final_steps: steps of `train_final` (default cfg.steps).
        dispatch: "batched" — all K candidates in one compiled `train_many` call (vmapped or
          chunked, sharded over 'cand'); "loop" — one compiled `train` per candidate, the K
          calls dispatched asynchronously (one compilation for every K; on a CPU the
          concurrent calls use several cores, which one batched call does not).
        compiler_options: XLA options for every compiled function (e.g. a lower optimisation
          level on CPU, which trades run time for compile time)."""
        if dispatch not in DISPATCH_MODES:
            raise ValueError(f"InnerEvaluator: dispatch must be one of {DISPATCH_MODES}, got {dispatch!r}")
        if mesh is not None and cfg.chunk_size and cfg.chunk_size % mesh.shape[CAND_AXIS]:
            raise ValueError(
                f"InnerEvaluator: chunk_size={cfg.chunk_size} must be a multiple of the 'cand' mesh axis "
                f"size {mesh.shape[CAND_AXIS]} (each chunk's candidates are spread over that axis)")
        self.domain, self.graphdef, self.cfg, self.mesh, self.dispatch = domain, graphdef, cfg, mesh, dispatch
        self.compiler_options = dict(compiler_options or {})
        self.search_loop = make_inner_loop(domain, graphdef, cfg, mesh)
        final_steps = cfg.steps if final_steps is None else int(final_steps)
        self.final_loop = (self.search_loop if final_steps == cfg.steps
                           else make_inner_loop(domain, graphdef, cfg.replace(steps=final_steps), mesh))
        self._jitted: dict = {}

    # ------------------------------------------------------------------ placement

    @property
    def _cand_size(self) -> int:
        return 1 if self.mesh is None else int(self.mesh.shape[CAND_AXIS])

    def _sharding(self, spec: PartitionSpec) -> NamedSharding:
        return NamedSharding(self.mesh, spec)

    def _policy_specs(self, params: Any) -> Any:
        """PartitionSpec per leaf of one policy (its 'model' metadata; replicated otherwise)."""
        if isinstance(params, nnx.State):
            return param_partition_specs(params, self.mesh)
        return jax.tree_util.tree_map(lambda _: PartitionSpec(), params)

    def _place(self, tree: Any, specs: Any) -> Any:
        if self.mesh is None:
            return tree
        return jax.device_put(tree, jax.tree_util.tree_map(
            self._sharding, specs, is_leaf=lambda x: isinstance(x, PartitionSpec)))

    def _place_candidates(self, tree: Any) -> Any:
        if self.mesh is None:
            return tree
        return jax.device_put(tree, self._sharding(PartitionSpec(CAND_AXIS)))

    def _place_replicated(self, tree: Any) -> Any:
        if self.mesh is None:
            return tree
        return jax.device_put(tree, self._sharding(PartitionSpec()))

    # ------------------------------------------------------------------ compiled functions

    def _jit(self, name: str, loop: InnerLoop, fn: Callable, params: Any, out_specs: Callable[[Any], Any]):
        key = (name, id(loop), jax.tree_util.tree_structure(params))
        if key not in self._jitted:
            out_shardings = None
            if self.mesh is not None:
                out_shardings = jax.tree_util.tree_map(
                    self._sharding, out_specs(params), is_leaf=lambda x: isinstance(x, PartitionSpec))
            self._jitted[key] = jax.jit(fn, out_shardings=out_shardings,
                                        compiler_options=self.compiler_options or None)
        return self._jitted[key]

    def _stacked_specs(self, params: Any) -> Any:
        return jax.tree_util.tree_map(lambda spec: PartitionSpec(CAND_AXIS, *spec), self._policy_specs(params),
                                      is_leaf=lambda x: isinstance(x, PartitionSpec))

    def train_candidates(self, loop: InnerLoop, programs: Program, init_params: Any, key, train_set: TokenDataset):
        """(params [Kp, ...], metrics name -> [Kp, S], K): the K programs padded to Kp with
        copies and trained by `loop`, outputs left on the mesh (sharded over 'cand')."""
        ops = np.asarray(programs.ops)
        if ops.ndim != 2 or ops.shape[0] < 1:
            raise ValueError(
                f"evaluate_candidates: programs must be a stacked Program[K] with K >= 1, got ops shape {ops.shape}")
        if params_candidate_axis(self.graphdef, init_params) is not None:
            raise ValueError(
                "evaluate_candidates: init_params must be one policy (shared by every candidate), not a stack")
        count = ops.shape[0]
        padded = padded_count(count, self.cfg.chunk_size, self._cand_size)
        rows = np.arange(padded) % count
        programs = Program(ops=jnp.asarray(ops[rows]), args=jnp.asarray(np.asarray(programs.args)[rows]),
                           size=jnp.asarray(np.asarray(programs.size)[rows]))
        keys = self.candidate_keys(key, count)[rows]
        specs = self._policy_specs(init_params)
        train_many = self._jit(
            "train_many", loop, loop.train_many, init_params,
            lambda p: (self._stacked_specs(p), {name: PartitionSpec(CAND_AXIS) for name in loop.metric_names}))
        params, metrics = train_many(self._place(init_params, specs), self._place_candidates(programs),
                                     self._place_candidates(keys), self._place_replicated(train_set))
        return params, metrics, count

    def _accuracy_many(self, loop: InnerLoop, params: Any, dataset: TokenDataset) -> np.ndarray:
        accuracy_many = self._jit("accuracy_many", loop, loop.accuracy_many, params,
                                  lambda p: PartitionSpec(CAND_AXIS))
        return np.asarray(accuracy_many(params, self._place_replicated(dataset)), np.float32)

    def candidate_keys(self, key, count: int) -> jax.Array:
        """The training key of each of `count` candidates: a key array [count] (typed key) or
        u32[count, 2] (raw key)."""
        if self.cfg.common_random_numbers:
            return jnp.broadcast_to(key, (count, *jnp.shape(key)))  # typed f[] or raw u32[2] keys
        return jax.random.split(key, count)

    # ------------------------------------------------------------------ the contract

    def evaluate_candidates(self, programs: Program, init_params: Any, key, train_set: TokenDataset,
                            val_set: TokenDataset) -> CandidateResults:
        """Train one policy per program from `init_params` on `train_set`; greedy pass@1 on `val_set`."""
        if self.dispatch == "loop":
            return self._evaluate_one_by_one(programs, init_params, key, train_set, val_set)
        params, metrics, count = self.train_candidates(self.search_loop, programs, init_params, key, train_set)
        scores = self._accuracy_many(self.search_loop, params, val_set)[:count]
        curves = {name: np.asarray(values)[:count] for name, values in metrics.items()}
        if _leading_size(params, "evaluate_candidates") != count:  # drop the padding copies
            params = _take_rows(params, np.arange(count))
        return CandidateResults(scores=scores, curves=curves, params=params)

    def _evaluate_one_by_one(self, programs: Program, init_params: Any, key, train_set: TokenDataset,
                             val_set: TokenDataset) -> CandidateResults:
        """`evaluate_candidates` with one `train` and one `accuracy` call per candidate."""
        ops = np.asarray(programs.ops)
        if ops.ndim != 2 or ops.shape[0] < 1:
            raise ValueError(
                f"evaluate_candidates: programs must be a stacked Program[K] with K >= 1, got ops shape {ops.shape}")
        keys = self.candidate_keys(key, ops.shape[0])
        # every call is dispatched before any result is read, so the calls overlap
        trained = [self._train_one(self.search_loop, _take_rows(programs, k), init_params, keys[k], train_set)
                   for k in range(ops.shape[0])]
        scores = [self._accuracy_one(params, val_set) for params, _ in trained]
        stacked = jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *[params for params, _ in trained])
        curves = {name: np.stack([np.asarray(metrics[name]) for _, metrics in trained])
                  for name in self.search_loop.metric_names}
        return CandidateResults(scores=np.asarray(scores, np.float32), curves=curves, params=stacked)

    def _train_one(self, loop: InnerLoop, program: Program, init_params: Any, key, train_set: TokenDataset):
        """(params, metrics name -> [S]) of one jitted `loop.train` call, left on the device."""
        if np.ndim(program.ops) != 1:
            raise ValueError(
                f"InnerEvaluator: program must be one unstacked Program, got ops shape {np.shape(program.ops)}")
        if params_candidate_axis(self.graphdef, init_params) is not None:
            raise ValueError("InnerEvaluator: init_params must be one policy (shared by every candidate), not a stack")
        specs = self._policy_specs(init_params)
        train = self._jit("train", loop, loop.train, init_params,
                          lambda p: (specs, {name: PartitionSpec() for name in loop.metric_names}))
        program = Program(ops=jnp.asarray(program.ops), args=jnp.asarray(program.args), size=jnp.asarray(program.size))
        return train(self._place(init_params, specs), self._place_replicated(program), self._place_replicated(key),
                     self._place_replicated(train_set))

    def _accuracy_one(self, params: Any, dataset: TokenDataset) -> jax.Array:
        accuracy = self._jit("accuracy", self.search_loop, self.search_loop.accuracy, params, lambda p: PartitionSpec())
        return accuracy(self._place(params, self._policy_specs(params)), self._place_replicated(dataset))

    def train_final(self, program: Program, init_params: Any, key, train_set: TokenDataset) -> tuple[Any, dict]:
        """A fresh policy trained with one program for the final-mode steps -> (params, curves [S]).

        Runs the unbatched `train` with `key` itself, so it equals candidate k of
        `evaluate_candidates` when given `candidate_keys(key, K)[k]` (and equal steps).
        """
        params, metrics = self._train_one(self.final_loop, program, init_params, key, train_set)
        return params, {name: np.asarray(values) for name, values in metrics.items()}

    def with_dispatch(self, dispatch: str) -> "InnerEvaluator":
        """This evaluator with another dispatch mode, sharing its loops and compiled functions."""
        if dispatch not in DISPATCH_MODES:
            raise ValueError(
                f"InnerEvaluator.with_dispatch: dispatch must be one of {DISPATCH_MODES}, got {dispatch!r}")
        other = copy.copy(self)
        other.dispatch = dispatch
        return other

    def cache_sizes(self) -> dict[str, int]:
        """How many executables each jitted function holds ("train_many": one per padded K, ...)."""
        sizes: dict[str, int] = {}
        for (name, _, _), fn in self._jitted.items():
            sizes[name] = sizes.get(name, 0) + fn._cache_size()
        return sizes

    def accuracy(self, params: Any, dataset: TokenDataset) -> float:
        """Greedy pass@1 of one policy on `dataset`."""
        if params_candidate_axis(self.graphdef, params) is not None:
            raise ValueError("accuracy: params must be one policy; use InnerLoop.accuracy_many for a stack")
        return float(self._accuracy_one(params, dataset))


# ----------------------------------------------------------------------------- run-level entry points


def run_mesh(cfg: Any) -> Mesh:
    """The mesh of a run config's `mesh` block (cand, data, model; one may be -1 = fill).

    Without a -1 the mesh uses the first cand*data*model devices.
    """
    sizes = [int(cfg.mesh.cand), int(cfg.mesh.data), int(cfg.mesh.model)]
    devices = None if -1 in sizes else jax.devices()[: math.prod(sizes)]
    if devices is not None and len(devices) < math.prod(sizes):
        raise ValueError(f"config.mesh asks for {math.prod(sizes)} devices (cand*data*model = {sizes}), "
                         f"only {len(jax.devices())} exist")
    return make_mesh(*sizes, devices=devices)


def make_evaluator(domain: TokenDomain, cfg: Any, *, mesh: Mesh | None = None) -> InnerEvaluator:
    """The evaluator of a run config (`config.inner`, `config.final.steps`, `config.policy`
    for the model shape, `config.mesh` unless `mesh` is given).

    `config.inner.dispatch` (optional, default "auto"): "batched", "loop", or "auto" = "loop"
    on a single CPU device (faster there, see benchmarks/bench_inner.py, and one compilation
    for any number of candidates) and "batched" otherwise.
    """
    graphdef, _ = abstract_model(sft.policy_model_config(domain, cfg.policy))
    mesh = run_mesh(cfg) if mesh is None else mesh
    dispatch = str(_block_value(cfg.inner, "dispatch", "auto"))
    if dispatch == "auto":
        single_cpu = mesh.devices.size == 1 and mesh.devices.flat[0].platform == "cpu"
        dispatch = "loop" if single_cpu else "batched"
    return InnerEvaluator(domain, graphdef, inner_config_from_run(cfg, domain), final_steps=int(cfg.final.steps),
                          mesh=mesh, dispatch=dispatch)


def validation_rows(num_train: int, split_seed: int) -> np.ndarray:
    """Rows of the training split that the outer loop holds out for validation
    (`derl_jax.meta.protocol.split_train` applied to row numbers)."""
    from derl_jax.meta.protocol import split_train  # the protocol imports the outer loop, which sits above this module

    rows = np.arange(num_train)
    numbered = TokenDataset(prompts=rows[:, None], prompt_mask=np.ones((num_train, 1), bool), context={})
    _, validation = split_train(numbered, split_seed)
    return np.asarray(validation.prompts)[:, 0]


def base_policy(domain: TokenDomain, cfg: Any, workdir: str | os.PathLike) -> nnx.State:
    """The run's base policy parameters, cached under `<workdir>/base_policy/`.

    The supervised corpus leaves out the validation rows of `config.outer.split_seed`, so
    validation scores measure held-out accuracy; `seed` is `config.seed`.
    """
    held_out = validation_rows(domain.train.size, int(cfg.outer.split_seed))
    _, params = sft.base_policy(domain, cfg.policy, os.path.join(os.fspath(workdir), BASE_POLICY_DIR),
                                seed=int(cfg.seed), holdout_rows=held_out)
    return params
