"""Direct tests of the fast impl's own machinery (the conformance suite covers its decisions):
the incremental hash equals the canonical chain, the intrusive free list behaves like a plain
list, and the batch builder's caches (per-request table rows, staging buffer) stay exact when
tables are trimmed and regrown, slots are recycled, and buffers grow.
"""

from __future__ import annotations

import random

import pytest
import torch

from enginespec.impls.fast.batch import BatchBuilder
from enginespec.impls.fast.free_queue import FreeQueue
from enginespec.impls.fast.hashing import extend_block_hashes
from enginespec.impls.fast.request import FastRequest
from enginespec.spec import (
    SamplingParams,
    SchedulerConfig,
    SchedulerOutput,
    check_request_args,
    hash_request_blocks,
    load_impl,
)
from enginespec.spec import build_batch as plain_build_batch

FAST = load_impl("fast")


def same_batch(a, b) -> None:
    for name in ("input_ids", "positions", "logits_indices"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    for name in (
        "query_start_loc",
        "seq_lens",
        "block_table",
        "slot_mapping",
        "query_start_loc_cpu",
        "seq_lens_cpu",
    ):
        x, y = getattr(a.meta, name), getattr(b.meta, name)
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name
    assert (a.meta.max_query_len, a.meta.max_seq_len) == (b.meta.max_query_len, b.meta.max_seq_len)
    assert (a.sample_request_ids, a.num_scheduled_tokens, a.num_reqs, a.prompt_logprob_rows) == (
        b.sample_request_ids,
        b.num_scheduled_tokens,
        b.num_reqs,
        b.prompt_logprob_rows,
    )


@pytest.mark.parametrize("seed", range(6))
def test_incremental_hashes_equal_the_canonical_chain(seed):
    rng = random.Random(seed)
    bs = rng.choice([1, 2, 3, 16])
    key = rng.choice([(), ("tenant",), ("lora", b"\x00", 3, None, True)])
    r = FAST.new_request("a", [rng.randrange(50_000) for _ in range(rng.randint(1, 70))], cache_key=key)
    for _ in range(5):
        hashes = extend_block_hashes(r, bs)
        assert hashes is r.block_hashes
        assert hashes == hash_request_blocks(r.token_ids, bs, key)
        for _ in range(rng.randint(0, 2 * bs)):
            r.append(rng.randrange(50_000))


def test_free_queue_matches_a_plain_list():
    """Random pops, removals, single pushes and batched releases (only blocks whose count
    reaches 0 join, in release order) against a list model."""
    rng = random.Random(0)
    num = 40
    queue, model = FreeQueue(num), list(range(num))
    refs = [0] * num
    for _ in range(3000):
        op = rng.randrange(4)
        if op == 0 and model:
            b = queue.pop_front()
            assert b == model.pop(0)
            refs[b] = rng.randint(1, 2)
        elif op == 1 and model:
            b = rng.choice(model)
            queue.remove(b)
            model.remove(b)
            refs[b] = 1
        elif op == 2:
            held = [b for b in range(num) if refs[b] > 0]
            chosen = rng.sample(held, min(len(held), rng.randint(0, 4)))
            queue.release(chosen, refs)
            model += [b for b in chosen if refs[b] == 0]
        else:
            out = [b for b in range(num) if b not in model and refs[b] == 1]
            if out:
                b = rng.choice(out)
                refs[b] = 0
                queue.push_back(b)
                model.append(b)
        assert len(queue) == len(model)
        assert all((b in queue) == (b in model) for b in range(num))
        assert all((refs[b] == 0) == (b in model) for b in range(num))
    assert queue.to_list() == model


def test_empty_free_queue_links_head_to_tail():
    queue = FreeQueue(3)
    for _ in range(3):
        queue.pop_front()
    assert queue.to_list() == [] and len(queue) == 0
    queue.push_back(2)
    assert queue.to_list() == [2] and queue.pop_front() == 2


def test_trim_makes_a_new_table_object_and_the_builder_sees_the_change():
    """A table trimmed then regrown to its old length holds other blocks: the builder's
    identity + length check must not serve the stale row."""
    bm = FAST.new_block_manager(16, 2, enable_prefix_caching=False)
    builder = BatchBuilder("cpu")
    r = FAST.new_request("a", list(range(1, 8)))
    assert bm.allocate_slots(r, 7)
    out = SchedulerOutput(scheduled=[(r, 7)])
    same_batch(builder.build(out, bm), plain_build_batch(out, bm))
    old = bm._tables["a"]
    bm.trim(r, 3)
    assert bm._tables["a"] is not old and bm.block_table("a") == old[:2]
    # the trimmed blocks (no hash) went to the front: another request takes them first
    assert bm.allocate_slots(FAST.new_request("b", [1, 2, 3, 4]), 4)
    assert bm.allocate_slots(r, 7)  # regrows to 4 blocks, the new ones from the free queue
    assert bm.block_table("a") != old
    same_batch(builder.build(out, bm), plain_build_batch(out, bm))


def test_a_trim_never_leaves_the_scheduler_believing_in_slots_the_table_lacks():
    """`_capacity` mirrors the tokens a request's table covers, and the fast scheduler skips
    allocate_slots for a step ending within it, so after any trim it may undercount, never
    overcount. Trace (block_size 4, threshold 1): `a` prefills 1 of its 4 prompt tokens, is
    rolled back to 0 and trimmed to nothing (as a rejected step's rollback is), then scheduled
    again: its 1-token chunk needs a block, which allocate_slots must be asked for."""
    bm = FAST.new_block_manager(8, 4, enable_prefix_caching=False)
    config = SchedulerConfig(
        max_num_batched_tokens=8, max_num_seqs=2, enable_chunked_prefill=True, long_prefill_token_threshold=1
    )
    scheduler = FAST.new_scheduler(config, bm)
    r = FAST.new_request("a", [10, 11, 12, 13], SamplingParams(max_tokens=2))
    scheduler.add(r)
    output = scheduler.schedule()
    scheduler.update_from_output(output, {})
    assert r.num_computed_tokens == 1 and len(bm.block_table("a")) == 1
    r.num_computed_tokens = 0
    bm.trim(r, 0)
    assert bm.block_table("a") == []
    output = scheduler.schedule()
    assert [(s.request_id, n) for s, n in output.scheduled] == [("a", 1)]
    assert len(bm.block_table("a")) == 1, "a 1-token step was scheduled without a block"


def test_builder_recycles_slots_and_grows_its_buffers():
    """Hundreds of short-lived requests (slots released through output.finished), tables wider
    than the initial rows, a step bigger than the initial staging buffer: every batch equals
    the plain builder's."""
    rng = random.Random(1)
    bm = FAST.new_block_manager(6000, 4)
    config = SchedulerConfig(max_num_batched_tokens=20_000, max_num_seqs=96, long_prefill_token_threshold=0)
    scheduler = FAST.new_scheduler(config, bm)
    builder = BatchBuilder("cpu")
    for i in range(300):
        prompt = [rng.randrange(1, 99) for _ in range(rng.randint(1, 300))]
        params = SamplingParams(
            max_tokens=rng.randint(1, 6), ignore_eos=True, prompt_logprobs=1 if i % 7 == 0 else None
        )
        scheduler.add(FAST.new_request(f"r{i}", prompt, params, arrival_time=float(i)))
    widths, num_steps = set(), 0
    while scheduler.has_unfinished:
        output = scheduler.schedule()
        got = builder.build(output, bm, pad_to=output.num_scheduled_tokens + num_steps % 3)
        same_batch(got, plain_build_batch(output, bm, "cpu", output.num_scheduled_tokens + num_steps % 3))
        widths.add(got.meta.block_table.shape[1])
        sampled = {rid: [rng.randrange(1, 99)] for rid in got.sample_request_ids}
        scheduler.update_from_output(output, sampled)
        num_steps += 1
    assert max(widths) > 16 and len(builder._tables.slot_of) < 96
    assert builder._staging.np.shape[0] > 1 << 16


def test_scheduler_finds_requests_in_every_queue():
    """abort() removes a request from the running, swapped and waiting queues by bisecting on
    its key; the remaining order stays the policy order."""
    bm = FAST.new_block_manager(4, 2)
    config = SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=4, preemption_mode="swap")
    scheduler = FAST.new_scheduler(config, bm)
    for i in range(4):
        scheduler.add(
            FAST.new_request(
                f"r{i}",
                [10 * i + t for t in range(1, 5)],
                SamplingParams(max_tokens=3),
                arrival_time=float(i),
            )
        )
    output = scheduler.schedule()  # r0, r1 admitted (2 blocks each), r2, r3 wait
    scheduler.update_from_output(output, {"r0": [5], "r1": [5]})
    output = scheduler.schedule()  # r0 needs a third block: r1 is swapped out
    assert [r.request_id for r in output.preempted] == ["r1"]
    assert [r.request_id for r in scheduler.waiting] == ["r1", "r2", "r3"]
    for rid in ("r2", "r1", "r0"):
        assert scheduler.abort(rid)
    assert [r.request_id for r in scheduler.waiting] == ["r3"] and scheduler.running == []
    assert not scheduler.abort("r1") and bm.num_free == 4


