"""Example-based tests of the reference impl: small hand-built scenarios, expected values worked
out by hand from SCHEDULING.md (the comments show the working)."""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
import time
from pathlib import Path

import pytest

import enginespec.spec as spec
from enginespec.entrypoints import simulate
from enginespec.impls.reference import IMPL, BlockManager, ReferenceImpl, Request, Scheduler
from enginespec.spec import SamplingParams, SchedulerConfig, Status, hash_block


def make_request(rid, prompt, arrival=0.0, **params):
    params.setdefault("ignore_eos", True)
    return Request(rid, prompt, SamplingParams(**params), eos_token_id=0, arrival_time=arrival)


def all_free(bm):
    state = bm.state()
    return (
        sorted(state.free_queue) == list(range(bm.num_blocks))
        and not any(state.ref_counts)
        and not state.tables
    )


# ---- Request ---------------------------------------------------------------------------------


def test_request_fields_and_validation():
    before = time.monotonic()
    r = Request("a", [5, 6, 7], SamplingParams(max_tokens=4))
    assert before <= r.arrival_time <= time.monotonic()
    assert (r.num_prompt_tokens, r.num_tokens, r.num_output_tokens) == (3, 3, 0)
    r.append(9)
    r.spec_token_ids = [1, 2]
    assert r.token_ids == [5, 6, 7, 9] and r.output_token_ids == [9]
    assert (r.num_tokens, r.num_output_tokens, r.num_tokens_with_spec) == (4, 1, 6)
    assert r.status is Status.WAITING and r.block_hashes == [] and r.stop_reason is None
    with pytest.raises(ValueError, match="prompt_token_ids"):
        Request("a", [])
    with pytest.raises(ValueError, match="prompt_token_ids"):
        Request("a", [1, -2])
    with pytest.raises(ValueError, match="prompt_token_ids"):
        Request("a", [1, 2.5])
    with pytest.raises(ValueError, match="request_id"):
        Request("", [1])
    with pytest.raises(ValueError, match="token_ids"):
        r.append(-1)
    assert r.token_ids == [5, 6, 7, 9]


def test_block_manager_constructor_validation():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, 4)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, 0)


# ---- Block manager ---------------------------------------------------------------------------


def test_free_is_tail_first_and_eviction_pops_the_front():
    bm = BlockManager(6, 2)
    a, b, c = (
        make_request("a", [1, 2, 3, 4, 5]),
        make_request("b", [7, 8, 9]),
        make_request("c", [1, 1, 1, 1]),
    )
    assert bm.allocate_slots(a, 5) and bm.block_table("a") == [0, 1, 2]
    assert bm.allocate_slots(b, 3) and bm.block_table("b") == [3, 4]
    bm.free(a)  # tail first: 2, 1, 0 after the untouched 5
    assert bm.state().free_queue == [5, 2, 1, 0]
    bm.free(b)
    assert bm.state().free_queue == [5, 2, 1, 0, 4, 3]
    assert bm.allocate_slots(c, 4) and bm.block_table("c") == [5, 2]
    assert bm.state().free_queue == [1, 0, 4, 3]


def test_one_token_left_and_hit_rate():
    bm = BlockManager(8, 4)
    a = make_request("a", list(range(1, 9)))  # exactly two full blocks
    assert bm.find_cached_prefix(a) == []  # max_blocks = 7 // 4 = 1, a miss
    assert bm.allocate_slots(a, 8)
    bm.cache_full_blocks(a, 8)
    b = make_request("b", list(range(1, 9)))
    assert bm.find_cached_prefix(b) == [0]  # block 1 holds the last token: never covered
    c = make_request("c", list(range(1, 10)))
    assert bm.find_cached_prefix(c) == [0, 1]  # max_blocks = 8 // 4 = 2
    assert bm.hit_rate == pytest.approx(3 / 4)  # queries 1 + 1 + 2, hits 0 + 1 + 2
    assert c.block_hashes[0] == hash_block(None, [1, 2, 3, 4])
    assert c.block_hashes[1] == hash_block(c.block_hashes[0], [5, 6, 7, 8])


