"""The outer loop: records, scores, population starts, budget, checkpoint/resume (incl. SIGKILL).

The inner loop and the Meta-Optimizer are replaced by small deterministic fakes defined here
(and reused by the other outer-loop tests): `FakeEvaluator` scores a candidate by how well
its reward correlates with the outcome primitive on fixed rows; `FakeMetaOptimizer` is a
categorical policy over a fixed corpus of expressions trained with a group-normalised
policy gradient and Adam. Both follow the real contracts exactly.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import sympy
from flax import struct

from derl_jax.checkpoint import CorruptCheckpointWarning
from derl_jax.domains.base import TokenDataset
from derl_jax.expr.grammar import make_grammar
from derl_jax.expr.parse import parse
from derl_jax.expr.canonical import to_sympy
from derl_jax.expr.program import Program
from derl_jax.expr.vm import evaluate_numpy
from derl_jax.logging import read_jsonl
from derl_jax.rl.evaluator import CandidateResults
from derl_jax.outer.search import (
    SEARCH_RESULT_FILE,
    search,
    strip_wall_clock,
)
from derl_jax.outer import CandidateRecord, make_strategy

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)


def get_config(preset: str | None = None):
    """`configs/arith.py:get_config(preset)`, loaded by path as `--config=configs/arith.py` does."""
    spec = importlib.util.spec_from_file_location("arith_config", os.path.join(REPO_ROOT, "configs", "arith.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(preset)

PRIMITIVES = ("correct", "boxed", "steps", "gold_anywhere")
CORPUS = (
    "g1",
    "g1+g2",
    "g1+0.5*g2",
    "(g1+g2+g3+g4)/4",
    "g1*g2*g3",
    "g1*(g2+0.2)*g3",
    "-(g1+g2)",
    "g2+g3",
    "g1/(g2-g2)",
    "3",
    "g1+0.1*g4",
    "g1**2+g2",
)
INVALID_IN_CORPUS = {"g1/(g2-g2)", "3"}


# --------------------------------------------------------------------------- fakes


@struct.dataclass
class FakeMetaState:
    params: dict
    opt_state: object
    ref_params: dict
    step: jax.Array


@struct.dataclass
class FakeMetaSample:
    texts: tuple = struct.field(pytree_node=False)
    symbols: jax.Array
    mask: jax.Array
    logp: jax.Array


class FakeMetaOptimizer:
    """A categorical 'Meta-Optimizer' over `corpus` with the real MetaOptimizer's interface."""

    learning_rate = 0.5

    def __init__(self, cfg, grammar, mesh=None, corpus=CORPUS):
        self.grammar, self.mesh = grammar, mesh
        self.corpus = tuple(corpus)
        ids = [grammar.tokenize(text) + [grammar.eos_id] for text in self.corpus]
        self.symbols = np.full((len(ids), grammar.max_length), grammar.pad_id, np.int32)
        for row, seq in enumerate(ids):
            self.symbols[row, : len(seq)] = seq
        self.symbol_mask = np.arange(grammar.max_length)[None, :] < np.array([len(s) for s in ids])[:, None]
        self.tx = optax.adam(self.learning_rate)
        self.init_calls = 0

    def init(self, key):
        self.init_calls += 1
        params = {"logits": 0.1 * jax.random.normal(key, (len(self.corpus),))}
        return FakeMetaState(params=params, opt_state=self.tx.init(params), ref_params=params, step=jnp.int32(0))

    def sample(self, state, key, n):
        index = np.asarray(jax.random.categorical(key, state.params["logits"], shape=(n,)))
        logp_all = jax.nn.log_softmax(state.params["logits"])
        logp = np.zeros((n, self.grammar.max_length), np.float32)
        logp[:, 0] = np.asarray(logp_all)[index]
        return FakeMetaSample(
            texts=tuple(self.corpus[i] for i in index),
            symbols=jnp.asarray(self.symbols[index]),
            mask=jnp.asarray(self.symbol_mask[index]),
            logp=jnp.asarray(logp),
        )

    def probabilities(self, state) -> np.ndarray:
        return np.asarray(jax.nn.softmax(state.params["logits"]))

    def update(self, state, sample, scores):
        index = jnp.asarray([self.corpus.index(t) for t in sample.texts])
        return self._update_step(state, index, jnp.asarray(scores, jnp.float32))

    @functools.partial(jax.jit, static_argnums=0)
    def _update_step(self, state, index, scores):
        advantages = (scores - scores.mean()) / (scores.std() + 1e-6)

        def loss_fn(params):
            return -jnp.mean(advantages * jax.nn.log_softmax(params["logits"])[index])

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new_state = FakeMetaState(params=params, opt_state=opt_state, ref_params=state.ref_params, step=state.step + 1)
        return new_state, {"loss": loss, "score_mean": scores.mean()}


