"""The one checkpoint writer: its entry point picks the family path or the shape path, and the
tiny checkpoints of a test run live under pytest's temp dir."""

from __future__ import annotations

import json

import pytest
import torch

from enginespec.testing import checkpoints


def test_family_goes_through_save_pretrained(tmp_path):
    path = checkpoints.make_checkpoint("llama", tmp_path / "llama")
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == checkpoints.VOCAB_SIZE
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert not (path / checkpoints._DONE_MARKER).exists()  # the shape path's marker: not this path


def test_shape_goes_shard_by_shard(tmp_path):
    path = checkpoints.make_checkpoint("tiny", tmp_path / "tiny", dtype=torch.float32, max_shard_bytes=40_000)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["vocab_size"] == 1024
    assert (path / "model.safetensors.index.json").is_file() and (path / checkpoints._DONE_MARKER).is_file()


def test_unknown_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="name must be a family"):
        checkpoints.make_checkpoint("gpt2", tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_tiny_model_dir_lives_under_the_session_root(tiny_checkpoint_root, tmp_path_factory):
    path = checkpoints.tiny_model_dir("qwen3")
    assert path.parent == tiny_checkpoint_root
    assert tiny_checkpoint_root.is_relative_to(tmp_path_factory.getbasetemp())
    assert checkpoints.tiny_model_dir("qwen3") == path  # written once per session


def test_tiny_model_dir_writes_once_however_its_defaults_are_spelled(tiny_checkpoint_root, monkeypatch):
    """tiny_model_dir("qwen3") and tiny_model_dir("qwen3", False, seed=0) are one checkpoint: the
    second must not write it again (on the CPU a loaded model's tensors map the file, which a
    rewrite would pull from under it). Another seed is another directory."""
    path = checkpoints.tiny_model_dir("qwen3")
    written, real = [], checkpoints.make_checkpoint
    monkeypatch.setattr(checkpoints, "make_checkpoint", lambda *a, **k: written.append(a) or real(*a, **k))
    assert checkpoints.tiny_model_dir("qwen3", False) == path
    assert checkpoints.tiny_model_dir("qwen3", tie_word_embeddings=False, seed=0) == path
    assert written == []
    other = checkpoints.tiny_model_dir("qwen3", seed=1)  # written here or by an earlier test
    assert other == tiny_checkpoint_root / "qwen3-seed1" and (other / "model.safetensors").is_file()
