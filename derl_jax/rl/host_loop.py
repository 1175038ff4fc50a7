"""The inner loop's driver for the "host" rollout kind: primitives of decoded text (GSM8K / MATH).

    evaluator = HostEvaluator(domain, graphdef, InnerConfig(...), mesh=mesh)
    results = evaluator.evaluate_candidates(programs, init_params, key, inner_train, validation)
    params, curves = evaluator.train_final(program, init_params, key, train)
    accuracy = evaluator.accuracy(params, test)          # greedy pass@1 via `correct`

It follows the evaluator contract of `derl_jax.rl.evaluator.CandidateEvaluator`.

One inner step of one candidate (B = prompts_per_step prompts x G samples = N rollouts,
T = max_new_tokens, P primitives):
  1. device  `PolicyFunctions.sample` (`derl_jax.rl.host_policy`): prefill + fixed-length scan decode (jit); each
             completion is cut after its first stop token (eos or `<|endoftext|>`).
  2. host    tokens -> text, host primitives -> prims f32[N, P] (`HostPrimitiveRunner`
             threads; answer equivalence in the `AnswerChecker` worker processes).
  3. device  `PolicyFunctions.update` (one jit, params and optimizer state donated):
             rewards = `derl_jax.expr.evaluate(program, prims, u)` (the jnp VM, u = `derl_jax.rl.config.progress`),
             non-finite rewards -> 0, group advantages, GRPO epochs x minibatches. The old
             log-probs are the sampler's temperature-1 log-probs; the KL reference
             (k1/k2/k3, `inner.kl`) is the policy the run started from.

DAPO's additions are those of the device loop (`derl_jax.rl.loop.rewards_and_advantages`): with
`inner.dynamic_oversample` = O > 1 steps 1-2 run on O*B prompts (O*N rollouts, all of them
counted as generated tokens) and the update trains on the B groups `derl_jax.rl.dapo.select`
picks; `inner.overlong_buffer` > 0 shapes the rewards by completion length (up to and
including the stop token).

What overlaps what (JAX dispatch is asynchronous, so the host runs ahead of the device):
  * Candidates in flight (`inner.chunk_size`; 0 = all K of a call). The K candidates of an
    `evaluate_candidates` call are trained in waves of that many, interleaved step by step:
    at step t the sampling of every candidate of the wave is dispatched first, then the host
    decodes and scores candidate k while the device samples candidates k+1.. and updates
    k-1. With one candidate in flight only the reference log-probs (dispatched before the
    host work) overlap the host primitives. The next sampling of the *same* candidate never
    overlaps its own scoring: it needs the updated policy (the loop stays on-policy).
  * Greedy evaluation: batch i+1 (of any candidate) is sampled while batch i is decoded,
    and the answer checks run in a background thread.
  Host share: `host_seconds` is the time the host thread spends decoding and running
  primitives (not waiting for the device), `wall_seconds` the wall time; per call in
  `evaluator.last_report` (`reports` keeps all), per step in the curves `host_seconds`,
  `step_seconds` and `host_share` (cumulative share of the wave's wall time).

Compute budget (paper Appendix H), for search candidates only (`evaluate_candidates`): a
candidate's inner run stops once its cumulative number of generated tokens (completion tokens up to and including the stop token) exceeds
`budget_factor` x the cost of outcome-only training on the same config; the policy after
the last finished step is kept ("the last checkpoint"), the remaining steps of its curves
repeat the last values with `trained` = 0, and a warning names the run. The outcome-only
cost (`inner.budget_reference`):
  * "base_lengths" (default, free): steps x the rollouts sampled per step (O*N) x the mean
    completion length of the starting policy on the first batch, measured at step 0 of the
    call's first candidate (identical for every candidate: same policy, prompts and key). It
    is what outcome-only training would cost if lengths stayed where they start.
  * "outcome_run": measured once per (mode, starting policy, data) by actually training the
    outcome-only reward (one extra inner run, cached).
  * `inner.budget_tokens` > 0 gives the outcome-only token count directly.
`budget_factor` <= 0 disables the budget. The budget counts tokens, never seconds, so it stops
a run at the same step on any machine and a resumed search replays the same candidates.
`inner.time_limit_s` > 0 is an opt-in safety stop on wall time (off by default; the paper's
3.5-hour limit): it also stops a search wave after that many seconds and logs a warning
naming the runs it stopped; results then depend on machine speed. Final training
(`train_final`) is never cut short: it trains `final_steps` steps for every method, whatever
the budget or time limit. The sampler itself always decodes T steps; the budget counts the
tokens a length-aware engine would have generated, as the paper does.

Devices: the mesh has axes (cand, data, model). It is cut into `cand` slices, each a
('data', 'model') mesh with its own compiled functions; candidate j of a wave trains on
slice j mod cand, so a wave of `cand` candidates trains them side by side on disjoint
devices. Inside a slice, params follow the transformer's sharding metadata over 'model'
(tensor parallel: heads, MLP width, vocabulary; dimensions that do not divide stay
replicated) and rollouts are split over 'data'. The same code runs on one CPU device, fake
CPU devices, a GPU, or several hosts after `maybe_initialize_distributed()`; with several
processes every process runs the same loop on the same data, arrays read back to the host
are gathered to every process, and `mesh.cand` must be 1.

Randomness: every candidate of a call sees the same prompt order and step keys (common
random numbers), so candidates differ by their rewards only.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from derl_jax.domains.base import TokenDataset
from derl_jax.rl.evaluator import CandidateResults
from derl_jax.expr.parse import parse
from derl_jax.expr.program import Program, compile_expr
from derl_jax.parallel import CAND_AXIS, gather_to_host, make_mesh
from derl_jax.rl.config import InnerConfig, metric_names, progress
from derl_jax.rl.host_pool import HostPrimitiveRunner
from derl_jax.rl.placement import candidate_slices
from derl_jax.rl.host_batches import HostSplit, batch_schedule, unstack_programs
from derl_jax.rl.host_policy import PolicyFunctions, shared_policy_functions

STOP_BUDGET, STOP_TIME = "budget", "time_limit"
_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- reports


@dataclasses.dataclass(frozen=True)
class InnerRunReport:
    """One inner training: how far it ran and why it stopped (None: all steps)."""

    candidate: int
    steps_run: int
    steps_planned: int
    stop_reason: str | None
    generated_tokens: int
    budget_tokens: float | None
    host_seconds: float


@dataclasses.dataclass(frozen=True)
class InnerCallReport:
    """One evaluator call ("search" or "final"): its runs and where the wall time went.

    host_share = (training + evaluation host seconds) / wall seconds.
    """

    mode: str
    runs: tuple[InnerRunReport, ...]
    reference_tokens: float | None
    train_host_seconds: float
    eval_host_seconds: float
    wall_seconds: float

    @property
    def host_seconds(self) -> float:
        return self.train_host_seconds + self.eval_host_seconds

    @property
    def host_share(self) -> float:
        return self.host_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "host_seconds": self.host_seconds, "host_share": self.host_share}


# --------------------------------------------------------------------------- runs


class _Budget:
    """The token cap of one call: factor x reference, the reference known now or after step 0."""

    def __init__(self, factor: float, reference: float | None, steps: int, rollouts: int):
        self.factor = factor
        self.reference = reference
        self.steps = steps
        self.rollouts = rollouts

    @property
    def enabled(self) -> bool:
        return self.factor > 0

    @property
    def cap(self) -> float | None:
        return self.factor * self.reference if self.enabled and self.reference is not None else None

    def observe_first_batch(self, lengths: np.ndarray) -> None:
        """Base-lengths reference: steps x rollouts sampled per step x mean length of the starting
        policy's first batch."""
        if self.enabled and self.reference is None:
            self.reference = float(self.steps * self.rollouts * np.mean(lengths))


