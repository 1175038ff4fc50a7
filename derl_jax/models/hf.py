"""Hugging Face Qwen2 / Qwen2.5 / Qwen3 checkpoints <-> `ModelConfig` and params.

A checkpoint directory holds `config.json` and either `model.safetensors` or shards
`model-0000i-of-0000n.safetensors` listed in `model.safetensors.index.json`. Both config
forms are read: the hub form (`rope_theta`, `torch_dtype`) and the newer one
(`rope_parameters: {rope_theta: ...}`, `dtype`). Torch linear weights are [out, in]; ours
are [in, out], so every projection is transposed on the way in and out. With tied
embeddings `lm_head.weight` is absent (or ignored when present). `model_type` (or the
architecture) picks the family: "qwen2" has q/k/v biases, "qwen3" has none but per-head
q/k norms (`ModelConfig.family`); Qwen3's `attention_bias=true` variant is refused.

Tensor names (i over layers):
    model.embed_tokens.weight                       -> embed.embedding
    model.layers.i.input_layernorm.weight           -> layers.i.input_norm.scale
    model.layers.i.self_attn.{q,k,v}_proj.{weight,bias} -> layers.i.attn.{q,k,v}_proj.{kernel,bias}
    model.layers.i.self_attn.o_proj.weight          -> layers.i.attn.o_proj.kernel
    model.layers.i.self_attn.{q,k}_norm.weight      -> layers.i.attn.{q,k}_norm.scale (Qwen3)
    model.layers.i.post_attention_layernorm.weight  -> layers.i.post_attn_norm.scale
    model.layers.i.mlp.{gate,up,down}_proj.weight   -> layers.i.mlp.{gate,up,down}_proj.kernel
    model.norm.weight                               -> final_norm.scale
    lm_head.weight                                  -> lm_head.kernel (untied only)
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any, Mapping

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from derl_jax.models.transformer import DTYPES, ModelConfig, abstract_model, default_compute_dtype

CONFIG_FILE = "config.json"
SINGLE_WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
"""{ModelConfig.family (the config's model_type): transformers architecture}."""
_NUMPY_DTYPES = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be read as a Qwen2 / Qwen3 model."""


def read_hf_config(path: str) -> dict:
    """The parsed `config.json` of checkpoint directory `path`."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"Hugging Face checkpoint directory {path!r} does not exist")
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise FileNotFoundError(f"Hugging Face checkpoint {path!r} has no {CONFIG_FILE} (looked for {config_path!r})")
    with open(config_path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as error:
            raise CheckpointError(f"{config_path!r} is not valid JSON: {error}") from error


def _rope_theta(hf: Mapping[str, Any], where: str) -> float:
    rope = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    for table in (rope, scaling):
        kind = table.get("rope_type", table.get("type", "default"))
        if kind != "default":
            raise CheckpointError(f"{where}: rope_type {kind!r} is not supported (only 'default' RoPE)")
    theta = rope.get("rope_theta", hf.get("rope_theta"))
    if theta is None:
        raise CheckpointError(f"{where}: neither rope_parameters.rope_theta nor rope_theta is set")
    return float(theta)


def checkpoint_dtype(hf: Mapping[str, Any]) -> str:
    """The stored dtype name from `dtype` / `torch_dtype` ("float32" when absent or unknown)."""
    name = str(hf.get("dtype") or hf.get("torch_dtype") or "float32").replace("torch.", "")
    return name if name in DTYPES else "float32"


def config_from_hf(hf: Mapping[str, Any], *, param_dtype: str | None = None,
                   compute_dtype: str | None = None, remat: bool = False,
                   where: str = CONFIG_FILE) -> ModelConfig:
    """ModelConfig from a Qwen2 / Qwen3 `config.json` mapping; `where` names the source in errors."""
    family = model_family(hf, where)
    if hf.get("use_sliding_window"):
        raise CheckpointError(f"{where}: use_sliding_window=true is not supported")
    if family == "qwen3" and hf.get("attention_bias"):
        raise CheckpointError(f"{where}: attention_bias=true is not supported for Qwen3 (only bias-free attention)")
    if hf.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{where}: hidden_act {hf.get('hidden_act')!r} is not supported (only 'silu')")
    missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads") if k not in hf]
    if missing:
        raise CheckpointError(f"{where}: missing required fields {missing}")
    heads = int(hf["num_attention_heads"])
    return ModelConfig(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=int(hf["hidden_size"]),
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // heads),
        rope_theta=_rope_theta(hf, where),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_position=int(hf.get("max_position_embeddings", 32768)),
        dtype=compute_dtype or default_compute_dtype(),
        param_dtype=param_dtype or checkpoint_dtype(hf),
        remat=remat,
        family=family,
    )


def model_family(hf: Mapping[str, Any], where: str = CONFIG_FILE) -> str:
    """"qwen2" or "qwen3" from a `config.json` mapping's model_type, else its architectures."""
    architectures = list(hf.get("architectures") or [])
    model_type = hf.get("model_type")
    if model_type in ARCHITECTURES:
        return model_type
    for family, architecture in ARCHITECTURES.items():
        if architecture in architectures:
            return family
    expected = " or ".join(f"{a!r} (model_type {f!r})" for f, a in ARCHITECTURES.items())
    raise CheckpointError(f"{where}: not a Qwen2 or Qwen3 model (architectures={architectures}, "
                          f"model_type={model_type!r}); expected {expected}")


def config_to_hf(config: ModelConfig, dtype: str | None = None) -> dict:
    """A `config.json` mapping for `config`, readable by transformers 4.x and 5.x."""
    dtype = dtype or config.param_dtype
    family = {"attention_bias": False} if config.family == "qwen3" else {}
    return {
        "architectures": [ARCHITECTURES[config.family]],
        "model_type": config.family,
        **family,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rope_scaling": None,
        "tie_word_embeddings": config.tie_embeddings,
        "max_position_embeddings": config.max_position,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": config.num_layers,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": dtype,
        "torch_dtype": dtype,
    }


def hf_tensor_names(config: ModelConfig) -> dict[str, tuple[tuple, bool]]:
    """{HF tensor name: (our param path, transposed)} for every tensor of `config`'s model."""
    names: dict[str, tuple[tuple, bool]] = {"model.embed_tokens.weight": (("embed", "embedding"), False),
                                             "model.norm.weight": (("final_norm", "scale"), False)}
    for i in range(config.num_layers):
        hf_layer, layer = f"model.layers.{i}", ("layers", i)
        names[f"{hf_layer}.input_layernorm.weight"] = (layer + ("input_norm", "scale"), False)
        names[f"{hf_layer}.post_attention_layernorm.weight"] = (layer + ("post_attn_norm", "scale"), False)
        for proj in ("q_proj", "k_proj", "v_proj"):
            names[f"{hf_layer}.self_attn.{proj}.weight"] = (layer + ("attn", proj, "kernel"), True)
            if config.qkv_bias:
                names[f"{hf_layer}.self_attn.{proj}.bias"] = (layer + ("attn", proj, "bias"), False)
        if config.qk_norm:
            for norm in ("q_norm", "k_norm"):
                names[f"{hf_layer}.self_attn.{norm}.weight"] = (layer + ("attn", norm, "scale"), False)
        names[f"{hf_layer}.self_attn.o_proj.weight"] = (layer + ("attn", "o_proj", "kernel"), True)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            names[f"{hf_layer}.mlp.{proj}.weight"] = (layer + ("mlp", proj, "kernel"), True)
    if not config.tie_embeddings:
        names["lm_head.weight"] = (("lm_head", "kernel"), True)
    return names


def weight_files(path: str) -> list[str]:
    """Safetensors files of checkpoint directory `path` (single file or the shards of the index)."""
    single = os.path.join(path, SINGLE_WEIGHTS_FILE)
    index = os.path.join(path, INDEX_FILE)
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index!r} has no weight_map")
        files = [os.path.join(path, name) for name in sorted(set(weight_map.values()))]
        absent = [f for f in files if not os.path.isfile(f)]
        if absent:
            raise FileNotFoundError(f"{index!r} lists shard files that do not exist: {absent}")
        return files
    if os.path.isfile(single):
        return [single]
    raise FileNotFoundError(
        f"Hugging Face checkpoint {path!r} has no weights: expected {SINGLE_WEIGHTS_FILE} or {INDEX_FILE}")


def read_tensors(files: list[str]) -> dict[str, np.ndarray]:
    """{name: array} of every tensor in the safetensors `files` (bf16 as ml_dtypes.bfloat16)."""
    tensors: dict[str, np.ndarray] = {}
    for file in files:
        with safe_open(file, framework="np") as reader:
            for name in reader.keys():
                tensors[name] = reader.get_tensor(name)
    return tensors


def _set_path(tree: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get_path(tree: Mapping, path: tuple) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def load_hf_checkpoint(path: str, dtype: str | None = None, *, compute_dtype: str | None = None,
                       remat: bool = False) -> tuple[ModelConfig, nnx.State]:
    """(ModelConfig, params) of the Qwen2 / Qwen3 checkpoint in directory `path`.

    dtype: parameter storage dtype name; None keeps the checkpoint's (`dtype`/`torch_dtype`).
    compute_dtype: None picks float32 on CPU, bfloat16 on accelerators.
    The graphdef to use with the params is `abstract_model(config)[0]` (see `load_hf_model`).
    """
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"load_hf_checkpoint: dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    config = config_from_hf(read_hf_config(path), param_dtype=dtype, compute_dtype=compute_dtype,
                            remat=remat, where=os.path.join(path, CONFIG_FILE))
    tensors = read_tensors(weight_files(path))
    _, abstract = abstract_model(config)
    shapes = nnx.to_pure_dict(abstract)
    expected = hf_tensor_names(config)
    missing = [name for name in expected if name not in tensors]
    if missing:
        raise CheckpointError(f"checkpoint {path!r} lacks tensors {missing[:8]}"
                              + (f" and {len(missing) - 8} more" if len(missing) > 8 else ""))
    known = set(expected) | ({"lm_head.weight"} if config.tie_embeddings else set())
    unexpected = [n for n in tensors if n not in known and not n.endswith(_IGNORED_SUFFIXES)]
    if unexpected:
        raise CheckpointError(f"checkpoint {path!r} has tensors that a {config.family} model of this config "
                              f"does not use: {sorted(unexpected)[:8]}")
    values: dict = {}
    storage = _NUMPY_DTYPES[config.param_dtype]
    for name, (param_path, transposed) in expected.items():
        target_shape = tuple(_get_path(shapes, param_path).shape)
        hf_shape = target_shape[::-1] if transposed else target_shape
        tensor = tensors[name]
        if tuple(tensor.shape) != hf_shape:
            raise CheckpointError(
                f"checkpoint {path!r}: tensor {name} has shape {tuple(tensor.shape)}, expected {hf_shape}")
        array = tensor.T if transposed else tensor
        _set_path(values, param_path, jnp.asarray(np.ascontiguousarray(array.astype(storage))))
    nnx.replace_by_pure_dict(abstract, values)
    return config, abstract


def load_hf_model(path: str, dtype: str | None = None, *, compute_dtype: str | None = None,
                  remat: bool = False) -> tuple[ModelConfig, nnx.GraphDef, nnx.State]:
    """(config, graphdef, params) of the checkpoint in `path`; see `load_hf_checkpoint`."""
    config, params = load_hf_checkpoint(path, dtype, compute_dtype=compute_dtype, remat=remat)
    return config, abstract_model(config)[0], params


def save_hf_checkpoint(path: str, config: ModelConfig, params: nnx.State, *, dtype: str | None = None,
                       max_shard_bytes: int | None = None) -> list[str]:
    """Write `config.json` and safetensors weights for `transformers.Qwen2ForCausalLM` (or
    `Qwen3ForCausalLM` for a "qwen3" config) into directory `path` (created if absent; files of
    the same names are replaced in place, see `save_hf_directory` for an atomic write).

    dtype: stored dtype name (default config.param_dtype). max_shard_bytes: split the weights
    into `model-0000i-of-0000n.safetensors` files plus `model.safetensors.index.json` when
    they exceed it (default: one `model.safetensors`). Returns the weight file names written.
    """
    dtype = dtype or config.param_dtype
    if dtype not in _NUMPY_DTYPES:
        raise ValueError(f"save_hf_checkpoint: dtype must be one of {sorted(_NUMPY_DTYPES)}, got {dtype!r}")
    values = nnx.to_pure_dict(params)
    tensors: dict[str, np.ndarray] = {}
    for name, (param_path, transposed) in hf_tensor_names(config).items():
        try:
            array = np.asarray(_get_path(values, param_path))
        except (KeyError, IndexError, TypeError) as error:
            raise ValueError(f"save_hf_checkpoint: params lack {'.'.join(map(str, param_path))} "
                             f"needed for {name}") from error
        array = array.astype(_NUMPY_DTYPES[dtype])
        tensors[name] = np.ascontiguousarray(array.T if transposed else array)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(config_to_hf(config, dtype), f, indent=2)
    shards = _pack_shards(tensors, max_shard_bytes)
    metadata = {"format": "pt"}
    if len(shards) == 1:
        if os.path.exists(os.path.join(path, INDEX_FILE)):
            os.remove(os.path.join(path, INDEX_FILE))
        save_file(shards[0], os.path.join(path, SINGLE_WEIGHTS_FILE), metadata=metadata)
        return [SINGLE_WEIGHTS_FILE]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for file_name, shard in zip(names, shards):
        save_file(shard, os.path.join(path, file_name), metadata=metadata)
        weight_map.update({tensor_name: file_name for tensor_name in shard})
    index = {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))}, "weight_map": weight_map}
    with open(os.path.join(path, INDEX_FILE), "w") as f:
        json.dump(index, f, indent=2)
    return names


