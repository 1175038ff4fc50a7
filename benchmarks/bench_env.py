"""Environment speed: steps/s of the JAX household against the real engines, and inner-loop episodes/s.

    python benchmarks/bench_env.py            # household at 1 .. 4,096 episodes, engines, inner loop
    python benchmarks/bench_env.py --quick    # 1 .. 256 episodes, fewer turns, 2 inner steps

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
  inner step       (full run only) one step of the default preset, 4 tasks x 8 episodes of 16
                   turns, at `domain.prompt_budget` 0 (the whole 221-token window) and 128.
"""

from __future__ import annotations

import argparse
import os
import shutil
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
        "prompt_budgets": (0, 128)}
QUICK = {"episodes": (1, 16, 256), "turns": 10, "inner_steps": 2, "sw_workers": 2, "sw_turns": 5,
         "prompt_budgets": ()}
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


def bench_inner(settings: dict) -> list[dict]:
    """The smoke inner loop; in a full run also one step of the default preset (4 tasks x 8
    episodes of 16 turns) with the whole window in the prompt and at the default prompt budget."""
    rows = [time_inner_loop("smoke", settings["inner_steps"], "inner loop (household smoke)")]
    for budget in settings["prompt_budgets"]:
        rows.append(time_inner_loop("default", 1, f"inner step (household default, prompt_budget={budget})",
                                    prompt_budget=budget))
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 .. 256 episodes, fewer turns, 2 inner steps")
    parser.add_argument("--no-inner", action="store_true", help="skip the inner-loop row")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else FULL
    rows = bench_household(settings) + bench_scienceworld(settings) + bench_alfworld(settings)
    if not args.no_inner:
        rows += bench_inner(settings)
    household_rows = [r for r in rows if r["engine"] == "household (JAX)"]
    summary = {"household_best_steps_per_s": max(r["steps_per_s"] for r in household_rows)}
    sw = [r for r in rows if r["engine"] == "ScienceWorld" and "steps_per_s" in r]
    if sw:
        summary["household_vs_scienceworld"] = summary["household_best_steps_per_s"] / sw[0]["steps_per_s"]
    return report("bench_env", rows, config={"quick": args.quick, **{k: str(v) for k, v in settings.items()}},
                  summary=summary, columns=["engine", "episodes", "steps", "compile_s", "run_s", "steps_per_s",
                                            "episodes_per_s", "status"])


if __name__ == "__main__":
    main()
