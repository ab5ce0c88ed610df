"""Checkpoint loader: a local Hugging Face directory (config.json + *.safetensors) -> a module tree.

Never downloads: the path must be a directory on disk (a repo id in the local hub cache is
resolved to its snapshot directory before it gets here: worker/hub_cache.py). Tensors are read with safetensors'
`safe_open` straight onto the target device and cast to the target dtype, one at a time, into a
module tree built on the meta device (so no weight is ever allocated twice). Every failure is a
CheckpointError (a ValueError) naming the file or tensor at fault; a missing directory or file
is also a FileNotFoundError. Loading in float16 refuses a checkpoint holding values beyond
float16's range (they would become inf, and every logit NaN), naming the tensor.

`trust_remote_code` (EngineArgs', vLLM's name) is passed to transformers' AutoConfig and
AutoTokenizer, so a checkpoint's own configuration / tokenization code may run when it is True;
the module tree is always transformers' own class for a SUPPORTED_ARCHITECTURES entry, never a
checkpoint's modeling code.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch
from torch import nn

# Architectures whose transformers modules FlatModel drives (config.json "architectures").
SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen2ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")
# Checkpoint tensors some exporters write that are recomputed buffers, not weights (older
# transformers saved inv_freq; ColossalAI-trained checkpoints carry the cos/sin caches too).
IGNORED_SUFFIXES = (".rotary_emb.inv_freq", ".rotary_emb.cos_cached", ".rotary_emb.sin_cached")
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"  # save_pretrained's name for an unsharded checkpoint
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


@dataclass(frozen=True)
class TensorSlice:
    """Rows start:stop of dimension `dim` (0 or 1) of a checkpoint tensor, zero-padded to `size`
    along that dimension (size >= stop - start). What a tensor-parallel rank reads of a weight
    it holds a shard of (worker/tp_shard.py decides which); the loader reads only those bytes."""

    dim: int
    start: int
    stop: int
    size: int


# name, full shape -> the part of the tensor to read, or None for all of it.
Slicer = Callable[[str, tuple], Optional[TensorSlice]]


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file or tensor."""


class CheckpointNotFound(CheckpointError, FileNotFoundError):
    """A checkpoint directory, config or shard that does not exist."""


def _read_json(path: Path) -> dict:
    """The JSON object in `path` (config.json, the shard index): a CheckpointError naming the
    file when it cannot be read, is no JSON, or holds no object (a list or a string made every
    reader's .get an AttributeError naming neither file nor field)."""
    try:
        body = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e
    if not isinstance(body, dict):
        raise CheckpointError(f"{path}: must hold a JSON object, got {type(body).__name__}")
    return body


def _local_dir(path, what: str, holds: str) -> Path:
    """`path` as the Path of an existing directory, else a CheckpointError naming it: an empty
    path (which Path reads as the current directory) and a file (config.json or a shard, given
    for its directory) are refused as such, anything else missing is CheckpointNotFound.
    `what` names the directory ("checkpoint"), `holds` what it should hold."""
    if not str(path).strip():
        raise CheckpointNotFound(f"{what} directory must be a non-empty path, got {str(path)!r}")
    root = Path(path)
    if root.exists() and not root.is_dir():
        raise CheckpointError(
            f"{what} path {root} is a file, not a directory (give the directory holding {holds})"
        )
    if not root.is_dir():
        raise CheckpointNotFound(
            f"{what} directory {root} does not exist (only local directories "
            f"are loaded; nothing is downloaded)"
        )
    return root


def check_checkpoint_dir(path) -> Path:
    """The checkpoint directory as a Path, after checking it holds a config.json."""
    root = _local_dir(path, "checkpoint", "config.json")
    if not (root / "config.json").is_file():
        raise CheckpointNotFound(f"checkpoint directory {root} has no config.json")
    return root


def merge_hf_overrides(config: dict, hf_overrides: Optional[dict]) -> dict:
    """config.json's object with EngineArgs.hf_overrides laid over it, as a new dict (neither
    argument changes): each key of the overrides replaces the config's, except that a dict over
    a dict merges key by key, at every depth (rope_parameters / rope_scaling, a text_config), so
    an override names only what it changes. vLLM sets a top-level dict value as given and
    merges only into a nested config object; here a partial rope dict keeps the checkpoint's
    rope_theta and rope_type, which a replaced one would drop without a word. A key the config
    lacks is added (vLLM's rule). Where config.json has transformers 5's rope_parameters, an
    override of the older top-level rope_theta / rope_scaling merges into it (_fold_legacy_rope).
    A null rope_scaling or rope_parameters turns the checkpoint's rope scaling off: the default
    rope at its rope_theta (or the overrides'), whichever form config.json has (_clear_rope)."""
    merged = deep_merge(config, hf_overrides or {})
    _fold_legacy_rope(merged, hf_overrides or {})
    _clear_rope(config, merged, hf_overrides or {})
    return merged


