"""Async scheduling (engine/async_scheduling.py) never changes outputs.

Step n + 1 is scheduled over placeholder tokens while step n's ids stay on the device; the
real ids replace the placeholders a step later, and stops that need the real token (stop
token ids, EOS) fire then. Every test runs the same workload serially and with
async_scheduling=True and compares token ids, finish reasons and stop reasons. Stop tokens are
chosen from the serial run's own outputs, so they are guaranteed to fire mid-generation.

Async scheduling needs the impl's requests to take a placeholder: the spec's OPTIONAL
SupportsAsyncScheduling Protocol (`Request.replace_last_token`). Where they do not, the engine
runs every step serially (engine/async_scheduling.py `deferrable`), and the same tests check
that: no async step, and outputs equal to the serial run. Only a test whose whole subject is a
pending placeholder skips, naming the missing method.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch

from enginespec.conformance.invariants import check_idle
from enginespec.engine.async_scheduling import deferrable
from enginespec.spec import SamplingParams, Status
from enginespec.spec import token_stop as stop_after
from enginespec.testing.checkpoints import EOS_ID, VOCAB_SIZE, tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [{"prompt_token_ids": [(5 * i + 3 * j) % 90 + 4 for j in range(5 + 4 * i)]} for i in range(10)]


def _llm(impl, async_scheduling: bool, **kwargs):
    from enginespec.llm import LLM

    args = dict(
        dtype="float32",
        device="cpu",
        block_size=4,
        num_blocks=40,
        max_num_batched_tokens=24,
        max_num_seqs=6,
        async_scheduling=async_scheduling,
    )
    return LLM(str(tiny_model_dir("qwen3")), impl=impl, **{**args, **kwargs})


def overlaps(impl) -> bool:
    """Whether the engine overlaps steps for this impl: its requests have the optional
    `replace_last_token` (SupportsAsyncScheduling). The engine's own test, so the suite expects
    exactly what the engine does."""
    return deferrable([impl.new_request("probe", [1], SamplingParams(), arrival_time=0.0)])


def needs_overlap(impl) -> None:
    """Skip a test whose subject is the async path itself when the impl cannot take it."""
    if not overlaps(impl):
        pytest.skip(
            f"impl {impl.name!r}: requests have no replace_last_token (optional "
            "SupportsAsyncScheduling), so the engine never overlaps steps"
        )


def check_async_steps(impl, async_stats, serial_stats) -> None:
    """The serial run never overlaps; the async run overlaps iff the impl's requests can take a
    placeholder, and otherwise falls back to serial steps (0 async steps) rather than failing."""
    assert serial_stats.num_async_steps == 0, "a serial run (async_scheduling=False) overlapped a step"
    if overlaps(impl):
        assert async_stats.num_async_steps > 0, "async_scheduling=True never overlapped a step"
    else:
        assert async_stats.num_async_steps == 0, (
            "requests without replace_last_token cannot take a placeholder: the engine must run serially"
        )


def _generate(impl, params, async_scheduling: bool, eos=None, **kwargs):
    llm = _llm(impl, async_scheduling, **kwargs)
    if eos is not None:  # plant an EOS the model actually emits: the request's EOS is the
        llm.engine.model.eos_token_id = eos  # tokenizer's, the model's without one
        tokenizer = llm.engine.tokenizer
        if tokenizer is not None:
            tokenizer.eos_token = tokenizer.convert_ids_to_tokens(eos)
            assert tokenizer.eos_token_id == eos
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)
    return [
        [(c.token_ids, c.finish_reason, c.stop_reason) for c in o.outputs] for o in outs
    ], llm.engine.stats


def _with_stops(impl):
    """Params whose stops fire mid-generation, taken from a serial run without stops: odd
    requests stop at their 3rd token (stop_token_ids); even ones honour EOS, planted as the
    most common sampled token, and every 4th has max_tokens ending on its first EOS, where the
    serial order of checks says "stop", not "length"."""
    base = [SamplingParams(max_tokens=6 + 3 * i, temperature=0.0, ignore_eos=True) for i in range(10)]
    first, _ = _generate(impl, base, False)
    runs = [out[0][0] for out in first]
    eos = Counter(t for ids in runs for t in ids).most_common(1)[0][0]
    params = []
    for i, (p, ids) in enumerate(zip(base, runs)):
        if i % 2:
            params.append(dataclasses.replace(p, stop_token_ids=(ids[min(2, len(ids) - 1)],)))
        elif i % 4 == 0 and eos in ids:
            params.append(dataclasses.replace(p, ignore_eos=False, max_tokens=ids.index(eos) + 1))
        else:
            params.append(dataclasses.replace(p, ignore_eos=False))
    return params, eos


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_async_equals_serial_with_stops_and_preemption(impl, mode):
    if mode == "swap" and "swap" not in getattr(impl, "capabilities", ()):
        pytest.skip(f"impl {impl.name!r} has no swap capability")
    params, eos = _with_stops(impl)
    serial, serial_stats = _generate(impl, params, False, eos, preemption_mode=mode, num_blocks=24)
    overlapped, async_stats = _generate(impl, params, True, eos, preemption_mode=mode, num_blocks=24)
    assert overlapped == serial
    check_async_steps(impl, async_stats, serial_stats)
    assert serial_stats.num_preemptions > 0, "the pool was meant to force preemptions"
    reasons = [o[0][1:] for o in serial]
    assert ("stop", None) in reasons, "the workload was meant to stop on EOS"
    assert any(r[0] == "stop" and r[1] is not None for r in reasons), "and on stop token ids"
    # a stop token is seen one step late: the async run schedules the wasted row, never fewer
    assert async_stats.num_scheduled_tokens >= serial_stats.num_scheduled_tokens


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_async_equals_serial_on_cuda(impl):
    """On the GPU the placeholder rows are patched on the device inside graph-replayed,
    compiled decode steps, and the host reads ids a step late through a pinned copy."""
    params, eos = _with_stops(impl)
    # every third request samples with a seed: those steps draw with the Triton kernels. (Not
    # unseeded: an unseeded row's key derives from its row index, and a stop found a step late
    # leaves a wasted row in the async run that shifts the rows after it.)
    params = [
        dataclasses.replace(p, temperature=0.8, seed=i) if i % 3 == 2 else p for i, p in enumerate(params)
    ]
    cuda = dict(device="cuda", num_blocks=None, num_gpu_blocks_override=24)
    serial, serial_stats = _generate(impl, params, False, eos, **cuda)
    overlapped, async_stats = _generate(impl, params, True, eos, **cuda)
    assert overlapped == serial
    check_async_steps(impl, async_stats, serial_stats)


def test_one_token_bad_words_never_make_a_step_wait_for_the_one_before(impl):
    """A one-token bad word is banned at every step whatever came before, so a batch whose bad
    words are all one token samples without resolving the step before (stats.num_resolved_first
    stays 0); a word of two tokens is banned only after its first, which must be real, so those
    steps resolve first. Outputs equal the serial run's either way, and no banned word appears."""
    for words, waits in (((9,), (12,), (40,)), False), (((9,), (40, 41)), True):
        params = [
            SamplingParams(max_tokens=6 + i, temperature=0.0, ignore_eos=True, bad_words_token_ids=words)
            for i in range(10)
        ]
        serial, serial_stats = _generate(impl, params, False)
        overlapped, async_stats = _generate(impl, params, True)
        assert overlapped == serial
        check_async_steps(impl, async_stats, serial_stats)
        assert serial_stats.num_resolved_first == 0
        if overlaps(impl):
            assert (async_stats.num_resolved_first > 0) == waits, words
        for out in serial:
            ids = out[0][0]
            assert not any(w[0] in ids for w in words if len(w) == 1)
            assert not any(ids[j : j + 2] == list(w) for w in words if len(w) == 2 for j in range(len(ids)))


