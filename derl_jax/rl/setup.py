"""Building the inner loop of a run: the base policy, the mesh and the one evaluator.

    base_params, evaluator = build_inner(domain, cfg, workdir)

The base policy is a local Hugging Face checkpoint (`config.policy.checkpoint`, Qwen2 /
Qwen2.5; cold-started by `config.policy.sft_steps` > 0 supervised steps on the domain's corpus,
`sft.cold_start`) or a scratch policy of the `config.policy` sizes, warm-started by supervised
fine-tuning on the domain's corpus when `config.policy.sft_steps` > 0 (cached under
`<workdir>/base_policy/`; the corpus leaves out the validation rows of
`config.outer.split_seed`, so validation scores measure held-out accuracy). The evaluator
(`derl_jax.rl.evaluator.CandidateEvaluator`) is chosen by the domain's rollout kind: device
kinds ("device", "env") train K candidates in the jitted loop (`DeviceEvaluator`), the host
kind overlaps host scoring with sampling (`HostEvaluator`); both read the same
`InnerConfig` (`derl_jax.rl.config`).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from flax import nnx
from jax.sharding import Mesh

from derl_jax.domains.base import Domain, TokenDataset, split_train
from derl_jax.models.transformer import count_params
from derl_jax.parallel import CAND_AXIS, is_primary_process
from derl_jax.rl import base_band, sft
from derl_jax.rl.config import check_rollout_kind, inner_config
from derl_jax.rl.device_evaluator import DeviceEvaluator
from derl_jax.rl.host_loop import HostEvaluator
from derl_jax.rl.placement import auto_data_size, compiler_options_for, run_mesh

BASE_POLICY_DIR = "base_policy"
DOMAIN_INFO_FILE = "domain.json"
BASE_PROPERTY_PREFIX = "property_seed_"   # <workdir>/base_policy/property_seed_<s>.json: the banded property


def _policy_field(cfg: Any, name: str, default: Any) -> Any:
    policy = cfg.policy
    return policy.get(name, default) if hasattr(policy, "get") else getattr(policy, name, default)


def validation_rows(num_train: int, split_seed: int) -> np.ndarray:
    """Rows of the training split that the outer loop holds out for validation
    (`derl_jax.domains.base.split_train` applied to row numbers)."""
    rows = np.arange(num_train)
    numbered = TokenDataset(prompts=rows[:, None], prompt_mask=np.ones((num_train, 1), bool), context={})
    _, validation = split_train(numbered, split_seed)
    return np.asarray(validation.prompts)[:, 0]


def load_checkpoint(domain: Domain, cfg: Any) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, params) of the local Hugging Face checkpoint `config.policy.checkpoint`."""
    from derl_jax.models import hf

    checkpoint = os.path.expanduser(str(cfg.policy.checkpoint).strip())
    compute = str(_policy_field(cfg, "compute_dtype", "")) or None
    config, graphdef, params = hf.load_hf_model(checkpoint, str(_policy_field(cfg, "param_dtype", "")) or None,
                                                compute_dtype=compute, remat=bool(_policy_field(cfg, "remat", False)))
    where = f"config.policy.checkpoint={checkpoint!r}"
    if config.vocab_size < domain.tokenizer.vocab_size:
        raise ValueError(f"{where}: vocabulary of {config.vocab_size} tokens, but the tokenizer has "
                         f"{domain.tokenizer.vocab_size}")
    longest = domain.prompt_length + domain.max_new_tokens
    if longest > config.max_position:
        raise ValueError(f"{where}: max_position {config.max_position} < the longest prompt plus completion ({longest})")
    return graphdef, params


def base_policy(domain: Domain, cfg: Any, workdir: str | os.PathLike | None) -> tuple[nnx.GraphDef, nnx.State]:
    """(graphdef, params) of the run's base policy (module docstring)."""
    checkpoint = str(_policy_field(cfg, "checkpoint", "")).strip()
    if checkpoint and int(_policy_field(cfg, "sft_steps", 0)) == 0:
        return load_checkpoint(domain, cfg)
    held_out = validation_rows(domain.train.size, int(cfg.outer.split_seed))
    cache = os.path.join(os.fspath(workdir), BASE_POLICY_DIR) if workdir is not None else None
    if cache is None:
        import tempfile

        cache = tempfile.mkdtemp(prefix="derl_base_policy_")
    if checkpoint:   # the cold start of a pretrained policy (sft.cold_start)
        graphdef, params = load_checkpoint(domain, cfg)
        return graphdef, sft.cold_start(domain, graphdef, params, cfg.policy, cache, seed=int(cfg.seed),
                                        holdout_rows=held_out, source=os.path.expanduser(checkpoint))
    graphdef, params = sft.base_policy(domain, cfg.policy, cache, seed=int(cfg.seed), holdout_rows=held_out)
    if domain.base_policy_band:
        check_base_policy(domain, graphdef, params, cfg, held_out, cache)
    return graphdef, params