def fixed_rows(num_primitives: int = 4, count: int = 128) -> np.ndarray:
    """f32[count, P]: binary outcome, a format signal that follows it, unrelated others."""
    rng = np.random.default_rng(123)
    outcome = (rng.random(count) < 0.5).astype(np.float32)
    fmt = np.clip(0.6 * outcome + 0.4 * rng.random(count), 0.0, 1.0)
    rest = rng.random((count, num_primitives - 2))
    return np.column_stack([outcome, fmt, rest]).astype(np.float32)


class FakeEvaluator:
    """Deterministic inner loop: quality q = max(0, corr(reward, outcome)) on `fixed_rows`;
    validation score = 0.6 q + 0.3 tanh(skill) + noise(key); a trained policy has skill + q."""

    steps = 5

    def __init__(self, num_primitives: int = 4, delay: float = 0.0, marker_dir: str | None = None):
        self.rows = fixed_rows(num_primitives)
        self.primitive_names = tuple(f"g{i + 1}" for i in range(num_primitives))
        self.delay = delay
        self.marker_dir = marker_dir
        self.calls: list[dict] = []
        self.final_calls: list[dict] = []

    def quality(self, program) -> float:
        reward = evaluate_numpy(program, self.rows, 1.0)
        if not np.all(np.isfinite(reward)) or reward.std() < 1e-9:
            return 0.0
        return float(max(np.corrcoef(reward, self.rows[:, 0])[0, 1], 0.0))

    @staticmethod
    def noise(key) -> float:
        return 0.05 * float(jax.random.uniform(key))

    def evaluate_candidates(self, programs, init_params, key, train_set, val_set, *, steps=None):
        if self.marker_dir is not None:
            marker = os.path.join(self.marker_dir, f"eval_{os.getpid()}_{len(self.calls)}")
            open(marker, "w").close()
        if self.delay:
            time.sleep(self.delay)
        ops, args, sizes = (np.asarray(a) for a in (programs.ops, programs.args, programs.size))
        quality = np.array([self.quality(Program(ops[k], args[k], sizes[k])) for k in range(ops.shape[0])])
        skill = float(init_params["skill"])
        scores = np.clip(0.6 * quality + 0.3 * np.tanh(skill) + self.noise(key), 0.0, 1.0).astype(np.float32)
        progress = np.linspace(0.25, 1.0, self.steps)
        curves = {"reward_mean": quality[:, None] * progress[None, :]}
        for j, name in enumerate(self.primitive_names):
            curves[f"primitive/{name}"] = np.repeat(self.rows[:, j].mean() * progress[None, :], len(quality), axis=0)
        self.calls.append({"k": len(quality), "skill": skill, "train": train_set.size, "val": val_set.size, "steps": steps})
        params = {"skill": jnp.asarray(skill + quality, jnp.float32)}
        return CandidateResults(scores=jnp.asarray(scores), curves=curves, params=params)

    def train_final(self, program, init_params, key, train_set):
        quality = self.quality(program)
        self.final_calls.append({"quality": quality, "train": train_set.size})
        curves = {"reward_mean": quality * np.linspace(0.25, 1.0, self.steps)}
        return {"skill": jnp.asarray(float(init_params["skill"]) + 2.0 * quality, jnp.float32)}, curves

    def accuracy(self, params, dataset) -> float:
        coverage = float(np.asarray(dataset.prompt_mask).mean())
        return float(jax.nn.sigmoid(2.0 * float(params["skill"]) - 1.0)) * coverage


def tiny_dataset(rows: int, seed: int) -> TokenDataset:
    rng = np.random.default_rng(seed)
    prompts = rng.integers(1, 10, (rows, 6)).astype(np.int32)
    return TokenDataset(prompts=jnp.asarray(prompts), prompt_mask=jnp.ones((rows, 6), bool), context={"answer": jnp.zeros(rows, jnp.int32)})


def fake_config(iterations: int = 3, num_candidates: int = 4):
    cfg = get_config("smoke")
    cfg.outer.iterations = iterations
    cfg.outer.num_candidates = num_candidates
    cfg.meta.max_symbols = 24
    cfg.meta.max_depth = 4
    return cfg