def test_stop_at_first_miss_even_when_a_later_block_is_cached():
    bm = BlockManager(6, 2)
    z = make_request("z", [1, 2, 3, 4])
    assert bm.allocate_slots(z, 4) and bm.block_table("z") == [0, 1]
    bm.cache_full_blocks(z, 4)  # H0 -> 0, H1 -> 1
    c = make_request("c", [1, 2, 3, 4, 5, 6])
    assert bm.allocate_slots(c, 6) and bm.block_table("c") == [2, 3, 4]
    bm.cache_full_blocks(c, 6)  # H0, H1 taken (first writer wins); H2 -> 4
    h0, h1, h2 = c.block_hashes
    assert bm.state().cached == {h0: 0, h1: 1, h2: 4}
    assert bm.state().block_hashes[2:4] == [None, None]
    bm.free(z)  # free queue [5, 1, 0]
    y = make_request("y", [9, 9, 9])
    assert bm.allocate_slots(y, 3) and bm.block_table("y") == [5, 1]
    state = bm.state()  # popping block 1 evicted H1
    assert state.cached == {h0: 0, h2: 4} and state.block_hashes[1] is None
    b = make_request("b", [1, 2, 3, 4, 5, 6, 7])
    assert bm.find_cached_prefix(b) == [0]  # H1 misses, so H2 is never looked at


def test_refused_allocation_changes_nothing_and_free_cached_blocks_cost_a_slot():
    bm = BlockManager(3, 2)
    a = make_request("a", [1, 2, 3, 4, 5])
    assert bm.allocate_slots(a, 5)
    bm.cache_full_blocks(a, 4)
    bm.free(a)  # free queue [2, 1, 0]; blocks 0, 1 cached
    x = make_request("x", [7, 8])
    assert bm.allocate_slots(x, 2) and bm.block_table("x") == [2]
    b = make_request("b", [1, 2, 3, 4, 5, 6])
    cached = bm.find_cached_prefix(b)
    assert cached == [0, 1]
    before = bm.state()
    # required = cdiv(0 + 4 + 2, 2) = 3, new = 1, plus 2 free cached blocks = 3 > 2 free
    assert not bm.allocate_slots(b, 2, cached)
    assert bm.state() == before
    bm.free(x)  # free queue [1, 0, 2]
    assert bm.allocate_slots(b, 2, cached)
    state = bm.state()
    assert state.tables == {"b": [0, 1, 2]} and state.free_queue == [] and state.ref_counts == [1, 1, 1]
    with pytest.raises(ValueError, match="table is empty"):
        bm.allocate_slots(b, 1, [0])


def test_cache_key_isolation_prompt_logprobs_and_reset():
    bm = BlockManager(8, 2)
    a = Request("a", [1, 2, 3, 4, 5], cache_key=("tenant-1",))
    assert bm.allocate_slots(a, 5)
    bm.cache_full_blocks(a, 5)
    assert bm.find_cached_prefix(Request("b", [1, 2, 3, 4, 5], cache_key=("tenant-2",))) == []
    assert bm.find_cached_prefix(Request("c", [1, 2, 3, 4, 5], cache_key=("tenant-1",))) == [0, 1]
    queries = bm.num_queries
    lp = Request("d", [1, 2, 3, 4, 5], SamplingParams(prompt_logprobs=1), cache_key=("tenant-1",))
    assert bm.find_cached_prefix(lp) == [] and bm.num_queries == queries
    assert bm.reset_prefix_cache() is False  # a still holds blocks
    bm.free(a)
    assert bm.reset_prefix_cache() is True
    assert (
        bm.state().cached == {}
        and bm.find_cached_prefix(Request("e", [1, 2, 3, 4, 5], cache_key=("tenant-1",))) == []
    )


def test_trim_frees_the_tail_and_rewinds_the_cursor():
    bm = BlockManager(4, 2)
    a = make_request("a", [1, 2, 3, 4, 5, 6, 7])
    assert bm.allocate_slots(a, 7) and bm.block_table("a") == [0, 1, 2, 3]
    bm.cache_full_blocks(a, 6)  # cursor 3
    bm.trim(a, 3)  # keep cdiv(3, 2) = 2 blocks
    assert bm.block_table("a") == [0, 1] and bm.state().free_queue == [3, 2]
    assert bm.cursors["a"] == 2 and bm.usage == 0.5


