"""Environment speed: steps/s of the JAX household against the real engines, and inner-loop episodes/s.

    python benchmarks/bench_env.py            # household at 1 .. 4,096 episodes, engines, inner loop
    python benchmarks/bench_env.py --quick    # 1 .. 256 episodes, fewer turns, 2 inner steps
    python benchmarks/bench_env.py --inner-only --baseline /path/to/earlier/checkout --out result.json
                                              # inner steps of this tree and an earlier one, in turns

Rows:
  household (JAX)  `HouseholdEnv` reset + `turns` steps per episode, random actions (a random
                   template over the room's entities with a random tag, or a random word string;
                   `expert.random_action`), jit + vmap over `episodes` episodes, all turns in one
                   `lax.scan`. steps/s = episodes * turns / run time (median after a compiled warm-up).
  ScienceWorld     the `scienceworld` engine through `derl_jax.domains.scienceworld.ScienceWorldEnv`
                   (one JVM per worker, the fast step), random word actions, `workers` episodes
                   in parallel; "not installed" when the package or Java is missing.
  ALFWorld         the `alfworld` engine through `derl_jax.domains.alfworld.AlfWorldEnv` (generated
                   games, `workers` worker processes, 4 episodes each), random well-formed
                   commands; "not installed" when the package is missing.
  inner loop       one GRPO inner-loop run (`derl_jax.rl.loop.train`, jitted) on the household
                   `smoke` config with a scratch policy: episodes/s = steps * B * G / run time.
  inner step       (full run, or --inner-only) one step of the default preset, 4 tasks x 8
                   episodes of 16 turns, scratch policy, for each of INNER_STEP_VARIANTS (the
                   history settings, named rather than "default")
                   (`benchmarks/inner_step.py` in a subprocess: compile, then `--repeats` timed
                   steps, `--rounds` times); run_s is the median of all timed steps, run_s_min /
                   run_s_max their range. With --baseline DIR the same script times DIR's code
                   (an earlier checkout) at BASELINE_VARIANTS, the two trees in turns, and the
                   summary gives each of this tree's variants against the baseline's default.
                   TWO_DEVICE_VARIANTS: the default with a step's rollouts over 2 host devices
                   (both trees), as a run on a 2-core host splits them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import median_time, report  # noqa: E402
from derl_jax.domains.household import tasks as T  # noqa: E402
from derl_jax.domains.household.env import HouseholdEnv  # noqa: E402
from derl_jax.domains.household.expert import random_action  # noqa: E402

FULL = {"episodes": (1, 16, 256, 4096), "turns": 30, "inner_steps": 4, "sw_workers": 4, "sw_turns": 20,
        "inner_step_rounds": 2}
QUICK = {"episodes": (1, 16, 256), "turns": 10, "inner_steps": 2, "sw_workers": 2, "sw_turns": 5,
         "inner_step_rounds": 0}
DISTINCT_TASKS = 64


def household_runner(env: HouseholdEnv, turns: int):
    """jit(vmap(episode)): reset, then `turns` random-action steps of every task -> successes f32[B]."""
    def episode(task, key):
        _, state = env.reset(key, task)

        def turn(state, turn_key):
            _, state, _, _, info = env.step(state, random_action(state, turn_key))
            return state, info["valid"]

        state, valid = jax.lax.scan(turn, state, jax.random.split(key, turns))
        return state.success.astype(jnp.float32) + 0.0 * jnp.sum(valid)

    return jax.jit(jax.vmap(episode))


def bench_household(settings: dict) -> list[dict]:
    train, _ = T.level_splits("L0", 0, DISTINCT_TASKS, 8)
    env = HouseholdEnv(max_turns=settings["turns"])
    run = household_runner(env, settings["turns"])
    rows = []
    for count in settings["episodes"]:
        tasks = T.to_device(train.take(np.arange(count) % DISTINCT_TASKS))
        keys = jax.random.split(jax.random.PRNGKey(0), count)
        start = time.perf_counter()
        jax.block_until_ready(run(tasks, keys))
        compile_s = time.perf_counter() - start
        seconds = median_time(lambda: jax.block_until_ready(run(tasks, keys)), repeats=3, warmup=0)
        steps = count * settings["turns"]
        rows.append({"engine": "household (JAX)", "episodes": count, "steps": steps, "compile_s": compile_s,
                     "run_s": seconds, "steps_per_s": steps / seconds})
    return rows


def bench_scienceworld(settings: dict) -> list[dict]:
    try:
        from derl_jax.domains.scienceworld.env import ScienceWorldEnv
        import scienceworld  # noqa: F401
    except ImportError as err:
        return [{"engine": "ScienceWorld", "status": f"not installed ({err.__class__.__name__}: {err})"}]
    if shutil.which("java") is None:
        return [{"engine": "ScienceWorld", "status": "not installed (no java on PATH)"}]
    workers, turns = settings["sw_workers"], settings["sw_turns"]
    start = time.perf_counter()
    env = ScienceWorldEnv(["boil"], num_workers=workers, max_turns=turns + 1)
    startup = time.perf_counter() - start
    try:
        rng = np.random.default_rng(0)
        tasks = {"task": np.zeros(workers, np.int32), "variation": np.arange(workers, dtype=np.int32)}
        _, states = env.reset(np.zeros((workers, 2), np.uint32), tasks)
        first_word = 4
        start = time.perf_counter()
        for _ in range(turns):
            actions = rng.integers(first_word, len(env.vocab), size=(workers, env.action_length)).astype(np.int32)
            actions[:, 3:] = env.vocab.pad_id
            _, states, _, _, _ = env.step(states, actions)
        seconds = time.perf_counter() - start
    finally:
        env.close()
    steps = workers * turns
    return [{"engine": "ScienceWorld", "episodes": workers, "steps": steps, "compile_s": startup, "run_s": seconds,
             "steps_per_s": steps / seconds, "status": "ok"}]


def bench_alfworld(settings: dict) -> list[dict]:
    try:
        from derl_jax.domains.alfworld import AlfWorldEnv, KINDS, generate_games, require_engine
        from derl_jax.domains.alfworld.domain import entity_names, make_vocabulary
        from derl_jax.domains.alfworld.problems import type_split

        require_engine()
    except (ImportError, ValueError) as err:
        return [{"engine": "ALFWorld", "status": f"not installed ({err.__class__.__name__}: {err})"}]
    workers, turns = settings["sw_workers"], settings["sw_turns"]
    split = type_split(0)
    games = generate_games(KINDS, 1, 0, *(split[s][0] for s in ("objects", "receptacles", "lamps")))
    vocab = make_vocabulary(games)
    episodes = 4 * workers
    rng = np.random.default_rng(0)

    def command(game: int) -> str:   # a random well-formed command over the game's entities (reaches the engine)
        names = sorted(entity_names(games[game]))
        a, b = (f"{names[i]} 1" for i in rng.integers(len(names), size=2))
        return ["look", f"go to {b}", f"open {b}", f"examine {b}", f"take {a} from {b}"][rng.integers(5)]

    start = time.perf_counter()
    env = AlfWorldEnv(games, num_workers=workers, vocab=vocab, max_turns=turns + 1)
    try:
        tasks = {"game": np.arange(episodes, dtype=np.int32) % len(games)}
        _, states = env.reset(np.zeros((episodes, 2), np.uint32), tasks)   # loads every game once
        startup = time.perf_counter() - start
        _, states = env.reset(np.zeros((episodes, 2), np.uint32), tasks)
        start = time.perf_counter()
        for _ in range(turns):
            texts = [f"act {command(int(g))}" for g in tasks["game"]]
            actions = np.stack([vocab.encode(t, env.action_length) for t in texts])
            _, states, _, _, _ = env.step(states, actions)
        seconds = time.perf_counter() - start
    finally:
        env.close()
    steps = episodes * turns
    return [{"engine": "ALFWorld", "episodes": episodes, "steps": steps, "compile_s": startup, "run_s": seconds,
             "steps_per_s": steps / seconds, "status": f"ok ({workers} workers)"}]


def time_inner_loop(preset: str, steps: int, label: str, **domain) -> dict:
    """One jitted GRPO inner-loop run of `steps` steps on the household `preset` (scratch policy;
    `domain` overrides config.domain fields): compile and median run seconds, episodes/s."""
    from configs import household
    from derl_jax.domains.registry import get_domain
    from derl_jax.expr import compile_expr, parse
    from derl_jax.models.transformer import init_params
    from derl_jax.rl import sft
    from derl_jax.rl.config import inner_config
    from derl_jax.rl.loop import make_inner_loop

    cfg = household.get_config(preset)
    cfg.inner.update(steps=steps, kl_metric=False)
    cfg.domain.update(domain)
    built = get_domain("household").build(cfg)
    graphdef, params = init_params(sft.policy_model_config(built, cfg.policy), jax.random.key(0))
    loop = make_inner_loop(built, graphdef, inner_config(cfg, built.max_new_tokens))
    program = compile_expr(parse("g1", built.primitive_names))
    train = jax.jit(loop.train)
    key = jax.random.key(1)
    start = time.perf_counter()
    jax.block_until_ready(train(params, program, key, built.train))
    compile_s = time.perf_counter() - start
    seconds = median_time(lambda: jax.block_until_ready(train(params, program, key, built.train)), repeats=1, warmup=0)
    episodes = steps * cfg.inner.prompts_per_step * cfg.inner.group_size
    return {"engine": label, "episodes": episodes, "steps": episodes * built.env.max_turns,
            "compile_s": compile_s, "run_s": seconds, "episodes_per_s": episodes / seconds,
            "status": f"prompts of {built.prompt_length} tokens"}


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INNER_STEP_SCRIPT = os.path.join(REPO, "benchmarks", "inner_step.py")
# (label, config.domain overrides) of this tree's inner-step rows
INNER_STEP_VARIANTS = (
    ("window W=2, prompt_budget=128", {"history": "window", "window": 2, "prompt_budget": 128}),
    ("window W=2, prompt_budget=0 (the whole window)", {"history": "window", "window": 2, "prompt_budget": 0}),
    ("whole history, prompt_budget=384", {"history": "full", "prompt_budget": 384}),
)
# the same rows of an earlier checkout (--baseline), whose `domain.history` is the window W
BASELINE_VARIANTS = (
    ("default (window W=2, prompt_budget=128)", {}),
    ("window W=2, prompt_budget=0 (the whole window)", {"prompt_budget": 0}),
)
# the default with a step's rollouts over two host devices (what a run on a 2-core host gets),
# both trees, in a subprocess of its own
TWO_DEVICE_VARIANTS = (("default, rollouts over 2 host devices", {}),)
TWO_DEVICES = 2


def run_inner_steps(tree: str, variants, repeats: int, data: int = 1) -> list[dict]:
    """`benchmarks/inner_step.py` of this tree run on the code of `tree` (its directory first on
    the path) for `variants`: one subprocess, every variant compiled, then timed in turns; with
    `data` > 1 the process has that many host devices and the rollouts split over them."""
    spec = {"preset": "default", "steps": 1, "repeats": repeats, "data": data,
            "variants": [{"label": label, "domain": domain} for label, domain in variants]}
    env = dict(os.environ, PYTHONPATH=tree)
    if data > 1:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={data}".strip()
    done = subprocess.run([sys.executable, INNER_STEP_SCRIPT, json.dumps(spec)], cwd=tree, env=env,
                          capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("INNER_STEP ")]
    if done.returncode or not lines:
        raise RuntimeError(f"inner_step.py on {tree} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("INNER_STEP "):])["variants"]


def inner_step_rows(rounds: int, repeats: int, baseline: str | None) -> tuple[list[dict], dict]:
    """Rows of this tree's INNER_STEP_VARIANTS (and the baseline's BASELINE_VARIANTS), each tree
    run `rounds` times in turns; the summary's ratios are against the baseline's default."""
    trees = [("this tree", REPO, INNER_STEP_VARIANTS, 1), ("this tree", REPO, TWO_DEVICE_VARIANTS, TWO_DEVICES)]
    if baseline:
        trees += [("baseline", os.path.abspath(baseline), BASELINE_VARIANTS, 1),
                  ("baseline", os.path.abspath(baseline), TWO_DEVICE_VARIANTS, TWO_DEVICES)]
    timed: dict[tuple[str, str], dict] = {}
    for _ in range(rounds):
        for name, tree, variants, data in trees:
            for result in run_inner_steps(tree, variants, repeats, data):
                entry = timed.setdefault((name, result["label"]), {**result, "run_s": [], "compile_s": []})
                entry["run_s"] += result["run_s"]
                entry["compile_s"].append(result["compile_s"])
    rows = []
    for (name, label), entry in timed.items():
        seconds = statistics.median(entry["run_s"])
        rows.append({"engine": f"inner step ({name}: {label})", "episodes": entry["episodes"],
                     "steps": entry["episodes"] * entry["turns"], "compile_s": statistics.median(entry["compile_s"]),
                     "run_s": seconds, "run_s_min": min(entry["run_s"]), "run_s_max": max(entry["run_s"]),
                     "timed_steps": len(entry["run_s"]), "episodes_per_s": entry["episodes"] / seconds,
                     "status": f"prompts of {entry['prompt_length']} tokens"})
    summary = {}
    if baseline:
        reference = timed[("baseline", BASELINE_VARIANTS[0][0])]
        base_s = statistics.median(reference["run_s"])
        summary["baseline_default_step_s"] = base_s
        for label, _ in INNER_STEP_VARIANTS:
            summary[f"speedup vs baseline default: {label}"] = base_s / statistics.median(timed[("this tree", label)]["run_s"])
        label = TWO_DEVICE_VARIANTS[0][0]
        summary[f"speedup vs baseline: {label}"] = (statistics.median(timed[("baseline", label)]["run_s"])
                                                    / statistics.median(timed[("this tree", label)]["run_s"]))
    return rows, summary


def bench_inner(settings: dict) -> list[dict]:
    """The smoke inner loop (household `smoke` config, scratch policy)."""
    return [time_inner_loop("smoke", settings["inner_steps"], "inner loop (household smoke)")]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 .. 256 episodes, fewer turns, 2 inner steps")
    parser.add_argument("--no-inner", action="store_true", help="skip the inner-loop rows")
    parser.add_argument("--inner-only", action="store_true", help="only the inner-step rows")
    parser.add_argument("--baseline", default=None,
                        help="an earlier checkout whose inner steps are timed too (BASELINE_VARIANTS)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="inner-step subprocesses per tree, in turns (default 2; 0 in --quick)")
    parser.add_argument("--repeats", type=int, default=5, help="timed inner steps per subprocess and variant")
    parser.add_argument("--out", default=None, help="also write the result JSON here")
    args = parser.parse_args(argv)
    settings = dict(QUICK if args.quick else FULL)
    if args.rounds is not None:
        settings["inner_step_rounds"] = args.rounds
    if args.inner_only and not settings["inner_step_rounds"]:
        settings["inner_step_rounds"] = 2
    rows, summary = [], {}
    if not args.inner_only:
        rows = bench_household(settings) + bench_scienceworld(settings) + bench_alfworld(settings)
        household_rows = [r for r in rows if r["engine"] == "household (JAX)"]
        summary["household_best_steps_per_s"] = max(r["steps_per_s"] for r in household_rows)
        sw = [r for r in rows if r["engine"] == "ScienceWorld" and "steps_per_s" in r]
        if sw:
            summary["household_vs_scienceworld"] = summary["household_best_steps_per_s"] / sw[0]["steps_per_s"]
        if not args.no_inner:
            rows += bench_inner(settings)
    if not args.no_inner and settings["inner_step_rounds"]:
        step_rows, step_summary = inner_step_rows(settings["inner_step_rounds"], args.repeats, args.baseline)
        rows += step_rows
        summary.update(step_summary)
    config = {"quick": args.quick, "baseline": args.baseline, "repeats": args.repeats,
              **{k: str(v) for k, v in settings.items()}}
    result = report("bench_env", rows, config=config, summary=summary,
                    columns=["engine", "episodes", "steps", "compile_s", "run_s", "run_s_min", "run_s_max", "steps_per_s",
                             "episodes_per_s", "status"], out=args.out)
    return result


if __name__ == "__main__":
    main()