BASE_PARAMS = {"skill": jnp.float32(0.0)}


def run_fake_search(workdir, strategy_name="derl", iterations=3, num_candidates=4, seed=7, evaluator=None, optimizer_box=None):
    """One search over the fakes; `optimizer_box` (a list) receives the optimizer built."""
    cfg = fake_config(iterations, num_candidates)
    grammar = make_grammar(len(PRIMITIVES), cfg.meta.max_symbols, cfg.meta.max_depth)

    def factory(config, g, mesh=None):
        optimizer = FakeMetaOptimizer(config, g, mesh)
        if optimizer_box is not None:
            optimizer_box.append(optimizer)
        return optimizer

    strategy = make_strategy(strategy_name, cfg, grammar, PRIMITIVES, optimizer_factory=factory)
    evaluator = evaluator if evaluator is not None else FakeEvaluator()
    result = search(
        strategy, evaluator, tiny_dataset(16, 0), tiny_dataset(8, 1), PRIMITIVES, cfg, workdir,
        jax.random.key(seed), init_params=BASE_PARAMS, progress=False, echo=lambda line: None,
    )
    return result, evaluator


def records_of(texts, scores, iteration: int = 0) -> list[CandidateRecord]:
    """Records of valid, trained candidates with these scores (for calling `update` directly)."""
    return [
        CandidateRecord(iteration=iteration, index=j, text=t, canonical=t, valid=True, reason=None, score=float(s))
        for j, (t, s) in enumerate(zip(texts, np.asarray(scores, np.float32)))
    ]


def reference_quality(text: str, rows: np.ndarray) -> float:
    """max(0, corr(reward, outcome)) with the reward computed by SymPy (not the VM)."""
    symbols = sympy.symbols("g1:5", real=True)
    fn = sympy.lambdify(symbols, to_sympy(parse(text, PRIMITIVES), rational=False), "numpy")
    reward = np.broadcast_to(np.asarray(fn(*rows.T.astype(np.float64)), np.float64), (rows.shape[0],))
    if not np.all(np.isfinite(reward)) or reward.std() < 1e-9:
        return 0.0
    return max(float(np.corrcoef(reward, rows[:, 0])[0, 1]), 0.0)


# --------------------------------------------------------------------------- tests


def test_history_scores_and_metrics(tmp_path):
    result, evaluator = run_fake_search(tmp_path, "derl", iterations=3)
    history = read_jsonl(tmp_path / "history.jsonl")
    assert len(history) == 12 and history == result.history
    assert [(r["iteration"], r["index"]) for r in history] == [(i, j) for i in range(3) for j in range(4)]
    rows = fixed_rows()
    # one evaluator call per iteration with a valid candidate, training each valid canonical form once
    trained_per_iteration = [len({r["canonical"] for r in history if r["iteration"] == i and r["valid"]}) for i in range(3)]
    assert [c["k"] for c in evaluator.calls] == [k for k in trained_per_iteration if k]
    for i in range(3):
        records = [r for r in history if r["iteration"] == i]
        valid = [r for r in records if r["valid"]]
        for r in records:
            if r["text"] in INVALID_IN_CORPUS:
                assert not r["valid"] and not r["trained"] and r["score"] == 0.0 and r["reason"]
                assert r["structure"] == "invalid" and r["curves"] == {}
            else:
                assert r["valid"] and r["trained"] == (r["duplicate_of"] is None) and r["reason"] == ""
                assert set(r["final"]) == {"reward_mean", "primitive/g1", "primitive/g2", "primitive/g3", "primitive/g4"}
                assert len(r["curves"]["reward_mean"]) == FakeEvaluator.steps
        # scores reach the candidate that earned them: differences follow the SymPy quality
        for a in valid:
            for b in valid:
                expected = 0.6 * (reference_quality(a["text"], rows) - reference_quality(b["text"], rows))
                assert a["score"] - b["score"] == pytest.approx(expected, abs=2e-4)
    assert sum(c["k"] for c in evaluator.calls) == sum(r["trained"] for r in history)
    assert all(c["train"] == 16 and c["val"] == 8 for c in evaluator.calls)

    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    for m in metrics:
        records = [r for r in history if r["iteration"] == m["step"]]
        assert m["validity_rate"] == pytest.approx(np.mean([r["valid"] for r in records]))
        assert m["score_mean"] == pytest.approx(np.mean([r["score"] for r in records]))
        shares = [m["share_stable"], m["share_unstable"], m["share_invalid"]]
        assert sum(shares) == pytest.approx(1.0)
        assert m["candidates_charged"] == 4 * (m["step"] + 1)
    assert os.path.isdir(tmp_path / "tb") and os.listdir(tmp_path / "tb")

    best = max(history, key=lambda r: (r["score"], -r["iteration"], -r["index"]))
    assert result.best_text == best["text"] and result.best_score == pytest.approx(best["score"])
    assert result.best_iteration == best["iteration"]
    shared = sum(r["duplicate_of"] is not None for r in history)
    assert result.budget == {"candidates_charged": 12, "candidates_trained": 12 - shared - sum(not r["valid"] for r in history),
                             "candidates_shared": shared, "start_policy_updates": 0}


