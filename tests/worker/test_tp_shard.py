"""Tensor-parallel sharding (worker/tp_shard.py, the loader's slices): what each rank reads is
exactly its part of the checkpoint's tensors, KV heads replicated when there are fewer than
ranks, the vocabulary padded to equal shards; impossible splits are ValueErrors. No processes."""

from __future__ import annotations

import pytest
import torch

from enginespec.testing.checkpoints import make_checkpoint
from enginespec.worker.loader import TensorSlice, build_model
from enginespec.worker.tp_shard import ShardPlan


def _plan(rank=0, world_size=2, **sizes) -> ShardPlan:
    base = dict(num_q_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=64, vocab_size=96)
    return ShardPlan(rank=rank, world_size=world_size, **{**base, **sizes})


@pytest.fixture(scope="module")
def one_kv_head(tmp_path_factory):
    """Qwen2 (q/k/v biases) with 1 KV head: over 2 ranks the KV head must be replicated."""
    return make_checkpoint("qwen2", tmp_path_factory.mktemp("qwen2-1kv"), num_key_value_heads=1)


def test_each_rank_reads_exactly_its_shard(one_kv_head):
    full = dict(build_model(one_kv_head).named_parameters())
    d, i = 16, 64 // 2
    for rank in range(2):
        plan = ShardPlan.from_config(build_model(one_kv_head).config, rank, 2)
        shard = dict(build_model(one_kv_head, slicer=plan.slice_for).named_parameters())
        q = slice(rank * 2 * d, (rank + 1) * 2 * d)
        attn, mlp = "model.layers.1.self_attn.", "model.layers.1.mlp."
        expect = {
            attn + "q_proj.weight": full[attn + "q_proj.weight"][q],
            attn + "q_proj.bias": full[attn + "q_proj.bias"][q],
            attn + "k_proj.weight": full[attn + "k_proj.weight"],  # the one KV head, replicated
            attn + "v_proj.bias": full[attn + "v_proj.bias"],
            attn + "o_proj.weight": full[attn + "o_proj.weight"][:, q],
            mlp + "gate_proj.weight": full[mlp + "gate_proj.weight"][rank * i : (rank + 1) * i],
            mlp + "down_proj.weight": full[mlp + "down_proj.weight"][:, rank * i : (rank + 1) * i],
            "model.embed_tokens.weight": full["model.embed_tokens.weight"][rank * 48 : (rank + 1) * 48],
            "lm_head.weight": full["lm_head.weight"][rank * 48 : (rank + 1) * 48],
            "model.norm.weight": full["model.norm.weight"],
        }
        for name, want in expect.items():
            assert torch.equal(shard[name], want), f"rank {rank}: {name}"


def test_kv_heads_split_or_replicated():
    assert [(_plan(r).kv_head_start, _plan(r).local_kv_heads) for r in range(2)] == [(0, 1), (1, 1)]
    four = [_plan(r, 4, num_q_heads=8, num_kv_heads=2) for r in range(4)]
    assert [(p.kv_head_start, p.local_kv_heads) for p in four] == [(0, 1), (0, 1), (1, 1), (1, 1)]
    # rank r's q heads [2r, 2r + 2) belong to KV group (2r) // (8 / 2): the head it holds
    assert all((2 * p.rank) // 4 == p.kv_head_start for p in four)


def test_vocab_shards_are_padded_to_equal_size():
    last = _plan(rank=1, vocab_size=95)
    assert last.slice_for("lm_head.weight", (95, 32)) == TensorSlice(0, 48, 95, 48)
    assert last.slice_for("model.embed_tokens.weight", (95, 32)) == TensorSlice(0, 48, 95, 48)
    assert (last.vocab_start, last.vocab_stop) == (48, 95)


@pytest.mark.parametrize(
    "sizes, field",
    [
        (dict(num_q_heads=3), "num_attention_heads"),
        (dict(num_q_heads=6, num_kv_heads=3, world_size=2), "num_key_value_heads"),
        (dict(intermediate_size=63), "intermediate_size"),
    ],
)
def test_impossible_splits_name_the_field(sizes, field):
    world_size = sizes.pop("world_size", 2)
    with pytest.raises(ValueError, match=field):
        _plan(world_size=world_size, **sizes)
