"""Trained policies out of the codebase: Hugging Face model directories (`--mode=export`).

Every final policy a run keeps is also written as `final_policy_hf/` beside its
`final_policy.npz` (and `--mode=final` writes one in its workdir): `config.json` and
`model.safetensors` that `transformers.AutoModelForCausalLM.from_pretrained` loads
(`Qwen2ForCausalLM` or `Qwen3ForCausalLM`), plus the run's tokenizer files, chat template and
stop / padding ids (`generation_config.json`) when its tokenizer is a Hugging Face one. A word- or character-level scratch policy's tokenizer
is derl_jax's own (`derl_jax.models.tokenizers`, a domain's word table), so its directory holds
the weights and config alone. Each directory is written atomically (`hf.save_hf_directory`).

`export_run` is `--mode=export`: it reads the `final_policy.npz` files under a run directory
(or one given `.npz`) and writes their Hugging Face directories, rebuilding the policy's shape
from the run config (its checkpoint's config.json, or the scratch sizes and the domain's
vocabulary) without training or loading any weights but the file's.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

import jax
import numpy as np
from flax import nnx

from derl_jax.config import InputError, config_value, has_field
from derl_jax.models import hf
from derl_jax.models.transformer import ModelConfig, abstract_model, config_of
from derl_jax.outer import candidate_policies

FINAL_POLICY_FILE = "final_policy.npz"
FINAL_POLICY_HF_DIR = "final_policy_hf"


def hf_tokenizer_of(tokenizer: Any) -> tuple[Any, str | None]:
    """(the transformers tokenizer inside `tokenizer`, the chat template the run used) or
    (None, None): a domain's tokenizer is a `HFTokenizer`, a table wrapping one (agent domains'
    `SubwordTable`), or a tokenizer of derl_jax's own, which has none."""
    template = None
    for _ in range(4):
        if tokenizer is None:
            return None, None
        template = getattr(tokenizer, "chat_template", None) if template is None else template
        if hasattr(tokenizer, "save_pretrained"):
            return tokenizer, template if isinstance(template, str) else None
        tokenizer = getattr(tokenizer, "tokenizer", None)
    return None, None


def hf_dir_for(npz_path: str) -> str:
    """Where the Hugging Face directory of the policy file `npz_path` goes: `final_policy_hf/`
    beside `final_policy.npz`, `<name>_hf/` beside any other `<name>.npz`."""
    directory, name = os.path.split(os.path.abspath(npz_path))
    stem = name[:-len(".npz")] if name.endswith(".npz") else name
    return os.path.join(directory, f"{stem}_hf")


def write_policy_hf(path: str, params: nnx.State, *, graphdef: nnx.GraphDef | None = None,
                    config: ModelConfig | None = None, tokenizer: Any = None) -> str | None:
    """Write `params` (one policy; its ModelConfig is `config`, or read from `graphdef`) as a
    Hugging Face directory at `path` with the tokenizer found in `tokenizer` (`hf_tokenizer_of`).
    Only process 0 of a multi-process job writes; returns `path` there, None elsewhere."""
    if jax.process_index() != 0:
        return None
    config = config if config is not None else config_of(graphdef, params)
    host = jax.tree_util.tree_map(np.asarray, jax.device_get(params))
    transformers_tokenizer, template = hf_tokenizer_of(tokenizer)
    return hf.save_hf_directory(path, config, host, tokenizer=transformers_tokenizer, chat_template=template,
                                generation=_generation_ids(tokenizer) if transformers_tokenizer is not None else None)


def _generation_ids(tokenizer: Any) -> dict | None:
    """{"eos_token_id": the ids the run stopped on, "pad_token_id": its padding id} of the first
    `HFTokenizer` (an object with `stop_ids`) inside `tokenizer`, else None."""
    for _ in range(4):
        if tokenizer is None:
            return None
        if hasattr(tokenizer, "stop_ids") and hasattr(tokenizer, "pad_id"):
            return {"eos_token_id": [int(i) for i in tokenizer.stop_ids], "pad_token_id": int(tokenizer.pad_id)}
        tokenizer = getattr(tokenizer, "tokenizer", None)
    return None


def _policy_field(cfg: Any, name: str) -> str:
    path = f"policy.{name}"
    return str(config_value(cfg, path) or "").strip() if has_field(cfg, path) else ""


def policy_shape(cfg: Any) -> tuple[ModelConfig, Any]:
    """(ModelConfig, tokenizer or None) of a run config's policy, without its weights: a
    checkpoint policy's from its config.json (dtypes as the run loads it) and its tokenizer
    directory; a scratch policy's from `policy.*` and the built domain's vocabulary."""
    checkpoint = os.path.expanduser(_policy_field(cfg, "checkpoint"))
    if checkpoint:
        config = hf.config_from_hf(hf.read_hf_config(checkpoint), param_dtype=_policy_field(cfg, "param_dtype") or None,
                                   compute_dtype=_policy_field(cfg, "compute_dtype") or None,
                                   where=f"config.policy.checkpoint={checkpoint!r}")
        from derl_jax.models.hf_tokenizer import HFTokenizer

        tokenizer_dir = os.path.expanduser(_policy_field(cfg, "tokenizer") or checkpoint)
        return config, HFTokenizer.from_directory(tokenizer_dir)
    from derl_jax.experiment import build
    from derl_jax.rl.sft import policy_model_config

    domain = build.build_domain(cfg)
    return policy_model_config(domain, cfg.policy), domain.tokenizer


def find_policies(workdir: str) -> list[str]:
    """Every `final_policy.npz` under `workdir`, sorted."""
    found = []
    for root, _, files in os.walk(workdir):
        if FINAL_POLICY_FILE in files:
            found.append(os.path.join(root, FINAL_POLICY_FILE))
    return sorted(found)


def export_run(cfg: Any, workdir: str, policy: str | None = None) -> list[str]:
    """--mode=export: the Hugging Face directory of `policy` (a `.npz` of `candidate_policies.save_stack`,
    e.g. a kept `final_policy.npz`), or of every `final_policy.npz` under `workdir`; returns the
    directories written. InputError naming the flag or file when there is nothing to export or a
    file does not fit the configured policy."""
    if policy is not None:
        if not policy.endswith(".npz") or not os.path.isfile(policy):
            raise InputError(f"--policy={policy!r}: no such .npz file")
        files = [policy]
    else:
        if not os.path.isdir(workdir):
            raise InputError(f"--workdir={workdir!r}: no such directory to export final policies from")
        files = find_policies(workdir)
        if not files:
            raise InputError(f"--workdir={workdir!r} holds no {FINAL_POLICY_FILE} (a compare keeps them with "
                             f"compare.keep_final_policies=True); pass --policy=FILE.npz")
    try:
        config, tokenizer = policy_shape(cfg)
    except (OSError, ValueError) as err:
        raise InputError(str(err)) from None
    _, template = abstract_model(config)
    written = []
    for path in files:
        try:
            stacked, _ = candidate_policies.load_stack(path, template)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as err:
            raise InputError(f"--policy={path!r}: {err}" if policy else f"{path}: {err}") from None
        if stacked is None:
            raise InputError(f"{path}: holds no policy")
        params = jax.tree_util.tree_map(lambda x: x[0], stacked)
        target = write_policy_hf(hf_dir_for(path), params, config=config, tokenizer=tokenizer)
        if target is not None:
            written.append(target)
    return written