def test_finished_search_is_returned_without_recomputing(tmp_path):
    first, evaluator = run_fake_search(tmp_path, "derl", iterations=2)
    optimizers = []
    again, evaluator2 = run_fake_search(tmp_path, "derl", iterations=2, optimizer_box=optimizers)
    assert evaluator2.calls == [] and optimizers[0].init_calls == 0
    assert strip_wall_clock(again.history) == strip_wall_clock(first.history)
    assert (again.best_text, again.best_score) == (first.best_text, first.best_score)


def test_population_starts_from_previous_best(tmp_path):
    result, evaluator = run_fake_search(tmp_path / "pop", "derl_pop", iterations=4)
    history = result.history
    expected_skill = 0.0
    for i, call in enumerate(evaluator.calls):
        assert call["skill"] == pytest.approx(expected_skill, abs=1e-6)
        valid = [r for r in history if r["iteration"] == i and r["trained"]]
        best = max(valid, key=lambda r: r["score"])  # first maximum, as the search picks it
        expected_skill += reference_quality(best["text"], fixed_rows())
    assert float(result.incumbent_params["skill"]) == pytest.approx(expected_skill, abs=1e-4)

    _, plain = run_fake_search(tmp_path / "plain", "derl", iterations=3)
    assert all(call["skill"] == 0.0 for call in plain.calls)


def test_all_invalid_iteration_trains_nothing(tmp_path):
    result, evaluator = run_fake_search(tmp_path, "fixed:3", iterations=2, num_candidates=3)
    assert evaluator.calls == []
    assert result.best_text is None and result.best_score == 0.0
    assert all(not r["valid"] and r["score"] == 0.0 and "constant" in r["reason"] for r in result.history)
    assert result.budget == {"candidates_charged": 6, "candidates_trained": 0, "candidates_shared": 0, "start_policy_updates": 0}


def test_extending_iterations_continues_the_run(tmp_path):
    run_fake_search(tmp_path / "a", "evolution", iterations=2)
    extended, evaluator = run_fake_search(tmp_path / "a", "evolution", iterations=4)
    assert len(evaluator.calls) == 2
    straight, _ = run_fake_search(tmp_path / "b", "evolution", iterations=4)
    assert strip_wall_clock(extended.history) == strip_wall_clock(straight.history)
    assert len({r["text"] for r in straight.history if r["iteration"] >= 1}) > 1  # evolution proposes variety


def test_resume_rejects_a_different_setup(tmp_path):
    run_fake_search(tmp_path, "derl", iterations=1)
    with pytest.raises(ValueError, match="different setup.*key"):
        run_fake_search(tmp_path, "derl", iterations=1, seed=8)
    with pytest.raises(ValueError, match="different setup.*strategy"):
        run_fake_search(tmp_path, "random", iterations=1)


def test_bad_evaluator_output_is_named(tmp_path):
    class ShortScores(FakeEvaluator):
        def evaluate_candidates(self, *args):
            out = super().evaluate_candidates(*args)
            return out.replace(scores=out.scores[:-1])

    with pytest.raises(ValueError, match="evaluate_candidates: expected scores of shape"):
        run_fake_search(tmp_path, "fixed:g1+g2", iterations=1, evaluator=ShortScores())