def test_async_with_mixed_rows_and_siblings(impl):
    """Seeded temperature rows and n > 1 siblings overlap like greedy ones; outputs stay those
    of the serial engine."""
    params = [
        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, n=2 if i == 3 else 1)
        if i % 4
        else SamplingParams(max_tokens=5, temperature=0.8, seed=i, ignore_eos=True)
        for i in range(10)
    ]
    assert _generate(impl, params, True)[0] == _generate(impl, params, False)[0]


@pytest.mark.parametrize("seeded", [True, False])
def test_async_equals_serial_when_sampling(impl, seeded):
    """Temperature rows are drawn on the device too (Sampler.sample_deferred): seeded rows key
    on the output index, unseeded ones on one generator draw per step, the same in both modes."""
    params = [
        SamplingParams(max_tokens=5 + 2 * i, temperature=0.9, seed=i if seeded else None, ignore_eos=True)
        for i in range(10)
    ]
    overlapped, async_stats = _generate(impl, params, True)
    serial, serial_stats = _generate(impl, params, False)
    assert overlapped == serial
    assert async_stats.num_steps == serial_stats.num_steps
    check_async_steps(impl, async_stats, serial_stats)


SETTINGS = [
    dict(temperature=0.0),
    dict(temperature=0.7, top_p=0.8, top_k=20),
    dict(top_p=0.9, prompt_logprobs=2),
    dict(min_p=0.2, temperature=1.2, logprobs=2),
    dict(repetition_penalty=1.4, frequency_penalty=0.5, presence_penalty=0.3, top_k=8),
    dict(logit_bias={7: 2.0, 11: -3.0}, allowed_token_ids=tuple(range(4, 40)), logprobs=0),
    dict(min_tokens=4, temperature=0.0, repetition_penalty=1.2, n=2),
    dict(temperature=0.8, presence_penalty=1.0, n=3, logprobs=3),
    dict(temperature=0.9, bad_words_token_ids=((9,), (40, 41), (12, 13, 14)), logprobs=1),
]


