"""The spec points a conformance report is made of, and which tests prove each one.

The eight points are DESIGN.md's "Conformance" section (docs/DESIGN.md); every impl must meet
them. The capability and optional-method entries say whether the parts of the suite that a
capability switches on passed; they are judged only for an impl that declares the capability
(or has the optional method): for any other the report says "not-declared", never "pass". So
their tests are only those that exercise the impl's capability and skip without it, never tests
of the engine's own machinery (the runner's swap copies run for every impl). A test proves a
point when its canonical id (plugin.canonical_id) starts with one of the point's prefixes, or
contains one of its fragments. A test may count for several points, and every test that calls
the backend counts for at least one of the eight (conformance/test_plugin.py checks it), so a
report cannot say "pass" on every point while one of them failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class Point:
    key: str
    title: str
    prefixes: tuple[str, ...] = ()
    fragments: tuple[str, ...] = ()  # substrings of the canonical id (parametrized variants)
    #: impl -> whether it declares what the point is about; None: every impl must meet the point.
    declared_by: Optional[Callable[[object], bool]] = None

    def covers(self, canonical_id: str) -> bool:
        return canonical_id.startswith(self.prefixes) or any(f in canonical_id for f in self.fragments)


_BM = "conformance/test_block_manager.py::"
_SCHED = "conformance/test_scheduler.py::"
_ERR = "conformance/test_errors.py::"
_HOSTILE = "conformance/test_hostile_input.py::"

#: The engine-level modules: outputs and behaviour of the engine composed over the impl.
ENGINE_MODULES = (
    "test_parity",
    "test_engine",
    "test_async_scheduling",
    "test_vllm_params",
    "test_faults",
    "test_concurrency",
    "test_hostile_input",
    "test_spec_decode",
    "test_spec_draft_model",
    "test_spec_combos",
    "test_spec_distribution",
    "test_sampling_distribution",
    "test_pressure",
    "test_structured_outputs",
    "test_soak",
)

POINTS = (
    Point(
        "1-no-leaked-blocks",
        "No leaked blocks: ref counts equal table occurrences, free queue exactly the unreferenced blocks, "
        "hash map consistent; idle engine => every block free",
        (
            f"{_BM}test_pool_lockstep",
            f"{_SCHED}test_every_step_invariants",
            f"{_SCHED}test_abort_from_any_state",
            "conformance/test_soak.py::",
        ),
    ),
    Point(
        "2-all-or-nothing-allocation",
        "All-or-nothing allocation: a refused allocation leaves state() identical",
        (
            f"{_BM}test_revived_cached_blocks",
            f"{_BM}test_pool_lockstep",
            f"{_ERR}test_block_manager_arguments",
            f"{_ERR}test_cached_blocks_only_into_an_empty_table",
            "conformance/test_numeric_args.py::",
        ),
    ),
    Point(
        "3-prefix-cache-rules",
        "One-token-left rule, stop at first miss, no cache for prompt_logprobs, cache_key isolation",
        (
            f"{_BM}test_one_token_left",
            f"{_BM}test_stop_at_first_miss",
            f"{_BM}test_cached_prefix_rules",
            f"{_BM}test_reset_prefix_cache",
            f"{_BM}test_unpublish_",
            f"{_HOSTILE}test_block_hashes_equal_the_spec",
            f"{_HOSTILE}test_keys_equal_in_python_but_not_in_the_spec",
            f"{_HOSTILE}test_cache_salt_separates_tenants",
        ),
    ),
    Point(
        "4-lru-order",
        "LRU order: tail-first freeing, eviction from the front, eviction removes the hash; trimmed "
        "blocks without a hash handed out before cached ones",
        (
            f"{_BM}test_lru_order",
            f"{_BM}test_trimmed_blocks_without_a_hash_are_handed_out_before_cached_ones",
        ),
    ),
    Point(
        "5-scheduler-invariants-and-liveness",
        "Scheduler invariants every step (budget, max_num_seqs, chunk threshold, running first, victim "
        "choice, no admission after preemption, priority order) and liveness",
        (
            _SCHED,
            "conformance/test_schedule_edges.py::",
            f"{_ERR}test_duplicate_id_refused",
            f"{_ERR}test_request_that_can_never_fit",
            f"{_ERR}test_empty_prompt",
            f"{_ERR}test_bad_prompt_token",
            f"{_ERR}test_refusal_states_the_count_and_the_bound",
            f"{_ERR}test_a_prompt_of_max_model_len_takes_one_token_in_a_pool_of_max_model_len",
            f"{_ERR}test_around_a_prompt_of_max_model_len_add_refuses",
            "conformance/test_strategies.py::test_limits_match_add",
        ),
    ),
    Point(
        "6-differential-lockstep",
        "The impl and the reference make identical decisions on the same trace",
        ("conformance/test_stateful.py::", f"{_BM}test_pool_lockstep"),
    ),
    Point(
        "7-attention-and-batch-layout",
        "Attention backends agree with the reference on ragged batches, shuffled tables, GQA, windows, "
        "padding rows; batches follow the canonical layout",
        (
            "conformance/test_attention.py::",
            "conformance/test_batch.py::",
            "conformance/test_batch_parity.py::",
        ),
    ),
    Point(
        "8-greedy-parity-and-engine",
        "Greedy parity with transformers' generate on forced paths; the engine's behaviour through the impl",
        tuple(f"conformance/{module}.py::" for module in ENGINE_MODULES),
    ),
)


def has_capability(name: str) -> Callable[[object], bool]:
    """An impl declares capability `name` by listing it in its `capabilities`."""

    def declares(impl) -> bool:
        return name in getattr(impl, "capabilities", ())

    return declares


def has_build_batch(impl) -> bool:
    return callable(getattr(impl, "build_batch", None))


def requests_replace_last_token(impl) -> bool:
    """The impl's requests satisfy the optional SupportsAsyncScheduling Protocol, the engine's
    own test for overlapping steps (engine/async_scheduling.py `deferrable`)."""
    from enginespec.spec import SamplingParams, SupportsAsyncScheduling

    request = impl.new_request("probe", [1], SamplingParams(), arrival_time=0.0)
    return isinstance(request, SupportsAsyncScheduling)


#: What each capability / optional method switches on, by the tests that exercise it in the impl
#: (each skips where the impl does not declare it).
CAPABILITIES = (
    Point(
        "capability:swap",
        "preemption_mode='swap' (runner copies blocks out and in)",
        (
            "conformance/test_schedule_edges.py::test_swap_in_",
            f"{_SCHED}test_swapped_request_",
            "conformance/test_engine.py::test_a_swapped_out_request_",
        ),
        ("[swap]", "[swap-", "-swap]", "::test_forced_swap_on_cuda"),
        has_capability("swap"),
    ),
    Point(
        "capability:cuda_graphs",
        "decode steps captured as CUDA graphs (needs a GPU)",
        (),
        ("on_cuda", "test_cuda_pool"),
        has_capability("cuda_graphs"),
    ),
    Point(
        "optional:build_batch",
        "the impl's own batch builder, checked against the plain one",
        ("conformance/test_batch_parity.py::",),
        declared_by=has_build_batch,
    ),
    Point(
        "optional:replace_last_token",
        "async scheduling (placeholder tokens)",
        ("conformance/test_async_scheduling.py::",),
        declared_by=requests_replace_last_token,
    ),
)
