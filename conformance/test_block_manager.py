"""Block pool conformance (DESIGN points 1-4), on the BlockManager alone.

`PoolMachine` drives the impl under test and the reference through the same random sequence of
admissions (cached prefix lookup + allocation + publish), growth, frees, trims and cache resets,
checking after every operation the exact transition each call must make, the pool invariants,
and that both pools are identical. The directed properties below build the situations random
traces reach only rarely (a hole in a cached chain, a refusal caused only by reviving free
cached blocks, a fully cached prompt).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from enginespec.conformance.diff import divergence_report, short
from enginespec.conformance.invariants import (
    cdiv,
    check_allocate,
    check_no_caching,
    check_pool,
    check_release,
    check_request,
    check_table_hashes,
    expected_prefix,
)
from enginespec.conformance.rules import spec_rule
from enginespec.conformance.strategies import (
    EOS_TOKEN_ID,
    block_sizes,
    cache_keys,
    pool_shapes,
    stems_for,
    token_lists,
)
from enginespec.spec import SamplingParams, hash_request_blocks
from enginespec.testing.fake_model import FakeModel

MODEL = FakeModel()


def make(impl, rid, tokens, *, cache_key=(), prompt_logprobs=None):
    params = SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=prompt_logprobs)
    return impl.new_request(
        rid, list(tokens), params, eos_token_id=EOS_TOKEN_ID, arrival_time=0.0, cache_key=cache_key
    )


def admit(bm, r, num_new_tokens=None):
    """What the scheduler does on admission: cached prefix, allocate, publish, compute."""
    cached = bm.find_cached_prefix(r)
    k = len(cached) * bm.block_size
    n = r.num_tokens - k if num_new_tokens is None else num_new_tokens
    ok = bm.allocate_slots(r, n, cached)
    if ok:
        r.num_computed_tokens = r.num_cached_tokens = k
        bm.cache_full_blocks(r, k + n)
        r.num_computed_tokens = k + n
    return ok, cached


@spec_rule("hash-chain")
def check_published(bm, r, start: int, end: int) -> None:
    """Blocks that became full between token positions start and end are findable by their
    canonical chain hash: the block carries it, or another block already did (first writer wins)."""
    state = bm.state()
    if not bm.enable_prefix_caching:
        check_no_caching(state)
        return
    table = state.tables[r.request_id]
    chain = hash_request_blocks(r.token_ids, bm.block_size, r.cache_key)
    for i in range(start // bm.block_size, min(end, r.num_tokens) // bm.block_size):
        carried = state.block_hashes[table[i]]
        if carried != chain[i] and chain[i] not in state.cached:  # raised: no raw 16-byte reprs
            raise AssertionError(
                f"block {i} of {r.request_id} (block id {table[i]}) became full: its chain hash "
                f"{short(chain[i])} (spec.hash_request_blocks(token_ids, block_size, cache_key)[{i}], "
                f"chained on block {i - 1}'s) is published by no block, and it carries "
                f"{short(carried) if carried is not None else 'no hash'}"
            )


@spec_rule("find-cached-prefix")
def check_prefix(before, after, cached, r, block_size: int, caching: bool) -> None:
    """find_cached_prefix changed nothing and returned the longest cached run of the request's
    chain from block 0, leaving the last token's block out."""
    assert after == before, "find_cached_prefix changed the pool"
    expected = expected_prefix(before, r, block_size, caching)
    assert cached == expected, (
        f"find_cached_prefix returned {cached}, expected {expected} (request of {r.num_tokens} "
        f"tokens, blocks of {block_size}: at most (num_tokens - 1) // block_size = "
        f"{(r.num_tokens - 1) // block_size} blocks, stopping at the first miss)"
    )


@spec_rule("find-cached-prefix")
def check_hit_rates(impl_rate: float, reference_rate: float) -> None:
    """Both pools count the same look-ups and hits (SCHEDULING.md: queries += max_blocks, hits +=
    len(result) per find_cached_prefix)."""
    assert impl_rate == pytest.approx(reference_rate), (
        f"hit_rate: impl {impl_rate:.4f} != reference {reference_rate:.4f} (hits / blocks looked up; "
        f"each find_cached_prefix looks up (num_tokens - 1) // block_size blocks, 0 with caching off "
        f"or prompt_logprobs set, and hits the blocks it returns)"
    )


def agree(what: str, results: list) -> None:
    """The impl's result (results[0]) equals the reference's (results[1:]): raised, naming which
    side returned what."""
    for other in results[1:]:
        if other != results[0]:
            raise AssertionError(f"{what} returned: impl {short(results[0])} != reference {short(other)}")


