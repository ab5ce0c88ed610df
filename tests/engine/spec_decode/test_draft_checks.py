"""A draft_model config is checked before the target model loads, wherever the two config.json
files (and the engine arguments) suffice: a missing draft directory, a draft of another
vocabulary are refused, naming the field, without reading the target's weights (or spawning
tensor-parallel workers); a good draft gets through to the load, under tensor parallelism too.

Each test replaces EngineCore._load_model with one that raises TargetLoaded, so reaching the
target's load is visible and costs nothing."""

from __future__ import annotations

import pytest

from enginespec.engine.engine_core import EngineCore
from enginespec.engine_args import EngineArgs
from enginespec.testing.checkpoints import make_checkpoint, tiny_model_dir
from enginespec.worker.loader import CheckpointNotFound


class TargetLoaded(Exception):
    """The engine went on to load the target model."""


@pytest.fixture(autouse=True)
def no_target_load(monkeypatch):
    def load(self):
        raise TargetLoaded

    monkeypatch.setattr(EngineCore, "_load_model", load)


def _build(draft, **args):
    config = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2}
    engine_args = dict(impl="reference", dtype="float32", device="cpu", num_blocks=16)
    engine_args.update(args)
    return EngineCore(
        EngineArgs(model=str(tiny_model_dir("qwen3")), speculative_config=config, **engine_args)
    )


def test_a_missing_draft_is_refused_before_the_target_loads(tmp_path):
    with pytest.raises(CheckpointNotFound, match=r"speculative_config\.model: .*no-draft.*does not exist"):
        _build(tmp_path / "no-draft")


def test_a_draft_of_another_vocabulary_is_refused_before_the_target_loads(tmp_path):
    wide = make_checkpoint("qwen3", tmp_path / "wide", vocab_size=128)
    with pytest.raises(
        ValueError,
        match=r"speculative_config\.model: the draft's vocab_size \(128\) must equal the target's \(96\)",
    ):
        _build(wide)


def test_a_draft_under_tensor_parallel_gets_through_to_the_target_load():
    with pytest.raises(TargetLoaded):  # runs whole on rank 0 (test_tensor_parallel.py)
        _build(tiny_model_dir("qwen3"), tensor_parallel_size=2)


def test_a_good_draft_gets_through_to_the_target_load(tmp_path):
    other = make_checkpoint("llama", tmp_path / "llama-draft")  # another family, same vocabulary
    with pytest.raises(TargetLoaded):
        _build(other)


def test_a_draft_model_given_loaded_reads_no_draft_checkpoint(tmp_path):
    """EngineCore(draft_model=...) (tests share a loaded draft between engines) checks that draft
    once it is loaded (_draft_model), so the early checks, which read config.json files, are
    skipped: speculative_config's "model" is then only a name, and need not be on disk."""
    config = {"method": "draft_model", "model": str(tmp_path / "nowhere"), "num_speculative_tokens": 2}
    args = EngineArgs(
        model=str(tiny_model_dir("qwen3")),
        speculative_config=config,
        impl="reference",
        dtype="float32",
        device="cpu",
        num_blocks=16,
    )
    with pytest.raises(TargetLoaded):
        EngineCore(args, draft_model=object())