def test_non_finite_scores_count_as_zero_and_never_win(tmp_path):
    class NaNForSums(FakeEvaluator):
        def evaluate_candidates(self, programs, *args):
            out = super().evaluate_candidates(programs, *args)
            sums = np.asarray(programs.size) == 3  # `g1+g2` compiles to 3 instructions, `g1` to 1
            return out.replace(scores=jnp.where(jnp.asarray(sums), jnp.nan, out.scores))

    result, _ = run_fake_search(tmp_path, "fixed:g1+g2", iterations=2, num_candidates=2, evaluator=NaNForSums())
    assert all(r["valid"] and r["trained"] == (r["index"] == 0) and r["score"] == 0.0 for r in result.history)
    assert [r["duplicate_of"] for r in result.history] == [None, 0, None, 0]
    assert {r["reason"] for r in result.history} == {"non-finite validation score"}
    assert result.best_text is None


def test_corrupt_latest_checkpoint_uses_the_previous_one(tmp_path):
    reference, _ = run_fake_search(tmp_path / "ref", "derl_pop", iterations=3)
    run_fake_search(tmp_path / "run", "derl_pop", iterations=3)
    run = tmp_path / "run"
    os.remove(run / SEARCH_RESULT_FILE)
    latest = run / "checkpoints" / "3"
    for dirpath, _, filenames in os.walk(latest / "arrays"):
        for name in filenames:
            with open(os.path.join(dirpath, name), "r+b") as handle:
                handle.truncate(max(0, os.path.getsize(os.path.join(dirpath, name)) // 2))
    with pytest.warns(CorruptCheckpointWarning, match="step 3"):
        resumed, evaluator = run_fake_search(run, "derl_pop", iterations=3)
    assert len(evaluator.calls) == 1  # only the third iteration was replayed
    assert strip_wall_clock(resumed.history) == strip_wall_clock(reference.history)
    assert float(resumed.incumbent_params["skill"]) == pytest.approx(float(reference.incumbent_params["skill"]))


SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {tests!r})
    sys.path.insert(0, {root!r})
    from test_search import FakeEvaluator, run_fake_search
    workdir, marker_dir = sys.argv[1], sys.argv[2]
    run_fake_search(workdir, "derl_pop", iterations={iterations}, evaluator=FakeEvaluator(delay=0.15, marker_dir=marker_dir))
    print("DONE")
    """
)


def _lines(path) -> int:
    if not os.path.exists(path):
        return 0
    with open(path, "rb") as handle:
        return handle.read().count(b"\n")


def _wait_until(predicate, process, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        if process.poll() is not None:
            return False
        time.sleep(0.02)
    return False


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_matches_uninterrupted(tmp_path):
    iterations = 3
    reference, _ = run_fake_search(tmp_path / "ref", "derl_pop", iterations=iterations)
    script = tmp_path / "run_search.py"
    script.write_text(SCRIPT.format(tests=TESTS_DIR, root=REPO_ROOT, iterations=iterations))
    workdir, markers = tmp_path / "killed", tmp_path / "markers"
    markers.mkdir()
    history_path = workdir / "history.jsonl"
    rng = np.random.default_rng(0)
    env = {**os.environ, "PYTHONPATH": REPO_ROOT}

    def start():
        return subprocess.Popen([sys.executable, str(script), str(workdir), str(markers)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT)

    def markers_of(process):
        return [m for m in os.listdir(markers) if m.startswith(f"eval_{process.pid}_")]

    def kill(process) -> None:
        process.send_signal(signal.SIGKILL)
        out, err = process.communicate(timeout=30)
        assert process.returncode == -signal.SIGKILL, f"exited with {process.returncode} before the kill: {err.decode()[-2000:]}"

    # 1: in the middle of an inner-loop evaluation, once an iteration is on disk
    process = start()
    assert _wait_until(lambda: _lines(history_path) >= 4 and len(markers_of(process)) >= 2, process, 60)
    time.sleep(rng.uniform(0.0, 0.1))
    kill(process)
    # 2: just after an iteration's records were written (before or while its checkpoint is saved)
    process = start()
    done_lines = _lines(history_path)
    assert _wait_until(lambda: _lines(history_path) > done_lines, process, 60)
    time.sleep(rng.uniform(0.0, 0.05))
    kill(process)

    process = start()
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err.decode()[-2000:]
    resumed = read_jsonl(history_path)
    assert strip_wall_clock(resumed) == strip_wall_clock(reference.history)
    metrics = [{k: v for k, v in m.items() if k not in ("time", "iteration_seconds")} for m in read_jsonl(workdir / "metrics.jsonl")]
    expected = [{k: v for k, v in m.items() if k not in ("time", "iteration_seconds")} for m in read_jsonl(tmp_path / "ref" / "metrics.jsonl")]
    assert metrics == expected