class Side:
    """One implementation's pool and its requests."""

    def __init__(self, impl, num_blocks, block_size, caching):
        self.impl = impl
        self.bm = impl.new_block_manager(num_blocks, block_size, caching)
        self.live = {}


class PoolMachine(RuleBasedStateMachine):
    """Impl under test (sides[0]) and reference (sides[1]) in lockstep on one pool trace."""

    impls: tuple = ()

    @initialize(shape=pool_shapes(max_blocks=10), caching=st.booleans(), data=st.data())
    def setup(self, shape, caching, data):
        (num_blocks, block_size), self.caching = shape, caching
        self.num_blocks, self.block_size = num_blocks, block_size
        self.sides = [Side(impl, num_blocks, block_size, caching) for impl in self.impls]
        self.stems = data.draw(stems_for(block_size))
        self.num_added = 0

    # ---- helpers ---------------------------------------------------------------------------

    def context(self) -> list[str]:
        """The lines after a divergence's diff: the pool, and where the trace is."""
        return [
            f"pool: {self.num_blocks} blocks of {self.block_size}, prefix caching {self.caching}; "
            "Hypothesis prints the operations below"
        ]

    def each(self, fn, what: str = "the operation"):
        """Run fn(side) on every side; the results must agree (differential)."""
        results = [fn(side) for side in self.sides]
        agree(what, results)
        return results[0]

    def grow(self, side, r, n):
        before = side.bm.state()
        start = r.num_computed_tokens
        ok = side.bm.allocate_slots(r, n)
        check_allocate(before, side.bm.state(), ok, r.request_id, start, n, [], self.block_size)
        if ok:
            side.bm.cache_full_blocks(r, start + n)
            check_published(side.bm, r, start, start + n)
            r.num_computed_tokens = start + n
            if r.num_computed_tokens == r.num_tokens:
                r.append(MODEL.next_token(r.token_ids))
        return ok

    # ---- rules -----------------------------------------------------------------------------

    @rule(data=st.data())
    def add(self, data):
        stem = data.draw(st.sampled_from(self.stems)) if data.draw(st.booleans()) else ()
        tokens = list(stem) + data.draw(
            token_lists(0 if stem else 1, (self.num_blocks + 1) * self.block_size)
        )
        key = data.draw(cache_keys) if data.draw(st.integers(0, 3)) == 0 else ()
        logprobs = 1 if data.draw(st.integers(0, 5)) == 0 else None
        rid = f"q{self.num_added}"
        self.num_added += 1
        fraction = data.draw(st.floats(0.0, 1.0))

        def run(side):
            r = make(side.impl, rid, tokens, cache_key=key, prompt_logprobs=logprobs)
            before = side.bm.state()
            cached = side.bm.find_cached_prefix(r)
            check_prefix(before, side.bm.state(), cached, r, self.block_size, self.caching)
            k = len(cached) * self.block_size
            n = 1 + int(fraction * (r.num_tokens - k - 1))
            ok = side.bm.allocate_slots(r, n, cached)
            check_allocate(before, side.bm.state(), ok, rid, 0, n, cached, self.block_size)
            if ok:
                r.num_computed_tokens = r.num_cached_tokens = k
                side.bm.cache_full_blocks(r, k + n)
                check_published(side.bm, r, k, k + n)
                r.num_computed_tokens = k + n
                if k + n == r.num_tokens:
                    r.append(MODEL.next_token(r.token_ids))
                side.live[rid] = r
            return ok, cached

        self.each(run, f"add({rid}): (allocated, cached blocks)")

    @precondition(lambda self: self.sides[0].live)
    @rule(data=st.data())
    def extend(self, data):
        rid = data.draw(st.sampled_from(sorted(self.sides[0].live)))
        fraction = data.draw(st.floats(0.0, 1.0))

        def run(side):
            r = side.live[rid]
            return self.grow(side, r, 1 + int(fraction * (r.num_tokens - r.num_computed_tokens - 1)))

        self.each(run, f"extend({rid}): allocate_slots")

    @precondition(lambda self: self.sides[0].live)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.sides[0].live)))

        def run(side):
            r = side.live.pop(rid)
            before = side.bm.state()
            side.bm.free(r)
            check_release(before, side.bm.state(), before.tables.get(rid, []), None, rid)

        self.each(run, f"free({rid})")

    @precondition(lambda self: self.sides[0].live)
    @rule(data=st.data())
    def trim(self, data):
        rid = data.draw(st.sampled_from(sorted(self.sides[0].live)))
        fraction = data.draw(st.floats(0.0, 1.0))

        def run(side):
            r = side.live[rid]
            k = int(fraction * r.num_computed_tokens)
            before = side.bm.state()
            side.bm.trim(r, k)
            table = before.tables.get(rid, [])
            keep = cdiv(k, self.block_size)
            check_release(before, side.bm.state(), table[keep:], table[:keep], rid, trim=True)
            r.num_computed_tokens = k
            r.num_cached_tokens = min(r.num_cached_tokens, k)

        self.each(run, f"trim({rid})")

    @rule()
    def reset(self):
        def run(side):
            before = side.bm.state()
            ok = side.bm.reset_prefix_cache()
            assert ok == (not any(before.ref_counts)), (
                f"reset_prefix_cache returned {ok} with refs {before.ref_counts}"
            )
            after = side.bm.state()
            if ok:
                check_no_caching(after)
                assert after.free_queue == before.free_queue
            else:
                assert after == before, "a refused reset_prefix_cache changed the pool"
            return ok

        self.each(run, "reset_prefix_cache()")

    @rule(data=st.data())
    def refuse(self, data):
        """An allocation larger than the free queue is refused and changes nothing (point 2)."""

        def run(side):
            free = side.bm.num_free
            r = make(side.impl, "too-big", [1] * ((free + 1) * self.block_size))
            before = side.bm.state()
            ok = side.bm.allocate_slots(r, r.num_tokens)
            assert not ok and side.bm.state() == before, "oversized allocation not refused cleanly"

        self.each(run, "refuse: allocate_slots past the free blocks")

    # ---- invariants ------------------------------------------------------------------------

    @invariant()
    def pools_valid_and_equal(self):
        if not hasattr(self, "sides"):
            return
        for side in self.sides:
            state = side.bm.state()
            check_pool(state, self.num_blocks)
            free = len(state.free_queue)
            assert side.bm.num_free == free, f"num_free is {side.bm.num_free}, the free queue holds {free}"
            assert side.bm.usage == pytest.approx(1 - free / self.num_blocks), (
                f"usage is {side.bm.usage}, expected 1 - {free}/{self.num_blocks} free"
            )
            for rid, r in side.live.items():
                check_request(r, self.block_size)
                check_table_hashes(state, r, self.block_size)
                table = state.tables.get(rid, [])
                assert side.bm.block_table(rid) == table, (
                    f"block_table({rid!r}) is {side.bm.block_table(rid)}, PoolState.tables has {table}"
                )
                assert len(table) >= cdiv(r.num_computed_tokens, self.block_size), (
                    f"{rid}: table {table} does not cover its {r.num_computed_tokens} computed tokens"
                )
        impl_state, reference_state = (side.bm.state() for side in self.sides)
        if impl_state != reference_state:  # raised, not asserted: the field diff, not all(<generator>)
            raise AssertionError(divergence_report("PoolState", impl_state, reference_state, self.context()))
        check_hit_rates(*(side.bm.hit_rate for side in self.sides))