def test_one_builder_per_pool_released_with_it():
    """Two pools with the same request ids get separate builders (their row caches never
    mix); a pool's builder goes away with the pool."""
    import gc
    import weakref

    outputs = []
    for fill in (1, 2):
        bm = FAST.new_block_manager(8, 2)
        r = FAST.new_request("same-id", [fill] * 5)
        assert bm.allocate_slots(r, 5)
        outputs.append((bm, SchedulerOutput(scheduled=[(r, 5)])))
    for bm, out in outputs + outputs[::-1]:
        same_batch(FAST.build_batch(out, bm), plain_build_batch(out, bm))
    assert {id(bm) for bm, _ in outputs} <= {id(k) for k in FAST._builders.keys()}
    before = len(FAST._builders)
    pools = [weakref.ref(bm) for bm, _ in outputs]
    del outputs, bm, out, r
    gc.collect()
    assert all(pool() is None for pool in pools)  # the builders held no reference to them
    # at most: the collection may also take pools that earlier tests left in reference cycles
    assert len(FAST._builders) <= before - 2


def test_decode_batches_launch_longest_first_with_one_sort_per_step():
    """FastAttention's launch order: argsort of seq_lens (longest first) for decode-only
    batches of several requests, made once per BatchMeta and reused by later layers; none for
    prefill rows or a single request."""
    from enginespec.impls.fast.attention import FastAttention
    from enginespec.spec import BatchMeta

    def meta(seq_lens, q_lens):
        qsl = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
        lens = torch.tensor(seq_lens, dtype=torch.int32)
        return BatchMeta(
            query_start_loc=qsl,
            seq_lens=lens,
            block_table=torch.zeros(len(seq_lens), 1, dtype=torch.int32),
            slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64),
            block_size=16,
            query_start_loc_cpu=qsl,
            seq_lens_cpu=lens,
            max_query_len=max(q_lens),
            max_seq_len=max(seq_lens),
        )

    backend = FastAttention("cpu", use_triton=True)
    decode = meta([5, 40, 12, 40, 1], [1] * 5)
    order = backend._launch_order(decode, decode.seq_lens)
    assert order.dtype == torch.int32
    assert decode.seq_lens[order.long()].tolist() == [40, 40, 12, 5, 1]
    assert backend._launch_order(decode, decode.seq_lens) is order  # the next layer: no new sort
    again = meta([5, 40, 12, 40, 1], [1] * 5)
    assert backend._launch_order(again, again.seq_lens) is not order  # a new step sorts again
    prefill = meta([5, 9], [1, 4])
    assert backend._launch_order(prefill, prefill.seq_lens) is None
    single = meta([7], [1])  # one request: nothing to order, no sort launched
    assert backend._launch_order(single, single.seq_lens) is None


