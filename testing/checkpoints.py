"""The one checkpoint writer: random-weight checkpoints saved exactly as a real one is on disk.

`make_checkpoint(name, path)` writes config.json, safetensors weights and a tokenizer that
matches the vocabulary, so the whole engine path (loader, tokenizer, detokenizer) runs on them.
`name` chooses one of two paths:

- a tiny family member (FAMILIES: qwen3, qwen2, llama, mistral), for tests and the demo: 2
  layers, GQA 4 q heads over 2 kv heads, head_dim 16, a 96-entry character tokenizer, float32,
  written through transformers' `save_pretrained` with the family's quirks switched on (qkv
  bias, llama3 rope scaling, a sliding window). Weights are random with a raised
  initializer_range, biases and norm weights perturbed and an untied head by default: at the
  default init a tied head repeats one token, and greedy parity over a constant output would
  test nothing.
- a named shape (SHAPES: tiny, qwen3-0.6b, qwen3-8b), for benchmarks that need no download:
  Qwen3 of that shape in bf16, written shard by shard in `save_pretrained`'s layout (one
  `model.safetensors`, or `model-0000k-of-0000n.safetensors` plus the index) with a word-level
  tokenizer. Why not `save_pretrained` here: it needs the whole model in host memory and then
  builds the shards from it (about 2x the checkpoint for Qwen3-8B, 16 GB of bf16). Instead the
  names and shapes come from a model built on the meta device, and each tensor is drawn (on
  `device`: a GPU draws 8B numbers in seconds, a CPU takes minutes), cast and written shard by
  shard, so peak host memory is one shard (`max_shard_bytes`) plus one tensor. RMSNorm weights
  are ones, everything else normal(0, initializer_range); throughput does not depend on the
  values (the benchmark uses ignore_eos). A finished shape checkpoint is reused by a later call
  with the same recipe (a marker file records it), so a benchmark pays the write once.

Both paths are deterministic in `seed`.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

# Tiny family members: one shared shape, each family's quirks on top.
FAMILIES = ("qwen3", "qwen2", "llama", "mistral")
VOCAB_SIZE = 96
SPECIAL_TOKENS = ("<pad>", "<unk>", "<s>", "</s>")
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3

# Shared shape: 2 layers, GQA 4 q heads over 2 kv heads, head_dim 16 (hidden 32 -> explicit).
_COMMON = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    initializer_range=0.2,
    rms_norm_eps=1e-6,
    bos_token_id=BOS_ID,
    eos_token_id=EOS_ID,
    pad_token_id=PAD_ID,
)


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


def make_checkpoint(name: str, path, *, dtype=None, seed: int = 0, **options) -> Path:
    """Write a random-weight checkpoint of `name` (a family or a shape) to `path`; return it.

    dtype defaults to float32 for a family and bfloat16 for a shape. Family options:
    tie_word_embeddings (False) and config overrides. Shape options: device ("cpu"),
    max_shard_bytes and config overrides. ValueError naming `name` when it is neither.
    """
    if name in FAMILIES:
        return _write_family(name, path, dtype=dtype or torch.float32, seed=seed, **options)
    if name in SHAPES:
        return _write_shape(name, path, dtype=dtype or torch.bfloat16, seed=seed, **options)
    raise ValueError(f"name must be a family {FAMILIES} or a shape {tuple(SHAPES)}, got {name!r}")


_cache_root: Optional[Path] = None


def use_cache_root(root) -> None:
    """Where `tiny_model_dir` writes its checkpoints. The test suites' session fixture
    (testing/fixtures.py) points it into pytest's tmp_path_factory, so a test run leaves
    nothing in the temp directory; a script must call it before tiny_model_dir."""
    global _cache_root
    root = Path(root)
    if root != _cache_root:
        _cache_root = root
        _tiny_model_dir.cache_clear()
        json_model_dir.cache_clear()
        reasoning_model_dir.cache_clear()


def cache_root() -> Optional[Path]:
    """The directory use_cache_root set (None before)."""
    return _cache_root


def tiny_model_dir(family: str, tie_word_embeddings: bool = False, seed: int = 0) -> Path:
    """A tiny float32 checkpoint of `family`, written once per cache root (use_cache_root),
    however its defaults are spelled (the cache's key is normalised: a second write of a
    loaded checkpoint would rewrite the files its tensors map, on the CPU). Another `seed`: the
    same config and names with other weights (weight-update tests)."""
    return _tiny_model_dir(family, bool(tie_word_embeddings), int(seed))


@functools.lru_cache(maxsize=None)
def _tiny_model_dir(family: str, tie_word_embeddings: bool, seed: int) -> Path:
    if _cache_root is None:
        raise RuntimeError("tiny_model_dir needs a cache root: call use_cache_root(directory) first")
    name = f"{family}-tied" if tie_word_embeddings else family
    name += f"-seed{seed}" if seed else ""
    return make_checkpoint(family, _cache_root / name, tie_word_embeddings=tie_word_embeddings, seed=seed)


#: The characters of `json_model_dir`'s tokenizer: printable ASCII but " ", "`" and "~", 92 of
#: them as in the tiny one, so with its 4 special tokens it fills the same 96-entry vocabulary.
JSON_CHARS = tuple(chr(c) for c in range(33, 127) if chr(c) not in "`~")


@functools.lru_cache(maxsize=None)
def json_model_dir(family: str = "qwen3") -> Path:
    """tiny_model_dir(family)'s weights and config with a character tokenizer that can write
    any compact JSON (the tiny one stops at "|", so it has no "}"): for structured outputs'
    tests. No space, so JSON constrained by a grammar stays compact whatever the weights."""
    return _with_tokenizer(tiny_model_dir(family), f"{family}-json", lambda: _tokenizer(JSON_CHARS))


#: The end tag `reasoning_model_dir`'s tokenizer writes as one token (its last id), as Qwen3's does.
THINK_END = "</think>"


@functools.lru_cache(maxsize=None)
def reasoning_model_dir(family: str = "qwen3") -> Path:
    """json_model_dir(family)'s weights with its tokenizer's "|" (no JSON needs it) given up
    for an added token THINK_END (id VOCAB_SIZE - 1), so that a random model may close its
    thinking in one token, as a reasoning model does: for structured outputs with reasoning."""

    def tokenizer():
        made = _tokenizer([c for c in JSON_CHARS if c != "|"])
        made.add_tokens([THINK_END])
        return made

    return _with_tokenizer(json_model_dir(family), f"{family}-reasoning", tokenizer)


def _with_tokenizer(src: Path, name: str, make_tokenizer) -> Path:
    """The checkpoint at `src` (its config and weights) under the cache's `name`, with the
    tokenizer make_tokenizer() builds in place of its own; made once, then reused."""
    import shutil

    assert _cache_root is not None
    dest = _cache_root / name
    if not (dest / "tokenizer.json").exists():
        dest.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.is_file() and not f.name.startswith(("tokenizer", "special_tokens")):
                shutil.copy2(f, dest / f.name)
        make_tokenizer().save_pretrained(str(dest))
    return dest


# ---- tiny family members (save_pretrained) ---------------------------------------------------------


def _config(family: str, tie_word_embeddings: bool, overrides: dict):
    """The transformers config of one tiny family member (family quirks switched on)."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    kwargs = dict(_COMMON, tie_word_embeddings=tie_word_embeddings)
    if family == "qwen3":
        cls = Qwen3Config
    elif family == "qwen2":  # qkv bias is built into Qwen2's attention
        cls = Qwen2Config
    elif family == "llama":  # llama3 rope scaling, as Llama 3.x checkpoints use
        cls = LlamaConfig
        kwargs["rope_parameters"] = dict(
            rope_type="llama3",
            rope_theta=10000.0,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        )
    elif family == "mistral":  # a sliding window short enough for tests to cross it
        cls = MistralConfig
        kwargs["sliding_window"] = 8
    else:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    kwargs.update(overrides)
    return cls(**kwargs)