# ---- Scheduler -------------------------------------------------------------------------------


def two_request_scheduler(mode="recompute", num_blocks=4):
    """bs 2; r0 = [1, 2, 3] (max_tokens 3), r1 = [4, 5, 6] (arrival 1, max_tokens 4); after the two
    steps run here each holds 2 blocks and 5 tokens, 4 of them computed."""
    bm = BlockManager(num_blocks, 2)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=4, preemption_mode=mode), bm)
    r0, r1 = (
        make_request("r0", [1, 2, 3], 0.0, max_tokens=3),
        make_request("r1", [4, 5, 6], 1.0, max_tokens=4),
    )
    sched.add(r0)
    sched.add(r1)
    out = sched.schedule()
    assert [(r.request_id, n) for r, n in out.scheduled] == [("r0", 3), ("r1", 3)]
    sched.update_from_output(out, {"r0": [7], "r1": [8]})
    out = sched.schedule()
    assert [(r.request_id, n) for r, n in out.scheduled] == [("r0", 1), ("r1", 1)]
    sched.update_from_output(out, {"r0": [9], "r1": [10]})
    assert (r0.num_computed_tokens, r1.num_tokens) == (4, 5)
    return sched, bm, r0, r1


def test_recompute_preemption_resets_progress_and_admits_nobody():
    sched, bm, r0, r1 = two_request_scheduler()
    late = make_request("late", [3], 2.0, max_tokens=1)
    sched.add(late)
    out = sched.schedule()  # r0 needs a 3rd block, none free: victim r1
    assert [(r.request_id, n) for r, n in out.scheduled] == [("r0", 1)]
    assert out.preempted == [r1] and out.swap_out == []
    assert (r1.status, r1.num_computed_tokens, r1.num_preemptions) == (Status.PREEMPTED, 0, 1)
    assert sched.running == [r0] and sched.waiting == [r1, late]
    assert bm.block_table("r0") == [0, 1, 3] and bm.state().free_queue == [2]
    update = sched.update_from_output(out, {"r0": [11]})
    assert update.finished == [r0] and r0.status is Status.FINISHED_LENGTH
    out = sched.schedule()  # r1: block [4, 5] still cached, [6, 8] evicted
    assert out.finished == ["r0"]
    assert [(r.request_id, n) for r, n in out.scheduled] == [("r1", 3), ("late", 1)]
    assert (r1.num_computed_tokens, r1.num_cached_tokens) == (2, 2) and bm.block_table("r1")[0] == 2


def test_swap_preemption_keeps_progress_and_lists_blocks():
    sched, bm, r0, r1 = two_request_scheduler("swap")
    out = sched.schedule()
    assert out.preempted == [r1] and out.swap_out == [("r1", [2, 3])]
    assert (r1.status, r1.swapped_out, r1.num_computed_tokens) == (Status.SWAPPED, True, 4)
    assert sched.waiting == [r1] and bm.block_table("r1") == []
    sched.update_from_output(out, {"r0": [11]})  # r0 finishes: free queue [2, 3, 1, 0]
    out = sched.schedule()
    assert [(r.request_id, n) for r, n in out.scheduled] == [("r1", 1)]
    assert out.swap_in == [("r1", [2, 3])] and bm.block_table("r1") == [2, 3, 1]
    assert (r1.status, r1.swapped_out, r1.num_computed_tokens) == (Status.RUNNING, False, 4)


def test_request_preempting_itself_is_not_scheduled():
    sched, bm, r0, r1 = two_request_scheduler(num_blocks=5)
    out = sched.schedule()  # r0 takes block 4; r1 finds none and is the victim
    assert [(r.request_id, n) for r, n in out.scheduled] == [("r0", 1)]
    assert out.preempted == [r1] and bm.state().free_queue == [3, 2]


def test_priority_policy_orders_queues_and_victims():
    bm = BlockManager(16, 2)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=8, policy="priority"), bm)
    low = Request("low", [1, 2], priority=5, arrival_time=0.0)
    high = Request("high", [3, 4], priority=0, arrival_time=1.0)
    mid = Request("mid", [5, 6], priority=1, arrival_time=2.0)
    mid2 = Request("mid2", [7, 8], priority=1, arrival_time=2.0)  # tie: add order decides
    for r in (low, high, mid, mid2):
        sched.add(r)
    assert sched.waiting == [high, mid, mid2, low]
    out = sched.schedule()
    assert [r for r, _ in out.scheduled] == [high, mid, mid2, low] and sched.running[-1] is low