def test_request_made_directly_takes_the_spec_defaults():
    """FastRequest is public (enginespec.impls.fast): made with only an id and a prompt, it holds
    spec.check_request_args' defaults. FastImpl.new_request passes every argument, so only a
    direct construction sees the class's own defaults."""
    r, want = FastRequest("r", [1]), check_request_args("r", [1])
    assert (r.params, r.eos_token_id, r.priority, r.cache_key) == (
        want.params,
        want.eos_token_id,
        want.priority,
        want.cache_key,
    )


@pytest.mark.parametrize("decode,switch", [(True, "1"), (False, "1"), (True, "0")])
def test_attend_qkv_equals_write_then_forward(decode, switch, monkeypatch):
    """FastAttention.attend_qkv (the route enginespec::paged_attention_qkv takes) gives the
    output and pool of write_qkv then forward. A decode-only batch takes the one-launch kernel
    (kernels/decode_attention.py) unless ENGINESPEC_FUSED_DECODE=0 was set when the backend
    was made; any other batch the two launches: counted by wrapping the kernel's wrapper."""
    from enginespec.impls.fast.attention import FastAttention
    from enginespec.kernels import decode_attention as fused_module
    from enginespec.kernels.reference import rope_inv_freq, rotary_cos_sin
    from enginespec.spec import BatchMeta
    from enginespec.testing.paged_batches import random_batch

    hq, hkv, d = 4, 2, 16
    device = "cuda" if torch.cuda.is_available() else "cpu"  # Triton runs interpreted on the CPU
    q_lens = [1, 1, 1] if decode else [1, 3, 1]
    batch = random_batch(
        3,
        30,
        3,
        num_q_heads=hq,
        num_kv_heads=hkv,
        head_dim=d,
        block_size=4,
        dtype=torch.float32,
        seed=9,
        lengths=([17, 5, 29], q_lens),
        device=device,
    )
    meta = BatchMeta(
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        block_table=batch.block_table,
        slot_mapping=batch.slot_mapping,
        block_size=4,
        query_start_loc_cpu=batch.query_start_loc,
        seq_lens_cpu=batch.seq_lens,
        max_query_len=batch.max_query_len,
        max_seq_len=batch.max_seq_len,
    )
    gen = torch.Generator().manual_seed(3)
    n = batch.slot_mapping.shape[0]
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=gen).to(device)
    cos_table, sin_table = rotary_cos_sin(rope_inv_freq(d, 10000.0), 32)
    cos = torch.cat([cos_table[batch.positions.cpu()]] * 2, dim=-1).to(device)
    sin = torch.cat([sin_table[batch.positions.cpu()]] * 2, dim=-1).to(device)
    weight = (1 + 0.1 * torch.randn(hq + hkv, d, generator=gen)).to(device)
    calls = []
    real = fused_module.decode_attention
    monkeypatch.setattr(fused_module, "decode_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setenv("ENGINESPEC_FUSED_DECODE", switch)
    backend = FastAttention(device, use_triton=True)
    monkeypatch.delenv("ENGINESPEC_FUSED_DECODE")  # read at construction, not per call
    cache_a, cache_b = batch.cache.clone(), batch.cache.clone()
    got = backend.attend_qkv(cache_a, qkv, cos, sin, weight, 1e-6, meta, hq, 0.3, 0)
    q = backend.write_qkv(cache_b, qkv, cos, sin, weight, 1e-6, meta, hq)
    want = backend.forward(q, cache_b, meta, scale=0.3)
    assert len(calls) == (1 if decode and switch == "1" else 0)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(cache_a, cache_b, atol=2e-5, rtol=2e-5, equal_nan=True)
    backend.fused_decode_max_rows = n - 1  # a decode batch over the bound takes the two launches
    calls.clear()
    cache_c = batch.cache.clone()
    torch.testing.assert_close(
        backend.attend_qkv(cache_c, qkv, cos, sin, weight, 1e-6, meta, hq, 0.3, 0), want
    )
    assert not calls
    torch.testing.assert_close(cache_c, cache_b, atol=2e-5, rtol=2e-5, equal_nan=True)


@pytest.mark.parametrize("num_reqs,pad_to", [(1, 1), (3, 4), (5, 8)])
def test_decode_batches_are_packed_for_a_one_copy_graph_load(num_reqs, pad_to):
    """The builder stages input_ids .. seq_lens at spec.packed_offsets: a decode graph finds the
    span (worker/cuda_graphs.packed_span) and one copy of it fills a bucket's views with every
    array; a batch whose arrays are separate tensors gives None (the graph loads them one by one)."""
    import dataclasses

    from enginespec.worker.cuda_graphs import _packed_views, packed_span

    bm = FAST.new_block_manager(64, 4)
    reqs = [FAST.new_request(f"d{i}", list(range(1, 7 + 3 * i))) for i in range(num_reqs)]
    for r in reqs:
        assert bm.allocate_slots(r, r.num_tokens)
        r.num_computed_tokens = r.num_tokens - 1  # a decode step: one new token each
    out = SchedulerOutput(scheduled=[(r, 1) for r in reqs])
    batch = BatchBuilder("cpu").build(out, bm, pad_to=pad_to)
    span = packed_span(batch)
    assert span is not None and span.dtype == torch.uint8
    buffer = torch.full((span.shape[0] + 64,), 0x55, dtype=torch.uint8)
    buffer[: span.shape[0]].copy_(span)
    meta = batch.meta
    want = (batch.input_ids, batch.positions, meta.slot_mapping, meta.query_start_loc, meta.seq_lens)
    for got, expected in zip(_packed_views(buffer, pad_to), want, strict=True):
        assert torch.equal(got, expected)
    assert meta.seq_lens[num_reqs:].eq(0).all() and meta.slot_mapping[num_reqs:].eq(-1).all()  # padding
    apart = dataclasses.replace(batch, positions=batch.positions.clone())
    assert packed_span(apart) is None


def _one_decode(bm, request_id: str, num_tokens: int):
    """A request of num_tokens tokens, all but the last computed, in bm: (it, its decode step)."""
    r = FAST.new_request(request_id, list(range(1, num_tokens + 1)))
    assert bm.allocate_slots(r, num_tokens)
    r.num_computed_tokens = num_tokens - 1
    return r, SchedulerOutput(scheduled=[(r, 1)])


def test_a_repeated_shape_after_the_staging_buffer_grew_is_laid_out_anew():
    """The builder keeps each shape's layout and host views; a step big enough to reallocate
    the staging buffer must retire them, or the next step of a kept shape would be written into
    the old buffer and the copy would send the new one's stale bytes."""
    bm = FAST.new_block_manager(4096, 4)
    builder = BatchBuilder("cpu")
    small, decode = _one_decode(bm, "s", 9)
    same_batch(builder.build(decode, bm), plain_build_batch(decode, bm))
    big = FAST.new_request("b", list(range(1, 3000)))  # ~50 KB of rows and table: past 64 KiB
    assert bm.allocate_slots(big, 2999)
    before = builder._staging.np
    wide = SchedulerOutput(scheduled=[(big, 2999)])
    same_batch(builder.build(wide, bm), plain_build_batch(wide, bm))
    assert builder._staging.np is not before  # the step did reallocate
    small.append(42)
    assert bm.allocate_slots(small, 1)
    small.num_computed_tokens = 9
    same_batch(builder.build(decode, bm), plain_build_batch(decode, bm))


def test_batches_stay_valid_for_the_ring_and_reuse_their_device_views():
    """The builder copies each step into RING_SLOTS device buffers in turn: a batch keeps its
    values while RING_SLOTS - 1 more are built (the Staging contract), the next build of its
    slot reuses the storage, and a repeated shape in a slot gets the very views made there
    before (no new views a step)."""
    from enginespec.impls.fast.batch_buffers import RING_SLOTS

    bm = FAST.new_block_manager(64, 4)
    builder = BatchBuilder("cpu")
    r, out = _one_decode(bm, "d", 8)
    batches, saved = [], []
    for step in range(RING_SLOTS):
        r.append(100 + step)
        r.num_computed_tokens += 1
        assert bm.allocate_slots(r, 1)
        batches.append(builder.build(out, bm))
        saved.append((batches[-1].input_ids.clone(), batches[-1].positions.clone()))
        same_batch(batches[-1], plain_build_batch(out, bm))
    for batch, (ids, pos) in zip(batches, saved):  # every held batch still holds its own step
        assert torch.equal(batch.input_ids, ids) and torch.equal(batch.positions, pos)
    assert [b.positions.item() for b in batches] == list(range(8, 8 + RING_SLOTS))
    again = builder.build(out, bm)  # the first batch's slot again, the same shape
    assert again.input_ids is batches[0].input_ids and again.meta.seq_lens is batches[0].meta.seq_lens
    assert again.input_ids.data_ptr() == batches[0].input_ids.data_ptr()
    assert len({b.input_ids.data_ptr() for b in batches}) == RING_SLOTS
    same_batch(again, plain_build_batch(out, bm))


def test_fast_scheduler_refuses_a_request_of_another_impl():
    """FastScheduler reads fields only FastRequest has (its policy key, prompt length and stop
    limits, the block manager's mirrors). An impl that keeps scheduler_cls = FastScheduler but
    swaps request_cls (or the reference's requests under the fast scheduler) is refused at add
    with a ValueError naming request_cls, changing nothing, not an AttributeError at the first
    schedule() that fails every request of the step."""
    sched = FAST.new_scheduler(SchedulerConfig(), FAST.new_block_manager(8, 4))
    foreign = load_impl("reference").new_request("a", [1, 2, 3], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match=r"request_cls .*FastRequest.*got enginespec\.impls\.reference"):
        sched.add(foreign)
    assert not sched.has_unfinished and sched.waiting == [] and foreign.status.value == "waiting"
    sched.add(FAST.new_request("a", [1, 2, 3], SamplingParams(max_tokens=2)))  # the id is still free
    assert [r for r, _ in sched.schedule().scheduled][0].request_id == "a"
