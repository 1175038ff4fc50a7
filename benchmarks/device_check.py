"""One accelerator check: MFU of sampling and of a GRPO step, batched candidates against a
loop, and the planner's predicted memory against the measured peak. Writes one JSON file.

    benchmarks/device_check.sh out.json            # one GPU/TPU, under 8 minutes
    python -m benchmarks.device_check --tiny --out=out.json --peak-flops=1e12   # CPU, tiny shapes

Sections (random weights, bf16 compute, f32 parameters, every row decodes all T tokens):

* memory      (run first, so the allocator's peak belongs to it) the planner's pieces for one
              candidate (`derl_jax.plan.compiled.compile_pieces`: `sample`, then the GRPO
              `update`) compiled on this device and run on real arrays. predicted = largest
              argument + output + temp - aliased bytes of the two executables (the compiler's
              memory analysis); measured = `memory_stats()["peak_bytes_in_use"]` where the
              backend keeps one (GPU, TPU). On CPU, where it does not, the bytes of the live
              arrays while `sample` runs (arguments + outputs) against the compiler's
              argument + output bytes.
* mfu         per policy shape (0.5B and 1.5B; --tiny: a tiny one): one `sample` call and
              one GRPO optimizer step; model FLOPs from `derl_jax.plan.analytic` (matmuls
              only), MFU = FLOPs / time / the device's peak bf16 rate (roofline table, or
              --peak-flops; null when neither knows it).
* candidates  one inner step (sample -> reward -> group advantages -> GRPO update) of K
              candidates of a small policy: one jitted `vmap` over K against a Python loop of
              one jitted candidate step; ms per candidate-step both ways.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import machine, median_time, table
from derl_jax.models import transformer as tr
from derl_jax.plan import analytic, compiled, roofline
from derl_jax.plan.analytic import RunShape
from derl_jax.rl.grpo import group_advantages, make_optimizer

DEVICE_KINDS = (("h200", "h200"), ("h100", "h100"), ("a100", "a100"), ("v5 lite", "v5e"), ("v5e", "v5e"),
                ("v5p", "v5p"))


def settings(tiny: bool) -> dict:
    """Shapes of each section; --tiny keeps a CPU run to a few seconds per piece."""
    if tiny:
        small = dict(num_layers=1, num_heads=2, num_kv_heads=1)
        return {
            "mfu_models": {"tiny": tr.tiny_config(256, hidden_size=64, intermediate_size=128, **small)},
            "mfu": dict(prompts_per_step=2, group_size=2, prompt_tokens=8, new_tokens=8),
            "memory": dict(prompts_per_step=2, group_size=2, prompt_tokens=8, new_tokens=8),
            "memory_model": tr.tiny_config(256, hidden_size=64, intermediate_size=128, **small),
            "candidates": (1, 4),
            "candidate_model": tr.tiny_config(64, hidden_size=32, intermediate_size=64, **small),
            "candidate_shape": dict(prompts_per_step=2, group_size=2, prompt_tokens=6, new_tokens=6),
            "repeats": 2,
        }
    bf16 = dict(dtype="bfloat16", param_dtype="float32")
    return {
        "mfu_models": {"0.5b": tr.qwen2_5_0_5b(**bf16), "1.5b": tr.qwen2_5_1_5b(**bf16)},
        "mfu": dict(prompts_per_step=16, group_size=4, prompt_tokens=128, new_tokens=128),
        "memory": dict(prompts_per_step=8, group_size=4, prompt_tokens=128, new_tokens=128),
        "memory_model": tr.qwen2_5_0_5b(**bf16),
        "candidates": (1, 8, 32),
        "candidate_model": tr.tiny_config(64, hidden_size=128, intermediate_size=384, num_layers=2, **bf16),
        "candidate_shape": dict(prompts_per_step=8, group_size=4, prompt_tokens=16, new_tokens=28),
        "repeats": 3,
    }


def device_peak(override: float | None) -> tuple[str, float | None]:
    device = jax.devices()[0]
    kind = str(getattr(device, "device_kind", device.platform))
    if override:
        return kind, float(override)
    for needle, key in DEVICE_KINDS:
        if needle in kind.lower():
            return kind, roofline.ACCELERATORS[key].peak_flops
    return kind, None


def random_prompts(shape: RunShape, seed: int = 0) -> tuple[jax.Array, jax.Array]:
    """(prompts i32[N, Tp], mask bool[N, Tp]): B random prompts, each repeated G times."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, shape.model.vocab_size, (shape.prompts_per_step, shape.prompt_tokens))
    prompts = np.repeat(prompts.astype(np.int32), shape.group_size, axis=0)
    return jnp.asarray(prompts), jnp.ones(prompts.shape, bool)