def deep_merge(base: dict, over: dict) -> dict:
    """`over` laid over `base` as a new dict (neither changes): a dict over a dict merges key by
    key, at every depth; any other value replaces (a copy of it). Also the CLI's rule for a JSON
    flag given again in dotted form (entrypoints/cli.merge_dotted)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _fold_legacy_rope(merged: dict, hf_overrides: dict) -> None:
    """transformers 5 builds the rope from rope_parameters where config.json has it: a top-level
    rope_theta beside it is ignored, and a rope_scaling replaces it, rope_theta reset to the
    family's default. So an override of either (vLLM users' names, from configs of the older
    form) would be lost or lose the checkpoint's theta; it merges into rope_parameters
    instead, meaning what it means on a checkpoint saved in the older form."""
    params = merged.get("rope_parameters")
    if not isinstance(params, dict) or "rope_parameters" in hf_overrides:
        return
    legacy = dict(hf_overrides["rope_scaling"]) if isinstance(hf_overrides.get("rope_scaling"), dict) else {}
    if "rope_theta" in hf_overrides:
        legacy["rope_theta"] = hf_overrides["rope_theta"]
    if legacy:
        merged["rope_parameters"] = deep_merge(params, legacy)
        merged.pop("rope_scaling", None)
        merged.pop("rope_theta", None)


def _clear_rope(config: dict, merged: dict, hf_overrides: dict) -> None:
    """{"rope_scaling": null} (vLLM users' way to drop a checkpoint's yarn or llama3 scaling) or
    {"rope_parameters": null}: the default rope at the checkpoint's rope_theta (or the
    overrides'), for either name over either form of config.json: the older form keeps its
    top-level rope_theta beside a null rope_scaling; transformers 5's form gets
    rope_parameters {"rope_type": "default", "rope_theta": ...} (a plain null there would be
    ignored, or reset rope_theta to the family's default)."""
    if not any(
        name in hf_overrides and hf_overrides[name] is None for name in ("rope_scaling", "rope_parameters")
    ):
        return
    params = config.get("rope_parameters")
    if not isinstance(params, dict):  # the older form: rope_theta stays beside a null scaling
        merged["rope_scaling"] = None
        merged.pop("rope_parameters", None)
        return
    theta = hf_overrides.get("rope_theta", params.get("rope_theta"))
    merged["rope_parameters"] = {"rope_type": "default", **({} if theta is None else {"rope_theta": theta})}
    merged.pop("rope_scaling", None)
    merged.pop("rope_theta", None)


def config_label(path, hf_overrides: Optional[dict]) -> str:
    """How errors name the config read: config.json's path, with the overrides where given
    (what config.json says is then not what was refused)."""
    config_path = Path(path) / "config.json"
    return f"{config_path} with hf_overrides {hf_overrides!r}" if hf_overrides else str(config_path)


def read_config_json(path, hf_overrides: Optional[dict] = None) -> dict:
    """The one reader of a target checkpoint's config.json: its object with hf_overrides merged
    (merge_hf_overrides). Everything that reads the target's config goes through here or
    load_config, which builds on it, so an override reaches every reader: the architecture and
    quantization checks, the dtype resolution, the model built (its max_position_embeddings,
    EOS, rope), the tensor-parallel plan and every rank's shard, the draft checks."""
    config = _read_json(check_checkpoint_dir(path) / "config.json")
    return merge_hf_overrides(config, hf_overrides) if hf_overrides else config


def architecture_of(path, hf_overrides: Optional[dict] = None) -> str:
    """The architecture named by config.json (a list of names, or one name); CheckpointError
    unless it is supported and its weights are unquantized (a quantization_config means packed
    or scaled tensors this loader would only meet as "unexpected tensor" errors)."""
    config = read_config_json(path, hf_overrides)
    config_path = config_label(path, hf_overrides)
    quant = config.get("quantization_config")
    if quant:
        method = quant.get("quant_method", "unknown") if isinstance(quant, dict) else quant
        raise CheckpointError(
            f"{config_path}: the checkpoint is quantized (quant_method {method!r}); enginespec loads "
            f"unquantized weights only (float32, float16 or bfloat16 safetensors), as "
            f"EngineArgs.quantization=None says"
        )
    archs = config.get("architectures") or []
    if isinstance(archs, str):  # a hand-edited config's lone name: not a list of its characters
        archs = [archs]
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return arch
    raise CheckpointError(
        f"{config_path}: unsupported architecture {archs or '(none given)'}; "
        f"supported: {list(SUPPORTED_ARCHITECTURES)}"
    )


def _check_rope_type(config, config_path: Path | str) -> None:
    """CheckpointError unless the config's rope scaling (rope_parameters, or rope_scaling in older
    configs) is one transformers computes: "default" or a key of its ROPE_INIT_FUNCTIONS. Any
    other (a legacy "su", a typo) made the model's rotary module raise a bare KeyError."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None)
    if not isinstance(rope, dict):
        return
    kind = rope.get("rope_type", rope.get("type", "default"))
    supported = ["default", *ROPE_INIT_FUNCTIONS]
    if kind not in supported:
        raise CheckpointError(f"{config_path}: unsupported rope_type {kind!r}; supported: {supported}")


def _rope_of(config):
    """(text config, its rope scaling dict or None): rope_parameters, or rope_scaling in older
    (transformers 4) configs."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None)
    return text, rope if isinstance(rope, dict) else None


def _check_rope_values(config, config_path: Path | str) -> None:
    """CheckpointError unless rope_theta (in rope_parameters, or the config's attribute in
    transformers 4) and a scaling's factor, where given, are numbers > 0. A theta of 0 or below or
    a factor of 0 made every cos/sin NaN (each request generated token 0, no error); a string or
    null made the rotary module raise a bare TypeError while the model was built."""
    text, rope = _rope_of(config)
    rope = rope or {}
    found = {}  # the field's name in a message -> its value
    if "rope_theta" in rope or hasattr(text, "rope_theta"):
        found["rope_theta"] = rope["rope_theta"] if "rope_theta" in rope else text.rope_theta
    if "factor" in rope:
        found["rope scaling factor"] = rope["factor"]
    for name, value in found.items():
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not value > 0:  # NaN fails too
            raise CheckpointError(
                f"{config_path}: {name} must be a number > 0 (rope_parameters, or rope_theta and "
                f"rope_scaling in older configs), got {value!r}"
            )


def _check_partial_rotary(config, config_path: Path | str) -> None:
    """CheckpointError unless the rope rotates whole heads: partial_rotary_factor (in
    rope_parameters, or the config's attribute) absent or 1. The supported families' attention
    (transformers' apply_rotary_pos_emb) rotates every dimension of a head: under a scaled rope
    type transformers computes cos/sin for head_dim x factor dimensions and every step failed
    on the shape mismatch; under "default" it ignores the field and rotates the whole head, not
    the model the config states (vLLM rotates the first head_dim x factor dimensions only)."""
    text, rope = _rope_of(config)
    factor = (rope or {}).get("partial_rotary_factor", getattr(text, "partial_rotary_factor", None))
    if factor is not None and factor != 1:
        raise CheckpointError(
            f"{config_path}: partial_rotary_factor {factor!r} is not supported: the "
            f"{getattr(text, 'model_type', None)!r} family's attention rotates every dimension of "
            f"a head; supported: 1.0 (or no partial_rotary_factor)"
        )


def _check_longrope_factors(config, config_path: Path | str) -> None:
    """CheckpointError unless a longrope scaling's short_factor and long_factor each hold one
    number per rotated frequency (as many as range(0, rotary dim, 2), the rotary dim being
    head_dim times partial_rotary_factor), as transformers' longrope computes them. transformers
    only logs a warning for another length: five short factors then failed the load with a bare
    RuntimeError from the rotary module, five long factors every step reaching past
    original_max_position_embeddings."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None)
    if not isinstance(rope, dict) or rope.get("rope_type", rope.get("type")) != "longrope":
        return
    partial = rope.get("partial_rotary_factor", 1.0)
    try:
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        expected = len(range(0, int(head_dim * partial), 2))
    except (AttributeError, TypeError, ZeroDivisionError):  # transformers' own checks name these
        return
    for name in ("short_factor", "long_factor"):
        factors = rope.get(name)
        if isinstance(factors, (list, tuple)) and len(factors) != expected:
            raise CheckpointError(
                f"{config_path}: rope scaling longrope {name} must hold {expected} numbers, one per "
                f"rotated frequency (half of head_dim {head_dim} x partial_rotary_factor {partial}), "
                f"got {len(factors)}"
            )


def _check_activation(config, config_path: Path | str) -> None:
    """CheckpointError unless the config's hidden_act is one transformers' MLPs can build (a key
    of its ACT2FN). Any other ("swiglu", a typo) made the model's constructor raise a bare
    KeyError naming only the value."""
    from transformers.activations import ACT2FN

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    act = getattr(text, "hidden_act", None)
    if isinstance(act, str) and act not in ACT2FN:  # a non-str: transformers' validation refuses it
        raise CheckpointError(f"{config_path}: unsupported hidden_act {act!r}; supported: {sorted(ACT2FN)}")


def _check_heads(config, config_path: Path | str) -> None:
    """CheckpointError unless num_key_value_heads (num_attention_heads where absent) is >= 1 and
    divides num_attention_heads, itself >= 1: each kv head serves a whole group of query heads.
    Otherwise the model built (its shapes are consistent) and every request then failed at its
    first step (transformers' forward fails there too); 0 kv heads, or 0 query heads over one
    (0 is a multiple of 1), was a bare ZeroDivisionError."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", None)
    kv = getattr(text, "num_key_value_heads", None)
    kv = heads if kv is None else kv
    if not isinstance(heads, int) or not isinstance(kv, int):  # transformers' validation refuses them
        return
    if kv < 1 or heads < 1 or heads % kv:
        raise CheckpointError(
            f"{config_path}: num_attention_heads ({heads}) must be a positive multiple of "
            f"num_key_value_heads ({kv}), which must be >= 1: each kv head serves a whole group of "
            f"query heads"
        )


def _check_head_dim(config, config_path: Path | str) -> None:
    """CheckpointError unless the head_dim the attention uses is an even int >= 2: the built
    config's head_dim, or, where it has none (Qwen2's config has no such field),
    hidden_size // num_attention_heads, as its attention derives it. The rope rotates a head's
    dimensions in pairs (cos/sin hold head_dim // 2 frequencies, doubled), so an odd one built a
    model whose every step failed on the shape mismatch (each request finished 'error', no
    token; transformers' forward fails alike). Qwen2 keeps what config.json says unchecked: null
    made its attention raise a bare TypeError (head_dim ** -0.5) while the model was built, a
    float another TypeError; 0 or below (any family) a ZeroDivisionError or a RuntimeError from
    the rotary module."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if hasattr(text, "head_dim"):
        head_dim, where = text.head_dim, ""
    else:
        hidden, heads = getattr(text, "hidden_size", None), getattr(text, "num_attention_heads", None)
        if not isinstance(hidden, int) or not isinstance(heads, int) or heads < 1:
            return  # transformers' validation, or _check_heads, speaks of those
        head_dim, where = hidden // heads, f" (derived: hidden_size {hidden} // num_attention_heads {heads})"
    if not isinstance(head_dim, int) or isinstance(head_dim, bool) or head_dim < 2 or head_dim % 2:
        raise CheckpointError(
            f"{config_path}: head_dim must be an even int >= 2 (the rope rotates pairs of a head's "
            f"dimensions; absent: hidden_size // num_attention_heads), got {head_dim!r}{where}"
        )


def _check_window(config, config_path: Path | str) -> None:
    """CheckpointError unless a sliding_window the model applies is null or an int >= 1.
    Mistral applies config.sliding_window to every layer, Qwen2/3 where use_sliding_window is
    set (Llama, and Qwen with it unset, ignore the key, so any value passes there). 0 or below
    ran as full attention (layer_window reads a false window as none) where transformers' own
    forward fails on the mask's shape: a model other than the one config.json states."""
    from enginespec.worker.merged_decoder import CONFIG_WINDOW_MODEL_TYPES

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    kind, window = getattr(text, "model_type", None), getattr(text, "sliding_window", None)
    per_layer = kind in ("qwen2", "qwen3") and getattr(text, "use_sliding_window", False)
    applies = kind in CONFIG_WINDOW_MODEL_TYPES or per_layer
    if not applies or window is None:
        return
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise CheckpointError(
            f"{config_path}: sliding_window must be an int >= 1 (or null: full attention) where "
            f"the {kind!r} family applies it, got {window!r}"
        )


def _check_positions(config, config_path: Path | str) -> None:
    """CheckpointError unless max_position_embeddings (the bound of max_model_len) is >= 2, the
    least max_model_len the engine takes (EngineArgs, SchedulerConfig): a prompt token and one
    generated. Below it the engine failed later naming another thing: -5 was a bare
    RuntimeError from building the rope table, 0 and 1 a ValueError about
    SchedulerConfig.max_model_len."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    positions = getattr(text, "max_position_embeddings", None)
    if isinstance(positions, int) and positions < 2:
        raise CheckpointError(
            f"{config_path}: max_position_embeddings must be an int >= 2 (the longest context the "
            f"model serves: a prompt token and a generated one at least), got {positions}"
        )


def load_config(path, *, trust_remote_code: bool = False, hf_overrides: Optional[dict] = None):
    """The transformers config of a supported local checkpoint (never touches the hub), with
    hf_overrides merged over its config.json (read_config_json), its rope
    one transformers computes over whole heads (_check_rope_type, _check_rope_values,
    _check_partial_rotary, _check_longrope_factors), its activation one transformers builds
    (_check_activation), its kv heads grouping its query heads (_check_heads), an even head_dim
    (_check_head_dim), a sliding window it applies >= 1 (_check_window) and at least two
    positions (_check_positions). An override that makes any of these false is the same
    CheckpointError, naming config.json with the overrides."""
    from transformers import AutoConfig

    arch = architecture_of(path, hf_overrides)
    config_path = config_label(path, hf_overrides)
    try:
        config = AutoConfig.from_pretrained(
            str(Path(path)), local_files_only=True, trust_remote_code=trust_remote_code
        )
        if hf_overrides:  # built from the merged object as from_pretrained builds it from the file's
            merged = read_config_json(path, hf_overrides)
            cls = _overridden_config_class(type(config), arch, merged, hf_overrides, config_path)
            config = cls.from_dict(
                merged if cls is type(config) else {**merged, "model_type": cls.model_type}
            )
    except CheckpointError:
        raise
    except Exception as e:  # an unknown model_type, a field transformers' config refuses (5.x
        # validates fields: huggingface_hub's StrictDataclassFieldValidationError is no ValueError)
        raise CheckpointError(f"{config_path}: cannot build the config: {' '.join(str(e).split())}") from e
    _check_rope_type(config, config_path)
    _check_rope_values(config, config_path)
    _check_partial_rotary(config, config_path)
    _check_longrope_factors(config, config_path)
    _check_activation(config, config_path)
    _check_heads(config, config_path)
    _check_head_dim(config, config_path)
    _check_window(config, config_path)
    _check_positions(config, config_path)
    return config


def _overridden_config_class(file_class, arch: str, merged: dict, hf_overrides: dict, config_path: str):
    """The config class of a checkpoint read with hf_overrides: the family the overrides name,
    else the one AutoConfig chose from config.json (`file_class`, trust_remote_code's
    included). Overrides naming `architectures` pick `arch`'s family (its config class), as
    vLLM picks its model class by the overridden architectures; naming only `model_type`,
    that model type's family, as AutoConfig picks by model_type. A file class that already is
    (or subclasses) that family's is kept. CheckpointError when the overrides name an
    architecture and a model_type of two families, or a model_type transformers lacks."""
    import transformers
    from transformers import CONFIG_MAPPING

    if "architectures" in hf_overrides:
        wanted = getattr(transformers, arch).config_class
        named = hf_overrides.get("model_type", wanted.model_type)
        if named != wanted.model_type:
            raise CheckpointError(
                f"{config_path}: architectures {hf_overrides['architectures']!r} build {arch}, whose "
                f"config has model_type {wanted.model_type!r}, got model_type {named!r}: name one "
                f"family (or leave model_type out)"
            )
    elif "model_type" in hf_overrides:
        if merged["model_type"] not in CONFIG_MAPPING:
            raise CheckpointError(f"{config_path}: unknown model_type {merged['model_type']!r}")
        wanted = CONFIG_MAPPING[merged["model_type"]]
    else:
        return file_class
    return file_class if issubclass(file_class, wanted) else wanted


def model_class(arch: str, config, config_path: Path | str):
    """The transformers class to build over `config`: `arch`'s own when the config is (or
    subclasses) its config class; else the supported architecture whose config class config.json's
    model_type built (a Mistral exported as "LlamaForCausalLM" runs as MistralForCausalLM, the
    class transformers' AutoModelForCausalLM picks by model_type). CheckpointError naming
    model_type and `arch` when no supported family's config was built: `arch`'s modules would read
    fields that config lacks, or silently compute another model than its family's."""
    import transformers

    own = getattr(transformers, arch)
    if isinstance(config, own.config_class):
        return own
    for name in SUPPORTED_ARCHITECTURES:
        cls = getattr(transformers, name)
        if type(config) is cls.config_class:
            return cls
    supported = sorted({getattr(transformers, n).config_class.model_type for n in SUPPORTED_ARCHITECTURES})
    raise CheckpointError(
        f"{config_path}: model_type {getattr(config, 'model_type', None)!r} is not the family of "
        f"architecture {arch}; supported model types: {supported}"
    )


def _weight_map(index: Path) -> dict:
    """The index's weight_map (tensor name -> shard file name): a CheckpointError naming the
    index unless it is a non-empty object of strings (a number or null for a shard's name was a
    bare TypeError from the path join)."""
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index}: no weight_map (a non-empty object of tensor name -> shard file)")
    bad = [v for v in weight_map.values() if not isinstance(v, str)]
    if bad:
        raise CheckpointError(f"{index}: weight_map's shard file names must be strings, got {bad[0]!r}")
    return weight_map