@dataclasses.dataclass
class _Run:
    """One candidate's training in progress."""

    candidate: int
    program: Program
    fns: PolicyFunctions
    params: Any
    opt_state: Any
    ref_params: Any
    steps_planned: int
    host_curves: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    device_metrics: list[dict] = dataclasses.field(default_factory=list)
    tokens: int = 0
    host_seconds: float = 0.0
    stop_reason: str | None = None

    @property
    def steps_run(self) -> int:
        return len(self.device_metrics)

    def record(self, **values: float) -> None:
        for name, value in values.items():
            self.host_curves.setdefault(name, []).append(float(value))

    def curves(self) -> dict[str, np.ndarray]:
        """name -> f32[steps_planned]; steps after a stop repeat the last value (`trained` = 0)."""
        fetched = jax.device_get(self.device_metrics)
        rows = {name: [float(np.asarray(m[name])) for m in fetched] for name in (fetched[0] if fetched else {})}
        rows.update(self.host_curves)
        out = {}
        for name, values in rows.items():
            values = np.asarray(values, np.float32)
            pad = self.steps_planned - values.size
            filler = 0.0 if name in ("trained", "generated_tokens", "host_seconds", "step_seconds") else values[-1]
            out[name] = np.concatenate([values, np.full(pad, filler, np.float32)]) if pad > 0 else values
        return out

    def report(self, budget: _Budget) -> InnerRunReport:
        return InnerRunReport(self.candidate, self.steps_run, self.steps_planned, self.stop_reason, self.tokens,
                              budget.cap, self.host_seconds)


