"""Lockstep failures a backend author can act on: a field-by-field diff with short hashes, the
operation that diverged, and the command that shrinks the trace."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import deque
from types import SimpleNamespace

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from enginespec.conformance.diff import differences, divergence_report, short
from enginespec.conformance.invariants import Harness, check_idle, check_request
from enginespec.conformance.plugin import needs_installed_plugin
from enginespec.conformance.strategies import RequestSpec
from enginespec.conformance.test_block_manager import PoolMachine
from enginespec.spec import PoolState, SamplingParams, SchedulerConfig, Status, load_impl

H1, H2 = bytes(range(16)), bytes(range(1, 17))


def test_differences_name_each_field_and_shorten_hashes():
    a = PoolState(
        free_queue=[1, 2],
        ref_counts=[1, 0, 0],
        block_hashes=[H1, None, None],
        cached={H1: 0},
        tables={"r0": [0]},
    )
    b = PoolState(
        free_queue=[2, 1],
        ref_counts=[1, 0, 0],
        block_hashes=[H2, None, None],
        cached={H2: 0},
        tables={"r0": [0], "r1": []},
    )
    assert differences(a, b, "PoolState") == [
        "PoolState.free_queue[0]: impl 1 != reference 2",
        "PoolState.free_queue[1]: impl 2 != reference 1",
        "PoolState.block_hashes[0]: impl 00010203 != reference 01020304",
        "PoolState.cached[00010203]: only in impl (0)",
        "PoolState.cached[01020304]: only in reference (0)",
        "PoolState.tables['r1']: only in reference ([])",
    ]
    assert differences(a, a) == []
    assert short([H1, None]) == "[00010203, None]"


def test_lists_of_different_length_are_shown_whole():
    assert differences({"r0": [1, 2, 3]}, {"r0": [1, 2]}, "Request") == [
        "Request['r0']: impl [1, 2, 3] != reference [1, 2]"
    ]


def test_report_is_bounded_and_carries_its_context():
    text = divergence_report(
        "x", list(range(100)), list(range(1, 101)), ["diverged at operation #3: step #1"]
    )
    assert text.count("!= reference") == 40 and "and 60 more differences" in text
    assert text.endswith("diverged at operation #3: step #1")


@needs_installed_plugin
def test_a_planted_divergence_reads_as_a_diff_with_a_rerun_command(tmp_path):
    """HEAD_FIRST_FREE frees blocks in the wrong order: the lockstep names the PoolState fields
    that differ, the operation, and the exact commands that replay and shrink the failing trace
    (the test's node id with --pyargs: the plugin's replay note)."""
    target = "enginespec.conformance.planted.bugs:HEAD_FIRST_FREE"
    env = {k: v for k, v in os.environ.items() if k not in ("ENGINESPEC_IMPL", "PYTEST_ADDOPTS")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--pyargs",
            "enginespec.conformance.test_stateful",
            "-k",
            "recompute",
            f"--impl={target}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout
    assert proc.returncode == 1, out[-3000:]
    assert "impl under test and reference diverged:" in out and "PoolState." in out, out[-3000:]
    assert "diverged at operation #" in out and "last operations:" in out, out[-3000:]
    assert (
        "  python -m pytest --pyargs 'enginespec.conformance.test_stateful::test_lockstep_with_reference"
        f"[recompute]' --impl={target}\n"
    ) in out, out[-3000:]
    assert f"[recompute]' --impl={target} --hypothesis-profile=enginespec-shrink\n" in out, out[-3000:]
    assert (
        "b'\\x" not in out.split("impl under test and reference diverged:")[1].split("Hypothesis prints")[0]
    )


# The reference reached through load_impl, as everything in conformance reaches implementations
# (tools/check_imports.py: the suite ships and must not import an impl by name).
_REFERENCE = load_impl("reference")


class DequeStateBlockManager(_REFERENCE.block_manager_cls):
    """The reference pool, but state() hands its free queue out as a deque: PoolState's fields
    must be plain lists (docs/writing-a-backend.md), and only the lockstep's equality sees it."""

    def state(self):
        snapshot = super().state()
        snapshot.free_queue = deque(snapshot.free_queue)
        return snapshot


class DequeStateImpl(type(_REFERENCE)):
    name = "deque-state"
    block_manager_cls = DequeStateBlockManager


def test_pool_lockstep_divergence_reads_as_a_field_diff():
    """test_pool_lockstep, the first test an outsider's `-x` run meets, reports a PoolState that
    differs from the reference's field by field, as test_stateful does (it said only "impl pool
    state differs from the reference" over `assert all(<generator>)`)."""
    machine = type("PoolLockstep", (PoolMachine,), {"impls": (DequeStateImpl(), _REFERENCE)})
    with pytest.raises(AssertionError) as failure:
        run_state_machine_as_test(machine, settings=settings(max_examples=5, database=None, derandomize=True))
    text = str(failure.value)
    assert text.startswith("impl under test and reference diverged:"), text
    assert "PoolState.free_queue: impl deque([" in text and "!= reference [" in text, text
    assert "blocks of" in text and "prefix caching" in text, text


@pytest.mark.parametrize("how", ["abort", "finish"])
def test_a_finish_that_keeps_blocks_names_the_request_its_state_and_blocks(how):
    """A scheduler whose abort (or stop-string finish) releases nothing: the failure is one
    sentence naming the request, its status before and after, and the blocks it still holds
    (it was `assert (status == ABORTED and 'r1' not in {...})` over a PoolState repr)."""
    config = SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=2)
    h = Harness(_REFERENCE, config, num_blocks=8, block_size=4, enable_prefix_caching=False)
    h.add(RequestSpec("r1", tuple(range(10, 16)), SamplingParams(max_tokens=4, temperature=0.0)))
    h.step()
    held = h.bm.block_table("r1")
    assert len(held) == 2, "6 prompt tokens in blocks of 4, all scheduled in the first step"
    h.bm.free = lambda request: None  # the planted leak: finishing a request releases nothing
    with pytest.raises(AssertionError) as failure:
        h.abort("r1") if how == "abort" else h.finish("r1", Status.FINISHED_STOPPED)
    text = str(failure.value)
    status = "finished_aborted" if how == "abort" else "finished_stopped"
    assert text.startswith("[spec rule abort:"), text
    assert f"{how}('r1'): request 'r1' (running, now {status}) still holds blocks {held}" in text, text


def test_pool_and_request_checks_name_the_blocks_and_counters_that_are_wrong():
    """check_idle named no block ("idle pool: not every block is free"); check_request's
    counter checks were bare compound asserts, shown as a Request repr."""
    held = PoolState(free_queue=[1, 2], ref_counts=[1, 0, 0], block_hashes=[None] * 3, cached={}, tables={})
    with pytest.raises(AssertionError, match=r"idle pool: blocks \[0\] are not free \(ref counts \{0: 1\}\)"):
        check_idle(held, 3)
    r = SimpleNamespace(
        request_id="r1", token_ids=[1, 2, 3], prompt_token_ids=[1, 2], output_token_ids=[3], num_tokens=4
    )
    r.num_prompt_tokens, r.num_output_tokens = 2, 1
    with pytest.raises(AssertionError, match=r"r1: num_tokens 4 != len\(token_ids\) 3"):
        check_request(r, 4)
