"""Random-weight checkpoints of a named model shape, for benchmarks that need no download.

`make_synthetic_checkpoint(shape, path)` writes a directory the loader and transformers both
accept: `config.json`, safetensors shards in `save_pretrained`'s layout (one
`model.safetensors`, or `model-0000k-of-0000n.safetensors` plus `model.safetensors.index.json`),
and a word-level tokenizer whose vocabulary matches the config.

Why not `model.save_pretrained`: that needs the whole model materialised in host memory, and the
shards are then built from it (about 2x the checkpoint for Qwen3-8B, 16 GB of bf16). Here the
parameter names and shapes come from a model built on the meta device (no memory), and each
tensor is drawn, cast and written shard by shard, so peak host memory is one shard
(`max_shard_bytes`) plus one tensor. Drawing happens on `device` (a GPU draws 8B numbers in
seconds; the CPU would take minutes).

Values: RMSNorm weights are ones (as the model's own init), every other tensor is
normal(0, initializer_range). Throughput does not depend on the values; the benchmark uses
`ignore_eos`, so the random outputs never stop early.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

# Name -> Qwen3Config kwargs. The two real shapes are those of the published Qwen3 checkpoints.
SHAPES: dict[str, dict] = {
    "tiny": dict(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=1024,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        rope_theta=1e6,
    ),
    "qwen3-0.6b": dict(
        num_hidden_layers=28,
        hidden_size=1024,
        intermediate_size=3072,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        rope_theta=1e6,
    ),
    "qwen3-8b": dict(
        num_hidden_layers=36,
        hidden_size=4096,
        intermediate_size=12288,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
        rope_theta=1e6,
    ),
}

_DONE_MARKER = ".synthetic-complete.json"
DEFAULT_MAX_SHARD_BYTES = 2 * 1024**3


def shape_config(shape: str, **overrides):
    """The HF `Qwen3Config` of a named shape (overrides win). EOS is the last vocabulary id."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {sorted(SHAPES)}, got {shape!r}")
    from transformers import Qwen3Config

    kwargs = {**SHAPES[shape], **overrides}
    vocab = kwargs["vocab_size"]
    kwargs.setdefault("eos_token_id", vocab - 1)
    kwargs.setdefault("bos_token_id", vocab - 1)
    config = Qwen3Config(**kwargs)
    config.architectures = ["Qwen3ForCausalLM"]  # loaders pick the model class from this
    return config


@dataclass(frozen=True)
class TensorSpec:
    """One checkpoint tensor: its name, shape, and whether it is a norm weight (init to ones)."""

    name: str
    shape: tuple[int, ...]
    is_norm: bool

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def tensor_specs(config) -> list[TensorSpec]:
    """Names and shapes of the tensors a checkpoint of `config` stores, in state_dict order.

    Built on the meta device, so nothing is allocated. A tied head is stored once (under the
    embedding's name), as `save_pretrained` does.
    """
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tied = set()
    if getattr(config, "tie_word_embeddings", False):
        keys = getattr(model, "_tied_weights_keys", None) or ["lm_head.weight"]
        tied = set(keys)  # a dict (target -> source) in transformers 5, a list before
    specs = []
    for name, t in model.state_dict().items():
        if name in tied:
            continue
        specs.append(TensorSpec(name, tuple(t.shape), name.endswith("norm.weight")))
    return specs


def _draw(spec: TensorSpec, std: float, gen: torch.Generator, device, dtype) -> torch.Tensor:
    if spec.is_norm:
        return torch.ones(spec.shape, dtype=dtype)
    t = torch.randn(spec.shape, generator=gen, device=device, dtype=torch.float32)
    return t.mul_(std).to(dtype).cpu()


def _plan_shards(specs: list[TensorSpec], elem_bytes: int, max_shard_bytes: int) -> list[list[TensorSpec]]:
    """Greedy split in order; a tensor larger than the cap gets a shard of its own."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for spec in specs:
        nbytes = spec.numel * elem_bytes
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes
    return shards


def _shard_name(i: int, n: int) -> str:
    return "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def _write_weights(path: Path, specs, *, std, seed, device, dtype, max_shard_bytes) -> int:
    """Write the shards (and the index when there are several). Returns total weight bytes."""
    from safetensors.torch import save_file

    elem_bytes = torch.empty((), dtype=dtype).element_size()
    shards = _plan_shards(specs, elem_bytes, max_shard_bytes)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        name = _shard_name(i, len(shards))
        tensors = {s.name: _draw(s, std, gen, device, dtype) for s in shard}
        save_file(tensors, str(path / name), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update({s.name: name for s in shard})
        del tensors
    if len(shards) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total


def write_tokenizer(path: Path, vocab_size: int, eos_token_id: int) -> None:
    """A word-level tokenizer over `vocab_size` entries: id i <-> "w{i}", the EOS id <-> "<eos>".

    Text round-trips through whitespace-separated words; the benchmark feeds token ids, so the
    tokenizer only has to exist, match the vocabulary, and decode cheaply.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if not 0 <= eos_token_id < vocab_size:
        raise ValueError(f"eos_token_id must be in [0, vocab_size={vocab_size}), got {eos_token_id}")
    vocab = {f"w{i}": i for i in range(vocab_size)}
    del vocab[f"w{eos_token_id}"]
    vocab["<eos>"] = eos_token_id
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="w0", pad_token="<eos>")
    fast.save_pretrained(str(path))


def make_synthetic_checkpoint(
    shape: str,
    path,
    *,
    dtype=torch.bfloat16,
    seed: int = 0,
    device="cpu",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    **overrides,
) -> Path:
    """Write a random-weight checkpoint of `shape` to `path` (created) and return the path.

    Reuses `path` when a previous call with the same arguments completed there (a marker file
    records them), so a benchmark pays the write once per machine.
    """
    if max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be >= 1, got {max_shard_bytes}")
    path = Path(path)
    config = shape_config(shape, **overrides)
    recipe = {"shape": shape, "dtype": str(dtype), "seed": seed, "overrides": sorted(overrides.items())}
    marker = path / _DONE_MARKER
    if marker.exists() and json.loads(marker.read_text()).get("recipe") == json.loads(json.dumps(recipe)):
        return path
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("model*.safetensors*"):
        old.unlink()
    config.dtype = dtype  # recorded in config.json so loaders pick bf16 by default
    config.save_pretrained(str(path))
    total = _write_weights(
        path,
        tensor_specs(config),
        std=config.initializer_range,
        seed=seed,
        device=device,
        dtype=dtype,
        max_shard_bytes=max_shard_bytes,
    )
    write_tokenizer(path, config.vocab_size, config.eos_token_id)
    marker.write_text(json.dumps({"recipe": recipe, "weight_bytes": total}))
    return path


def default_dir(shape: str) -> Path:
    """Where a benchmark caches a shape's checkpoint: $ENGINESPEC_SYNTH_DIR or the temp dir."""
    root = os.environ.get("ENGINESPEC_SYNTH_DIR") or os.path.join(
        os.environ.get("TMPDIR", "/tmp"), "enginespec-synth"
    )
    return Path(root) / shape
