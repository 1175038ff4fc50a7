"""The cold start of a pretrained policy in the agent prompt: the share of its greedy answers on
held-out games that are well-formed and name an admissible action, before and after.

    python benchmarks/cold_start_share.py --seeds 0 1 2 --out benchmarks/results/cold_start_share.json

`--domain` picks the JAX household (the default) or a real engine (`alfworld`: generated
games; `scienceworld`: the task's variations), whose `tiny` preset runs with the checkpoint in
the agent prompt; on an engine the shares are read from the environment's answer counts during
the greedy test pass of a run (`evaluator.accuracy`). `--passes` K plays the training games K
times, each pass with its own detours (more turns, the same games). On ALFWorld `--expert` picks
the corpus's expert (`policy.sft_expert`; search, the presets', by default).

The policy is a tiny random Qwen2 over the Qwen2.5 tokenizer's vocabulary (or over --tokenizer's,
a directory such as the compact one of tests/compact_tokenizer.py) written by `transformers`
(`write_checkpoint`, sized by --layers, --hidden, --heads, --kv-heads) and loaded as a run loads a checkpoint (`models.hf`). The cold
start is `rl.sft`'s on the domain's corpus (`Domain.corpus`: the perturbed expert's turns in the
agent prompt) with the training games' last --num-val rows held out of it as validation games;
the test games (the domain's test split) never reach it. It trains as `train_sft` does
(`sft.sft_step`: the same optimizer, schedule and batches, in one scan per --eval-every
steps) so that the shares can be read along the run: at every checkpoint the greedy shares over every turn of the
validation and the test episodes (`answer_shares`, the slow test's measure). The reported
"after" share is the final checkpoint's; `selected` is the test share of the checkpoint with
the best validation share (chosen on validation games only). Rows per (seed, checkpoint); the
summary gives mean and per-seed figures. A model/SFT seed makes the checkpoint's weights, the
corpus's detours and the batch order.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import resource
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import report  # noqa: E402
from derl_jax.experiment.runtime import commit_of  # noqa: E402

QWEN_VOCAB = 151936


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def household_domain(args):
    from derl_jax.domains.household.domain import make_household_domain
    from derl_jax.models.hf_tokenizer import bundled_qwen_tokenizer_dir

    block = ml_collections.ConfigDict({
        "kind": "household", "level": args.level, "seed": 0, "num_train": args.num_train + args.num_val,
        "num_test": args.num_test, "held_out_kinds": (4, 5), "max_turns": args.max_turns, "history": "window",
        "window": args.window, "answer_length": 48, "obs_length": 96, "admissible_length": 192})
    return make_household_domain(block, args.tokenizer or bundled_qwen_tokenizer_dir())


def engine_config(args, checkpoint: str = "") -> ml_collections.ConfigDict:
    """The `tiny` preset of ALFWorld (generated games) or ScienceWorld with the agent prompt over
    the tokenizer, at the benchmark's sizes; `checkpoint` is the policy's directory (no cold
    start in the run: this script runs it)."""
    import importlib

    from derl_jax.models.hf_tokenizer import bundled_qwen_tokenizer_dir

    cfg = importlib.import_module(f"configs.{args.domain}").get_config("tiny")
    sizes = {"num_train": args.num_train + args.num_val, "num_test": args.num_test, "max_turns": args.max_turns,
             "history": args.window, "obs_length": 96, "action_length": 48, "admissible_length": 192}
    cfg.domain.update(**sizes, **({"num_workers": 0} if args.domain == "alfworld" else {}))
    cfg.policy.update(checkpoint=checkpoint, tokenizer=args.tokenizer or bundled_qwen_tokenizer_dir(), sft_steps=0,
                      param_dtype="float32", compute_dtype="float32")
    cfg.inner.eval_batch_size = 64
    return cfg


def engine_domain(args):
    from derl_jax.experiment import build

    return build.build_domain(engine_config(args))


def write_checkpoint(path: str, *, hidden: int, layers: int, heads: int, kv_heads: int, seed: int,
                     vocab_size: int = QWEN_VOCAB) -> str:
    """A tiny random Qwen2 over `vocab_size` tokens (Qwen's vocabulary unless told), saved by
    transformers -> its directory."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads, max_position_embeddings=2048,
                                      tie_word_embeddings=True)
    transformers.Qwen2ForCausalLM(config).save_pretrained(path)
    return path


def count_answers(domain, record: list | None) -> None:
    """Gives the domain's environment fresh answer counts; with `record`, each answer the
    environment reads also appends [action, whether it was well-formed and admissible] to it."""
    from derl_jax.domains import agent_prompt as AP

    domain.env.counts = AP.AnswerCounts()
    if record is not None:
        add = domain.env.counts.add

        def recording(answer, admissible):
            record.append([answer.action, bool(answer.well_formed and admissible and answer.action in admissible)])
            add(answer, admissible)

        domain.env.counts.add = recording