def _tokenizer(chars=None):
    """A WordLevel tokenizer over single characters: ids 4.. are printable chars (`chars`,
    default "!" to "|"), whitespace split, so any text made of those chars round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = chars or [chr(c) for c in range(33, 33 + VOCAB_SIZE - len(SPECIAL_TOKENS))]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(chars))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def _write_family(
    family: str,
    path,
    *,
    dtype: torch.dtype,
    tie_word_embeddings: bool = False,
    seed: int,
    **overrides,
) -> Path:
    """A tiny random `family` checkpoint (weights + config + tokenizer) at `path`."""
    import transformers

    config = _config(family, tie_word_embeddings, overrides)
    arch = (
        config.architectures[0]
        if config.architectures
        else {
            "qwen3": "Qwen3ForCausalLM",
            "qwen2": "Qwen2ForCausalLM",
            "llama": "LlamaForCausalLM",
            "mistral": "MistralForCausalLM",
        }[family]
    )
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(config).to(dtype)
    _perturb_biases_and_norms(model, seed)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    _tokenizer().save_pretrained(str(path))
    return path


def _perturb_biases_and_norms(model, seed: int) -> None:
    """Default init leaves biases at 0 and norm weights at 1; randomize them so a loader that
    skips one of those tensors fails the parity tests."""
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias") or "norm" in name:
                noise = torch.randn(param.shape, generator=gen, dtype=torch.float32) * 0.1
                param.add_(noise.to(param.dtype))


# ---- named shapes (shard by shard) -----------------------------------------------------------------


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


def _write_shape(
    shape: str,
    path,
    *,
    dtype,
    seed: int,
    device="cpu",
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    **overrides,
) -> Path:
    """A random-weight checkpoint of `shape` at `path`, shard by shard; reuses a finished one
    with the same recipe."""
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


def write_hub_cache(
    src, cache, repo_id: str, *, commit: Optional[str] = None, ref: Optional[str] = "main"
) -> Path:
    """Lay the checkpoint directory `src` out in `cache` as huggingface_hub's cache holds a
    downloaded repo, and return the snapshot directory:
    `models--{org}--{name}/blobs/<sha256 of each file>` (the content, named as an LFS file's
    blob is), `snapshots/<commit>/<file>` (relative symlinks into ../../blobs, as `hf download`
    makes them) and `refs/<ref>` holding the commit (ref None: no ref, reachable by the commit
    alone). commit defaults to a 40-hex digest of the files, so the same checkpoint gets the same
    commit. For tests of the model argument as a repo id (worker/hub_cache.py)."""
    import hashlib

    src, cache = Path(src), Path(cache)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    digests = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}
    if commit is None:
        commit = hashlib.sha1("".join(digests[p] for p in files).encode()).hexdigest()
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    for p in files:
        blob = repo / "blobs" / digests[p]
        blob.parent.mkdir(parents=True, exist_ok=True)
        if not blob.exists():
            blob.write_bytes(p.read_bytes())
        link = snapshot / p.relative_to(src)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref is not None:
        ref_file = repo / "refs" / ref
        ref_file.parent.mkdir(parents=True, exist_ok=True)
        ref_file.write_text(commit)  # no newline, as huggingface_hub writes it
    return snapshot