def _ranked(logprobs):
    """Logprob entries (None kept) with each value's rank beside it (a Logprob compares as its
    float, so the ranks would go unchecked)."""
    if logprobs is None:
        return None
    return [None if e is None else [(t, v, v.rank) for t, v in e.items()] for e in logprobs]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_async_equals_serial_for_every_setting(impl, mode):
    """Every row type draws on the device (Sampler.sample_deferred) and overlaps: top-k/top-p/
    min-p cuts, penalties (device-side output counts that count the in-flight placeholder with
    its real id), bias, allowed ids, bad words (the engine resolves the step before: their bans
    read the real newest token), min_tokens, logprobs and prompt logprobs (read in the same
    copy as the ids), n > 1 siblings, under preemption. Seeded rows: the async run equals the serial one."""
    if mode == "swap" and "swap" not in getattr(impl, "capabilities", ()):
        pytest.skip(f"impl {impl.name!r} has no swap capability")
    params = [
        SamplingParams(max_tokens=6 + i, seed=i, stop_token_ids=(5,), **SETTINGS[i % len(SETTINGS)])
        for i in range(10)
    ]
    runs = {}
    for overlap in (False, True):
        llm = _llm(impl, overlap, preemption_mode=mode, num_blocks=24)
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)
        runs[overlap] = (
            [
                [(c.token_ids, c.finish_reason, _ranked(c.logprobs)) for c in o.outputs]
                + [_ranked(o.prompt_logprobs)]
                for o in outs
            ],
            llm.engine.stats,
        )
    assert runs[True][0] == runs[False][0]
    assert runs[True][0][2][-1] is not None, "prompt logprobs were asked for"
    async_stats = runs[True][1]
    assert async_stats.num_async_steps == (async_stats.num_steps if overlaps(impl) else 0)
    assert runs[False][1].num_preemptions > 0, "the pool was meant to force preemptions"


