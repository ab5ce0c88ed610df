"""An impl whose scheduler stops making progress (a leaked pool, a schedule() that raises) fails
its requests with a readable error instead of the engine stepping forever
(EngineCore._check_progress, EngineCore._recover). Each test steps by hand, a bounded number of
times, so a regression fails instead of hanging."""

from __future__ import annotations

import pytest

from enginespec.engine.spec_decode import Drafter
from enginespec.spec import SamplingParams, load_impl
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

_REFERENCE = load_impl("reference")


class LeakOnFreeBM(_REFERENCE.block_manager_cls):
    """free() loses the request's last block: the pool shrinks with every finished request."""

    def free(self, request):
        table = self.tables.get(request.request_id)
        if table:
            table.pop()
        super().free(request)


LEAKY = type("Leaky", (type(_REFERENCE),), {"name": "leaky", "block_manager_cls": LeakOnFreeBM})()


def _run(impl, num_requests: int, max_steps: int = 200) -> dict:
    from enginespec.llm import LLM

    llm = LLM(
        str(tiny_model_dir("qwen3")), impl=impl, dtype="float32", device="cpu", block_size=4, num_blocks=12
    )
    engine = llm.engine
    params = SamplingParams(max_tokens=10, ignore_eos=True, temperature=0.0)
    for i in range(num_requests):
        engine.add_request(f"r{i}", [5 + i] * 10, params)
    finals = {}
    for _ in range(max_steps):
        finals.update((o.request_id, o.outputs[0]) for o in engine.step() if o.finished)
        if not engine.has_unfinished:
            break
    assert not engine.has_unfinished, "the engine kept stepping a stuck impl"
    return finals


def test_a_pool_that_leaks_until_nothing_fits_fails_the_waiting_requests():
    finals = _run(LEAKY, num_requests=12)
    errors = [c for c in finals.values() if c.finish_reason == "error"]
    assert errors and len(errors) < 12, [c.finish_reason for c in finals.values()]
    assert "liveness" in errors[0].error and "blocks free" in errors[0].error


def test_a_schedule_that_raises_fails_every_unfinished_request():
    finals = _run("enginespec.conformance.planted.bugs:HALF_DONE_ALLOCATION", num_requests=6)
    errors = [c for c in finals.values() if c.finish_reason == "error"]
    assert errors and all("before it was scheduled" in c.error for c in errors)


class _BrokenDrafter(Drafter):
    """A drafter whose every proposal raises (a persistent fault, unlike a one-off)."""

    def propose(self, request, num_real, max_drafts):
        raise RuntimeError("drafter is broken")

    def forget(self, request_id):
        pass


def test_drafting_that_fails_at_every_step_fails_the_requests_after_a_few_steps():
    from enginespec.llm import LLM

    config = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    llm = LLM(
        str(tiny_model_dir("qwen3")),
        impl="reference",
        dtype="float32",
        device="cpu",
        block_size=4,
        num_blocks=32,
        speculative_config=config,
    )
    engine = llm.engine
    engine.add_request(
        "a", [5, 6, 5, 6, 5, 6], SamplingParams(max_tokens=8, ignore_eos=True, temperature=0.0)
    )
    finals = {}
    for _ in range(40):
        if finals.get("a") is None and engine.stats.num_scheduled_tokens > 0:
            engine.spec.drafter = _BrokenDrafter()  # after the prefill: decodes draft from now on
        finals.update((o.request_id, o.outputs[0]) for o in engine.step() if o.finished)
        if not engine.has_unfinished:
            break
    assert not engine.has_unfinished, "the engine kept stepping a drafter that always raises"
    assert finals["a"].finish_reason == "error" and "drafter is broken" in finals["a"].error
    assert engine.stats.num_failed_steps == 3