def test_pool_lockstep(impl, reference_impl):
    """Points 1-4 on random pool traces, and the same decisions as the reference."""
    machine = type("PoolLockstep", (PoolMachine,), {"impls": (impl, reference_impl)})
    run_state_machine_as_test(machine, settings=settings())


# --------------------------------------------------------------------------- directed properties


@given(block_size=block_sizes, num_blocks_prompt=st.integers(1, 4), extra=st.integers(0, 2), data=st.data())
@spec_rule("find-cached-prefix")
def test_one_token_left(impl, block_size, num_blocks_prompt, extra, data):
    """A fully cached prompt still leaves its last token to compute (point 3)."""
    tokens = data.draw(
        token_lists(num_blocks_prompt * block_size + extra, num_blocks_prompt * block_size + extra)
    )
    bm = impl.new_block_manager(2 * num_blocks_prompt + 4, block_size)
    first = make(impl, "first", tokens + [1] * block_size)
    assert admit(bm, first)[0]
    again = make(impl, "again", tokens)
    cached = bm.find_cached_prefix(again)
    assert len(cached) == (len(tokens) - 1) // block_size, (
        f"{len(cached)} cached blocks for {len(tokens)} tokens"
    )
    ok, _ = admit(bm, make(impl, "again2", tokens))
    assert ok
    check_pool(bm.state(), bm.num_blocks)


