"""The evaluator of device rollout kinds ("device", "env"): K candidates through the jitted loop.

Batched dispatch pads K up to a multiple of the chunk size and of the 'cand' axis with
copies (dropped afterwards), places the inputs on the mesh and reuses one compiled function
per padded K. Loop dispatch calls the compiled single-policy `train` once per candidate
(asynchronously): one compilation for every K, and on a CPU host it is as fast as one
batched call or faster (benchmarks/bench_inner.py), so "auto" picks it there.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from derl_jax.domains.base import Domain, TokenDataset
from derl_jax.rl.evaluator import CandidateResults
from derl_jax.expr.program import Program
from derl_jax.models.transformer import param_partition_specs
from derl_jax.parallel import CAND_AXIS, gather_to_host, put_global
from derl_jax.rl.config import InnerConfig
from derl_jax.rl.loop import InnerLoop, make_inner_loop
from derl_jax.rl.placement import leading_size, padded_count, params_candidate_axis, take_rows

DISPATCH_MODES = ("batched", "loop")


class DeviceEvaluator:
    """The inner loop as the outer loop uses it (`derl_jax.rl.evaluator.CandidateEvaluator`).

    evaluate_candidates(programs Program[K], init_params, key, train_set, val_set)
        -> CandidateResults(scores np.f32[K], curves name -> np.f32[K, S], params [K, ...])
    train_final(program, init_params, key, train_set, *, steps=None) -> (params, curves name -> np.f32[S_final])
    accuracy(params, dataset) -> float

    Candidate k trains with `candidate_keys(key, K)[k]`: `key` itself under
    `cfg.common_random_numbers`, else `jax.random.split(key, K)[k]`. K is padded with copies up to a
    multiple of the chunk size and of the mesh's 'cand' axis; jitted functions are made once
    per (loop, params structure) and compile once per padded K (see `cache_sizes`).
    """

    def __init__(self, domain: Domain, graphdef: nnx.GraphDef, cfg: InnerConfig, *,
                 mesh: Mesh | None = None, dispatch: str = "batched",
                 compiler_options: Mapping[str, Any] | None = None):
        """`train_final` runs cfg.final_steps steps.
        dispatch: "batched" — all K candidates in one compiled `train_many` call (vmapped or
          chunked, sharded over 'cand'); "loop" — one compiled `train` per candidate, the K
          calls dispatched asynchronously (one compilation for every K; on a CPU the
          concurrent calls use several cores, which one batched call does not).
        compiler_options: XLA options for every compiled function (e.g. a lower optimisation
          level on CPU, which trades run time for compile time)."""
        if dispatch not in DISPATCH_MODES:
            raise ValueError(f"DeviceEvaluator: dispatch must be one of {DISPATCH_MODES}, got {dispatch!r}")
        if mesh is not None and cfg.chunk_size and cfg.chunk_size % mesh.shape[CAND_AXIS]:
            raise ValueError(
                f"DeviceEvaluator: chunk_size={cfg.chunk_size} must be a multiple of the 'cand' mesh axis "
                f"size {mesh.shape[CAND_AXIS]} (each chunk's candidates are spread over that axis)")
        self.domain, self.graphdef, self.cfg, self.mesh, self.dispatch = domain, graphdef, cfg, mesh, dispatch
        self.compiler_options = dict(compiler_options or {})
        self.search_loop = make_inner_loop(domain, graphdef, cfg, mesh)
        final_steps = cfg.final_steps
        self.final_loop = (self.search_loop if final_steps == cfg.steps
                           else make_inner_loop(domain, graphdef, cfg.replace(steps=final_steps), mesh))
        self._loops: dict[int, InnerLoop] = {}
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
        return put_global(tree, jax.tree_util.tree_map(
            self._sharding, specs, is_leaf=lambda x: isinstance(x, PartitionSpec)))

    def _place_candidates(self, tree: Any) -> Any:
        if self.mesh is None:
            return tree
        return put_global(tree, self._sharding(PartitionSpec(CAND_AXIS)))

    def _place_replicated(self, tree: Any) -> Any:
        if self.mesh is None:
            return tree
        return put_global(tree, self._sharding(PartitionSpec()))

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
        return np.asarray(gather_to_host(accuracy_many(params, self._place_replicated(dataset))), np.float32)

    def candidate_keys(self, key, count: int) -> jax.Array:
        """The training key of each of `count` candidates: a key array [count] (typed key) or
        u32[count, 2] (raw key)."""
        if self.cfg.common_random_numbers:
            return jnp.broadcast_to(key, (count, *jnp.shape(key)))  # typed f[] or raw u32[2] keys
        return jax.random.split(key, count)

    # ------------------------------------------------------------------ the contract

    def loop_for(self, steps: int | None) -> InnerLoop:
        """The compiled-once loop of a run of `steps` steps (None: cfg.steps; u spans those steps)."""
        steps = self.cfg.steps if steps is None else int(steps)
        if steps == self.search_loop.cfg.steps:
            return self.search_loop
        if steps == self.final_loop.cfg.steps:
            return self.final_loop
        if steps not in self._loops:
            self._loops[steps] = make_inner_loop(self.domain, self.graphdef, self.cfg.replace(steps=steps), self.mesh)
        return self._loops[steps]

    def evaluate_candidates(self, programs: Program, init_params: Any, key, train_set: TokenDataset,
                            val_set: TokenDataset, *, steps: int | None = None) -> CandidateResults:
        """Train one policy per program from `init_params` on `train_set` for `steps` steps
        (default cfg.steps); greedy pass@1 on `val_set`."""
        loop = self.loop_for(steps)
        if self.dispatch == "loop":
            return self._evaluate_one_by_one(loop, programs, init_params, key, train_set, val_set)
        params, metrics, count = self.train_candidates(loop, programs, init_params, key, train_set)
        scores = self._accuracy_many(loop, params, val_set)[:count]
        curves = {name: values[:count] for name, values in gather_to_host(dict(metrics)).items()}
        if leading_size(params, "evaluate_candidates") != count:  # drop the padding copies
            params = take_rows(params, np.arange(count))
        return CandidateResults(scores=scores, curves=curves, params=params)

    def _evaluate_one_by_one(self, loop: InnerLoop, programs: Program, init_params: Any, key,
                             train_set: TokenDataset, val_set: TokenDataset) -> CandidateResults:
        """`evaluate_candidates` with one `train` and one `accuracy` call per candidate."""
        ops = np.asarray(programs.ops)
        if ops.ndim != 2 or ops.shape[0] < 1:
            raise ValueError(
                f"evaluate_candidates: programs must be a stacked Program[K] with K >= 1, got ops shape {ops.shape}")
        keys = self.candidate_keys(key, ops.shape[0])
        # every call is dispatched before any result is read, so the calls overlap
        trained = [self._train_one(loop, take_rows(programs, k), init_params, keys[k], train_set)
                   for k in range(ops.shape[0])]
        scores = [self._accuracy_one(params, val_set) for params, _ in trained]
        stacked = jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *[params for params, _ in trained])
        curves = {name: np.stack([np.asarray(metrics[name]) for _, metrics in trained])
                  for name in loop.metric_names}
        return CandidateResults(scores=np.asarray(scores, np.float32), curves=curves, params=stacked)

    def _train_one(self, loop: InnerLoop, program: Program, init_params: Any, key, train_set: TokenDataset):
        """(params, metrics name -> [S]) of one jitted `loop.train` call, left on the device."""
        if np.ndim(program.ops) != 1:
            raise ValueError(
                f"DeviceEvaluator: program must be one unstacked Program, got ops shape {np.shape(program.ops)}")
        if params_candidate_axis(self.graphdef, init_params) is not None:
            raise ValueError("DeviceEvaluator: init_params must be one policy (shared by every candidate), not a stack")
        specs = self._policy_specs(init_params)
        train = self._jit("train", loop, loop.train, init_params,
                          lambda p: (specs, {name: PartitionSpec() for name in loop.metric_names}))
        program = Program(ops=jnp.asarray(program.ops), args=jnp.asarray(program.args), size=jnp.asarray(program.size))
        return train(self._place(init_params, specs), self._place_replicated(program), self._place_replicated(key),
                     self._place_replicated(train_set))

    def _accuracy_one(self, params: Any, dataset: TokenDataset) -> jax.Array:
        accuracy = self._jit("accuracy", self.search_loop, self.search_loop.accuracy, params, lambda p: PartitionSpec())
        return accuracy(self._place(params, self._policy_specs(params)), self._place_replicated(dataset))

    def train_final(self, program: Program, init_params: Any, key, train_set: TokenDataset, *,
                    steps: int | None = None) -> tuple[Any, dict]:
        """A fresh policy trained with one program for `steps` (None: the final-mode steps,
        cfg.final_steps) -> (params, curves [S]).

        Runs the unbatched `train` with `key` itself, so it equals candidate k of
        `evaluate_candidates` when given `candidate_keys(key, K)[k]` (and equal steps).
        """
        loop = self.final_loop if steps is None else self.loop_for(steps)
        params, metrics = self._train_one(loop, program, init_params, key, train_set)
        return params, {name: np.asarray(values) for name, values in metrics.items()}

    def with_dispatch(self, dispatch: str) -> "DeviceEvaluator":
        """This evaluator with another dispatch mode, sharing its loops and compiled functions."""
        if dispatch not in DISPATCH_MODES:
            raise ValueError(
                f"DeviceEvaluator.with_dispatch: dispatch must be one of {DISPATCH_MODES}, got {dispatch!r}")
        other = copy.copy(self)
        other.dispatch = dispatch
        return other

    def cache_sizes(self) -> dict[str, int]:
        """How many executables each jitted function holds ("train_many": one per padded K, ...)."""
        sizes: dict[str, int] = {}
        for (name, _, _), fn in self._jitted.items():
            sizes[name] = sizes.get(name, 0) + fn._cache_size()
        return sizes

    def item_scores(self, params: Any, dataset: TokenDataset) -> np.ndarray:
        """f32[N]: each example's greedy success under one policy (their mean is `accuracy`)."""
        if params_candidate_axis(self.graphdef, params) is not None:
            raise ValueError("item_scores: params must be one policy")
        scores = self._jit("item_scores", self.search_loop, self.search_loop.item_scores, params,
                           lambda p: PartitionSpec())
        placed = self._place(params, self._policy_specs(params))
        return np.asarray(gather_to_host(scores(placed, self._place_replicated(dataset))), np.float32)

    def accuracy(self, params: Any, dataset: TokenDataset) -> float:
        """Greedy pass@1 of one policy on `dataset`."""
        if params_candidate_axis(self.graphdef, params) is not None:
            raise ValueError("accuracy: params must be one policy; use InnerLoop.accuracy_many for a stack")
        return float(self._accuracy_one(params, dataset))