def update_batch(shape: RunShape, prompts, mask, tokens, logp, completion_mask, advantages) -> dict:
    return {"prompts": prompts, "prompt_mask": mask, "completions": tokens, "mask": completion_mask,
            "old_logp": logp, "advantages": advantages}


def stack(tree, count: int):
    return jax.tree_util.tree_map(lambda x: jnp.broadcast_to(x, (count, *x.shape)), tree)


# ----------------------------------------------------------------------------- sections


def check_memory(model: tr.ModelConfig, sizes: dict) -> dict:
    shape = RunShape(model, num_candidates=1, **sizes)
    pieces = compiled.compile_pieces(shape)
    predicted = {name: compiled.memory_stats(piece) for name, piece in pieces.items()}
    params = stack(tr.init_params(model, jax.random.key(0))[1], 1)
    opt_state = jax.vmap(make_optimizer(compiled.grpo_config(shape)).init)(params)
    prompts, mask = random_prompts(shape)
    keys = jax.random.split(jax.random.key(1), 1)
    prompts, mask = prompts[None], mask[None]
    tokens, logp, completion_mask = jax.block_until_ready(pieces["sample"](params, prompts, mask, keys))
    live_during_sample = sum(a.nbytes for a in jax.live_arrays())
    advantages = jnp.asarray(np.random.default_rng(2).normal(size=(1, shape.rollouts)), jnp.float32)
    batch = update_batch(shape, prompts, mask, tokens, logp, completion_mask, advantages)
    params, opt_state, metrics = jax.block_until_ready(pieces["update"](params, opt_state, batch, keys))
    stats = jax.devices()[0].memory_stats() or {}
    out = {"shape": {"vocab_size": model.vocab_size, "hidden_size": model.hidden_size, "layers": model.num_layers,
                     **sizes},
           "predicted": predicted,
           "predicted_peak_bytes": (max(p["peak_bytes"] for p in predicted.values())
                                    if all(predicted.values()) else None),
           "analytic_peak_bytes": analytic.peak_bytes_estimate(shape),
           "loss_finite": bool(np.isfinite(np.asarray(metrics["loss"])).all())}
    if "peak_bytes_in_use" in stats:
        out.update(measured_source="memory_stats", measured_peak_bytes=int(stats["peak_bytes_in_use"]))
        if out["predicted_peak_bytes"]:
            out["measured_over_predicted"] = out["measured_peak_bytes"] / out["predicted_peak_bytes"]
    else:  # live while sampling: the sample executable's arguments and outputs, and the optimizer state
        expected = (predicted["sample"]["argument_bytes"] + predicted["sample"]["output_bytes"]
                    + analytic.optimizer_bytes(model, shape.optimizer))
        out.update(measured_source="live_arrays", measured_live_bytes=int(live_during_sample),
                   predicted_live_bytes=expected, measured_over_predicted=live_during_sample / expected)
    return out


def check_mfu(name: str, model: tr.ModelConfig, sizes: dict, peak: float | None, repeats: int) -> dict:
    shape = RunShape(model, num_candidates=1, **sizes)
    graphdef, params = tr.init_params(model, jax.random.key(0))
    fns = compiled.candidate_functions(shape, graphdef)
    sample = jax.jit(fns["sample"])
    update = jax.jit(fns["update"], donate_argnums=(0, 1))
    prompts, mask = random_prompts(shape)
    key = jax.random.key(1)
    sample_s = median_time(lambda: jax.block_until_ready(sample(params, prompts, mask, key)), repeats=repeats)
    tokens, logp, completion_mask = sample(params, prompts, mask, key)
    advantages = jnp.asarray(np.random.default_rng(2).normal(size=shape.rollouts), jnp.float32)
    batch = update_batch(shape, prompts, mask, tokens, logp, completion_mask, advantages)
    state = {"params": params, "opt": make_optimizer(compiled.grpo_config(shape)).init(params)}

    def step():
        state["params"], state["opt"], metrics = update(state["params"], state["opt"], batch, key)
        jax.block_until_ready(metrics)

    step_s = median_time(step, repeats=repeats)
    sample_flops, step_flops = analytic.sampling_flops(shape), analytic.update_step_flops(shape)
    mfu = (lambda flops, seconds: flops / seconds / peak if peak else None)
    return {"shape": name, "params": analytic.param_count(model), "rows": shape.rollouts,
            "prompt_tokens": shape.prompt_tokens, "new_tokens": shape.new_tokens,
            "sample_s": sample_s, "sample_flops": sample_flops,
            "sample_tokens_per_s": shape.rollouts * shape.new_tokens / sample_s,
            "sample_mfu": mfu(sample_flops, sample_s),
            "grpo_step_s": step_s, "grpo_step_flops": step_flops, "grpo_mfu": mfu(step_flops, step_s)}


