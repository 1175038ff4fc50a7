"""Policy sampling and GRPO step speed at Qwen2.5 shapes: ours (JAX) vs transformers and TRL.

    python -m benchmarks.bench_math                     # CPU: 0.5B shape, batch 2, prompt 64, response 32
    python -m benchmarks.bench_math --device-report     # accelerator: 0.5B and 1.5B shapes + MFU
    python -m benchmarks.bench_math --device-report --peak-flops=989e12 --device-batch=64

What is timed (median of `--repeats` after one warm-up call; weights random, Qwen2.5 shapes):

* sample   ours: `PolicyFunctions.sample` (jit: prefill + fixed-length scan decode with KV
           cache, temperature 1, full vocabulary), B prompts of Tp tokens, T new tokens;
           transformers: `Qwen2ForCausalLM.generate(do_sample=True, top_k=0, min_new_tokens=T)`
           on the same shapes. Reported as generated tokens per second (B * T / time).
* grpo     ours: `PolicyFunctions.update` (one jit: reward program on host primitive values,
           group advantages, clipped surrogate, backward over prompt + completion, AdamW);
           TRL: `GRPOTrainer.compute_loss` (loss_type "bnpo" = token mean, as ours) +
           backward + AdamW step on the same rollouts. KL is off on both sides (a reference
           forward is outside the step in both implementations).

The CPU run uses float32 everywhere (what both frameworks do best on CPU). `--device-report`
runs our side only (PyTorch here is CPU-only) at bfloat16 compute and float32 or `--param-dtype`
parameters, for each of `--device-shapes`, and adds model-FLOPs utilisation:

    MFU = model FLOPs / time / --peak-flops (default 989e12: H100/H200 dense bf16)

Model FLOPs count matmuls only: per token 2 x (matmul parameters incl. the tied LM head)
plus 4 x layers x heads x head_dim x attended positions for attention scores and values;
sampling = prefill (B x Tp tokens) + decode (B x T tokens attending to the cache); a GRPO
step = 3 x the forward over B x (Tp + T) tokens (forward + backward).
Prints one `RESULT {json}` line and a table (benchmarks/common.py).
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time

import jax
import numpy as np

from benchmarks.common import median_time, report
from derl_jax.expr import compile_expr, parse
from derl_jax.models import transformer as tr
from derl_jax.parallel import make_mesh
from derl_jax.rl.grpo import GRPOConfig
from derl_jax.rl.host_policy import PolicyFunctions
from derl_jax.rl.placement import candidate_slices

SHAPES = {"0.5b": tr.qwen2_5_0_5b, "1.5b": tr.qwen2_5_1_5b, "3b": tr.qwen2_5_3b}
H100_DENSE_BF16 = 989e12
EOS_ID, PAD_ID = 151645, 151643


# ----------------------------------------------------------------------------- FLOPs


def matmul_params(config: tr.ModelConfig) -> int:
    """Parameters that take part in matmuls per token: every projection plus the LM head."""
    d, f, h, k, dh = config.hidden_size, config.intermediate_size, config.num_heads, config.num_kv_heads, config.head_dim
    per_layer = d * h * dh + 2 * d * k * dh + h * dh * d + 3 * d * f
    return config.num_layers * per_layer + config.vocab_size * d


def forward_flops(config: tr.ModelConfig, tokens: int, attended: float) -> float:
    """Matmul FLOPs of a forward over `tokens` tokens that attend to `attended` positions on average."""
    attention = 4 * config.num_layers * config.num_heads * config.head_dim * attended
    return tokens * (2 * matmul_params(config) + attention)


def sampling_flops(config: tr.ModelConfig, batch: int, prompt: int, response: int) -> float:
    prefill = forward_flops(config, batch * prompt, (prompt + 1) / 2)
    decode = forward_flops(config, batch * response, prompt + (response + 1) / 2)
    return prefill + decode


def grpo_step_flops(config: tr.ModelConfig, batch: int, prompt: int, response: int) -> float:
    length = prompt + response
    return 3 * forward_flops(config, batch * length, (length + 1) / 2)


# ----------------------------------------------------------------------------- ours


def inputs(batch: int, prompt: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prompts i32[B, Tp], mask, host primitive values f32[B, 4]) with random tokens below 150000."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, min(vocab, 150_000), (batch, prompt)).astype(np.int32)
    return prompts, np.ones((batch, prompt), bool), rng.integers(0, 2, (batch, 4)).astype(np.float32)


def bench_ours(config: tr.ModelConfig, batch: int, prompt: int, response: int, repeats: int) -> dict:
    """Median seconds of one sampling call and one GRPO update on one device."""
    graphdef, params = tr.init_params(config, jax.random.key(0))
    grpo = GRPOConfig(group_size=2 if batch % 2 == 0 else 1, learning_rate=1e-6, kl_coef=0.0, max_grad_norm=1.0,
                      weight_decay=0.01)
    mesh = candidate_slices(make_mesh(1, 1, 1, devices=jax.devices()[:1]))[0]
    fns = PolicyFunctions(graphdef, mesh, max_new_tokens=response, temperature=1.0, top_k=0, grpo=grpo,
                          eos_id=-1, pad_id=PAD_ID, stop_ids=(-1,))  # never stop: always T tokens, as min_new_tokens
    params = fns.place(params)
    prompts, mask, prims = inputs(batch, prompt, config.vocab_size)
    prompts, mask = fns.rows(prompts), fns.rows(mask)
    key = jax.random.key(1)
    sample_s = median_time(lambda: jax.block_until_ready(fns.sample(params, prompts, mask, key)), repeats=repeats)
    rollout = fns.sample(params, prompts, mask, key)
    program = compile_expr(parse("g1 + 0.5*g2 + 0.1*(g3 + g4)", ("correct", "boxed", "steps", "gold")), num_primitives=4)
    state = {"params": params, "opt": fns.init_optimizer(params)}

    def step():
        state["params"], state["opt"], metrics = fns.update(state["params"], state["opt"], program, prims, 0.5, rollout,
                                                            None, key)
        jax.block_until_ready((state["params"], metrics))

    step_s = median_time(step, repeats=repeats)
    generated = int(np.asarray(rollout.lengths).sum())
    del params, state, rollout, fns
    gc.collect()
    jax.clear_caches()
    return {"sample_s": sample_s, "step_s": step_s, "generated": generated}


# ----------------------------------------------------------------------------- references


def torch_model(config: tr.ModelConfig):
    import torch
    import transformers

    torch.manual_seed(0)
    hf = transformers.Qwen2Config(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads, head_dim=config.head_dim, rope_theta=config.rope_theta,
        tie_word_embeddings=config.tie_embeddings, max_position_embeddings=config.max_position)
    return transformers.Qwen2ForCausalLM(hf)


def bench_transformers_generate(model, batch: int, prompt: int, response: int, repeats: int) -> float:
    import torch

    prompts, mask, _ = inputs(batch, prompt, model.config.vocab_size)
    ids, attention = torch.tensor(prompts, dtype=torch.long), torch.tensor(mask, dtype=torch.long)
    model.eval()

    def generate():
        with torch.no_grad():
            out = model.generate(ids, attention_mask=attention, do_sample=True, top_k=0, temperature=1.0,
                                 max_new_tokens=response, min_new_tokens=response, pad_token_id=PAD_ID,
                                 eos_token_id=EOS_ID)
        if out.shape[1] != prompt + response:
            raise RuntimeError(f"transformers generated {out.shape[1] - prompt} tokens, expected {response}")

    return median_time(generate, repeats=repeats)


def bench_trl_step(model, tokenizer_dir: str, batch: int, prompt: int, response: int, repeats: int) -> float:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    from transformers import AutoTokenizer

    args = TRLConfig(
        output_dir=tempfile.mkdtemp(prefix="bench_math_trl_"), per_device_train_batch_size=batch,
        num_generations=2 if batch % 2 == 0 else 1, max_completion_length=response, beta=0.0, learning_rate=1e-6,
        loss_type="bnpo", report_to=[], use_cpu=True, bf16=False, save_strategy="no", logging_steps=10_000,
        max_grad_norm=1.0, weight_decay=0.01)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["x"] * (2 * batch)}),
                          processing_class=AutoTokenizer.from_pretrained(tokenizer_dir))
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.training_step in a real loop
    prompts, mask, _ = inputs(batch, prompt, model.config.vocab_size)
    rng = np.random.default_rng(2)
    rows = {
        "prompt_ids": torch.tensor(prompts, dtype=torch.long),
        "prompt_mask": torch.tensor(mask, dtype=torch.long),
        "completion_ids": torch.tensor(rng.integers(0, 150_000, (batch, response)), dtype=torch.long),
        "completion_mask": torch.ones(batch, response, dtype=torch.long),
        "advantages": torch.tensor(rng.standard_normal(batch), dtype=torch.float32),
        "old_per_token_logps": torch.full((batch, response), -12.0),
        "num_items_in_batch": torch.tensor(float(batch * response)),
    }
    model.train()

    def step():
        loss = trainer.compute_loss(model, rows)
        loss.backward()
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)

    return median_time(step, repeats=repeats)


# ----------------------------------------------------------------------------- main


def shape_row(name: str, config: tr.ModelConfig, batch: int, prompt: int, response: int, timings: dict,
              peak: float | None) -> dict:
    row = {
        "shape": name, "impl": "derl_jax", "batch": batch, "prompt": prompt, "response": response,
        "params_M": round(tr.count_params(tr.abstract_model(config)[1]) / 1e6, 1),
        "sample_s": timings["sample_s"], "sample_tok_per_s": batch * response / timings["sample_s"],
        "grpo_step_s": timings["step_s"],
    }
    if peak:
        row["sample_mfu"] = sampling_flops(config, batch, prompt, response) / timings["sample_s"] / peak
        row["grpo_mfu"] = grpo_step_flops(config, batch, prompt, response) / timings["step_s"] / peak
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-reference", action="store_true", help="skip transformers / TRL")
    parser.add_argument("--device-report", action="store_true", help="accelerator shapes and MFU (our side only)")
    parser.add_argument("--device-shapes", default="0.5b,1.5b")
    parser.add_argument("--device-batch", type=int, default=64)
    parser.add_argument("--device-prompt", type=int, default=256)
    parser.add_argument("--device-response", type=int, default=256)
    parser.add_argument("--param-dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--peak-flops", type=float, default=H100_DENSE_BF16, help="peak dense FLOP/s of one device")
    args = parser.parse_args()

    rows, summary = [], {}
    if args.device_report:
        for name in [s.strip() for s in args.device_shapes.split(",") if s.strip()]:
            config = SHAPES[name](dtype="bfloat16", param_dtype=args.param_dtype)
            timings = bench_ours(config, args.device_batch, args.device_prompt, args.device_response, args.repeats)
            rows.append(shape_row(name, config, args.device_batch, args.device_prompt, args.device_response, timings,
                                  args.peak_flops))
        report("bench_math device report", rows, config={**vars(args), "backend": jax.default_backend()})
        return

    config = tr.qwen2_5_0_5b(dtype="float32", param_dtype="float32")
    batch, prompt, response = args.batch, args.prompt, args.response
    ours = bench_ours(config, batch, prompt, response, args.repeats)
    rows.append(shape_row("0.5b", config, batch, prompt, response, ours, None))
    if not args.no_reference:
        from derl_jax.models.hf_tokenizer import bundled_qwen_tokenizer_dir

        model = torch_model(config)
        generate_s = bench_transformers_generate(model, batch, prompt, response, args.repeats)
        trl_s = bench_trl_step(model, bundled_qwen_tokenizer_dir(), batch, prompt, response, args.repeats)
        rows.append({"shape": "0.5b", "impl": "transformers/trl", "batch": batch, "prompt": prompt, "response": response,
                     "params_M": rows[0]["params_M"], "sample_s": generate_s,
                     "sample_tok_per_s": batch * response / generate_s, "grpo_step_s": trl_s})
        summary = {
            "sampling speed-up (ours tok/s / transformers tok/s)": rows[0]["sample_tok_per_s"] / rows[1]["sample_tok_per_s"],
            "GRPO step speed-up (TRL s / ours s)": trl_s / ours["step_s"],
        }
    report("bench_math", rows, config={"batch": batch, "prompt": prompt, "response": response, "repeats": args.repeats,
                                       "dtype": "float32", "time": time.strftime("%Y-%m-%d %H:%M")}, summary=summary)


if __name__ == "__main__":
    main()