def checkpoint_files(path) -> list[Path]:
    """The safetensors files of a checkpoint: the shards named by the index when there is one,
    else model.safetensors when there is one (transformers' rule: other safetensors files beside
    it, Mistral's consolidated.safetensors or a training run's adapter_model.safetensors, are not
    the model's), else every *.safetensors file in the directory (sorted)."""
    root = check_checkpoint_dir(path)
    index = root / INDEX_FILE
    if index.is_file():
        files = [root / name for name in sorted(set(_weight_map(index).values()))]
        for file in _linked(files):
            if not file.is_file():
                raise CheckpointNotFound(f"shard {file.name} listed in {index} is missing")
        return files
    if (root / SINGLE_FILE).is_file():
        return [root / SINGLE_FILE]
    files = _linked(sorted(root.glob("*.safetensors")))
    if not files:
        raise CheckpointNotFound(
            f"checkpoint directory {root} has no *.safetensors file{_pickled_hint(root)}"
        )
    return files


def _linked(files: list[Path]) -> list[Path]:
    """`files`, after a CheckpointNotFound for the first that is a symlink to nothing: a hub
    cache snapshot whose blob is gone (an interrupted or pruned download). Read, it was "corrupt
    safetensors file ...: No such file or directory", or a shard "missing", naming no link."""
    for file in files:
        if file.is_symlink() and not file.exists():
            raise CheckpointNotFound(
                f"{file} is a link to {os.readlink(file)}, which does not exist (an interrupted or "
                f"pruned download: fetch the checkpoint again)"
            )
    return files