def answer_shares(domain, split, params, graphdef, record: list | None = None, *, greedy: bool = True,
                  key: int = 1) -> dict[str, float]:
    """Greedy shares of well-formed answers and of well-formed answers naming an admissible action
    over every turn of `split`'s episodes (also the measure of tests/test_cold_start.py);
    with `record`, each answer's action and whether it was admissible are appended to it.
    `greedy=False`: the same over answers sampled at temperature 1 (as RL's rollouts are) with
    `jax.random.key(key)`."""
    from derl_jax.rl import rollout as R
    from derl_jax.rl.config import InnerConfig
    from derl_jax.rl.grpo import GRPOConfig

    cfg = InnerConfig(steps=1, prompts_per_step=1, group_size=1, max_new_tokens=domain.max_new_tokens,
                      temperature=1.0, eval_batch_size=split.size, grpo=GRPOConfig(learning_rate=1e-3),
                      kl_metric=False)
    count_answers(domain, record)
    run = jax.jit(R.device_rollout(domain, graphdef, cfg).fn, static_argnums=3)
    jax.block_until_ready(run(params, split, jax.random.key(key), greedy))
    return domain.env.counts.shares()


def engine_answer_shares(domain, evaluator, split, params, record: list | None = None) -> dict[str, float]:
    """`answer_shares` on an engine domain: the greedy test pass of a run (`evaluator.accuracy`),
    read through the environment's answer counts."""
    count_answers(domain, record)
    evaluator.accuracy(params, split)
    return domain.env.counts.shares()


LOOK_WORDS = ("look", "inventory", "examine", "help")


def beyond_look(record: list) -> float:
    """Share of the recorded answers ([action, admissible] pairs) that name an admissible action
    other than a look, inventory, examine or help (the engines' harmless detours, always admissible)."""
    hits = [ok and (action.split() or [""])[0] not in LOOK_WORDS for action, ok in record]
    return sum(hits) / max(len(hits), 1)


def segment_fn(graphdef, cfg, data):
    """A jitted run of `count` steps of `sft.train_sft` from step `start` (same optimizer, schedule
    and batch draws), so a run cut into segments ends where one scan of `cfg.steps` would."""
    from derl_jax.rl import sft

    optimizer = sft.sft_optimizer(cfg)
    step = sft.sft_step(graphdef, data, jax.random.key(cfg.seed + 1), cfg, optimizer)

    def run(params, opt_state, start, count):
        (params, opt_state), losses = jax.lax.scan(step, (params, opt_state), start + jnp.arange(count))
        return params, opt_state, losses

    return jax.jit(run, static_argnums=3), optimizer