def check_candidates(model: tr.ModelConfig, sizes: dict, counts: tuple[int, ...], repeats: int) -> list[dict]:
    shape = RunShape(model, num_candidates=1, **sizes)
    graphdef, params = tr.init_params(model, jax.random.key(0))
    fns = compiled.candidate_functions(shape, graphdef)
    optimizer = make_optimizer(compiled.grpo_config(shape))
    prompts, mask = random_prompts(shape)

    def inner_step(params, opt_state, key):
        tokens, logp, completion_mask = fns["sample"](params, prompts, mask, key)
        rewards = jnp.mean(((tokens % 2) == 0) & completion_mask, axis=1, dtype=jnp.float32)
        advantages = group_advantages(rewards, shape.group_size)
        batch = update_batch(shape, prompts, mask, tokens, logp, completion_mask, advantages)
        params, opt_state, metrics = fns["update"](params, opt_state, batch, key)
        return params, opt_state, metrics["loss"]

    one = jax.jit(inner_step)
    batched = jax.jit(jax.vmap(inner_step))
    opt_state = optimizer.init(params)
    rows = []
    for count in counts:
        keys = jax.random.split(jax.random.key(3), count)
        stacked_params, stacked_opt = stack(params, count), stack(opt_state, count)
        batched_s = median_time(lambda: jax.block_until_ready(batched(stacked_params, stacked_opt, keys)),
                                repeats=repeats)
        loop_s = median_time(lambda: jax.block_until_ready([one(params, opt_state, keys[k]) for k in range(count)]),
                             repeats=repeats)
        rows.append({"K": count, "batched_ms_per_candidate_step": 1e3 * batched_s / count,
                     "loop_ms_per_candidate_step": 1e3 * loop_s / count, "batched_speedup": loop_s / batched_s})
    return rows


def run(tiny: bool, peak_override: float | None = None, save=lambda result: None) -> dict:
    """All sections; `save(result)` after each one (a run cut short by its time limit still
    leaves what it measured, with "complete": false)."""
    start = time.perf_counter()
    config = settings(tiny)
    kind, peak = device_peak(peak_override)
    result = {"tiny": tiny, "device": {"platform": jax.default_backend(), "kind": kind, "peak_flops": peak},
              "machine": machine(), "complete": False}
    result["memory"] = check_memory(config["memory_model"], config["memory"])
    save(result)
    result["mfu"] = []
    for name, model in config["mfu_models"].items():
        result["mfu"].append(check_mfu(name, model, config["mfu"], peak, config["repeats"]))
        save(result)
    result["candidates"] = check_candidates(config["candidate_model"], config["candidate_shape"],
                                            config["candidates"], config["repeats"])
    result.update(wall_s=time.perf_counter() - start, complete=True)
    save(result)
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="device_check.json")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (CPU, tests)")
    parser.add_argument("--peak-flops", type=float, default=None, help="override the device's peak FLOP/s")
    args = parser.parse_args(argv)
    def save(result):
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=1)

    result = run(args.tiny, args.peak_flops, save)
    print(table(result["mfu"], ["shape", "sample_s", "sample_mfu", "grpo_step_s", "grpo_mfu"]))
    print(table(result["candidates"]))
    memory = result["memory"]
    print(f"memory: predicted peak {memory['predicted_peak_bytes']}, measured ({memory['measured_source']}) "
          f"ratio {memory.get('measured_over_predicted')}; wall {result['wall_s']:.1f} s -> {args.out}")
    return result


if __name__ == "__main__":
    main()