def _pickled_hint(root: Path) -> str:
    """Where `root` holds PyTorch pickle weights (pytorch_model.bin or its shards, transformers'
    names: a fine-tune's training_args.bin is no weight file), a clause naming the first and how
    to convert them, as the loader reads safetensors only (a pickle may run code when loaded);
    else ""."""
    pickled = sorted(p.name for p in root.glob("pytorch_model*.bin") if p.is_file())
    if not pickled:
        return ""
    return (
        f" (it holds {pickled[0]}{' and more' if len(pickled) > 1 else ''}: enginespec loads safetensors "
        f"only; convert with transformers, AutoModelForCausalLM.from_pretrained(dir)"
        f".save_pretrained(dir), which writes safetensors)"
    )


def _read_slice(handle, name: str, part: TensorSlice) -> torch.Tensor:
    """Only the bytes of `part` (safetensors' get_slice), zero-padded to part.size."""
    return take_slice(handle.get_slice(name), part)


def take_slice(view, part: TensorSlice) -> torch.Tensor:
    """`part` of `view` (a safetensors slice, read lazily, or a whole tensor), zero-padded to
    part.size: what a tensor-parallel rank keeps of a checkpoint tensor, at load and at a weight
    update (worker/weight_update.py)."""
    tensor = view[part.start : part.stop] if part.dim == 0 else view[:, part.start : part.stop]
    missing = part.size - (part.stop - part.start)
    if missing > 0:
        pad_shape = list(tensor.shape)
        pad_shape[part.dim] = missing
        tensor = torch.cat([tensor, tensor.new_zeros(pad_shape)], dim=part.dim)
    return tensor


