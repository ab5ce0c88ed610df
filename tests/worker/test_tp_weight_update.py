"""Weight updates under tensor parallelism (worker/weight_update.py, tp_runner.py): every rank
takes the full checkpoint-named tensors and keeps its own shard (the loader's split), so an
engine of checkpoint A given B's tensors, or reload_weights(B), serves exactly what an engine
loaded from B serves, at the same tensor_parallel_size; a refusal leaves every rank unchanged;
sleep(level=2) discards every rank's shard until an update fills it again.

The model is the parity suite's hardest split: one KV head over two ranks (replicated), qkv
biases (sliced with their rows), and a tied head over a vocabulary of 95 (the second shard
padded by one row), with folded norms (ENGINESPEC_FOLD_NORMS=1, inherited by the workers)."""

from __future__ import annotations

import pytest
import torch

from enginespec import LLM
from enginespec.testing.checkpoints import make_checkpoint
from enginespec.worker.loader import iter_tensors
from enginespec.worker.merged_decoder import FOLD_NORMS_ENV
from enginespec.worker.sleep import EngineAsleepError
from tests.worker.tp_common import _generate

pytestmark = pytest.mark.usefixtures("torch_one_thread")

OVERRIDES = dict(num_key_value_heads=1, tie_word_embeddings=True, vocab_size=95)
KWARGS = dict(impl="fast", dtype="float32", device="cpu", tensor_parallel_size=2, enable_sleep_mode=True)
Q = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def paths(tmp_path_factory) -> tuple[str, str]:
    """Checkpoints A and B: one config, two seeds."""
    root = tmp_path_factory.mktemp("tp_weights")
    return tuple(str(make_checkpoint("qwen2", root / f"seed{s}", seed=s, **OVERRIDES)) for s in (0, 1))