def check_base_policy(domain: Domain, graphdef: nnx.GraphDef, params: nnx.State, cfg: Any, held_out: np.ndarray,
                      cache: str) -> dict:
    """Measure the base policy's banded property on the inner-training rows (`base_band.measure`),
    record it in `<cache>/property_seed_<seed>.json` and raise `BasePolicyOutOfBand` outside the band."""
    inner_rows = np.setdiff1d(np.arange(domain.train.size), held_out)
    measured = base_band.measure(domain, graphdef, params, inner_config(cfg, domain.max_new_tokens),
                                 domain.train.take(inner_rows))
    band = {name: [float(low), float(high)] for name, (low, high) in domain.base_policy_band.items()}
    record = {"seed": int(cfg.seed), "measured": measured, "band": band,
              "inside": not base_band.band_violations(measured, domain.base_policy_band)}
    if is_primary_process():
        os.makedirs(cache, exist_ok=True)
        with open(os.path.join(cache, f"{BASE_PROPERTY_PREFIX}{int(cfg.seed)}.json"), "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=2)
    base_band.check_band(measured, domain.base_policy_band, domain=domain.name, where=f"config.seed={int(cfg.seed)}")
    return record


def base_policy_property(workdir: str | os.PathLike, seed: int) -> dict | None:
    """The recorded base-policy property of `seed` in `workdir` (`check_base_policy`), None when not measured."""
    path = os.path.join(os.fspath(workdir), BASE_POLICY_DIR, f"{BASE_PROPERTY_PREFIX}{int(seed)}.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def make_evaluator(domain: Domain, graphdef: nnx.GraphDef, cfg: Any, mesh: Mesh | None = None):
    """The evaluator of `domain`'s rollout kind under a run config (`config.inner`, `final.steps`,
    `config.mesh` unless `mesh` is given; `mesh.data` = 0 counts as 1 here, `build_inner`
    resolves it).

    `config.inner.dispatch` (device kinds): "batched", "loop", or "auto" = "loop" on CPU
    devices when the 'cand' axis is 1 (one policy at a time, its rows over 'data': faster there,
    see benchmarks/bench_inner.py, and one compilation for any number of candidates) and
    "batched" otherwise. On CPU a single-turn domain's loops compile with
    `placement.compiler_options_for` (XLA's matmul library for single matmuls only).
    """
    mesh = run_mesh(cfg) if mesh is None else mesh
    inner = inner_config(cfg, domain.max_new_tokens)
    if domain.rollout == "host":
        return HostEvaluator(domain, graphdef, inner, mesh)
    platform = mesh.devices.flat[0].platform
    dispatch = inner.dispatch
    if dispatch == "auto":
        dispatch = "loop" if mesh.shape[CAND_AXIS] == 1 and platform == "cpu" else "batched"
    return DeviceEvaluator(domain, graphdef, inner, mesh=mesh, dispatch=dispatch,
                           compiler_options=compiler_options_for(domain.rollout, platform))


def build_inner(domain: Domain, cfg: Any, workdir: str | os.PathLike | None, *,
                host_cores: int | None = None) -> tuple[Any, Any]:
    """(base_params, evaluator) of a run: the policy (checkpoint, or scratch + warm start), the
    mesh and the evaluator of the domain's rollout kind. `workdir` (when given) receives
    `domain.json` (the domain's info, primitives, rollout kind and mesh) and the cached base policy.
    `host_cores`: the CPU cores the run may use when `config.mesh.data` is 0 (auto; default all
    of this process's, `placement.auto_data_size`)."""
    inner = inner_config(cfg, domain.max_new_tokens)
    check_rollout_kind(inner, domain)   # before the warm start, which may take a while
    graphdef, params = base_policy(domain, cfg, workdir)
    mesh = run_mesh(cfg, auto_data_size(cfg, inner, count_params(params), cores=host_cores))
    evaluator = make_evaluator(domain, graphdef, cfg, mesh)
    if domain.rollout == "host":
        params = evaluator.place(params)
    if workdir is not None and is_primary_process():  # process 0 alone writes the run directory
        os.makedirs(os.fspath(workdir), exist_ok=True)
        info = {key: value for key, value in dict(domain.info).items() if _is_json(value)}
        with open(os.path.join(os.fspath(workdir), DOMAIN_INFO_FILE), "w", encoding="utf-8") as handle:
            json.dump({**info, "domain": domain.name, "rollout": domain.rollout,
                       "primitives": list(domain.primitive_names), "mesh": dict(mesh.shape),
                       **({"base_policy_property": base_policy_property(workdir, int(cfg.seed))}
                          if domain.base_policy_band else {})}, handle, indent=2)
    return params, evaluator


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False