def measure_seed(domain, validation, args, seed: int, workdir: str) -> list[dict]:
    """One seed's rows: the shares before the cold start and at each checkpoint (module docstring)."""
    from derl_jax.models import hf
    from derl_jax.rl import sft

    start_cpu, start_wall = cpu_seconds(), time.perf_counter()
    path = write_checkpoint(os.path.join(workdir, f"ckpt_{seed}"), hidden=args.hidden, layers=args.layers,
                            heads=args.heads, kv_heads=args.kv_heads, seed=seed,
                            vocab_size=domain.tokenizer.vocab_size if args.tokenizer else QWEN_VOCAB)
    if args.domain == "household":
        _, graphdef, params = hf.load_hf_model(path, "float32", compute_dtype="float32")

        def measure(split, params, record):
            return answer_shares(domain, split, params, graphdef, record)
    else:
        from derl_jax.experiment import build

        params, evaluator = build.build_inner(domain, engine_config(args, path), os.path.join(workdir, f"run_{seed}"))
        graphdef = evaluator.graphdef

        def measure(split, params, record):
            return engine_answer_shares(domain, evaluator, split, params, record)
    policy = ml_collections.ConfigDict({"sft_steps": args.steps, "sft_lr": args.lr, "sft_batch_size": args.batch,
                                        "sft_perturb_rate": args.perturb, "sft_expert": args.expert})
    cfg = dataclasses.replace(sft.sft_config_from(policy, seed), final_lr_fraction=args.final_lr_fraction)
    holdout = list(range(args.num_train, args.num_train + args.num_val))
    # every pass plays the training games again with its own detours (pass 0 is the run's own corpus)
    corpus = [pair for k in range(args.passes) for pair in sft.domain_corpus(domain, seed + 1000 * k, holdout, policy)]
    data = sft.trim_padding(sft.encode_corpus(domain.tokenizer, corpus, int(domain.prompt_length),
                                              int(domain.max_new_tokens)))
    run, optimizer = segment_fn(graphdef, cfg, data)
    opt_state = optimizer.init(params)

    def shares(step: int, losses) -> dict:
        row = {"seed": seed, "step": step, "corpus_turns": data.size,
               "loss": float(np.mean(losses)) if losses is not None else None}
        for name, split in (("validation", validation), ("test", domain.test)):
            if split is None:
                continue
            record = [] if name == "test" and step == args.steps else None
            got = measure(split, params, record)
            if record is not None:
                row["test_answers"] = record[: args.show]
                row["test_failed_answers"] = [action for action, ok in record if not ok][: args.show]
                row["test_admissible_beyond_look"] = beyond_look(record)
                actions = collections.Counter(action for action, _ in record)
                row["test_distinct_actions"] = len(actions)
                row["test_top_action"] = actions.most_common(1)[0] if actions else None
            row[f"{name}_well_formed"], row[f"{name}_admissible"] = got["well_formed"], got["admissible"]
        if args.sampled and args.domain == "household":
            record = []
            got = answer_shares(domain, domain.test, params, graphdef, record, greedy=False)
            row["test_sampled_admissible"] = got["admissible"]
            row["test_sampled_distinct_actions"] = len({action for action, _ in record})
        return row

    rows = [shares(0, None)]
    every = args.eval_every or args.steps
    done = 0
    while done < args.steps:
        count = min(every, args.steps - done)
        params, opt_state, losses = run(params, opt_state, done, count)
        done += count
        rows.append(shares(done, np.asarray(losses)))
        print(json.dumps({**rows[-1], "elapsed_s": round(time.perf_counter() - start_wall, 1)}), flush=True)
    for row in rows:
        row["cpu_s"] = round(cpu_seconds() - start_cpu, 1)
        row["wall_s"] = round(time.perf_counter() - start_wall, 1)
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domain", default="household", choices=["household", "alfworld", "scienceworld"])
    parser.add_argument("--level", default="L0")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--num-train", type=int, default=40, help="training games the corpus is played on")
    parser.add_argument("--num-val", type=int, default=8, help="training games held out as validation games")
    parser.add_argument("--num-test", type=int, default=16)
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--tokenizer", default="", help="tokenizer directory (default: the bundled Qwen2.5 one)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--perturb", type=float, default=0.1)
    parser.add_argument("--final-lr-fraction", type=float, default=0.1)
    parser.add_argument("--sampled", action="store_true",
                        help="household: also the test shares of answers sampled at temperature 1")
    parser.add_argument("--expert", default="search", choices=["planner", "search"],
                        help="alfworld: the corpus's expert (policy.sft_expert, the presets' search by default: "
                             "the task's object looked for at the admissible list's places in order, then the "
                             "planner; planner: the planner's plan, which goes straight to the object)")
    parser.add_argument("--passes", type=int, default=1,
                        help="the corpus plays the training games this many times, each with its own detours")
    parser.add_argument("--eval-every", type=int, default=0, help="measure every this many steps (0: at the end)")
    parser.add_argument("--show", type=int, default=24,
                        help="test answers (action, admissible) and failed answers kept per seed at the end")
    parser.add_argument("--out", default=None, help="also write the result JSON here")
    args = parser.parse_args(argv)
    # read before the engines load: ALFWorld's loader rewrites sys.argv
    command = "python benchmarks/cold_start_share.py " + " ".join(argv if argv is not None else sys.argv[1:])

    start_cpu = cpu_seconds()
    domain = household_domain(args) if args.domain == "household" else engine_domain(args)
    validation = domain.train.take(np.arange(args.num_train, args.num_train + args.num_val)) if args.num_val else None
    with tempfile.TemporaryDirectory() as workdir:
        rows = [row for seed in args.seeds for row in measure_seed(domain, validation, args, seed, workdir)]
    summary = {}
    finals = [r for r in rows if r["step"] == args.steps]
    befores = [r for r in rows if r["step"] == 0]
    for name in ("test_well_formed", "test_admissible", "validation_admissible"):
        if name in finals[0]:
            summary[f"before / {name} mean"] = round(statistics.mean(r[name] for r in befores), 4)
            summary[f"after / {name} mean"] = round(statistics.mean(r[name] for r in finals), 4)
            summary[f"after / {name} per seed"] = [round(r[name], 4) for r in finals]
    late = [r for r in rows if r["step"] >= args.steps // 2]
    summary["test_admissible min over checkpoints in the second half"] = round(min(r["test_admissible"] for r in late), 4)
    if validation is not None:
        selected = []
        for seed in args.seeds:
            mine = [r for r in rows if r["seed"] == seed and r["step"] > 0]
            best = max(mine, key=lambda r: (r["validation_admissible"], r["step"]))
            selected.append(best)
        summary["selected on validation / step per seed"] = [r["step"] for r in selected]
        summary["selected on validation / test_admissible per seed"] = [round(r["test_admissible"], 4) for r in selected]
        summary["selected on validation / test_admissible mean"] = round(
            statistics.mean(r["test_admissible"] for r in selected), 4)
    summary["cpu_s"] = round(cpu_seconds() - start_cpu, 1)
    config = {"command": command,
              "git_commit": commit_of(__file__), **{k: v for k, v in vars(args).items() if k != "out"}}
    answer_lists = ("test_answers", "test_failed_answers")   # kept in the JSON, too long for the table
    columns = [c for c in dict.fromkeys(k for row in rows for k in row) if c not in answer_lists]
    return report("cold_start_share", rows, config=config, summary=summary, columns=columns, out=args.out)


if __name__ == "__main__":
    main()