def iter_tensors(
    path,
    device="cpu",
    dtype: torch.dtype | None = None,
    shapes: dict[str, tuple] | None = None,
    slicer: Optional[Slicer] = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of the checkpoint, read onto `device`; floating tensors
    are cast to `dtype`. With `shapes`, a tensor whose name is listed but whose shape differs
    raises before it is read. With `slicer`, a tensor it returns a TensorSlice for is read in
    part (the shape check still applies to the whole tensor)."""
    from safetensors import safe_open

    for file in checkpoint_files(path):
        try:
            handle = safe_open(str(file), framework="pt", device=str(torch.device(device)))
        except Exception as e:  # safetensors raises its own error types for bad headers
            raise CheckpointError(f"corrupt safetensors file {file}: {e}") from e
        with handle:
            for name in handle.keys():
                found = None
                if (shapes is not None and name in shapes) or slicer is not None:
                    found = tuple(handle.get_slice(name).get_shape())
                if shapes is not None and name in shapes and found != tuple(shapes[name]):
                    raise CheckpointError(
                        f"tensor {name!r} in {file.name} has shape {list(found)}, "
                        f"the model expects {list(shapes[name])}"
                    )
                part = slicer(name, found) if slicer is not None else None
                try:
                    tensor = handle.get_tensor(name) if part is None else _read_slice(handle, name, part)
                except Exception as e:
                    raise CheckpointError(
                        f"corrupt safetensors file {file}: cannot read {name!r}: {e}"
                    ) from e
                if dtype is not None and tensor.is_floating_point():
                    tensor = tensor.to(dtype)
                yield name, tensor


def _tied_alias(model: nn.Module) -> str | None:
    """Name of the output-embedding weight when it is tied to the input embedding, else None."""
    config = getattr(model, "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return None
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if out is None:
        return None
    for name, module in model.named_modules():
        if module is out:
            return f"{name}.weight"
    return None


def _set_tensor(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    prefix, _, leaf = name.rpartition(".")
    module = model.get_submodule(prefix) if prefix else model
    if leaf in module._parameters:
        module._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)
    else:
        module._buffers[leaf] = tensor


def load_weights(
    model: nn.Module,
    path,
    *,
    device="cpu",
    dtype: torch.dtype = torch.float32,
    slicer: Optional[Slicer] = None,
) -> None:
    """Fill every parameter and persistent buffer of `model` (typically on the meta device) from
    the checkpoint at `path`, on `device` in `dtype`. Ties the output embedding to the input one
    when the config says so (the checkpoint may then omit it, or store it equal: one that differs
    is refused, _check_stored_head). CheckpointError for a missing, unexpected or misshapen
    tensor. With `slicer` (tensor parallelism), the tensors it names are read in part and become
    parameters of the part's shape."""
    tied = _tied_alias(model)
    expected = {n: tuple(p.shape) for n, p in model.named_parameters(remove_duplicate=False)}
    expected.update(
        {n: tuple(b.shape) for n, b in model.state_dict(keep_vars=True).items() if n not in expected}
    )
    if tied is not None:
        expected.pop(tied, None)
    seen: set[str] = set()
    ranges: list[tuple[str, torch.Tensor]] = []  # float16 only: (name, [min, max]) on the device
    stored_head = None  # the tied head's tensor where the checkpoint stores one anyway
    for name, tensor in iter_tensors(path, device, dtype, shapes=expected, slicer=slicer):
        if name == tied:
            stored_head = tensor
            continue
        if name.endswith(IGNORED_SUFFIXES):
            continue
        if name not in expected:
            raise CheckpointError(
                f"unexpected tensor {name!r} in checkpoint {path} "
                f"(no such parameter in {type(model).__name__})"
            )
        if tensor.dtype == torch.float16 and tensor.numel() > 0:
            ranges.append((name, torch.stack(torch.aminmax(tensor))))
        _set_tensor(model, name, tensor)
        seen.add(name)
    check_float16_range(ranges, f"checkpoint {path}")
    missing = sorted(set(expected) - seen)
    if missing:
        raise CheckpointError(
            f"checkpoint {path} is missing tensor(s) {missing[:8]}{' ...' if len(missing) > 8 else ''}"
        )
    if tied is not None:
        embedding = model.get_input_embeddings().weight
        _check_stored_head(stored_head, embedding, tied, path)
        model.get_output_embeddings().weight = embedding


def _check_stored_head(head: Optional[torch.Tensor], embedding: torch.Tensor, name: str, path) -> None:
    """A CheckpointError where config.json ties the head (tie_word_embeddings) but the checkpoint
    also stores a head tensor that is not the embedding: the checkpoint contradicts itself, and
    the readers of it disagree (vLLM and transformers 4.x use the embedding, transformers 5.x
    the stored head), so either choice gave some user silently different logits. A stored head
    equal to the embedding (exporters that write both) loads."""
    if head is None or (head.shape == embedding.shape and torch.equal(head, embedding)):
        return
    raise CheckpointError(
        f"checkpoint {path}: config.json sets tie_word_embeddings=true, but tensor {name!r} "
        f"(shape {list(head.shape)}) is not the input embedding (shape {list(embedding.shape)}); "
        f"set tie_word_embeddings to false to use the stored head, or remove {name!r} to tie it"
    )


def check_float16_range(ranges: list[tuple[str, torch.Tensor]], where: str) -> None:
    """A CheckpointError naming the first tensor whose float16 copy holds an infinity: a value
    beyond float16's range (largest finite 65504) in the checkpoint (`where`: "checkpoint
    PATH", or a weight update) became inf in the cast, and every logit of the model would then
    be NaN (greedy token 0, empty text, no error). The (min, max) pairs, in float16, were
    gathered on the device while loading and are read here with one copy."""
    if not ranges:
        return
    infinite = torch.isinf(torch.stack([r for _, r in ranges])).any(dim=1).tolist()
    bad = [name for (name, _), inf in zip(ranges, infinite) if inf]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise CheckpointError(
            f"tensor {bad[0]!r}{more} in {where} holds values beyond float16's range "
            f"(largest finite {torch.finfo(torch.float16).max:.0f}): dtype='float16' would make them "
            f"inf and every logit NaN; load it with dtype='bfloat16' or 'float32'"
        )


def materialize_buffers(model: nn.Module, device) -> None:
    """Rebuild modules whose non-persistent buffers (rotary inv_freq) are still on the meta
    device, from their own config, on `device`; so buffers are computed exactly as transformers
    computes them."""
    for name, module in list(model.named_modules()):
        if not any(b.is_meta for b in module.buffers(recurse=False)):
            continue
        config = getattr(module, "config", None)
        if config is None:
            raise CheckpointError(
                f"cannot materialize buffers of {name} ({type(module).__name__}): no config"
            )
        with torch.device(device):
            rebuilt = type(module)(config)
        prefix, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(prefix) if prefix else model, leaf, rebuilt)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise CheckpointError(f"tensors still unmaterialized after loading: {left[:8]}")


