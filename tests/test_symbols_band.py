"""The base policy's band: measured when the warm start is built, recorded, and a policy outside refused
with one line; compare seeds warm-start their own base policies; the reference table's drift (slow)."""

from __future__ import annotations

import importlib.util
import json
import os

import jax
import numpy as np
import pytest

import primitives.symbols as prims
from derl_jax.config import InputError
from derl_jax.domains import symbols
from derl_jax.experiment import compare
from derl_jax.rl import base_band, setup
from derl_jax.rl.config import inner_config
from derl_jax.rl.rollout import sample_rollouts

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK = prims.symbols_tokenizer()


def smoke_config(band=None):
    spec = importlib.util.spec_from_file_location("symbols_config", os.path.join(REPO_ROOT, "configs", "symbols.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = module.get_config("smoke")
    cfg.domain.base_policy_band = dict(band or {})
    return cfg


def position_by_hand(output: str, gold: str) -> float:
    """The text definition of `position` (docs/domains/symbols.md)."""
    return sum(a == b for a, b in zip(output, gold)) / max(len(output), len(gold), 1)


def test_check_band_refuses_with_one_line():
    band = {"position": (0.27, 0.35), "exact": (0.0, 0.03)}
    base_band.check_band({"position": 0.31, "exact": 0.01, "bag": 0.9}, band, domain="symbols", where="config.seed=3")
    with pytest.raises(base_band.BasePolicyOutOfBand) as caught:
        base_band.check_band({"position": 0.5, "exact": 0.01}, band, domain="symbols", where="config.seed=3")
    message = str(caught.value)
    assert isinstance(caught.value, InputError) and "\n" not in message
    assert message.startswith("config.seed=3:") and "position=0.500 outside [0.270, 0.350]" in message
    assert "exact" not in message.split("(")[0]
    assert base_band.band_violations({"position": 0.2, "exact": 0.04}, band) == [
        "position=0.200 outside [0.270, 0.350]", "exact=0.040 outside [0.000, 0.030]"]
    with pytest.raises(ValueError, match="not measured"):
        base_band.check_band({"exact": 0.0}, band, domain="symbols", where="x")


def test_domain_rejects_a_band_over_unknown_primitives():
    with pytest.raises(ValueError, match="base_policy_band"):
        symbols.make_symbols_domain(smoke_config({"nope": (0.0, 1.0)}).domain)
    with pytest.raises(ValueError, match="base_policy_band"):
        symbols.make_symbols_domain(smoke_config({"position": (0.5, 0.2)}).domain)
    assert symbols.make_symbols_domain(smoke_config({"position": (0.1, 0.2)}).domain).base_policy_band == {
        "position": (0.1, 0.2)}


def test_default_preset_declares_the_measured_band():
    spec = importlib.util.spec_from_file_location("symbols_config", os.path.join(REPO_ROOT, "configs", "symbols.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    band = module.get_config().domain.base_policy_band
    with open(os.path.join(REPO_ROOT, "benchmarks", "results", "symbols_band.json"), encoding="utf-8") as handle:
        measured = json.load(handle)["seeds"]
    assert len(measured) >= 5 and len(module.get_config("smoke").domain.base_policy_band) == 0
    for row in measured:   # every measured seed lies inside the declared band
        assert not base_band.band_violations(row["measured"], {k: tuple(v) for k, v in band.items()})


def test_out_of_band_policy_is_refused_and_the_property_recorded(tmp_path):
    cfg = smoke_config({"position": (0.99, 1.0)})
    domain = symbols.make_symbols_domain(cfg.domain)
    with pytest.raises(base_band.BasePolicyOutOfBand, match=r"config.seed=0: the symbols base policy's sampled position="):
        setup.base_policy(domain, cfg, tmp_path)
    record = setup.base_policy_property(tmp_path, 0)
    assert record["inside"] is False and record["band"] == {"position": [0.99, 1.0]}

    # the recorded means, recomputed from the same samples by the text definitions
    graphdef, params = setup.sft.base_policy(domain, cfg.policy, os.path.join(tmp_path, setup.BASE_POLICY_DIR),
                                             seed=0, holdout_rows=setup.validation_rows(domain.train.size, 0))
    rows = np.setdiff1d(np.arange(domain.train.size), setup.validation_rows(domain.train.size, int(cfg.outer.split_seed)))
    probe = domain.train.take(rows)
    inner = inner_config(cfg, domain.max_new_tokens)
    out = sample_rollouts(graphdef, params, probe.prompts, probe.prompt_mask, jax.random.key(base_band.PROBE_SEED),
                          max_new_tokens=domain.max_new_tokens, eos_id=domain.eos_id, pad_id=domain.pad_id,
                          stop_ids=domain.stop_ids, temperature=inner.temperature, top_k=inner.top_k, greedy=False)
    gold = [symbols.answer_of(s) for s in domain.info["train_strings"][rows]]
    texts = []
    for tokens, mask in zip(np.asarray(out.completions), np.asarray(out.mask)):
        ids = [int(t) for t, m in zip(tokens, mask) if m]
        ids = ids[: ids.index(TOK.eos_id)] if TOK.eos_id in ids else ids
        texts.append("".join(TOK.token_names[i] if i > TOK.eos_id else "\x00" for i in ids))
    assert record["measured"]["position"] == pytest.approx(np.mean([position_by_hand(t, g) for t, g in zip(texts, gold)]),
                                                           abs=1e-6)
    assert record["measured"]["marker"] == pytest.approx(np.mean(["#" in t for t in texts]), abs=1e-6)

    # inside the band: accepted, recorded as inside, and in the run's domain.json
    cfg = smoke_config({"position": (0.0, 1.0)})
    domain = symbols.make_symbols_domain(cfg.domain)
    setup.build_inner(domain, cfg, tmp_path)
    with open(os.path.join(tmp_path, setup.DOMAIN_INFO_FILE), encoding="utf-8") as handle:
        info = json.load(handle)
    assert info["base_policy_property"]["inside"] is True
    assert info["base_policy_property"]["measured"] == record["measured"]


def test_compare_seeds_build_their_own_base_policies(tmp_path):
    cfg = smoke_config({"position": (0.0, 1.0)})
    domain = symbols.make_symbols_domain(cfg.domain)
    base_params, evaluator = setup.build_inner(domain, cfg, tmp_path)
    assert cfg.compare.own_base_policy
    base_of = compare.own_base_policies(cfg, domain, evaluator, str(tmp_path), base_params)
    assert base_of(0) is base_params
    other = base_of(1)
    assert base_of(1) is other
    differ = jax.tree_util.tree_map(lambda a, b: bool(np.any(np.asarray(a) != np.asarray(b))), base_params, other)
    assert any(jax.tree_util.tree_leaves(differ))
    assert setup.base_policy_property(tmp_path, 1)["seed"] == 1
    with cfg.unlocked():
        cfg.compare.own_base_policy = False
    assert compare.own_base_policies(cfg, domain, evaluator, str(tmp_path), base_params) is None


# ----------------------------------------------------------------------------- reference drift (slow)

REFERENCE = os.path.join(REPO_ROOT, "benchmarks", "results", "symbols_reference_small.json")


@pytest.mark.slow
def test_reference_rewards_stay_where_the_table_put_them(tmp_path):
    """The small reference table's seeds and rewards rerun under its recorded XLA flags: the base
    property's seed mean within 0.025, each reward's test and training reward inside the 99% Welch
    interval (`benchmarks/symbols_reference.drift_violations`; docs/domains/symbols.md)."""
    import subprocess
    import sys

    from benchmarks import symbols_reference as reference

    with open(REFERENCE, encoding="utf-8") as handle:
        table = json.load(handle)
    env = dict(os.environ, XLA_FLAGS=table["xla_flags"])
    subprocess.run([sys.executable, "-m", "benchmarks.symbols_reference", f"--seeds={','.join(map(str, table['seeds']))}",
                    f"--expressions={';'.join(table['expressions'])}", f"--pairs={';'.join('|'.join(p) for p in table['pairs'])}", f"--workdir={tmp_path}",
                    *(f"--override={o}" for o in table["overrides"])],
                   check=True, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL)
    with open(os.path.join(tmp_path, "reference.json"), encoding="utf-8") as handle:
        rerun = json.load(handle)
    moved = reference.drift_violations(table, rerun)
    assert not moved, ("the symbols reference table moved: " + "; ".join(moved) + ". Regenerate "
                       "benchmarks/results/symbols_reference_small.json with the command of docs/domains/symbols.md "
                       "if the change is meant")
