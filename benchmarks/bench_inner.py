"""Inner-loop speed: GRPO steps/s and sampled tokens/s for K candidates, three ways, and TRL.

    python benchmarks/bench_inner.py            # K = 1, 8, 32; a few minutes on 2 CPU cores
    python benchmarks/bench_inner.py --quick    # K = 1, 4, fewer steps
    python benchmarks/bench_inner.py --k1       # only K = 1 against TRL, 3 trials: the per-step comparison
    python benchmarks/bench_inner.py --k1 --trials 5 --out result.json   # five trials, the JSON kept
    python benchmarks/bench_inner.py --k1 --trials 4 --pairs 20   # and 20 TRL steps paired with ours per trial

Every step samples 16 prompts x 8 completions = 128 completions (--prompts, --group). With
several trials (`--trials`, default 3 with --k1, else 1) the summary gives the median of each
ratio over the trials, its range (`_min`, `_max`) and every trial's value (`_trials`).

Modes (the same `InnerLoop`, the same inputs):
  vmapped  `train_many` with every candidate vmapped in one compiled call
  chunked  `train_many` with `chunk_size` candidates per chunk (lax.map over chunks)
  sharded  `train_many` vmapped, candidates over the 'cand' axis of a mesh of every device
           (on a CPU host: one device per core, `--xla_force_host_platform_device_count`)
  loop     one jitted `train` called once per candidate from Python (asynchronous dispatch)
  loop_devices  the same, candidate k on device k % (number of devices)
  loop_data     the same as loop, but each step's rollouts split over the 'data' axis of a
                (1, devices, 1) mesh: one candidate uses every host device (every core)

Each row: compile seconds (first call), run seconds (median after the warm-up), GRPO steps
per second summed over candidates (K * steps / run), sampled tokens per second (generated
tokens up to and including EOS), and the compiled executable's temporary buffer size
(`memory_analysis`, a per-executable peak that, unlike the process's maxrss, separates modes).
`speedup_vs_loop` is against the faster of the two loops; the summary gives the best batched
mode against the one-device loop and against the fastest loop.

Then TRL's `GRPOTrainer` (PyTorch CPU) trains a `transformers.Qwen2ForCausalLM` of the same
shape on the same prompts with the same batch (B prompts x G samples), completion length
and outcome reward; a callback times each optimizer step after a warm-up step, and TRL's
step is the median of as many steps as one of our timed runs holds (8; 2 with --quick).
The K = 1 loops are then timed again (`step_ms_after_trl`), and the per-step ratio against
TRL uses the mean of ours before and after TRL (`step_ms_bracketed`): the speed of a shared
host drifts over a run, and bracketing the reference cancels a drift that is linear in time.

With `--pairs P` TRL then trains 2P more steps: our fastest K = 1 mode is timed again (one
warm-up and 3 timed runs of 8 steps, about a second), TRL runs one step untimed (its own
warm-up after ours) and then one timed step; that step and the timing of ours just before it
make a pair, and their ratio is taken per pair. On a shared host TRL's step moves with the
host's load more than ours does, so a ratio of two medians taken at different moments is
noisier than the median of ratios taken a second apart. The summary gives the median of the
pairs' ratios over every trial, its 95% interval from a bootstrap over trials and pairs, and
the median ratio in each quarter of the pairs sorted by TRL's step (`paired_speedup_*`).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import sys
import tempfile
import time

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={os.cpu_count()}").strip()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import report  # noqa: E402
from derl_jax.experiment.stats import BOOTSTRAP_REPS, BOOTSTRAP_SEED, crossed_bootstrap  # noqa: E402
from derl_jax.domains.arith import BOX_CLOSE, BOX_OPEN, make_arith_domain  # noqa: E402
from derl_jax.expr import compile_expr, parse, stack_programs  # noqa: E402
from derl_jax.models.transformer import init_params  # noqa: E402
from derl_jax.parallel import make_mesh  # noqa: E402
from derl_jax.rl import sft  # noqa: E402
from derl_jax.rl.grpo import GRPOConfig  # noqa: E402
from derl_jax.rl.config import InnerConfig  # noqa: E402
from derl_jax.rl.loop import make_inner_loop  # noqa: E402
from derl_jax.rl.placement import compiler_options_for  # noqa: E402

POLICY = {"hidden_size": 64, "intermediate_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
          "head_dim": 16}
DOMAIN = {"seed": 0, "num_train": 320, "num_test": 64, "levels": (1, 2), "max_new_tokens": 28}
EXPRESSIONS = ("g1", "g1 + 0.5*g2", "g1 + g2*g3", "(g1 + g4)/2", "g1*g2 + 0.1*g3", "max(g1, g4)", "g1 + u*g2",
               "g1 - 0.2*(1 - g2)")


def block(tree):
    return jax.tree_util.tree_map(lambda x: x.block_until_ready(), tree)


def programs_for(count: int, names) -> object:
    return stack_programs([compile_expr(parse(EXPRESSIONS[k % len(EXPRESSIONS)], names)) for k in range(count)])


def temp_megabytes(compiled) -> float | None:
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None
    return round((analysis.temp_size_in_bytes + analysis.output_size_in_bytes) / 2**20, 2)


def run_options() -> dict:
    """The XLA options a run compiles the arith (single-turn) inner loop with on these devices
    (`rl.setup.make_evaluator`)."""
    return compiler_options_for("device", jax.devices()[0].platform)


def time_batched(loop, params, programs, keys, dataset, repeats: int, mesh=None):
    """(compile s, median run s, metrics, MiB) of one jitted train_many (candidates over
    `mesh`'s 'cand' axis when given)."""
    if mesh is not None:
        programs, keys = jax.device_put((programs, keys), NamedSharding(mesh, PartitionSpec("cand")))
        params, dataset = jax.device_put((params, dataset), NamedSharding(mesh, PartitionSpec()))
    start = time.perf_counter()
    compiled = jax.jit(loop.train_many).lower(params, programs, keys, dataset).compile(run_options())
    compile_s = time.perf_counter() - start
    _, metrics = block(compiled(params, programs, keys, dataset))
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        _, metrics = block(compiled(params, programs, keys, dataset))
        runs.append(time.perf_counter() - start)
    return compile_s, statistics.median(runs), metrics, temp_megabytes(compiled)


def time_candidate_calls(run_all, repeats: int) -> tuple[float, dict]:
    """(median seconds of `repeats` calls of `run_all` after one warm-up, metrics stacked over
    candidates) for `run_all() -> [(params, metrics)]`, one entry per candidate."""
    outputs = run_all()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = run_all()
        runs.append(time.perf_counter() - start)
    metrics = {name: np.stack([np.asarray(out[1][name]) for out in outputs]) for name in outputs[0][1]}
    return statistics.median(runs), metrics


def time_loop(loop, params, programs, keys, dataset, repeats: int, compiled_cache: dict, devices=None):
    """The same with a Python loop over candidates calling one jitted `train`; with `devices`,
    candidate k runs on devices[k % len(devices)] (one executable per device)."""
    devices = list(devices or [jax.devices()[0]])
    count = keys.shape[0]
    placed = [jax.device_put((params, dataset), device) for device in devices]
    singles = [jax.device_put(jax.tree_util.tree_map(lambda x, k=k: x[k], (programs, keys)), devices[k % len(devices)])
               for k in range(count)]
    compile_s = 0.0
    for index, device in enumerate(devices):
        if device not in compiled_cache:
            start = time.perf_counter()
            program, key = jax.device_put(singles[0], device)
            lowered = jax.jit(loop.train).lower(placed[index][0], program, key, placed[index][1])
            compiled_cache[device] = lowered.compile(run_options())
            compile_s += time.perf_counter() - start

    def run_all():
        calls = []
        for k in range(count):
            index = k % len(devices)
            program, key = singles[k]
            calls.append(compiled_cache[devices[index]](placed[index][0], program, key, placed[index][1]))
        return block(calls)

    seconds, metrics = time_candidate_calls(run_all, repeats)
    return compile_s, seconds, metrics, temp_megabytes(compiled_cache[devices[0]])


def time_data_parallel(loop, mesh, params, programs, keys, dataset, repeats: int, compiled_cache: dict):
    """`time_loop` for a loop built on `mesh` (rows of each step over its 'data' axis): every
    candidate in turn, its inputs replicated over the mesh."""
    replicated = NamedSharding(mesh, PartitionSpec())
    params, dataset = jax.device_put((params, dataset), replicated)
    singles = [jax.device_put(jax.tree_util.tree_map(lambda x, k=k: x[k], (programs, keys)), replicated)
               for k in range(keys.shape[0])]
    compile_s = 0.0
    if "data" not in compiled_cache:
        start = time.perf_counter()
        compiled_cache["data"] = jax.jit(loop.train).lower(params, *singles[0], dataset).compile(run_options())
        compile_s = time.perf_counter() - start
    compiled = compiled_cache["data"]

    def run_all():
        return block([compiled(params, program, key, dataset) for program, key in singles])

    seconds, metrics = time_candidate_calls(run_all, repeats)
    return compile_s, seconds, metrics, temp_megabytes(compiled)


def jax_rows(args) -> tuple[list[dict], dict]:
    domain = make_arith_domain(DOMAIN)
    model_cfg = sft.policy_model_config(domain, POLICY)
    graphdef, params = init_params(model_cfg, jax.random.key(0))
    # kl_coef 0 and no KL metric: the same work per step as TRL's GRPOTrainer with beta=0
    base = dict(steps=args.steps, prompts_per_step=args.prompts, group_size=args.group,
                max_new_tokens=domain.max_new_tokens, grpo=GRPOConfig(learning_rate=3e-4), kl_metric=False)
    loops = {0: make_inner_loop(domain, graphdef, InnerConfig(**base))}
    devices = len(jax.devices())
    mesh = make_mesh(devices, 1, 1) if devices > 1 else None
    sharded_loop = make_inner_loop(domain, graphdef, InnerConfig(**base), mesh) if mesh is not None else None
    per_candidate = args.prompts * args.group
    data_mesh = make_mesh(1, devices, 1) if devices > 1 and per_candidate % devices == 0 else None
    data_loop = make_inner_loop(domain, graphdef, InnerConfig(**base), data_mesh) if data_mesh is not None else None
    rows, cache, retime = [], {}, []

    def mode_timer(mode, chunk, programs, keys):
        """() -> (compile s, run s, metrics, MiB) of one mode on these candidates."""
        if mode == "loop_data":
            return lambda: time_data_parallel(data_loop, data_mesh, params, programs, keys, domain.train,
                                              args.repeats, cache)
        if mode in ("loop", "loop_devices"):
            return lambda: time_loop(loops[0], params, programs, keys, domain.train, args.repeats, cache,
                                     jax.devices() if mode == "loop_devices" else None)
        if mode == "sharded":
            return lambda: time_batched(sharded_loop, params, programs, keys, domain.train, args.repeats, mesh)
        return lambda: time_batched(loops[chunk], params, programs, keys, domain.train, args.repeats)

    for count in args.candidates:
        programs = programs_for(count, domain.primitive_names)
        keys = jax.random.split(jax.random.key(1), count)
        modes = [] if args.k1 else [("vmapped", 0)]
        if count > 1:
            chunk = min(args.chunk, count)
            modes.append(("chunked", chunk))
            loops.setdefault(chunk, make_inner_loop(domain, graphdef, InnerConfig(**base, chunk_size=chunk)))
        if mesh is not None and count % devices == 0:
            modes.append(("sharded", 0))
        modes.append(("loop", 0))
        if data_mesh is not None:
            modes.append(("loop_data", 0))
        if mesh is not None and count > 1:
            modes.append(("loop_devices", 0))
        for mode, chunk in modes:
            timer = mode_timer(mode, chunk, programs, keys)
            compile_s, run_s, metrics, mib = timer()
            tokens = float(np.sum(np.asarray(metrics["response_length"]))) * per_candidate
            rows.append({
                "K": count, "mode": mode, "chunk": chunk, "compile_s": round(compile_s, 2),
                "run_s": round(run_s, 3), "step_ms_per_candidate": round(1e3 * run_s / (count * args.steps), 2),
                "grpo_steps_per_s": round(count * args.steps / run_s, 2), "tokens_per_s": round(tokens / run_s, 1),
                "exec_mib": mib,
            })
            print(rows[-1], flush=True)
            if count == 1 and mode in ("loop", "loop_data"):   # compiled once: timing again costs no compile
                retime.append((rows[-1], lambda timer=timer: timer()[1]))
    for count in args.candidates:
        of_k = [r for r in rows if r["K"] == count]
        loop_s = min(r["run_s"] for r in of_k if r["mode"] in ("loop", "loop_devices", "loop_data"))
        for r in of_k:
            r["speedup_vs_loop"] = round(loop_s / r["run_s"], 2)
    return rows, {"domain": domain, "model_cfg": model_cfg, "retime_k1": retime}


def fastest_k1(rows_and_timers, steps: int) -> tuple[str | None, object]:
    """(mode, () -> its ms per step timed now) for the K = 1 mode that was fastest in its first
    timing; (None, None) without one."""
    if not rows_and_timers:
        return None, None
    row, timer = min(rows_and_timers, key=lambda pair: pair[0]["step_ms_per_candidate"])
    return row["mode"], lambda: 1e3 * timer() / steps


def time_again_after(rows_and_timers, steps: int) -> None:
    """Time the K = 1 loops again (compiled already) and add `step_ms_after_trl` and
    `step_ms_bracketed` (the mean of the two) to their rows: the host's speed drifts over a
    run, and timing ours on both sides of TRL cancels a drift that is linear in time."""
    for row, timer in rows_and_timers:
        after = 1e3 * timer() / steps
        row["step_ms_after_trl"] = round(after, 2)
        row["step_ms_bracketed"] = round((row["step_ms_per_candidate"] + after) / 2, 2)


# ----------------------------------------------------------------------------- TRL


def outcome_reward(completions, answer, **_) -> list[float]:
    """1.0 when the last `[...]` box of the completion holds exactly the gold answer."""
    pattern = re.escape(BOX_OPEN) + r"([^" + re.escape(BOX_OPEN + BOX_CLOSE) + r"]*)" + re.escape(BOX_CLOSE)
    scores = []
    for text, gold in zip(completions, answer):
        boxes = re.findall(pattern, text)
        scores.append(1.0 if boxes and boxes[-1] == str(gold) else 0.0)
    return scores


def char_tokenizer(domain):
    """A Hugging Face fast tokenizer with the domain's character vocabulary and special ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    names = domain.tokenizer.token_names
    vocab = {name: index for index, name in enumerate(names)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=names[domain.pad_id]))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    bos = names[domain.tokenizer.bos_id]
    core.post_processor = processors.TemplateProcessing(single=f"{bos} $A",
                                                        special_tokens=[(bos, domain.tokenizer.bos_id)])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token=bos, eos_token=names[domain.eos_id],
                                   pad_token=names[domain.pad_id], padding_side="left")


class StepClock:
    """Time stamps of TRL's optimizer-step ends (`step_ended`, called by a trainer callback):
    the gaps between them are whole steps (batch, generation, rewards, update), whatever the
    trainer does before `on_step_begin`. The first `timed_steps` + 1 ends time a warm-up step
    and `timed_steps` steps (`timed_steps_s`). Then, while fewer than `pairs` pairs are done,
    `ours_before_step()` (ours in ms, with its own warm-up run) runs after a step end, the next
    TRL step runs untimed (TRL's warm-up after ours) and the one after it is timed:
    `paired_trl_ms[j]` pairs with `paired_ours_ms[j]`."""

    def __init__(self, timed_steps: int, pairs: int = 0, ours_before_step=None, clock=time.perf_counter):
        self.timed_steps, self.pairs, self.ours_before_step, self.clock = timed_steps, pairs, ours_before_step, clock
        self.step_ends: list[float] = []
        self.paired_trl_ms: list[float] = []
        self.paired_ours_ms: list[float] = []
        self.waiting_for: str | None = None   # "warm-up" or "timed": the TRL step now running
        self.resumed = 0.0

    def steps_needed(self) -> int:
        return self.timed_steps + 1 + 2 * self.pairs

    def step_ended(self) -> None:
        now = self.clock()
        if len(self.step_ends) <= self.timed_steps:
            self.step_ends.append(now)
        elif self.waiting_for == "warm-up":
            self.waiting_for, self.resumed = "timed", now
            return
        elif self.waiting_for == "timed":
            self.paired_trl_ms.append(1e3 * (now - self.resumed))
            self.waiting_for = None
        if len(self.step_ends) > self.timed_steps and self.waiting_for is None and len(self.paired_ours_ms) < self.pairs:
            self.paired_ours_ms.append(self.ours_before_step())
            self.waiting_for = "warm-up"

    def timed_steps_s(self) -> list[float]:
        """Seconds of each timed step (the warm-up step left out)."""
        return [float(gap) for gap in np.diff(self.step_ends)]


def trl_row(args, domain, model_cfg, ours_before_step=None) -> dict:
    """TRL's step (the median of `args.trl_steps` steps after a warm-up step) and, with
    `args.pairs` > 0 and `ours_before_step` (() -> our step in ms, timed then), that many
    more TRL steps each paired with a timing of ours just before it (`StepClock`;
    `paired_trl_step_ms`, `paired_ours_step_ms`)."""
    import datasets
    import torch
    import transformers
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=model_cfg.vocab_size, hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size, num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads, num_key_value_heads=model_cfg.num_kv_heads,
        max_position_embeddings=model_cfg.max_position, rope_theta=model_cfg.rope_theta,
        rms_norm_eps=model_cfg.rms_norm_eps, tie_word_embeddings=True, bos_token_id=domain.tokenizer.bos_id,
        eos_token_id=domain.eos_id, pad_token_id=domain.pad_id)
    model = transformers.Qwen2ForCausalLM(config)
    tokenizer = char_tokenizer(domain)
    model.generation_config.pad_token_id = domain.pad_id
    model.generation_config.eos_token_id = domain.eos_id
    problems = domain.info["train_problems"]
    dataset = datasets.Dataset.from_dict({"prompt": [p.prompt for p in problems],
                                          "answer": [p.answer for p in problems]})
    pairs = args.pairs if ours_before_step is not None else 0
    clock = StepClock(args.trl_steps, pairs, ours_before_step)

    class StepTimer(transformers.TrainerCallback):
        def on_step_end(self, *_, **__):
            clock.step_ended()

    with tempfile.TemporaryDirectory() as output_dir:
        trl_args = TRLConfig(
            output_dir=output_dir, per_device_train_batch_size=args.prompts * args.group,
            num_generations=args.group, max_completion_length=domain.max_new_tokens, temperature=1.0,
            learning_rate=3e-4, beta=0.0, num_iterations=1, max_steps=clock.steps_needed(),
            logging_strategy="no", save_strategy="no", eval_strategy="no", report_to="none",
            use_vllm=False, use_cpu=True, gradient_checkpointing=False, disable_tqdm=True, bf16=False, seed=0)
        trainer = GRPOTrainer(model=model, reward_funcs=outcome_reward, args=trl_args, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[StepTimer()])
        trainer.train()
    measured = clock.timed_steps_s()
    row = {"K": 1, "mode": "trl_grpo_trainer", "chunk": 0, "run_s": round(sum(measured), 3),
           "step_ms_per_candidate": round(1e3 * statistics.median(measured), 2),
           "grpo_steps_per_s": round(1.0 / statistics.median(measured), 3), "measured_steps": len(measured)}
    if pairs:
        row["paired_trl_step_ms"] = [round(ms, 2) for ms in clock.paired_trl_ms]
        row["paired_ours_step_ms"] = [round(ms, 2) for ms in clock.paired_ours_ms[:len(clock.paired_trl_ms)]]
    return row


def paired_speedup(trl_ms, ours_ms) -> dict:
    """TRL's step over ours, pair by pair: trl_ms, ours_ms f[trials, pairs] (pair j of a trial
    = a TRL step and ours timed just before it). Returns the median of the ratios, its 95%
    percentile interval from a bootstrap that draws trials and pairs with replacement
    (`stats.crossed_bootstrap`: the pairs of one trial share its process and compilation),
    each trial's median, the number of pairs, and the median ratio within each quarter of the
    pairs sorted by TRL's step (`paired_speedup_by_trl_quartile`, fastest TRL steps first: on a
    shared host TRL's step is fastest when the host is quietest)."""
    trl_ms, ours_ms = np.asarray(trl_ms, dtype=np.float64), np.asarray(ours_ms, dtype=np.float64)
    if trl_ms.shape != ours_ms.shape or trl_ms.ndim != 2 or trl_ms.size == 0:
        raise ValueError(f"paired_speedup: trl_ms and ours_ms must be the same non-empty [trials, pairs], "
                         f"got {trl_ms.shape} and {ours_ms.shape}")
    ratios = trl_ms / ours_ms
    interval = crossed_bootstrap(lambda r: np.array([np.median(r)]), ratios, reps=BOOTSTRAP_REPS,
                                 seed=BOOTSTRAP_SEED)
    return {"paired_speedup_median": round(float(np.median(ratios)), 2),
            "paired_speedup_ci95": [round(float(interval[0, 0]), 2), round(float(interval[1, 0]), 2)],
            "paired_speedup_trials": [round(float(m), 2) for m in np.median(ratios, axis=1)],
            "paired_count": int(ratios.size),
            "paired_speedup_by_trl_quartile": [
                round(float(np.median(quarter)), 2)
                for quarter in np.array_split(ratios.ravel()[np.argsort(trl_ms.ravel(), kind="stable")], 4)
                if quarter.size]}


def trial_summary(args, rows) -> dict:
    """One trial's ratios: ours (K = 1, fastest mode; fastest per candidate-step in any mode) vs
    TRL per step, and the best batched mode vs the loops for every K > 1."""
    summary = {}
    trl = next((r for r in rows if r["mode"] == "trl_grpo_trainer"), None)
    if trl is not None:
        summary["trl_step_ms"] = trl["step_ms_per_candidate"]
        single = [r.get("step_ms_bracketed", r["step_ms_per_candidate"]) for r in rows
                  if r["K"] == 1 and r["mode"] != "trl_grpo_trainer"]
        if single:
            summary["ours_step_ms_k1"] = min(single)
            summary["speedup_vs_trl_per_step"] = round(trl["step_ms_per_candidate"] / min(single), 2)
        ours_any = min(r.get("step_ms_bracketed", r["step_ms_per_candidate"]) for r in rows
                       if r["mode"] != "trl_grpo_trainer")
        summary["speedup_vs_trl_per_candidate_step_best_mode"] = round(trl["step_ms_per_candidate"] / ours_any, 2)
    for count in args.candidates:
        if count > 1:
            best = max((r for r in rows if r["K"] == count and r["mode"] in ("vmapped", "chunked", "sharded")),
                       key=lambda r: r["grpo_steps_per_s"])
            one_device_loop = next(r for r in rows if r["K"] == count and r["mode"] == "loop")
            summary[f"best_batched_vs_one_device_loop_K{count}"] = round(one_device_loop["run_s"] / best["run_s"], 2)
            summary[f"best_batched_vs_fastest_loop_K{count}"] = best["speedup_vs_loop"]
    return summary


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="K = 1, 4 and fewer steps")
    parser.add_argument("--no-trl", action="store_true", help="skip the TRL comparison")
    parser.add_argument("--k1", action="store_true", help="only K = 1 in loop mode (and TRL)")
    parser.add_argument("--candidates", type=int, nargs="+", dest="only_candidates",
                        help="the values of K to run (instead of the preset's)")
    parser.add_argument("--prompts", type=int, default=16, help="prompts per GRPO step (B; default 16)")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt (G; default 8)")
    parser.add_argument("--out", default=None, help="also write the result JSON here")
    parser.add_argument("--pairs", type=int, default=0,
                        help="after TRL's timed steps, this many more, each paired with a timing of ours "
                             "just before it (K = 1 only; the summary's paired_speedup_*)")
    parser.add_argument("--trials", type=int, default=None,
                        help="repeat everything (ours, then TRL) this many times; the summary gives medians, "
                             "ranges and each trial's ratios (default 3 with --k1, else 1)")
    args = parser.parse_args(argv)
    if args.trials is None:
        args.trials = 3 if args.k1 else 1
    for name in ("prompts", "group", "trials"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.pairs < 0:
        parser.error(f"--pairs must be 0 or a positive integer, got {args.pairs}")
    if args.pairs and args.no_trl:
        parser.error("--pairs pairs TRL's steps with ours: it cannot be used with --no-trl")
    args.candidates = (1,) if args.k1 else (1, 4) if args.quick else (1, 8, 32)
    if args.only_candidates:
        args.candidates = tuple(args.only_candidates)
    args.steps = 2 if args.quick else 8
    args.repeats = 1 if args.quick else 3
    args.chunk = 4
    args.trl_steps = args.steps
    rows, summaries = [], []
    for trial in range(args.trials):
        trial_rows, setup = jax_rows(args)
        if not args.no_trl:
            mode, ours_now = fastest_k1(setup["retime_k1"], args.steps)
            trial_rows.append(trl_row(args, setup["domain"], setup["model_cfg"], ours_now))
            if "paired_trl_step_ms" in trial_rows[-1]:
                trial_rows[-1]["paired_ours_mode"] = mode
            time_again_after(setup["retime_k1"], args.steps)
        summaries.append(trial_summary(args, trial_rows))
        if args.trials > 1:
            for row in trial_rows:
                row["trial"] = trial
        rows.extend(trial_rows)
    summary = {name: round(float(statistics.median(s[name] for s in summaries)), 2) for name in summaries[0]}
    if args.trials > 1:
        for name in [n for n in summaries[0] if n.startswith("speedup") or n.startswith("best_batched")]:
            values = [float(s[name]) for s in summaries]
            summary.update({f"{name}_min": min(values), f"{name}_max": max(values), f"{name}_trials": values})
    paired = [r for r in rows if "paired_trl_step_ms" in r]
    if paired:
        summary.update(paired_speedup([r["paired_trl_step_ms"] for r in paired],
                                      [r["paired_ours_step_ms"] for r in paired]))
    summary["process_maxrss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    config = {"devices": len(jax.devices()), "compiler_options": run_options(), "policy": POLICY,
              "levels": DOMAIN["levels"], **library_versions(),
              "max_new_tokens": DOMAIN["max_new_tokens"],
              "prompts_per_step": args.prompts, "group_size": args.group,
              "completions_per_step": args.prompts * args.group, "steps": args.steps, "pairs": args.pairs,
              "candidates": args.candidates, "chunk_size": args.chunk, "trials": args.trials}
    columns = ["trial"] * (args.trials > 1) + ["K", "mode", "chunk", "compile_s", "run_s", "step_ms_per_candidate", "grpo_steps_per_s",
               "tokens_per_s", "exec_mib", "speedup_vs_loop"] + ["step_ms_after_trl", "step_ms_bracketed"] * (not args.no_trl)
    result = report("inner_loop", rows, config=config, summary=summary, columns=columns, out=args.out)
    return result


def library_versions() -> dict:
    """The versions the TRL ratio depends on (TRL's trainer changes speed between releases)."""
    versions = {}
    for name in ("trl", "torch", "transformers"):
        try:
            versions[f"{name}_version"] = __import__(name).__version__
        except ImportError:
            versions[f"{name}_version"] = None
    return versions


if __name__ == "__main__":
    main()