def test_async_equals_serial_with_stop_strings(impl):
    """A stop string is matched on real tokens when they arrive, a step late; the text is cut
    at it and the request ends "stop" as in a serial run."""
    from enginespec.llm import LLM
    from enginespec.testing.checkpoints import tiny_model_dir as tiny

    base = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    texts = {}
    for mode in (False, True):
        llm = LLM(
            str(tiny("qwen3")),
            impl=impl,
            dtype="float32",
            device="cpu",
            block_size=4,
            num_blocks=40,
            async_scheduling=mode,
        )
        if not texts:  # stop strings taken from the serial run's own text: two chars at index 3
            first = llm.generate(PROMPTS[:6], base, use_tqdm=False)
            stops = [o.outputs[0].text[3:5] for o in first]
        params = [dataclasses.replace(base, stop=(stop,)) for stop in stops]
        outs = llm.generate(PROMPTS[:6], params, use_tqdm=False)
        assert (llm.engine.stats.num_async_steps > 0) == (mode and overlaps(impl))
        texts[mode] = [
            (o.outputs[0].text, o.outputs[0].token_ids, o.outputs[0].finish_reason, o.outputs[0].stop_reason)
            for o in outs
        ]
    assert texts[True] == texts[False]
    assert all(t[2] == "stop" for t in texts[False])


@pytest.mark.parametrize("stop", ["token", "string"])
def test_prompt_logprobs_of_a_chunk_beside_a_late_stop_are_kept(impl, stop):
    """A short request that stops on its first token (found a step late, when the real id
    arrives) shares the next step with a chunk of a long prompt that asked for prompt logprobs.
    That step's only sampling row belongs to the stopped request, so no placeholder is pending
    after it; the engine used to drop the whole launched step then, and with it the chunk's
    prompt logprobs: the long prompt's prompt_logprobs came back shorter than the prompt (26 of
    40 entries here), shifted against its tokens. They must equal the serial run's."""
    short = {"prompt_token_ids": [5, 6, 7]}
    long = {"prompt_token_ids": list(range(10, 50))}
    runs = {}
    for overlap in (False, True):
        llm = _llm(impl, overlap, max_num_batched_tokens=8)
        first = llm.generate(short, SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False)[0]
        ends = (
            dict(stop_token_ids=first.outputs[0].token_ids)
            if stop == "token"
            else dict(stop=(first.outputs[0].text,))
        )
        params = [
            SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, **ends),
            SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0),
        ]
        outs = llm.generate([short, long], params, use_tqdm=False)
        check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)
        assert outs[0].outputs[0].finish_reason == "stop"
        runs[overlap] = _ranked(outs[1].prompt_logprobs)
        assert (llm.engine.stats.num_async_steps > 0) == (overlap and overlaps(impl))
    assert len(runs[False]) == len(long["prompt_token_ids"])
    assert runs[True] == runs[False]


def test_stream_never_shows_a_placeholder(impl):
    llm = _llm(impl, True)
    params = SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True)
    seen: dict = {}
    for step_outputs in llm.stream(PROMPTS[:4], params):
        for out in step_outputs:
            ids = out.outputs[0].token_ids
            assert VOCAB_SIZE not in ids, "a placeholder leaked into an output"
            before = seen.get(out.request_id, [])
            assert ids[: len(before)] == before, "stream outputs must be cumulative"
            seen[out.request_id] = ids
    serial = _llm(impl, False).generate(PROMPTS[:4], params, use_tqdm=False)
    assert sorted(seen.values()) == sorted(o.outputs[0].token_ids for o in serial)