def test_fcfs_admission_stops_at_head_of_line():
    bm = BlockManager(16, 2)
    sched = Scheduler(
        SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=4, enable_chunked_prefill=False), bm
    )
    big, small = (
        make_request("big", [1] * 6, 0.0, max_tokens=2),
        make_request("small", [2] * 4, 1.0, max_tokens=2),
    )
    first = make_request("first", [3] * 3, -1.0, max_tokens=2)
    for r in (big, small, first):
        sched.add(r)
    out = sched.schedule()  # first (3) fits; big (6) > 5 left: stop, small waits
    assert [(r.request_id, n) for r, n in out.scheduled] == [("first", 3)]


def test_long_prefill_threshold_and_mid_prompt_chunk_samples_nothing():
    bm = BlockManager(16, 2)
    sched = Scheduler(
        SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=4, long_prefill_token_threshold=4), bm
    )
    r = make_request("r", list(range(1, 11)), max_tokens=2)
    sched.add(r)
    out = sched.schedule()
    assert out.scheduled == [(r, 4)]
    update = sched.update_from_output(out, {"r": [99]})
    assert r.num_computed_tokens == 4 and r.num_tokens == 10 and update.new_token_ids == {}
    assert [n for _, n in sched.schedule().scheduled] == [4]


def run_one(tokens, config=None, prompt=(1, 2, 3, 4), **params):
    """Schedule one request and feed `tokens` as its samples of the first step."""
    sched = Scheduler(config or SchedulerConfig(), BlockManager(32, 4))
    r = Request("r", list(prompt), SamplingParams(**params), eos_token_id=2)
    sched.add(r)
    update = sched.update_from_output(sched.schedule(), {"r": list(tokens)})
    return sched, r, update


@pytest.mark.parametrize(
    "tokens, params, appended, status, reason",
    [
        ([7, 5, 7], dict(stop_token_ids=(5,)), [7, 5], Status.FINISHED_STOPPED, 5),
        ([5, 5, 5, 5], dict(stop_token_ids=(5,), min_tokens=2), [5, 5, 5], Status.FINISHED_STOPPED, 5),
        ([3, 2, 4], dict(), [3, 2], Status.FINISHED_STOPPED, None),
        ([2, 2, 4], dict(min_tokens=1), [2, 2], Status.FINISHED_STOPPED, None),
        ([3, 2, 4], dict(ignore_eos=True, max_tokens=3), [3, 2, 4], Status.FINISHED_LENGTH, None),
        ([7, 7, 7, 7], dict(max_tokens=3), [7, 7, 7], Status.FINISHED_LENGTH, None),
        ([7, 5], dict(max_tokens=2, stop_token_ids=(5,)), [7, 5], Status.FINISHED_STOPPED, 5),
        ([7, 8], dict(max_tokens=5), [7, 8], Status.RUNNING, None),
    ],
)
def test_stop_rules(tokens, params, appended, status, reason):
    sched, r, update = run_one(tokens, **params)
    assert update.new_token_ids == {"r": appended} and r.output_token_ids == appended
    assert (r.status, r.stop_reason) == (status, reason)
    assert update.finished == ([r] if status.is_finished else [])
    assert sched.has_unfinished == (not status.is_finished)
    assert all_free(sched.block_manager) == status.is_finished


def test_stop_at_max_model_len():
    # add() refuses prompt + max_tokens > max_model_len, so the rule is reached by tightening the
    # config after add (the rule reads the current config).
    sched, r, update = run_one([7], max_tokens=10)
    sched.config = dataclasses.replace(sched.config, max_model_len=7)
    out = sched.schedule()
    sched.update_from_output(out, {"r": [8]})
    assert r.status is Status.RUNNING and r.num_tokens == 6
    sched.update_from_output(sched.schedule(), {"r": [9, 10]})
    assert r.status is Status.FINISHED_LENGTH and r.output_token_ids == [7, 8, 9]


