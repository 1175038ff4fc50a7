"""The plan of a run: per device memory, FLOPs, roofline step time and fit, as a table and JSON.

    python -m derl_jax.plan.report --preset=math_3b --devices=8 --accelerator=h100
    python -m derl_jax.plan.report --preset=agent_1_5b --devices=64 --accelerator=h200 --json=plan.json
    python -m derl_jax.plan.report --preset=math_3b --devices=8 --compile   # + the compiler's figures

From a run config (what `launch/run.py --mode=plan` calls):

    plan_from_config(cfg, accelerators=("h100",), compile=False, domain=None) -> {"plans": [...], "table": str}

Memory figures are per device in bytes: params (starting policy + the device's trained
copies), optimizer state, gradients and KV cache from `analytic`; activations/temporaries
from the compiler's memory analysis when compiled (largest `temp` over the pieces), else the
analytic estimate. The peak is the compiler's (largest argument + output + temp - aliased
over the pieces, plus trained copies beyond the chunk in flight) or the analytic one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any, Sequence

from derl_jax.models import transformer as tr
from derl_jax.plan import analytic, roofline
from derl_jax.plan.analytic import RunShape

# The paper's settings. MATH: Qwen2.5-3B, group 5, 64 prompts, 512 + 512 tokens, 4 minibatches,
# KL 0.001 (a reference forward), remat, n = 8 candidates. Agent (ALFWorld/ScienceWorld):
# Qwen2.5-1.5B-Instruct, 16 tasks x group 8, 50 turns, 1024-token turn prompts (task + recent
# history), 128-token actions, 8 minibatches, n = 8.
PRESETS = {
    "math_3b": lambda: RunShape(tr.qwen2_5_3b(dtype="bfloat16", remat=True), num_candidates=8,
                                prompts_per_step=64, group_size=5, prompt_tokens=512, new_tokens=512,
                                minibatches=4, reference=True),
    "agent_1_5b": lambda: RunShape(tr.qwen2_5_1_5b(dtype="bfloat16", remat=True), num_candidates=8,
                                   prompts_per_step=16, group_size=8, prompt_tokens=1024, new_tokens=128,
                                   minibatches=8, reference=True, turns=50),
}


def gib(value: float) -> str:
    """GiB with one decimal; below 0.1 GiB, MiB."""
    if value < 0.1 * (1 << 30):
        return f"{value / (1 << 20):.2f} MiB"
    return f"{value / (1 << 30):.1f}"


def plan(shape: RunShape, device: str | roofline.Accelerator, compiled: dict | None = None) -> dict[str, Any]:
    """The plan of `shape` on `device` (an `Accelerator` or its key); `compiled` is
    `derl_jax.plan.compiled.compiled_plan(shape)` when available."""
    spec = roofline.accelerator(device)
    sizes = analytic.per_device(shape)
    flops = analytic.per_device_flops(shape)
    peak = analytic.peak_bytes_estimate(shape)
    activations, source = sizes["activations"], "analytic"
    memory = (compiled or {}).get("memory") or {}
    if memory and all(memory.values()):
        one_policy = analytic.param_bytes(shape.model, shape.mesh[2])
        cand = shape.mesh[0]
        local = analytic.padded_candidates(shape) // cand
        in_flight = max(min(shape.in_flight, analytic.padded_candidates(shape)) // cand, 1)
        activations = max(piece["temp_bytes"] for piece in memory.values())
        peak = max(piece["peak_bytes"] for piece in memory.values()) + (local - in_flight + 1) * one_policy
        source = "compiled"
    times = roofline.roofline_seconds(flops, analytic.hbm_bytes_estimate(shape), spec)
    fit = roofline.fits(peak, spec)
    result = {
        "accelerator": spec.name, "devices": shape.num_devices, "mesh": list(shape.mesh),
        "chunk_size": shape.chunk_size, "num_candidates": shape.num_candidates, "minibatches": shape.minibatches,
        "params_bytes": sizes["params"], "optimizer_bytes": sizes["optimizer"],
        "gradients_bytes": sizes["gradients"], "kv_cache_bytes": sizes["kv_cache"],
        "activations_bytes": activations, "peak_bytes": peak, "memory_source": source,
        "device_memory_bytes": spec.memory, "fits": fit,
        "flops_per_device": flops, "roofline_seconds": times,
    }
    flop_pieces = (compiled or {}).get("flops") or {}
    if flop_pieces.get("step"):
        total = analytic.step_flops(shape)["total"]
        result["compiled_flops_ratio"] = flop_pieces["step"]["total"] / total if total else 1.0
    if not fit:
        result["suggestion"] = roofline.suggest(shape, spec)
    return result


def suggestion_text(suggestion: dict | None) -> str:
    if suggestion is None:
        return "nothing up to 1024 devices"
    cand, data, model = suggestion["mesh"]
    chunk = f", chunk_size={suggestion['chunk_size']}" if suggestion["chunk_size"] else ""
    return (f"{suggestion['devices']} devices, mesh cand={cand} data={data} model={model}{chunk}, "
            f"minibatches={suggestion['minibatches']}")


def format_table(plans: Sequence[dict], title: str = "") -> str:
    """A Markdown table of plans: GiB per device (usable = 90% of the device's memory), TFLOP
    per device per step, chunk = candidates trained at once."""
    header = ("| accelerator | devices | mesh (cand, data, model) | chunk | minibatches | params | optimizer | "
              "grads | KV cache | activations/temps | peak / usable | TFLOP/step | roofline step (s) | fits? |")
    lines = ([f"**{title}**", ""] if title else []) + [header, "|" + "---|" * 14]
    for p in plans:
        fit = "yes" if p["fits"] else f"no: {suggestion_text(p.get('suggestion'))}"
        lines.append(
            f"| {p['accelerator']} | {p['devices']} | {tuple(p['mesh'])} | {p['chunk_size'] or p['num_candidates']} | "
            f"{p['minibatches']} | "
            f"{gib(p['params_bytes'])} | "
            f"{gib(p['optimizer_bytes'])} | {gib(p['gradients_bytes'])} | {gib(p['kv_cache_bytes'])} | "
            f"{gib(p['activations_bytes'])} | {gib(p['peak_bytes'])} / "
            f"{gib(roofline.USABLE_MEMORY_FRACTION * p['device_memory_bytes'])} | "
            f"{p['flops_per_device']['total'] / 1e12:.1f} | {p['roofline_seconds']['step']:.2f} | {fit} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- from a run config


def _field(cfg: Any, dotted: str, default: Any = None) -> Any:
    node = cfg
    for part in dotted.split("."):
        if node is None or part not in node:
            return default
        node = node[part]
    return node


def model_config_from_run(cfg: Any, vocab_size: int | None = None) -> tr.ModelConfig:
    """The policy's ModelConfig: its checkpoint's config.json when the directory exists, else
    the `policy.*` sizes (with `policy.vocab_size`, or `vocab_size`: the domain tokenizer's)."""
    from derl_jax.models import hf

    compute = _field(cfg, "policy.compute_dtype") or "bfloat16"
    param_dtype = _field(cfg, "policy.param_dtype") or "float32"
    remat = bool(_field(cfg, "policy.remat", False))
    checkpoint = _field(cfg, "policy.checkpoint") or ""
    if checkpoint and os.path.isdir(os.path.expanduser(checkpoint)):
        return hf.config_from_hf(hf.read_hf_config(os.path.expanduser(checkpoint)), param_dtype=param_dtype,
                                 compute_dtype=compute, remat=remat)
    sizes = {name: _field(cfg, f"policy.{name}") for name in
             ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")}
    sizes["vocab_size"] = sizes["vocab_size"] or vocab_size
    missing = [name for name, value in sizes.items() if value is None]
    if missing:
        raise ValueError(f"plan: policy.{missing[0]} is not set and policy.checkpoint {checkpoint!r} is not a "
                         f"directory to read it from")
    return tr.ModelConfig(**{k: int(v) for k, v in sizes.items()}, dtype=compute, param_dtype=param_dtype,
                          remat=remat)


def shape_from_config(cfg: Any, model: tr.ModelConfig | None = None, *, domain: Any = None) -> RunShape:
    """The RunShape of a run config (policy.*, inner.*, domain.max_new_tokens /
    max_prompt_tokens, outer.num_candidates, mesh.*; a -1 mesh size counts as 1). A built
    `domain` supplies what the config leaves to it: the tokenizer's vocabulary, the prompt
    length, and for multi-turn domains the episode length."""
    prompt = _field(cfg, "domain.max_prompt_tokens") or (domain.prompt_length if domain is not None else None)
    if prompt is None:
        raise ValueError("plan: domain.max_prompt_tokens is not set (and no domain was built to read it from)")
    vocab = domain.tokenizer.vocab_size if domain is not None else None
    new_tokens = domain.max_new_tokens if domain is not None else _field(cfg, "domain.max_new_tokens", 16)
    turns = int(getattr(domain.env, "max_turns", 1)) if domain is not None and domain.rollout == "env" else 1
    mesh = tuple(max(int(_field(cfg, f"mesh.{axis}", 1)), 1) for axis in ("cand", "data", "model"))
    return RunShape(
        model or model_config_from_run(cfg, vocab), num_candidates=int(_field(cfg, "outer.num_candidates", 1)),
        prompts_per_step=int(_field(cfg, "inner.prompts_per_step", 1)),
        group_size=int(_field(cfg, "inner.group_size", 1)), prompt_tokens=int(prompt), new_tokens=int(new_tokens),
        minibatches=int(_field(cfg, "inner.minibatches", 1)), epochs=int(_field(cfg, "inner.epochs", 1)),
        reference=float(_field(cfg, "inner.kl", 0.0) or 0.0) > 0, chunk_size=int(_field(cfg, "inner.chunk_size", 0)),
        mesh=mesh, turns=turns)


def plan_from_config(cfg: Any, accelerators: Sequence[str] = ("h100", "h200"), compile: bool = False,
                     domain: Any = None) -> dict:
    """{"shape": RunShape as a dict, "plans": [plan per accelerator], "table": Markdown}.
    With `compile`, the pieces are compiled in a subprocess on prod(mesh) fake CPU devices.
    What `launch/run.py --mode=plan` prints."""
    from derl_jax.plan import compiled as compiled_lib

    shape = shape_from_config(cfg, domain=domain)
    compiled = compiled_lib.plan_in_subprocess(shape) if compile else None
    plans = [plan(shape, name, compiled) for name in accelerators]
    return {"shape": json.loads(compiled_lib.shape_to_json(shape)), "plans": plans,
            "compiled": compiled, "table": format_table(plans)}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--devices", type=int, nargs="+", default=[8])
    parser.add_argument("--accelerator", nargs="+", default=["h100", "h200"])
    parser.add_argument("--mesh", type=int, nargs=3, metavar=("CAND", "DATA", "MODEL"),
                        help="default: the first layout that fits (roofline.suggest), minibatches raised if needed")
    parser.add_argument("--compile", action="store_true", help="compile the pieces on fake CPU devices")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    from derl_jax.plan import compiled as compiled_lib

    plans, compiled_by_mesh = [], {}
    for count in args.devices:
        for name in args.accelerator:
            shape = PRESETS[args.preset]()
            if args.mesh:
                shape = shape.replace(mesh=tuple(args.mesh))
            else:
                choice = roofline.suggest(shape.replace(mesh=(count, 1, 1)), roofline.accelerator(name),
                                          max_devices=count)
                if choice and choice["devices"] == count:
                    shape = shape.replace(mesh=tuple(choice["mesh"]), chunk_size=choice["chunk_size"],
                                          minibatches=choice["minibatches"])
                else:  # shown as it is, with the suggestion
                    cand = math.gcd(count, shape.num_candidates)
                    shape = shape.replace(mesh=(cand, 1, count // cand))
            key = (shape.mesh, shape.chunk_size, shape.minibatches)
            if args.compile and key not in compiled_by_mesh:
                compiled_by_mesh[key] = compiled_lib.plan_in_subprocess(shape, with_flops=False)
            plans.append(plan(shape, name, compiled_by_mesh.get(key)))
    table = format_table(plans, args.preset)
    print(table)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"preset": args.preset, "plans": plans}, handle, indent=1)
    return {"plans": plans, "table": table}


if __name__ == "__main__":
    main()