def test_abort_while_a_placeholder_is_pending(impl):
    needs_overlap(impl)
    engine = _llm(impl, True).engine
    long = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    engine.add_request("keep", [5, 6, 7], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    engine.add_request("drop", [8, 9, 10], long)
    engine.add_request("forget", [11, 12], long)
    for _ in range(3):
        engine.step()
    assert engine._inflight is not None and "drop" in engine._inflight.awaiting
    engine.abort("drop")
    engine.abort("forget", report=False)
    finals = {}
    while engine.has_unfinished:
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    dropped = finals["drop"].outputs[0]
    assert dropped.finish_reason == "abort" and VOCAB_SIZE not in dropped.token_ids
    assert "forget" not in finals and finals["keep"].outputs[0].finish_reason == "length"
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)


def _step_until_shown(engine, request_id: str, num_shown: int) -> None:
    """Step until the request's output shows num_shown ids (the step after it then in flight)."""
    for _ in range(50):
        outs = [o for o in engine.step() if o.request_id == request_id]
        if outs and len(outs[0].outputs[0].token_ids) >= num_shown:
            assert len(outs[0].outputs[0].token_ids) == num_shown and not outs[0].finished
            return
    raise AssertionError(f"{request_id!r} never showed {num_shown} ids")


def test_an_abort_reported_while_a_placeholder_is_pending_equals_the_serial_abort(impl):
    """abort() (reported: its output comes from the next step) of a request whose next token
    is in flight: the final output is the serial engine's for the same abort, finish_reason
    "abort" with the ids and text shown so far. The pending token used to be attached after
    the abort had settled the sample: it showed in the output, fed a detokenizer already
    flushed, and where it completed a stop string it turned the finish_reason "abort" into
    "stop" (an invariant of output_processor.py: a finish_reason is set once)."""
    needs_overlap(impl)
    prompt = [5, 6, 7, 8, 9]
    serial = _llm(impl, False)
    tokenizer = serial.get_tokenizer()
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    ids = serial.generate([{"prompt_token_ids": prompt}], greedy, use_tqdm=False)[0].outputs[0].token_ids
    # a stop string the pending token would complete: the text of the first id whose text is new
    shown = next(
        k for k in range(1, len(ids)) if tokenizer.decode(ids[k : k + 1]) not in tokenizer.decode(ids[:k])
    )
    params = dataclasses.replace(greedy, stop=(tokenizer.decode(ids[shown : shown + 1]),))
    finals = []
    for llm in (_llm(impl, True), serial):
        engine = llm.engine
        engine.add_request("r", prompt, params)
        _step_until_shown(engine, "r", shown)
        if engine.args.async_scheduling:  # the next token, the stop string's, is in flight
            assert "r" in engine._inflight.awaiting
        assert engine.abort("r")
        sample = run_to_end(engine)["r"].outputs[0]
        check_idle(engine.block_manager.state(), engine.runner.num_blocks)
        finals.append((sample.token_ids, sample.text, sample.finish_reason, sample.stop_reason))
    assert finals[1] == (ids[:shown], tokenizer.decode(ids[:shown]), "abort", None)
    assert finals[0] == finals[1]