def test_abort_from_every_state_frees_everything():
    sched, bm, r0, r1 = two_request_scheduler("swap", num_blocks=5)
    r2 = make_request("r2", [9, 9], 5.0, max_tokens=2)
    sched.add(r2)
    out = sched.schedule()  # r0 running, r1 swapped, r2 waiting
    assert (r0.status, r1.status, r2.status) == (Status.RUNNING, Status.SWAPPED, Status.WAITING)
    assert [sched.abort(rid) for rid in ("r1", "r2", "r0", "r0", "nope")] == [True, True, True, False, False]
    assert all_free(bm) and not sched.has_unfinished and sched.waiting == [] and sched.running == []
    update = sched.update_from_output(out, {"r0": [1]})  # aborted after schedule: skipped
    assert update.new_token_ids == {} and r0.output_token_ids == [7, 9]
    assert sched.schedule().finished == ["r1", "r2", "r0"]
    sched2, bm2, p0, p1 = two_request_scheduler("recompute")
    sched2.schedule()
    assert p1.status is Status.PREEMPTED and sched2.abort("r1") and sched2.abort("r0") and all_free(bm2)
    sched2.add(make_request("r0", [1], max_tokens=1))  # a finished id may be reused


def test_add_errors_change_nothing():
    bm = BlockManager(4, 2)
    sched = Scheduler(
        SchedulerConfig(
            max_num_batched_tokens=4, max_num_seqs=4, enable_chunked_prefill=False, max_model_len=8
        ),
        bm,
    )
    sched.add(make_request("a", [1, 2], max_tokens=2))
    bad = [
        (make_request("a", [1], max_tokens=1), "already"),
        (make_request("b", [1] * 5, max_tokens=4), "max_model_len"),
        (make_request("c", [1] * 3, max_tokens=3), "max_num_batched_tokens"),
        (make_request("d", [1] * 5, max_tokens=1), "max_num_batched_tokens"),
    ]
    for request, match in bad:
        with pytest.raises(ValueError, match=match):
            sched.add(request)
    assert [r.request_id for r in sched.waiting] == ["a"] and list(sched.requests) == ["a"]
    small = Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4), BlockManager(2, 2))
    with pytest.raises(ValueError, match="num_blocks"):
        small.add(make_request("e", [1] * 4, max_tokens=1))
    assert small.waiting == [] and not small.has_unfinished


# ---- Implementation and simulation -----------------------------------------------------------


def test_reference_impl_builds_its_parts():
    impl = spec.load_impl("reference")
    assert isinstance(impl, ReferenceImpl) and impl.name == "reference" and "swap" in impl.capabilities
    bm = impl.new_block_manager(4, 2, enable_prefix_caching=False)
    sched = impl.new_scheduler(SchedulerConfig(), bm)
    r = impl.new_request("x", [1, 2], priority=3, cache_key=("k",))
    assert isinstance(r, IMPL.request_cls) and (r.priority, r.cache_key) == (3, ("k",))
    assert sched.block_manager is bm and bm.enable_prefix_caching is False
    assert (
        isinstance(sched, spec.Scheduler)
        and isinstance(bm, spec.BlockManager)
        and isinstance(r, spec.Request)
    )


BACKEND_MODULE = """
from enginespec.impls.reference import ReferenceImpl


class Impl(ReferenceImpl):
    name = "{name}"


IMPL = Impl()
"""