class HostEvaluator:
    """The inner loop with host primitives, behind the `CandidateEvaluator` contract (module docstring)."""

    def __init__(self, domain: Any, graphdef: nnx.GraphDef, config: InnerConfig, mesh: Mesh | None = None):
        self.domain = domain
        self.graphdef = graphdef
        self.config = config
        self.mesh = mesh if mesh is not None else make_mesh(1, 1, 1, devices=jax.devices()[:1])
        if jax.process_count() > 1 and self.mesh.shape[CAND_AXIS] > 1:
            raise ValueError("host inner loop: with several processes config.mesh.cand must be 1")
        stops = tuple(getattr(domain, "stop_ids", (domain.eos_id,)))
        self.slices = [
            shared_policy_functions(graphdef, sub, max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                                    top_k=config.top_k, grpo=config.grpo, eos_id=int(domain.eos_id),
                                    pad_id=int(domain.pad_id), stop_ids=tuple(int(s) for s in stops),
                                    dynamic_oversample=config.dynamic_oversample,
                                    overlong_buffer=config.overlong_buffer)
            for sub in candidate_slices(self.mesh)
        ]
        self.runner = HostPrimitiveRunner(domain.primitives, num_workers=config.host_workers)
        self.outcome_runner = HostPrimitiveRunner([domain.primitives[domain.outcome_index]], num_workers=1)
        self.reports: list[InnerCallReport] = []
        self._outcome_tokens: list[tuple[Any, Any, str, int, float]] = []

    @property
    def last_report(self) -> InnerCallReport | None:
        return self.reports[-1] if self.reports else None

    def place(self, params: nnx.State) -> nnx.State:
        """`params` on the first candidate slice of the mesh (how base policies are kept)."""
        return self.slices[0].place(params)

    # ------------------------------------------------------------------ contract

    def evaluate_candidates(self, programs: Program, init_params: Any, key: jax.Array, train_set: TokenDataset,
                            val_set: TokenDataset, *, steps: int | None = None) -> CandidateResults:
        """Train one policy per program of Program[K] from `init_params` on `train_set` for
        `steps` (default config.steps); score each by greedy pass@1 on `val_set` ->
        CandidateResults (scores f32[K], curves name -> f32[K, steps], params stacked on the host or None)."""
        steps = self.config.steps if steps is None else int(steps)
        started = time.perf_counter()
        program_list = unstack_programs(programs)
        train, validation = HostSplit(train_set, self.domain), HostSplit(val_set, self.domain)
        budget = self._budget("search", steps, init_params, key, train_set, train)
        in_flight = self.config.chunk_size or len(program_list)
        scores, curves, kept, runs_done, eval_host = [], [], [], [], 0.0
        for start in range(0, len(program_list), in_flight):
            indices = range(start, min(start + in_flight, len(program_list)))
            runs = self._train_wave(indices, [program_list[k] for k in indices], init_params, key, train,
                                    steps, budget, time_limit_s=self.config.time_limit_s)
            accuracies, spent = self._greedy_accuracies([(r.fns, r.params) for r in runs], validation)
            eval_host += spent
            for run, accuracy in zip(runs, accuracies):
                scores.append(accuracy)
                curves.append(run.curves())
                if self.config.return_params:
                    kept.append(gather_to_host(run.params))
                runs_done.append(run)
                run.params = run.opt_state = run.ref_params = None
        self._finish_report("search", runs_done, budget, eval_host, started)
        names = metric_names(self.domain.primitive_names, self.config.uses_reference, host=True,
                             dynamic_sampling=self.config.dynamic_sampling)
        stacked = {name: np.stack([c.get(name, np.full(steps, np.nan, np.float32)) for c in curves])
                   for name in names}
        params = jax.tree.map(lambda *leaves: np.stack(leaves), *kept) if kept else None
        return CandidateResults(scores=np.asarray(scores, np.float32), curves=stacked, params=params)

    def train_final(self, program: Program, init_params: Any, key: jax.Array, train_set: TokenDataset, *,
                    steps: int | None = None) -> tuple[Any, dict[str, np.ndarray]]:
        """A fresh policy trained with one program for `steps` (None: `final_steps`) -> (params on the
        mesh, curves name -> f32[steps])."""
        steps = self.config.final_steps if steps is None else int(steps)
        started = time.perf_counter()
        program = Program(ops=np.asarray(program.ops), args=np.asarray(program.args), size=np.asarray(program.size))
        if program.ops.ndim != 1:
            raise ValueError(f"train_final: expected one program, got ops of shape {program.ops.shape}")
        train = HostSplit(train_set, self.domain)
        budget = _Budget(0.0, None, steps, self.config.sampled_per_step)  # never cut short
        (run,) = self._train_wave([0], [program], init_params, key, train, steps, budget,
                                  time_limit_s=0.0)
        params = run.params
        self._finish_report("final", [run], budget, 0.0, started)
        return params, run.curves()

    def accuracy(self, params: Any, dataset: TokenDataset) -> float:
        """Greedy pass@1 (the `correct` primitive) of one policy on `dataset`."""
        fns = self.slices[0]
        (score,), _ = self._greedy_accuracies([(fns, fns.place(params))], HostSplit(dataset, self.domain))
        return float(score)

    def item_scores(self, params: Any, dataset: TokenDataset) -> np.ndarray:
        """f32[N]: the `correct` primitive of each greedy completion (their mean is `accuracy`)."""
        fns = self.slices[0]
        (scores,), _ = self._greedy_pass([(fns, fns.place(params))], HostSplit(dataset, self.domain), check=True)
        return np.asarray(scores, np.float32)

    def greedy_texts(self, params: Any, dataset: TokenDataset) -> list[str]:
        """The decoded greedy completion of every row of `dataset` (what `accuracy` scores)."""
        fns = self.slices[0]
        texts, _ = self._greedy_pass([(fns, fns.place(params))], HostSplit(dataset, self.domain), check=False)
        return texts[0]

    def close(self) -> None:
        self.runner.close()
        self.outcome_runner.close()

    # ------------------------------------------------------------------ training

    def _start_run(self, candidate: int, position: int, program: Program, init_params: Any,
                   placed: dict[int, Any], steps: int) -> _Run:
        slice_index = position % len(self.slices)
        fns = self.slices[slice_index]
        if slice_index not in placed:
            placed[slice_index] = fns.place(init_params)
        reference = placed[slice_index]
        params = jax.tree.map(lambda x: x.copy(), reference)
        return _Run(candidate, program, fns, params, fns.init_optimizer(params), reference, steps)

    def _train_wave(self, candidates: Sequence[int], programs: Sequence[Program], init_params: Any, key: jax.Array,
                    train: HostSplit, steps: int, budget: _Budget, *, time_limit_s: float) -> list[_Run]:
        """Train `programs` interleaved step by step (module docstring); returns the finished runs.
        `time_limit_s` > 0 stops the wave's runs after that many wall-clock seconds."""
        placed: dict[int, Any] = {}
        runs = [self._start_run(c, j, p, init_params, placed, steps) for j, (c, p) in enumerate(zip(candidates, programs))]
        sampled = self.config.prompts_per_step * self.config.dynamic_oversample   # prompts per step
        schedule = batch_schedule(key, train.size, sampled, steps)
        group = self.config.grpo.group_size
        names = self.domain.primitive_names
        wave_started = time.perf_counter()
        wall_total, host_total = 0.0, 0.0
        for step in range(steps):
            active = [r for r in runs if r.stop_reason is None]
            if not active:
                break
            step_started = time.perf_counter()
            prompts, mask, contexts = train.batch(schedule[step], group, self.domain.bucket_sizes)
            sample_key, update_key = jax.random.split(jax.random.fold_in(key, step))
            u = progress(step, steps)
            inputs: dict[int, tuple] = {}
            rollouts = []
            for run in active:
                if id(run.fns) not in inputs:
                    inputs[id(run.fns)] = (run.fns.rows(prompts), run.fns.rows(mask))
                rollouts.append(run.fns.sample(run.params, *inputs[id(run.fns)], sample_key))
            step_host = 0.0
            for run, rollout in zip(active, rollouts):
                completions, completion_mask, lengths = gather_to_host((rollout.completions, rollout.mask, rollout.lengths))
                ref_logp = run.fns.reference_logprobs(run.ref_params, rollout) if self.config.uses_reference else None
                host_started = time.perf_counter()
                texts = self.domain.tokenizer.decode_batch(completions, completion_mask)
                prims = self.runner.run(texts, contexts)
                spent = time.perf_counter() - host_started
                run.params, run.opt_state, metrics = run.fns.update(run.params, run.opt_state, run.program, prims,
                                                                    u, rollout, ref_logp, update_key)
                run.device_metrics.append(metrics)
                if step == 0:
                    budget.observe_first_batch(lengths)
                run.tokens += int(lengths.sum())
                run.host_seconds += spent
                step_host += spent
                means = prims.mean(axis=0)
                run.record(trained=1.0, generated_tokens=float(lengths.sum()), tokens_cumulative=float(run.tokens),
                           response_length=float(lengths.mean()), host_seconds=spent,
                           **{f"primitive/{name}": means[i] for i, name in enumerate(names)})
                self._check_budget(run, budget, step)
            wall = time.perf_counter() - step_started
            wall_total += wall
            host_total += step_host
            for run in active:
                run.record(step_seconds=wall, host_share=host_total / wall_total if wall_total > 0 else 0.0)
            self._check_time(active, wave_started, step, steps, time_limit_s)
        return runs

    def _check_budget(self, run: _Run, budget: _Budget, step: int) -> None:
        cap = budget.cap
        if cap is not None and run.tokens > cap and run.stop_reason is None and step + 1 < run.steps_planned:
            run.stop_reason = STOP_BUDGET
            _log.warning(
                "inner run of candidate %d stopped by the compute budget after step %d of %d: %d generated tokens "
                "> %.0f (%.2f x outcome-only %.0f); keeping its policy after step %d",
                run.candidate, step + 1, run.steps_planned, run.tokens, cap, budget.factor, budget.reference, step + 1)

    @staticmethod
    def _check_time(active: Sequence[_Run], wave_started: float, step: int, steps: int, limit: float) -> None:
        if limit > 0 and time.perf_counter() - wave_started > limit and step + 1 < steps:
            for run in active:
                if run.stop_reason is None:
                    run.stop_reason = STOP_TIME
                    _log.warning("inner run of candidate %d stopped by the wall-clock safety limit "
                                 "(config.inner.time_limit_s=%.0f s) after step %d of %d; this run's result depends "
                                 "on machine speed", run.candidate, limit, step + 1, steps)

    def _budget(self, mode: str, steps: int, init_params: Any, key: jax.Array, dataset: TokenDataset,
                train: HostSplit) -> _Budget:
        config = self.config
        budget = _Budget(config.budget_factor, None, steps, config.sampled_per_step)
        if not budget.enabled:
            return budget
        if config.budget_tokens > 0:
            budget.reference = float(config.budget_tokens)
        elif config.budget_reference == "outcome_run":
            budget.reference = self._outcome_run_tokens(mode, steps, init_params, key, dataset, train)
        return budget

    def _outcome_run_tokens(self, mode: str, steps: int, init_params: Any, key: jax.Array, dataset: TokenDataset,
                            train: HostSplit) -> float:
        """Generated tokens of one outcome-only training (cached per mode, starting policy and data)."""
        for params, data, cached_mode, cached_steps, tokens in self._outcome_tokens:
            if params is init_params and data is dataset and cached_mode == mode and cached_steps == steps:
                return tokens
        outcome = f"g{self.domain.outcome_index + 1}"
        program = compile_expr(parse(outcome, self.domain.primitive_names), num_primitives=len(self.domain.primitives))
        unbounded = _Budget(0.0, None, steps, self.config.sampled_per_step)
        (run,) = self._train_wave([-1], [program], init_params, key, train, steps, unbounded, time_limit_s=0.0)
        tokens = float(run.tokens)
        _log.info("outcome-only reference run (%s, %d steps): %d generated tokens", mode, steps, run.tokens)
        self._outcome_tokens.append((init_params, dataset, mode, steps, tokens))
        return tokens

    def _finish_report(self, mode: str, runs: Sequence[_Run], budget: _Budget, eval_host: float, started: float) -> None:
        report = InnerCallReport(
            mode=mode, runs=tuple(r.report(budget) for r in runs), reference_tokens=budget.reference,
            train_host_seconds=float(sum(r.host_seconds for r in runs)), eval_host_seconds=float(eval_host),
            wall_seconds=time.perf_counter() - started)
        self.reports.append(report)
        stopped = [r.candidate for r in report.runs if r.stop_reason]
        _log.info("inner %s: %d run(s), host share %.1f%% of %.1f s%s", mode, len(runs), 100 * report.host_share,
                  report.wall_seconds, f", stopped early: {stopped}" if stopped else "")

    # ------------------------------------------------------------------ greedy evaluation

    def _greedy_accuracies(self, jobs: Sequence[tuple[PolicyFunctions, Any]], split: HostSplit) -> tuple[list[float], float]:
        """(greedy pass@1 of every (functions, params) job on `split`, host seconds spent)."""
        scores, host = self._greedy_pass(jobs, split, check=True)
        return [float(np.mean(s)) for s in scores], host

    def _greedy_pass(self, jobs, split: HostSplit, *, check: bool):
        """Greedy completions of every job on every row of `split`, batch i+1 sampled while
        batch i is decoded; with `check`, the `correct` scores f32[M] per job, else the texts."""
        size = self.config.eval_batch_size
        batches = [np.arange(i, min(i + size, split.size)) for i in range(0, split.size, size)]
        items = [(j, b) for j in range(len(jobs)) for b in range(len(batches))]
        key = jax.random.key(0)

        def dispatch(item):
            j, b = item
            fns, params = jobs[j]
            rows = np.concatenate([batches[b], np.full(size - batches[b].size, batches[b][0])])
            prompts, mask, _ = split.batch(rows, 1, self.domain.bucket_sizes)
            return fns.sample(params, fns.rows(prompts), fns.rows(mask), key, greedy=True)

        results: list[list[Any]] = [[] for _ in jobs]
        host = 0.0
        pending = dispatch(items[0]) if items else None
        for position, (j, b) in enumerate(items):
            upcoming = dispatch(items[position + 1]) if position + 1 < len(items) else None
            real = batches[b].size
            completions, completion_mask = (a[:real] for a in gather_to_host((pending.completions, pending.mask)))
            host_started = time.perf_counter()
            texts = self.domain.tokenizer.decode_batch(completions, completion_mask)
            if check:
                results[j].append(self.outcome_runner.submit(texts, [split.contexts[r] for r in batches[b]]))
            else:
                results[j].extend(texts)
            host += time.perf_counter() - host_started
            pending = upcoming
        if not check:
            return results, host
        waited = time.perf_counter()
        scores = [np.concatenate([f.result()[:, 0] for f in futures]) for futures in results]
        return scores, host + time.perf_counter() - waited