def test_an_engine_left_idle_by_an_abort_keeps_no_step_in_flight(impl):
    """Closing the last stream (abort without a report) while its next token is in flight:
    the engine is idle and holds nothing, as after a finish. It used to keep that step (its
    device tensors, its ids) until some later request's first step."""
    needs_overlap(impl)
    llm = _llm(impl, True)
    stream = llm.stream(
        [{"prompt_token_ids": [5, 6, 7, 8, 9]}], SamplingParams(max_tokens=12, temperature=0.0)
    )
    next(stream)
    next(stream)
    engine = llm.engine
    assert engine._inflight is not None and engine._inflight.awaiting, "no token in flight to drop"
    stream.close()
    assert not engine.has_unfinished and engine._inflight is None
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)
    again = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=4, temperature=0.0))
    serial = _llm(impl, False).generate(
        [{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=4, temperature=0.0)
    )
    assert again[0].outputs[0].token_ids == serial[0].outputs[0].token_ids


def run_to_end(engine) -> dict:
    finals = {}
    while engine.has_unfinished:
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    return finals


@pytest.mark.parametrize("old_max_tokens", [20, 4], ids=["running", "finished-by-the-pending-step"])
def test_a_request_id_reused_after_an_abort_while_a_placeholder_is_pending(impl, old_max_tokens):
    """abort(report=False) then add_request under the same id before the next step (what an
    AsyncLLM user does who leaves a generate and retries under its id): the pending step's
    placeholder, token and length finish were the aborted request's, yet they were matched by
    id to the new one. Its prefill then raised "scheduled N tokens over a placeholder", which
    failed every request of that step ("keep" too), or its first output was the old request's
    length finish. The new request and the others must run as if the old one had never been."""
    needs_overlap(impl)
    engine = _llm(impl, True).engine
    keep = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    new = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    old = SamplingParams(max_tokens=old_max_tokens, temperature=0.0, ignore_eos=True)
    engine.add_request("keep", [5, 6, 7], keep)
    engine.add_request("reuse", [8, 9, 10], old)
    for _ in range(4):
        engine.step()
    assert engine._inflight is not None and "reuse" in engine._inflight.awaiting
    engine.abort("reuse", report=False)
    engine.add_request("reuse", [11, 12, 13, 14], new)
    finals = {}
    while engine.has_unfinished:
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    serial = _llm(impl, False).generate(
        [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [11, 12, 13, 14]}], [keep, new], use_tqdm=False
    )
    got = [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in (finals["keep"], finals["reuse"])]
    assert got == [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in serial]
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)


class _R:
    def __init__(self, num_output, **params):
        self.params = SamplingParams(temperature=0.0, **params)
        self.num_output_tokens = num_output
        self.eos_token_id = EOS_ID


def test_stop_after_follows_the_serial_rules():
    assert stop_after(_R(2, stop_token_ids=(7,)), 7) == (Status.FINISHED_STOPPED, 7)
    assert stop_after(_R(2), EOS_ID) == (Status.FINISHED_STOPPED, None)
    assert stop_after(_R(2, ignore_eos=True), EOS_ID) is None
    assert stop_after(_R(2, stop_token_ids=(7,), min_tokens=2), 7) is None  # output 2 is not > 2
    assert stop_after(_R(3, stop_token_ids=(EOS_ID,)), EOS_ID) == (Status.FINISHED_STOPPED, EOS_ID)
    assert stop_after(_R(5), 9) is None


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_a_placeholder_that_fills_a_block_is_never_shared_by_prefix_caching(impl, family):
    """Requests with one history up to a placeholder that fills a block hash that block alike
    (a 3-token prompt, block_size 4: the first sampled token fills block 0). The engine re-hashes
    the block once the real token replaces the placeholder, so a request recomputed after
    preemption adopts only a block of its own real tokens: greedy and seeded outputs equal the
    serial run's, with prefix caching on and preemptions."""
    from enginespec.llm import LLM

    prompt = {"prompt_token_ids": [11, 12, 13]}
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    params = [SamplingParams(temperature=1.0, seed=2, max_tokens=12, ignore_eos=True), greedy, greedy, greedy]
    runs = {}
    for mode in (False, True):
        llm = LLM(
            str(tiny_model_dir(family)),
            impl=impl,
            dtype="float32",
            device="cpu",
            block_size=4,
            num_blocks=6,
            max_num_seqs=4,
            async_scheduling=mode,
            enable_prefix_caching=True,
            preemption_mode="recompute",
        )
        outs = llm.generate([prompt] * 4, params, use_tqdm=False)
        runs[mode] = [o.outputs[0].token_ids for o in outs]
        assert llm.engine.stats.num_preemptions > 0, "the pool was meant to force preemptions"
        assert (llm.engine.stats.num_async_steps > 0) == (mode and overlaps(impl))
        check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)
    assert runs[True] == runs[False]