@pytest.fixture(scope="module", autouse=True)
def _folded():
    """Folded norms on every rank (the variable is read when a model is built, here and in
    each spawned worker, which inherits the environment)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(FOLD_NORMS_ENV, "1")
        yield


@pytest.fixture(scope="module")
def want_b(paths) -> list[list[int]]:
    """The greedy tokens of a TP=2 engine loaded from B."""
    with LLM(paths[1], **KWARGS) as llm:
        return _generate(llm)


def test_load_and_reload_weights_under_tp_serve_bs_tokens_and_refusals_change_no_rank(paths, want_b):
    """load_weights(B's tensors) -> B's tokens; reload_weights() -> A's again; reload_weights(B)
    and collective_rpc("reload_weights") likewise (vLLM's list: a count per rank). An unknown name or a wrong shape after good
    tensors is a ValueError naming it, and no rank copied anything (A's tokens: a rank that
    had copied its shard of the good ones would change them). It was refused ('not supported
    with tensor_parallel_size > 1')."""
    a, b = paths
    tensors_b = list(iter_tensors(b))
    with LLM(a, **KWARGS) as llm:
        want_a = _generate(llm)
        assert want_a != want_b  # the two checkpoints disagree: the test can tell them apart
        good = [(n, t) for n, t in tensors_b if ".layers." in n]
        q = dict(tensors_b)[Q]
        for bad, message in [
            (
                ("model.layers.9.mlp.up_proj.weight", q),
                r"unknown weight 'model\.layers\.9\.mlp\.up_proj\.weight'",
            ),
            ((Q, q[:-1]), r"'model\.layers\.0\.self_attn\.q_proj\.weight' has shape \[63, 32\]"),
        ]:
            with pytest.raises(ValueError, match=message):
                llm.load_weights(good + [bad])
            assert _generate(llm) == want_a
        assert llm.load_weights(tensors_b) == len(tensors_b)
        assert _generate(llm) == want_b
        assert llm.reload_weights() == len(tensors_b)
        assert _generate(llm) == want_a
        assert llm.collective_rpc("reload_weights", args=(b,)) == [len(tensors_b)] * 2  # one per rank
        assert _generate(llm) == want_b


def test_sleep_level_2_under_tp_until_load_weights_fills_every_rank(paths, want_b):
    """vLLM's recipe at TP=2: sleep(level=2); wake_up(tags=["weights"]); load_weights(B) in two
    calls; wake_up(tags=["kv_cache"]): requests are refused until every name is loaded, then
    B's tokens; a second cycle with reload_weights() gives A's again. It was refused ('sleep
    level 2 is not supported with tensor_parallel_size > 1')."""
    a, b = paths
    tensors_b = list(iter_tensors(b))
    with LLM(a, **KWARGS) as llm:
        want_a = _generate(llm)
        llm.sleep(level=2)
        llm.wake_up(tags=["weights"])
        llm.load_weights(tensors_b[:3])
        llm.wake_up(tags=["kv_cache"])
        with pytest.raises(EngineAsleepError, match=r"are not loaded"):
            _generate(llm)
        llm.load_weights(tensors_b[3:])
        assert _generate(llm) == want_b
        llm.sleep(level=2)
        llm.wake_up()
        with pytest.raises(EngineAsleepError, match="reload_weights"):
            _generate(llm)
        llm.reload_weights()
        assert _generate(llm) == want_a
        workers = list(llm.engine.tensor_parallel.processes)
    assert [p.exitcode for p in workers] == [0]


def test_a_refusal_on_one_worker_alone_leaves_every_rank_unchanged(paths):
    """float16: a value beyond its range in the embedding's last rows (rank 1's part alone) is
    found by rank 1 after rank 0 checked its own part and found nothing: a ValueError naming
    the tensor and the rank, and no rank copies anything (rank 0 neither its embedding rows nor
    the good tensors given before). Then the same update without it is taken on both ranks."""
    a, b = paths
    tensors_b = dict(iter_tensors(b))
    embedding = tensors_b["model.embed_tokens.weight"].clone()
    embedding[90, 3] = 65520.0  # inf in float16; row 90 of 95 is rank 1's (rows 48..95)
    good = [(n, t) for n, t in tensors_b.items() if n != "model.embed_tokens.weight"]
    with LLM(a, **dict(KWARGS, dtype="float16")) as llm:
        want_a = _generate(llm)
        with pytest.raises(
            ValueError,
            match=r"tensor-parallel rank 1: tensor 'model\.embed_tokens\.weight' .*float16's range",
        ):
            llm.load_weights(good + [("model.embed_tokens.weight", embedding)])
        assert _generate(llm) == want_a
        embedding[90, 3] = 0.0
        assert llm.load_weights(good + [("model.embed_tokens.weight", embedding)]) == len(tensors_b)
        assert _generate(llm) != want_a


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2-tied-one-kv-head"])
def test_a_ranks_part_of_a_whole_tensor_is_what_the_loader_reads(family, tmp_path):
    """own_shard (a weight update's cut, on the whole tensor) equals the loader's slice of the
    checkpoint (load_shard's) for every tensor, rank and split of 2 and 4 ranks (4: the one KV
    head replicated over 4, the vocabulary's last part padded), and full_shapes are the
    checkpoint's shapes. No engine: the model is the loader's, the plan tp_shard's."""
    from types import SimpleNamespace

    from enginespec.worker.flat_model import _text_config
    from enginespec.worker.loader import build_model
    from enginespec.worker.tp_shard import ShardPlan
    from enginespec.worker.weight_update import full_shapes, own_shard

    name, overrides = (family, {}) if "-" not in family else ("qwen2", OVERRIDES)
    path = make_checkpoint(name, tmp_path / family, **overrides)
    hf_model, whole = build_model(path), dict(iter_tensors(path))
    for world_size in (2, 4):
        for rank in range(world_size):
            plan = ShardPlan.from_config(_text_config(hf_model.config), rank, world_size)
            model = SimpleNamespace(hf_model=hf_model, shard_plan=plan)
            assert full_shapes(model) == {n: tuple(t.shape) for n, t in whole.items()} | (
                {"lm_head.weight": tuple(whole["model.embed_tokens.weight"].shape)} if overrides else {}
            )
            for tensor_name, part in iter_tensors(path, slicer=plan.slice_for):
                assert torch.equal(own_shard(model, tensor_name, whole[tensor_name]), part), tensor_name


def test_a_checkpoint_of_other_shapes_is_refused_by_every_rank_though_its_parts_would_fit(paths, tmp_path):
    """A checkpoint whose MLP is twice as wide: each rank's rows of gate/up (and columns of
    down) have the shapes of its live part, so only the whole tensors' shapes tell. Both ways a
    rank takes an update refuse it, naming the tensor: reload_weights' read (read_checkpoint,
    the shapes checked before the slice) and load_weights' cut (own_shard). No engine."""
    from types import SimpleNamespace

    from enginespec.worker.flat_model import _text_config
    from enginespec.worker.loader import CheckpointError, build_model
    from enginespec.worker.tp_shard import ShardPlan
    from enginespec.worker.weight_update import own_shard, read_checkpoint

    hf_model = build_model(paths[0])
    wide = make_checkpoint(
        "qwen2", tmp_path / "wide", **OVERRIDES, intermediate_size=2 * hf_model.config.intermediate_size
    )
    up = "model.layers.0.mlp.up_proj.weight"
    wide_up = dict(iter_tensors(wide))[up]
    for rank in range(2):
        plan = ShardPlan.from_config(_text_config(hf_model.config), rank, 2)
        model = SimpleNamespace(hf_model=hf_model, shard_plan=plan)
        assert plan.slice_for(up, tuple(wide_up.shape)).size * 2 == hf_model.config.intermediate_size
        with pytest.raises(CheckpointError, match=r"mlp\.(gate|up|down)_proj\.weight"):
            read_checkpoint(model, wide)
        with pytest.raises(ValueError, match=r"'model\.layers\.0\.mlp\.up_proj\.weight' has shape"):
            own_shard(model, up, wide_up)