def test_load_impl_accepts_every_documented_form(tmp_path, monkeypatch):
    """docs/writing-a-backend.md: `--impl` takes a registered name, `pkg.module` (its IMPL) or
    `pkg.module:attr`, and its skeleton is a top-level `my_backend` package: a name with no dot
    that is not registered is tried as a module too. A name that is neither lists the registered
    names and the accepted forms; a module that fails inside keeps its own import error."""
    (tmp_path / "es_top_module.py").write_text(BACKEND_MODULE.format(name="top-module"))
    (tmp_path / "es_top_pkg").mkdir()
    (tmp_path / "es_top_pkg" / "__init__.py").write_text(BACKEND_MODULE.format(name="top-pkg"))
    (tmp_path / "es_top_pkg" / "backend.py").write_text(BACKEND_MODULE.format(name="sub-module"))
    (tmp_path / "es_broken_backend.py").write_text("import es_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert spec.load_impl("es_top_module").name == "top-module"
    assert spec.load_impl("es_top_pkg").name == "top-pkg"
    assert spec.load_impl("es_top_pkg.backend").name == "sub-module"
    assert spec.load_impl("es_top_pkg:Impl").name == "top-pkg"  # a class is instantiated
    assert spec.load_impl("reference").name == "reference"
    with pytest.raises(
        ValueError, match=r"unknown impl 'es_no_such_backend'.*'fast'.*'reference'.*pkg\.module:attr"
    ):
        spec.load_impl("es_no_such_backend")
    with pytest.raises(ValueError, match=r"unknown impl 'es_top_pkg.nope'.*registered"):
        spec.load_impl("es_top_pkg.nope")
    with pytest.raises(ValueError, match="cannot import module 'es_broken_backend'.*es_no_such_dependency"):
        spec.load_impl("es_broken_backend")
    with pytest.raises(ValueError, match="has no attribute 'IMPL'.*accepted forms"):
        spec.load_impl("dataclasses")


def test_a_registered_backend_that_fails_to_import_keeps_its_own_error(tmp_path, monkeypatch):
    """An `enginespec.impls` entry point whose module fails inside (a missing dependency of the
    backend) is the same ValueError as the module form's, naming the entry point and the import
    error: the suite turns it into one usage error, not the traceback at every test's setup."""
    from importlib import metadata

    from enginespec.spec import impl as impl_module

    (tmp_path / "es_broken_registered.py").write_text("import es_no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    broken = metadata.EntryPoint("es-broken", "es_broken_registered:IMPL", spec.ENTRY_POINT_GROUP)
    monkeypatch.setattr(impl_module.metadata, "entry_points", lambda group: [broken])
    with pytest.raises(
        ValueError,
        match=r"impl 'es-broken': entry point es-broken = es_broken_registered:IMPL cannot be loaded: "
        r".*es_no_such_dependency",
    ):
        spec.load_impl("es-broken")


class ImplWithArgs(ReferenceImpl):
    """An Implementation class whose constructor needs an argument."""

    name = "with-args"

    def __init__(self, num_gpus):
        self.num_gpus = num_gpus


def test_load_impl_names_a_class_that_is_no_implementation_or_needs_arguments():
    """`pkg.module:Class` instantiates the class with no arguments. A part's class named by
    mistake (the block manager: its constructor needs num_blocks, block_size) and an impl class
    that needs arguments are ValueErrors saying so (the --impl usage error), not a TypeError
    from inside the call."""
    with pytest.raises(
        ValueError, match=r"class BlockManager is not an Implementation \(missing \['new_request'"
    ):
        spec.load_impl("enginespec.impls.reference:BlockManager")
    with pytest.raises(ValueError, match=r"class ImplWithArgs cannot be made with no arguments.*num_gpus"):
        spec.load_impl(f"{__name__}:ImplWithArgs")
    assert spec.load_impl("enginespec.impls.reference:ReferenceImpl").name == "reference"


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_simulation_runs_to_an_empty_pool(mode, capsys):
    argv = ["--num-requests", "10", "--num-blocks", "32", "--seed", "1", "--preemption-mode", mode]
    assert simulate.main(argv) == 0
    first = capsys.readouterr().out
    assert "preempted 1" in first or "preempted 2" in first  # the small pool forces preemption
    assert first.rstrip().endswith("free 32/32 at the end")
    assert simulate.main(argv) == 0 and capsys.readouterr().out == first


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "writing-a-backend.md"


def guide_imports(text: str) -> list[tuple[str, str]]:
    """(module, name) for every "`enginespec.<module>` (`Name`, `Name`, ...)" of the backend
    author's guide: the names it tells an outsider to import from that module."""
    pairs = []
    for module, names in re.findall(r"`(enginespec\.[\w.]+)` \(([^)]*)\)", " ".join(text.split())):
        pairs += [(module, name) for name in re.findall(r"`(\w+)`", names)]
    return pairs


def test_backend_guide_names_what_its_modules_export():
    """docs/writing-a-backend.md lists what an outside backend may compose from the reference;
    each name it gives after a module must import from that module as written (it named
    ReferenceAttention under enginespec.impls.reference, which does not export it)."""
    pairs = guide_imports(GUIDE.read_text())
    assert ("enginespec.impls.reference", "Scheduler") in pairs, pairs
    missing = [f"{m}.{n}" for m, n in pairs if not hasattr(importlib.import_module(m), n)]
    assert not missing, f"docs/writing-a-backend.md names imports that fail: {missing}"


def test_an_unknown_impl_in_the_current_directory_says_how_to_import_it(tmp_path, monkeypatch):
    """Plain `pytest` leaves the current directory off sys.path, so --impl=mybackend:IMPL with
    mybackend.py right there is 'unknown' under pytest and fine under `python -m pytest`: the
    error says so (an outsider's report)."""
    from enginespec.spec import load_impl

    (tmp_path / "es_here_backend.py").write_text("IMPL = None\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    with pytest.raises(ValueError, match=r"'es_here_backend' is in the current directory.*python -m pytest"):
        load_impl("es_here_backend:IMPL")
    with pytest.raises(ValueError) as elsewhere:
        load_impl("es_not_here_backend:IMPL")
    assert "current directory" not in str(elsewhere.value)


def _prefill_step(num_rows: int, seq_len: int, heads=(4, 2, 16), block_size=16, seed=0):
    """(q, cache, meta) of one request's prefill chunk: its last num_rows of seq_len positions,
    the whole context already in a pool read through a shuffled block table."""
    import torch

    hq, hkv, d = heads
    gen = torch.Generator().manual_seed(seed)
    num_blocks = -(-seq_len // block_size)
    table = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    cache = torch.randn(2, num_blocks + 1, block_size, hkv, d, generator=gen)
    pos = torch.arange(seq_len - num_rows, seq_len)
    qsl, seq = torch.tensor([0, num_rows], dtype=torch.int32), torch.tensor([seq_len], dtype=torch.int32)
    meta = spec.BatchMeta(
        query_start_loc=qsl,
        seq_lens=seq,
        block_table=table[None],
        slot_mapping=table[pos // block_size].to(torch.int64) * block_size + pos % block_size,
        block_size=block_size,
        query_start_loc_cpu=qsl.clone(),
        seq_lens_cpu=seq.clone(),
        max_query_len=num_rows,
        max_seq_len=seq_len,
    )
    return torch.randn(num_rows, hq, d, generator=gen), cache, meta


def test_attention_scores_stay_within_the_budget(monkeypatch):
    """ReferenceAttention.forward (impl=reference's attention on any device) holds at most
    SCORE_BUDGET score elements at once: a prefill chunk of 8192 rows over a 100k context once
    built [Hq, 8192, 100k] float32 scores (13 GB, three copies) and the OOM killer took the
    host. Every op's output stays within the budget or one context's K/V per query head."""
    from enginespec.impls.reference import attention
    from tests.kernels.test_paged_attention import LargestOutput

    q, cache, meta = _prefill_step(256, 1024)
    budget = 16 * 4 * 1024  # 16 rows of 4 heads over 1024 keys
    monkeypatch.setattr(attention, "SCORE_BUDGET", budget, raising=False)
    with LargestOutput() as seen:
        IMPL.attention_backend("cpu").forward(q, cache, meta)
    assert seen.largest <= max(budget, 1024 * 4 * 16), f"{seen.largest} elements in one tensor"


@pytest.mark.parametrize("window", [0, 7, 200])
def test_attention_pieces_match_one_dense_piece(monkeypatch, window):
    """Rows attended a few at a time (each over the keys up to its piece's last position) equal
    one dense masked softmax over the whole chunk."""
    import torch

    from enginespec.impls.reference import attention

    q, cache, meta = _prefill_step(90, 300, heads=(6, 2, 16), block_size=5, seed=3)
    backend = IMPL.attention_backend("cpu")
    dense = backend.forward(q, cache, meta, window=window)
    for budget in (1, 6 * 300 * 4 + 5):
        monkeypatch.setattr(attention, "SCORE_BUDGET", budget, raising=False)
        torch.testing.assert_close(backend.forward(q, cache, meta, window=window), dense)