@given(block_size=block_sizes, data=st.data())
@spec_rule("find-cached-prefix")
def test_stop_at_first_miss(impl, block_size, data):
    """A chain with a hole (block 1 evicted, block 2 still cached) matches only block 0 (point 3).

    The hole is made legally: a prompt_logprobs request cannot adopt, so it computes X, Y, Z in
    blocks of its own and publishes only the new XYZ; then the first writer of X and XY is
    freed (tail first) and exactly two blocks are handed out, evicting XY but not X."""
    x, y, z = (data.draw(token_lists(block_size, block_size)) for _ in range(3))
    bm = impl.new_block_manager(7, block_size)
    a = make(impl, "a", x + y + [1])
    assert admit(bm, a)[0]
    block_x = bm.block_table("a")[0]
    p = make(impl, "p", x + y + z + [1], prompt_logprobs=1)
    assert admit(bm, p)[0]
    bm.free(a)
    holder = make(impl, "holder", [2] * (2 * block_size))
    assert bm.allocate_slots(holder, 2 * block_size)
    b = make(impl, "b", x + y + z + [3])
    assert expected_prefix(bm.state(), b, block_size, True) == [block_x]
    assert bm.find_cached_prefix(b) == [block_x], "matching must stop at the first missing block"


@given(block_size=block_sizes, data=st.data())
@spec_rule("find-cached-prefix")
def test_cached_prefix_rules(impl, block_size, data):
    """No cache for prompt_logprobs, none with caching off, and cache_key isolation (point 3)."""
    tokens = data.draw(token_lists(2 * block_size + 1, 4 * block_size))
    key_a, key_b = data.draw(st.lists(cache_keys, min_size=2, max_size=2, unique=True))
    for caching in (True, False):
        bm = impl.new_block_manager(12, block_size, caching)
        assert admit(bm, make(impl, "a", tokens, cache_key=key_a))[0]
        same = bm.find_cached_prefix(make(impl, "same", tokens, cache_key=key_a))
        assert len(same) == ((len(tokens) - 1) // block_size if caching else 0)
        assert bm.find_cached_prefix(make(impl, "other", tokens, cache_key=key_b)) == [], "cache_key leaked"
        assert bm.find_cached_prefix(make(impl, "lp", tokens, cache_key=key_a, prompt_logprobs=0)) == []
        other = make(impl, "other2", tokens, cache_key=key_b)
        assert admit(bm, other)[0]
        state = bm.state()
        assert not set(state.tables["a"]) & set(state.tables["other2"]), "tenants share a block"
        if not caching:
            check_no_caching(state)


@given(block_size=block_sizes, num_prompt_blocks=st.integers(1, 3), spare=st.integers(0, 3), data=st.data())
@spec_rule("allocate-slots")
def test_revived_cached_blocks_cost_free_slots(impl, block_size, num_prompt_blocks, spare, data):
    """Adopting a cached block that sits in the free queue costs a free slot: an allocation that
    fits only if revived blocks were free of charge is refused, and nothing changes (point 2)."""
    tokens = data.draw(token_lists(num_prompt_blocks * block_size, num_prompt_blocks * block_size))
    num_blocks = num_prompt_blocks + 1 + spare
    bm = impl.new_block_manager(num_blocks, block_size)
    first = make(impl, "first", tokens + [0])
    assert admit(bm, first)[0]
    bm.free(first)
    filler = make(impl, "filler", [2] * (spare * block_size or 1))
    if spare:
        assert bm.allocate_slots(filler, spare * block_size)
    # free now: the first request's num_prompt_blocks cached blocks + its partial block
    second = make(impl, "second", tokens + [1] * (block_size * 2))
    cached = bm.find_cached_prefix(second)
    assert len(cached) == num_prompt_blocks
    before = bm.state()
    need_new = cdiv(second.num_tokens, block_size) - len(cached)
    ok = bm.allocate_slots(second, second.num_tokens - len(cached) * block_size, cached)
    check_allocate(
        before, bm.state(), ok, "second", 0, second.num_tokens - len(cached) * block_size, cached, block_size
    )
    assert need_new + len(cached) > len(before.free_queue) and not ok


@given(block_size=block_sizes, data=st.data())
@spec_rule("free-order")
def test_lru_order(impl, block_size, data):
    """Freed blocks queue tail first; allocation evicts from the front and drops the hash, so the
    evicted block is no longer found, while the rest of its chain prefix still is (point 4)."""
    tokens = data.draw(token_lists(3 * block_size, 3 * block_size))
    bm = impl.new_block_manager(3, block_size)
    a = make(impl, "a", tokens + [1])
    assert admit(bm, a, 3 * block_size)[0]
    table = bm.block_table("a")
    before = bm.state()
    bm.free(a)
    assert bm.state().free_queue == before.free_queue + table[::-1], "free must append the table tail first"
    b = make(impl, "b", [2])
    assert admit(bm, b)[0]
    assert bm.block_table("b") == [table[-1]], "allocation must take the front of the free queue"
    assert len(bm.find_cached_prefix(make(impl, "c", tokens + [1]))) == 2, "evicted tail still matched"
    check_pool(bm.state(), 3)


@spec_rule("free-order")
def test_trimmed_blocks_without_a_hash_are_handed_out_before_cached_ones(impl):
    """trim puts a block reaching ref 0 without a hash at the FRONT (the first trimmed first), so
    the next allocation takes it back and a cached block of an idle request keeps its hash: a
    speculative step trims its rejected drafts' block and the next step allocates again, which
    must not evict one cached block a step."""
    bm = impl.new_block_manager(6, 2)
    a = make(impl, "a", [1, 2, 3, 4, 5])
    assert admit(bm, a)[0]
    bm.free(a)  # blocks 0, 1 cached at the back, 2 (unhashed) behind them
    b = make(impl, "b", [7, 8])
    assert admit(bm, b, 2)[0] and bm.allocate_slots(b, 4)  # its known block + 2 for drafts
    table = bm.block_table("b")
    bm.trim(b, 2)
    assert bm.state().free_queue[:2] == table[1:], "unhashed trimmed blocks go to the front, in order"
    assert bm.allocate_slots(b, 4) and bm.block_table("b") == table, "the next allocation takes them back"
    assert len(bm.find_cached_prefix(make(impl, "c", [1, 2, 3, 4, 5]))) == 2, "a cached block was evicted"
    check_pool(bm.state(), 6)


@spec_rule("pool-accounting")
def test_reset_prefix_cache_refused_while_in_use(impl):
    bm = impl.new_block_manager(4, 2)
    r = make(impl, "r", [1, 2, 3, 4, 5])
    assert admit(bm, r)[0]
    before = bm.state()
    assert bm.reset_prefix_cache() is False and bm.state() == before
    bm.free(r)
    assert bm.reset_prefix_cache() is True
    assert bm.find_cached_prefix(make(impl, "s", [1, 2, 3, 4, 5])) == []
    check_pool(bm.state(), 4)


def test_unpublish_withdraws_only_the_requests_hashes_past_the_point(impl):
    """unpublish(r, num_tokens) withdraws the hashes r published for table indexes >=
    num_tokens // block_size and nothing else: not the blocks before, not a last partial block
    (r has no chain hash for it: the table is longer than r.block_hashes), no ref count, no
    free-queue order; a request that has published nothing is a no-op."""
    bm = impl.new_block_manager(8, 2)
    fresh = make(impl, "fresh", [9, 8, 7])
    assert bm.allocate_slots(fresh, 3)  # a table of 2 blocks, nothing published
    before = bm.state()
    bm.unpublish(fresh, 0)
    assert bm.state() == before
    r = make(impl, "r", [1, 2, 3, 4, 5])
    assert admit(bm, r)[0]
    table = bm.block_table("r")
    assert len(table) == 3 and len(r.block_hashes) == 2, "5 tokens: 2 full blocks published, 1 partial"
    before = bm.state()
    bm.unpublish(r, 2)
    after = bm.state()
    withdrawn = table[1]
    assert after.block_hashes[withdrawn] is None and r.block_hashes[1] not in after.cached
    expected = dict(before.cached)
    del expected[r.block_hashes[1]]
    assert after.cached == expected
    assert [h for b, h in enumerate(after.block_hashes) if b != withdrawn] == [
        h for b, h in enumerate(before.block_hashes) if b != withdrawn
    ]
    assert (after.ref_counts, after.free_queue, after.tables) == (
        before.ref_counts,
        before.free_queue,
        before.tables,
    )
    check_pool(after, 8)


def test_unpublish_from_zero_withdraws_every_own_hash(impl):
    """unpublish(r, 0) withdraws every hash r published, block 0 included (block_size 1, where
    an off-by-one in num_tokens // block_size shows)."""
    bm = impl.new_block_manager(4, 1)
    r = make(impl, "r", [1, 2, 3])
    assert admit(bm, r)[0]
    assert len(bm.state().cached) == 3, "the 3 one-token blocks are computed, full and published"
    bm.unpublish(r, 0)
    state = bm.state()
    assert state.cached == {} and all(h is None for h in state.block_hashes)
    check_pool(state, 4)
