"""The history search's history and belief survive SIGKILL: a killed and resumed search proposes exactly what an
uninterrupted one does, and ends with the same history file.

Each run is a subprocess running `derl_jax.outer.search.search` with the `history_search` strategy and a
fake evaluator (scores and curves are NumPy functions of the expression). Two kills: one right
after the strategy wrote round 2's history (so the file is ahead of the checkpoint), one in the
middle of evaluating a later round.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from derl_jax.methods.arbo import history as hist

SCRIPT = textwrap.dedent('''
    import os, signal, sys
    import jax, jax.numpy as jnp, ml_collections, numpy as np
    from derl_jax.domains.base import TokenDataset
    from derl_jax.rl.evaluator import CandidateResults
    from derl_jax.expr.program import Program
    from derl_jax.expr.vm import evaluate_numpy
    from derl_jax.outer import search as search_module
    from derl_jax.methods.arbo import history as hist
    from derl_jax.outer import make_strategy

    workdir, kill_after_save, kill_at_eval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    NAMES = ("correct", "format", "steps", "length")
    ROWS = np.random.default_rng(0).random((32, 4)).astype(np.float32)
    ROWS[:, 0] = ROWS[:, 0] > 0.5
    STEPS = 6

    class Evaluator:
        calls = 0

        def evaluate_candidates(self, programs, init_params, key, train_set, val_set, *, steps=None):
            if Evaluator.calls == kill_at_eval:
                os.kill(os.getpid(), signal.SIGKILL)
            Evaluator.calls += 1
            ops, args, sizes = (np.asarray(a) for a in (programs.ops, programs.args, programs.size))
            k = ops.shape[0]
            quality, curves = np.zeros(k, np.float32), {}
            for j in range(k):
                reward = evaluate_numpy(Program(ops[j], args[j], sizes[j]), ROWS, 1.0)
                quality[j] = max(np.corrcoef(reward, ROWS[:, 0])[0, 1], 0.0) if reward.std() > 1e-9 else 0.0
            progress = np.linspace(0.2, 1.0, STEPS, dtype=np.float32)
            curves["reward_mean"] = quality[:, None] * progress[None, :]
            for i, name in enumerate(NAMES):
                moving = progress if i != 2 else np.ones(STEPS, np.float32)
                curves[f"primitive/{name}"] = np.repeat(ROWS[:, i].mean() * moving[None, :], k, 0)
            scores = np.clip(0.8 * quality + 0.05 * float(jax.random.uniform(key)), 0, 1).astype(np.float32)
            return CandidateResults(scores=scores, curves=curves, params={"skill": jnp.zeros(k)})

    original_save = hist.save

    def save_then_maybe_die(history, run_dir, about=None):
        path = original_save(history, run_dir, about)
        if history.rounds == kill_after_save:
            os.kill(os.getpid(), signal.SIGKILL)
        return path

    hist.save = save_then_maybe_die
    cfg = ml_collections.ConfigDict({"outer": {"iterations": 6, "num_candidates": 4},
                                     "inner": {"common_random_numbers": True},
                                     "arbo": {"initial_explore": 1, "patience": 1, "reexplore": 1}})
    data = TokenDataset(prompts=jnp.ones((4, 3), jnp.int32), prompt_mask=jnp.ones((4, 3), bool), context={})
    strategy = make_strategy("history_search", cfg, None, NAMES, workdir=workdir)
    search_module.search(strategy, Evaluator(), data, data, NAMES, cfg, workdir, jax.random.key(3),
                         init_params={"skill": jnp.float32(0)}, progress=False, echo=lambda line: None)
''')


def run(script, workdir, kill_after_save=-1, kill_at_eval=-1):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    return subprocess.run([sys.executable, str(script), str(workdir), str(kill_after_save), str(kill_at_eval)],
                          env=env, capture_output=True, text=True, timeout=600)


def proposals(workdir):
    with open(os.path.join(workdir, "history.jsonl")) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    return [(r["iteration"], r["index"], r["text"], r["score"]) for r in records]


@pytest.mark.slow
def test_history_and_belief_survive_sigkill(tmp_path):
    script = tmp_path / "history_search_run.py"
    script.write_text(SCRIPT)
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    done = run(script, straight)
    assert done.returncode == 0, done.stderr[-2000:]

    first = run(script, killed, kill_after_save=3)
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    assert hist.load(killed).rounds == 3            # the file is one round ahead of the checkpoint
    second = run(script, killed, kill_at_eval=1)    # resumes at round 2, dies evaluating round 3
    assert second.returncode == -signal.SIGKILL, second.stderr[-2000:]
    assert hist.load(killed).rounds == 3
    third = run(script, killed)
    assert third.returncode == 0, third.stderr[-2000:]

    assert proposals(killed) == proposals(straight)
    final = hist.load(killed)
    assert final == hist.load(straight)
    assert final.rounds == 6 and len(final.observations) == 24
    assert final.belief.round == 5 and final.belief.notes["credit"]
    modes = [entry.mode for entry in final.lineage[::4]]
    assert "exploit" in modes and modes[0] == "explore"
    assert any(entry.parent is not None for entry in final.lineage)