def save_hf_directory(path: str, config: ModelConfig, params: nnx.State, *, tokenizer: Any = None,
                      chat_template: str | None = None, generation: Mapping[str, Any] | None = None,
                      dtype: str | None = None, max_shard_bytes: int | None = None) -> str:
    """Write a whole Hugging Face model directory at `path` atomically: `save_hf_checkpoint`'s
    files, plus the tokenizer's files (`tokenizer.save_pretrained`, a transformers tokenizer),
    `chat_template` when given and not already the tokenizer's own, and `generation` (e.g.
    {"eos_token_id": [...], "pad_token_id": ...}) as `generation_config.json`.

    Everything is written into a temporary directory beside `path`, which then takes its place
    by rename (a directory already at `path` is moved aside first and deleted after), so a
    process killed mid-write leaves the previous directory or none, never a partial one.
    Returns `path`.
    """
    path = os.path.abspath(path)
    parent, name = os.path.dirname(path), os.path.basename(path)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=parent)
    try:
        save_hf_checkpoint(staging, config, params, dtype=dtype, max_shard_bytes=max_shard_bytes)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
            if chat_template and chat_template != getattr(tokenizer, "chat_template", None):
                _write_chat_template(staging, chat_template)
        if generation:
            with open(os.path.join(staging, GENERATION_CONFIG_FILE), "w") as f:
                json.dump(dict(generation), f, indent=2)
        _sync_tree(staging)
        _replace_directory(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


CHAT_TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


def _write_chat_template(directory: str, template: str) -> None:
    """`template` as the directory's chat template: `chat_template.jinja`, and the
    `chat_template` entry of tokenizer_config.json when that file carries one."""
    with open(os.path.join(directory, CHAT_TEMPLATE_FILE), "w", encoding="utf-8") as f:
        f.write(template)
    config_path = os.path.join(directory, TOKENIZER_CONFIG_FILE)
    if os.path.isfile(config_path):
        with open(config_path, encoding="utf-8") as f:
            tokenizer_config = json.load(f)
        if "chat_template" in tokenizer_config:
            tokenizer_config["chat_template"] = template
            with open(config_path, "w", encoding="utf-8") as f:
                json.dump(tokenizer_config, f, indent=2, ensure_ascii=False)


def _sync_tree(directory: str) -> None:
    """fsync every file of `directory` and the directory itself."""
    for name in os.listdir(directory):
        file_path = os.path.join(directory, name)
        if os.path.isfile(file_path):
            with open(file_path, "rb") as f:
                os.fsync(f.fileno())
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _replace_directory(staging: str, path: str) -> None:
    """Rename `staging` to `path`; a directory already there is moved aside, then deleted."""
    old = None
    if os.path.lexists(path):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".old", dir=os.path.dirname(path))
        os.rename(path, os.path.join(old, "previous"))
    os.rename(staging, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    descriptor = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _pack_shards(tensors: dict[str, np.ndarray], max_shard_bytes: int | None) -> list[dict[str, np.ndarray]]:
    """Tensors in order, cut into consecutive groups of at most `max_shard_bytes` (a larger tensor alone)."""
    if max_shard_bytes is None:
        return [tensors]
    if max_shard_bytes <= 0:
        raise ValueError(f"save_hf_checkpoint: max_shard_bytes must be positive, got {max_shard_bytes}")
    shards: list[dict[str, np.ndarray]] = [{}]
    used = 0
    for name, tensor in tensors.items():
        if shards[-1] and used + tensor.nbytes > max_shard_bytes:
            shards.append({})
            used = 0
        shards[-1][name] = tensor
        used += tensor.nbytes
    return shards
