"""Differential lockstep (DESIGN point 6): the impl under test and the reference, driven by the
same random trace of add / abort / finish / step, must make identical decisions.

Modelled on zarr-python's stateful tests: one RuleBasedStateMachine holds a `Harness` per
implementation (each checks every invariant of points 1 and 5 on its own side at every call);
after every rule the two sides are compared: scheduled (id, n) in batch order, preempted ids,
swap lists, finished ids, appended tokens, the pool's PoolState, the queues, and every request's
token list and counters. Samples come from the deterministic fake model, so equal histories get
equal tokens.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from enginespec.conformance.diff import divergence_report
from enginespec.conformance.invariants import Harness
from enginespec.conformance.strategies import (
    Limits,
    drafting,
    drafts_for,
    request_specs,
    scenarios,
    stems_for,
)
from enginespec.spec import Status

REQUEST_FIELDS = (
    "token_ids",
    "spec_token_ids",
    "num_computed_tokens",
    "num_cached_tokens",
    "status",
    "num_preemptions",
    "swapped_out",
    "stop_reason",
)


def request_view(r) -> dict:
    """What must match between impls, by field name (so a divergence names the field).
    block_hashes is left out: when an impl extends it is its own business (each side's chain is
    checked against spec.hash_request_blocks instead)."""
    return {"request_id": r.request_id, **{name: _plain(getattr(r, name)) for name in REQUEST_FIELDS}}


def _plain(value):
    return list(value) if isinstance(value, (list, tuple)) else value


class EngineLockstep(RuleBasedStateMachine):
    """sides[0] = impl under test, sides[1] = reference."""

    impls: tuple = ()
    mode: str = "recompute"

    @initialize(scn=scenarios(max_requests=4), data=st.data())
    def setup(self, scn, data):
        scn.config = dataclasses.replace(scn.config, preemption_mode=self.mode)
        self.scn = scn
        self.sides = [
            Harness(impl, scn.config, scn.num_blocks, scn.block_size, scn.enable_prefix_caching)
            for impl in self.impls
        ]
        self.limits = Limits.of(scn.config, scn.num_blocks, scn.block_size)
        self.stems = data.draw(stems_for(scn.block_size))
        self.num_added = len(scn.requests)
        self.clock = 0
        self.ops: list[str] = []  # every operation so far, for the failure message
        for spec in scn.requests:  # start with work, so runs that only step still exercise it
            self.agree(lambda side, spec=spec: side.add(spec), f"add({spec.request_id})", "added")

    def agree(self, fn, op: str | None = None, what: str = "result"):
        """Run `fn` on both sides (op names it, for the message) and require equal results."""
        if op is not None:
            self.ops.append(op)
        impl_result, ref_result = (fn(side) for side in self.sides)
        if impl_result != ref_result:  # raised, not asserted: pytest's own whole-object diff is noise here
            self.diverged = True
            raise AssertionError(divergence_report(what, impl_result, ref_result, self.context()))
        return impl_result

    def context(self) -> list[str]:
        last = self.ops[-8:]
        return [
            f"diverged at operation #{len(self.ops)}: {self.ops[-1] if self.ops else 'setup'} "
            f"(scenario: {self.scn.config}, {self.scn.num_blocks} blocks of {self.scn.block_size}, "
            f"prefix caching {self.scn.enable_prefix_caching})",
            f"last operations: {'; '.join(last)}",
            "Hypothesis prints the whole trace below, then how to replay it",
        ]

    @rule(data=st.data())
    def add(self, data):
        spec = data.draw(
            request_specs(
                self.limits,
                f"s{self.num_added}",
                self.stems,
                arrival_time=float(self.clock - data.draw(st.integers(0, 1))),
            )
        )
        self.num_added += 1
        self.agree(lambda side: side.add(spec), f"add({spec.request_id})", "added")

    @rule(data=st.data())
    def add_refused(self, data):
        """A duplicate id or a request that can never fit: ValueError on both, nothing changes."""
        live = sorted(self.sides[0].live)
        big = self.limits.max_total_tokens
        spec = data.draw(
            request_specs(self.limits, data.draw(st.sampled_from(live)) if live else "s0", self.stems)
        )
        if not live:  # no duplicate possible: make it too long instead
            spec = type(spec)(f"big{self.num_added}", spec.prompt_token_ids + (1,) * big, spec.params)

        def refuse(side):
            before = (side.bm.state(), [request_view(r) for r in side.live.values()])
            with pytest.raises(ValueError):
                side.add(spec)
            assert (side.bm.state(), [request_view(r) for r in side.live.values()]) == before

        self.agree(refuse, f"add_refused({spec.request_id})", "refused")

    @rule(data=st.data())
    def abort(self, data):
        """Abort a live request (any state) most of the time, else a finished or unknown id."""
        live = sorted(self.sides[0].live)
        others = sorted(set(self.sides[0].all) - set(live)) + ["unknown"]
        rid = data.draw(st.sampled_from(live if live and data.draw(st.integers(0, 3)) else others))
        self.agree(lambda side: side.abort(rid), f"abort({rid})", "abort() return")

    @precondition(lambda self: any(r.status == Status.RUNNING for r in self.sides[0].live.values()))
    @rule(data=st.data())
    def finish_stop_string(self, data):
        rid = data.draw(
            st.sampled_from(
                sorted(rid for rid, r in self.sides[0].live.items() if r.status == Status.RUNNING)
            )
        )
        self.agree(
            lambda side: side.finish(rid, Status.FINISHED_STOPPED), f"finish({rid}, stop string)", "finish"
        )

    @precondition(lambda self: any(drafting(r) for r in self.sides[0].live.values()))
    @rule(data=st.data())
    def propose_drafts(self, data):
        """Draft tokens on a decoding request: scheduled with it, then verified against the fake
        model (a prefix accepted, the rest trimmed), identically on both sides."""
        rid = data.draw(st.sampled_from(sorted(rid for rid, r in self.sides[0].live.items() if drafting(r))))
        drafts = data.draw(drafts_for(self.sides[0].live[rid], self.sides[0].model))
        self.agree(lambda side: side.propose(rid, drafts), f"propose_drafts({rid}, {drafts})", "propose")

    @rule(num_steps=st.integers(1, 4))
    def step(self, num_steps):
        for _ in range(num_steps):
            self.clock += 1
            self.agree(lambda side: side.step(), f"step #{self.sides[0].num_steps + 1}", "StepResult")

    @invariant()
    def same_state(self):
        if not hasattr(self, "sides"):
            return
        self.agree(lambda side: side.bm.state(), what="PoolState")
        self.agree(
            lambda side: {
                "running": [r.request_id for r in side.sched.running],
                "waiting": [r.request_id for r in side.sched.waiting],
                "has_unfinished": side.sched.has_unfinished,
            },
            what="Scheduler",
        )
        self.agree(
            lambda side: {rid: request_view(side.all[rid]) for rid in sorted(side.all)}, what="Request"
        )

    def teardown(self):
        """Liveness from any reachable state: everything left finishes, and the pools empty."""
        if not hasattr(self, "sides") or getattr(self, "diverged", False):
            return
        live = self.sides[0].live.values()
        total = sum(r.num_prompt_tokens + r.params.max_tokens for r in live)
        bound = self.sides[0].num_steps + (len(live) + 1) * (total + 2) + 2
        while self.sides[0].sched.has_unfinished:
            assert self.sides[0].num_steps < bound, "requests left unfinished (livelock?)"
            self.agree(
                lambda side: side.step(), f"teardown step #{self.sides[0].num_steps + 1}", "StepResult"
            )
        self.same_state()


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_lockstep_with_reference(impl, reference_impl, mode):
    if mode == "swap" and "swap" not in getattr(impl, "capabilities", frozenset()):
        pytest.skip(f"{impl.name} does not declare the swap capability")
    attrs = {"impls": (impl, reference_impl), "mode": mode}
    machine = type(f"Lockstep_{mode}", (EngineLockstep,), attrs)
    # Traces are cheap (no tensors) and this is the suite's main net: up to 4x the profile's
    # examples (ci 48, dev 240), never fewer than the profile asks for (thorough 1000).
    base = settings().max_examples
    run_state_machine_as_test(machine, settings=settings(max_examples=max(base, min(4 * base, 250))))
