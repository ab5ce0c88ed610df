"""Tiny random checkpoints of each supported family, saved exactly as a real one is on disk.

`make_tiny_checkpoint(family, path)` writes config.json + model.safetensors (via transformers'
`save_pretrained`) and a small WordLevel tokenizer beside it, so the whole engine path (loader,
tokenizer, detokenizer) is exercised on CPU in milliseconds. Weights are random with a raised
initializer_range and an untied head by default: at the default init a tied head repeats one
token, and greedy parity over a constant output would test nothing.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import torch

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


def _tokenizer():
    """A WordLevel tokenizer over single characters: ids 4.. are printable chars, whitespace
    split, so any text made of those chars round-trips."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(33, 33 + VOCAB_SIZE - len(SPECIAL_TOKENS))]
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(chars))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def make_tiny_checkpoint(
    family: str,
    path,
    *,
    dtype: torch.dtype = torch.float32,
    tie_word_embeddings: bool = False,
    seed: int = 0,
    **overrides,
) -> Path:
    """Write a random tiny `family` checkpoint (weights + config + tokenizer) to `path`."""
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


@functools.lru_cache(maxsize=None)
def tiny_model_dir(family: str, tie_word_embeddings: bool = False) -> Path:
    """A tiny float32 checkpoint of `family`, written once per session into a temp directory."""
    root = Path(tempfile.mkdtemp(prefix=f"enginespec-tiny-{family}-"))
    return make_tiny_checkpoint(family, root / family, tie_word_embeddings=tie_word_embeddings)