def build_model(
    path,
    *,
    device="cpu",
    dtype: torch.dtype = torch.float32,
    slicer: Optional[Slicer] = None,
    trust_remote_code: bool = False,
    hf_overrides: Optional[dict] = None,
):
    """The transformers CausalLM of a local checkpoint, weights loaded by `load_weights` (in
    part where `slicer` says so), built from its config with hf_overrides merged (load_config)."""
    arch = architecture_of(path, hf_overrides)
    config = load_config(path, trust_remote_code=trust_remote_code, hf_overrides=hf_overrides)
    cls = model_class(arch, config, config_label(path, hf_overrides))
    with torch.device("meta"):
        model = cls(config)
    load_weights(model, path, device=device, dtype=dtype, slicer=slicer)
    materialize_buffers(model, device)
    return model.eval()


def _has_tokenizer(root: Path) -> bool:
    return any((root / f).is_file() for f in TOKENIZER_FILES)


def _auto_tokenizer(root: Path, trust_remote_code: bool, use_fast: bool):
    """AutoTokenizer over `root`; whatever it raises for broken tokenizer files (a JSON error,
    a missing converter) becomes a one-line CheckpointError naming the directory."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            str(root), local_files_only=True, trust_remote_code=trust_remote_code, use_fast=use_fast
        )
    except Exception as e:  # transformers and tokenizers raise many types for a broken file
        hint = _missing_sentencepiece(root)
        raise CheckpointError(f"cannot load the tokenizer in {root}: {hint}{' '.join(str(e).split())}") from e


def _missing_sentencepiece(root: Path) -> str:
    """What a SentencePiece-only tokenizer (tokenizer.model, no tokenizer.json) lacks when the
    sentencepiece package is not importable: transformers needs it to convert the model, and
    without it falls back to reading the file as tiktoken's, whose error asks for tiktoken (which
    cannot read it). "" otherwise, and for a tiktoken file under that name (Llama 3's original
    one: lines of base64 and a rank), which the tiktoken error is right about. vLLM depends on
    sentencepiece, so its users never meet this."""
    import importlib.util
    import re

    model = root / "tokenizer.model"
    if not model.is_file() or (root / "tokenizer.json").is_file():
        return ""
    with open(model, "rb") as f:
        if re.fullmatch(rb"[A-Za-z0-9+/=]+ \d+\r?\n?", f.readline(256)):
            return ""
    try:
        if importlib.util.find_spec("sentencepiece") is not None:
            return ""
    except ValueError:  # a module object without a spec stands in for it: importable
        return ""
    return (
        "its tokenizer.model is a SentencePiece model (there is no tokenizer.json) and reading it "
        "needs the sentencepiece package, which is not installed (pip install sentencepiece); "
        "transformers said: "
    )


def load_tokenizer(path, *, trust_remote_code: bool = False, use_fast: bool = True):
    """The tokenizer saved beside the checkpoint, or None when the directory has none.
    use_fast=False asks transformers for the slow tokenizer (transformers 5 ignores it)."""
    root = check_checkpoint_dir(path)
    if not _has_tokenizer(root):
        return None
    return _auto_tokenizer(root, trust_remote_code, use_fast)


def load_tokenizer_dir(path, *, trust_remote_code: bool = False, use_fast: bool = True):
    """The tokenizer of a directory named for it alone (EngineArgs.tokenizer): it need not be a
    checkpoint, but it must be a local directory holding tokenizer files (CheckpointNotFound,
    naming it, otherwise: a hub name is not downloaded)."""
    root = _local_dir(path, "tokenizer", "the tokenizer files")
    if not _has_tokenizer(root):
        raise CheckpointNotFound(f"tokenizer directory {root} has none of {list(TOKENIZER_FILES)}")
    return _auto_tokenizer(root, trust_remote_code, use_fast)
