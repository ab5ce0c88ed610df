"""The engine's API: input validation (ValueError, nothing else disturbed), LLM.generate's prompt
forms, stop strings, n > 1 seeds, streaming, aborts, logprobs against transformers, the model
runner's pool sizing and swaps. Tiny float32 models on CPU, through the `impl` fixture."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from enginespec.conformance.invariants import check_idle
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import VOCAB_SIZE, tiny_model_dir

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


pytestmark = pytest.mark.usefixtures("torch_one_thread")


def make_llm(impl, **kwargs):
    from enginespec.llm import LLM

    kwargs = {
        "dtype": "float32",
        "device": "cpu",
        "block_size": 4,
        "num_blocks": 32,
        "max_model_len": 64,
        **kwargs,
    }
    return LLM(str(tiny_model_dir("qwen3")), impl=impl, **kwargs)


def run_all(engine) -> dict:
    finals = {}
    for _ in range(500):
        if not engine.has_unfinished:
            return finals
        finals.update({o.request_id: o for o in engine.step() if o.finished})
    raise AssertionError("engine did not finish in 500 steps")


GOOD = {"a": [5, 6, 7, 8, 9], "b": [5, 6, 7, 20]}
BAD_ADDS = [
    ("empty prompt", "x", [], GREEDY, "must not be empty"),
    ("id over the vocab", "x", [1, VOCAB_SIZE], GREEDY, "vocab_size"),
    ("negative id", "x", [1, -1], GREEDY, "vocab_size"),
    ("non-int id", "x", [1, 2.5], GREEDY, "ints"),
    ("prompt over max_model_len", "x", [1] * 65, SamplingParams(max_tokens=1), "max_model_len"),
    (
        "stop id over the vocab",
        "x",
        [1, 2],
        SamplingParams(stop_token_ids=[VOCAB_SIZE + 3]),
        "stop_token_ids",
    ),
    (
        "allowed id over the vocab",
        "x",
        [1, 2],
        SamplingParams(allowed_token_ids=[VOCAB_SIZE]),
        "allowed_token_ids",
    ),
    ("duplicate id", "a", [1, 2], GREEDY, "already in use"),
    ("not SamplingParams", "x", [1, 2], {"max_tokens": 3}, "SamplingParams"),
]


@pytest.mark.parametrize("case", BAD_ADDS, ids=[c[0] for c in BAD_ADDS])
def test_bad_input_is_a_value_error_and_disturbs_nothing(impl, case):
    _, request_id, prompt, params, needle = case
    clean = make_llm(impl).engine
    for rid, ids in GOOD.items():
        clean.add_request(rid, ids, GREEDY)
    expected = {rid: out.outputs[0].token_ids for rid, out in run_all(clean).items()}

    engine = make_llm(impl).engine
    engine.add_request("a", GOOD["a"], GREEDY)
    engine.step()  # "a" is running when the bad request arrives
    with pytest.raises(ValueError, match=needle):
        engine.add_request(request_id, prompt, params)
    engine.add_request("b", GOOD["b"], GREEDY)
    got = {rid: out.outputs[0].token_ids for rid, out in run_all(engine).items()}
    assert got == expected
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)


FULL_PROMPT = [(7 * j) % 90 + 4 for j in range(32)]  # exactly the max_model_len below


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize(
    "asked",
    [
        SamplingParams(max_tokens=None, temperature=0.0, prompt_logprobs=1),
        SamplingParams(max_tokens=5, min_tokens=3, temperature=0.0, prompt_logprobs=1),
    ],
    ids=["max_tokens None", "max_tokens 5 min_tokens 3"],
)
def test_a_prompt_of_max_model_len_gets_one_token_and_finishes_length(impl, asked, async_scheduling):
    """vLLM's offline engine refuses only a prompt over max_model_len: one of exactly
    max_model_len gets one token, sampled at its last position (no KV slot of its own), and
    finishes "length"; max_tokens (None or larger) is fitted to 1 and min_tokens with it. So a
    pool of exactly max_model_len tokens (8 blocks of 4) holds it, and its prompt_logprobs are
    complete, equal to those of an engine with room to spare. lm-evaluation-harness's
    log-likelihood requests are such prompts; they were refused ("must be < max_model_len")."""
    llm = make_llm(impl, max_model_len=32, num_blocks=8, async_scheduling=async_scheduling)
    (out,) = llm.generate({"prompt_token_ids": FULL_PROMPT}, asked, use_tqdm=False)
    roomy = make_llm(impl, max_model_len=64, num_blocks=16, async_scheduling=async_scheduling)
    one = dataclasses.replace(asked, max_tokens=1, min_tokens=0)
    (want,) = roomy.generate({"prompt_token_ids": FULL_PROMPT}, one, use_tqdm=False)
    assert out.outputs[0].token_ids == want.outputs[0].token_ids and len(want.outputs[0].token_ids) == 1
    assert out.outputs[0].finish_reason == "length"
    assert len(out.prompt_logprobs) == len(FULL_PROMPT) and out.prompt_logprobs[0] is None
    for p in range(1, len(FULL_PROMPT)):
        got, expected = out.prompt_logprobs[p], want.prompt_logprobs[p]
        assert FULL_PROMPT[p] in got and got.keys() == expected.keys(), p
        assert all(got[t].logprob == pytest.approx(expected[t].logprob, abs=1e-5) for t in got), p
    assert not llm.engine.has_unfinished
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)


def test_a_prompt_of_max_model_len_gets_no_drafts(impl):
    """Speculative decoding's draft cap for a prompt of exactly max_model_len
    (max_model_len - num_tokens - 1 = -1) is 0, never negative: with a budget of 31 its last
    prompt token runs alone, the step the drafter asks about it. It still gets its one token."""
    config = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    llm = make_llm(impl, max_model_len=32, num_blocks=8, max_num_batched_tokens=31, speculative_config=config)
    spec, limits = llm.engine.spec, []
    limit = spec._limit
    spec._limit = lambda r: limits.append(limit(r)) or limits[-1]
    (out,) = llm.generate({"prompt_token_ids": [5, 6] * 16}, GREEDY, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 1 and out.outputs[0].finish_reason == "length"
    assert limits == [0]
    assert spec.stats.num_draft_tokens == 0


def test_request_over_the_pool_is_refused(impl):
    engine = make_llm(impl, num_blocks=2).engine
    with pytest.raises(ValueError, match="num_blocks"):
        engine.add_request("big", [1] * 6, SamplingParams(max_tokens=4))
    assert not engine.has_unfinished


def test_generate_is_all_or_nothing(impl):
    llm = make_llm(impl)
    with pytest.raises(ValueError, match="vocab_size"):
        llm.generate(
            [{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": [VOCAB_SIZE]}], GREEDY, use_tqdm=False
        )
    assert not llm.engine.has_unfinished
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)
    out = llm.generate({"prompt_token_ids": [5, 6]}, GREEDY, use_tqdm=False)
    assert len(out) == 1 and len(out[0].outputs[0].token_ids) == GREEDY.max_tokens


def test_unknown_engine_args_are_a_type_error_naming_them(impl):
    with pytest.raises(TypeError, match="max_num_seq_s.*tensor_parallel"):
        make_llm(impl, max_num_seq_s=4, tensor_parallel=2)


@pytest.mark.parametrize(
    "field, value",
    [
        ("seed", 2**70),
        ("seed", 1.5),
        ("enable_chunked_prefill", "no"),
        ("enable_prefix_caching", "no"),
        ("async_scheduling", None),
        ("max_num_seqs", True),
        ("gpu_memory_utilization", 5.0),
        ("gpu_memory_utilization", 0.0),
        ("num_gpu_blocks_override", 0),
        ("scheduling_policy", "lifo"),
        ("preemption_mode", "copy"),
        ("long_prefill_token_threshold", -1),
        ("long_prefill_token_threshold", True),
        ("max_num_batched_tokens", 0),
        ("max_num_batched_tokens", 16.0),
    ],
)
def test_engine_args_refuse_a_bad_type_or_range_naming_the_field(field, value):
    """Checked on construction (no model needed): a string "no" for a flag used to be truthy,
    a seed of 2**70 failed inside torch naming no field, 5.0 of the GPU memory passed on CPU.
    The scheduler's knobs were checked only by SchedulerConfig, after the model had loaded, and
    scheduling_policy was named "SchedulerConfig.policy" there."""
    from enginespec.engine_args import EngineArgs

    with pytest.raises(ValueError, match=field):
        EngineArgs(**{field: value})


def test_a_budget_below_max_num_seqs_is_taken():
    """vLLM refuses max_num_batched_tokens < max_num_seqs; here such a budget is taken (a step
    then decodes fewer requests than are running, as the scheduler's token budget says), since
    small budgets beside the default max_num_seqs are a common test and debugging setting."""
    from enginespec.engine_args import EngineArgs

    assert EngineArgs(max_num_batched_tokens=8, max_num_seqs=16).max_num_batched_tokens == 8


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole"])
def test_an_engine_with_a_budget_below_max_num_seqs_builds_and_serves(impl, chunked):
    """A budget below max_num_seqs (here the default 256 seats) passed EngineArgs but then failed
    the engine's build, after the model had loaded, with SchedulerConfig's refusal of
    max_num_batched_tokens < max_num_seqs. The engine now runs at most max_num_batched_tokens
    requests at once (no step could decode more), and every request finishes as it would alone."""
    llm = make_llm(impl, max_num_batched_tokens=16, max_model_len=16, enable_chunked_prefill=chunked)
    assert (
        llm.engine.scheduler_config.max_num_seqs == 16 == llm.engine.scheduler_config.max_num_batched_tokens
    )
    prompts = [{"prompt_token_ids": [5 + i, 6, 7]} for i in range(20)]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    alone = make_llm(impl).generate(prompts[:3], GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs[:3]] == [o.outputs[0].token_ids for o in alone]
    assert all(len(o.outputs[0].token_ids) == GREEDY.max_tokens for o in outs)
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)


def test_bad_engine_args_are_value_errors(impl):
    with pytest.raises(ValueError, match="max_model_len"):
        make_llm(impl, max_model_len=10_000)
    with pytest.raises(ValueError, match="kv_cache_bytes"):
        make_llm(impl, num_blocks=None, kv_cache_bytes=10)
    with pytest.raises(ValueError, match="scheduling_policy"):
        make_llm(impl, scheduling_policy="lifo")
    with pytest.raises(ValueError, match="dtype"):
        make_llm(impl, dtype="int3")
    no_swap = type("NoSwap", (type(impl),), {"capabilities": frozenset()})()
    with pytest.raises(ValueError, match="swap"):
        make_llm(no_swap, preemption_mode="swap")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            make_llm(impl, device="cuda")


def test_generate_prompt_forms_order_and_text(impl):
    llm = make_llm(impl)
    tok = llm.get_tokenizer()
    prompts = ["abc", {"prompt_token_ids": tok.encode("xyz")}, {"prompt": "hello"}, tok.encode("q")]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert [o.prompt for o in outs] == ["abc", None, "hello", None]
    assert outs[0].prompt_token_ids == tok.encode("abc")
    for out in outs:
        completion = out.outputs[0]
        assert out.finished and completion.finish_reason == "length"
        assert completion.text == tok.decode(completion.token_ids, skip_special_tokens=True)
    alone = llm.generate("xyz", GREEDY, use_tqdm=False)[0]
    assert alone.outputs[0].token_ids == outs[1].outputs[0].token_ids
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(["a", "b"], [GREEDY], use_tqdm=False)


def test_stop_string_cuts_text_and_finishes(impl):
    llm = make_llm(impl)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    free = llm.generate("abc", params, use_tqdm=False)[0].outputs[0]
    assert len(free.text) >= 4, "the tiny model's output is too short to pick a stop string"
    stop = free.text[2:4]
    first = free.text.index(stop)
    stopped = llm.generate(
        "abc", SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop=[stop]), use_tqdm=False
    )[0].outputs[0]
    assert stopped.text == free.text[:first]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop
    assert stopped.token_ids == free.token_ids[: len(stopped.token_ids)]
    assert len(stopped.token_ids) < len(free.token_ids)
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_stop_tokens_text_is_not_shown_unless_asked(impl, async_scheduling):
    """A request ended by a stop token keeps its id but not its text (vLLM's rule);
    include_stop_str_in_output shows it, and keeps a stop string in the text too."""
    llm = make_llm(impl, async_scheduling=async_scheduling)
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    ids = llm.generate("abc", greedy, use_tqdm=False)[0].outputs[0].token_ids
    cut = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i])
    text = llm.engine.tokenizer.decode(ids[: cut + 1], skip_special_tokens=True)
    shown = text[: len(llm.engine.tokenizer.decode(ids[:cut], skip_special_tokens=True))]
    assert shown != text, "the chosen stop token renders no text"
    for include, want in ((False, shown), (True, text)):
        params = dataclasses.replace(greedy, stop_token_ids=(ids[cut],), include_stop_str_in_output=include)
        out = llm.generate("abc", params, use_tqdm=False)[0].outputs[0]
        assert (out.token_ids, out.text, out.stop_reason) == (ids[: cut + 1], want, ids[cut])
    stop = text[-2:]
    kept = dataclasses.replace(greedy, stop=(stop,), include_stop_str_in_output=True)
    out = llm.generate("abc", kept, use_tqdm=False)[0].outputs[0]
    assert out.text.endswith(stop) and out.stop_reason == stop
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)


def test_n_siblings_share_the_prompt_and_use_seed_plus_index(impl):
    llm = make_llm(impl)
    prompt = {"prompt_token_ids": list(range(10, 22))}
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=7, n=3, ignore_eos=True)
    out = llm.generate(prompt, params, use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert llm.engine.block_manager.hit_rate > 0, "siblings should reuse the prompt's cached blocks"
    for i, completion in enumerate(out.outputs):
        single = SamplingParams(max_tokens=8, temperature=1.0, seed=7 + i, ignore_eos=True)
        alone = make_llm(impl).generate(prompt, single, use_tqdm=False)[0].outputs[0]
        assert completion.token_ids == alone.token_ids
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1, "seeded siblings drew the same sample"


def test_a_sibling_whose_seed_plus_index_is_minus_one_stays_seeded(impl):
    """seed=-2, n=3 gives siblings seeds -2, -1, 0: the -1 is a seed like any other there (vLLM
    seeds a child with seed + index as it is), not the "no seed" that a request's own -1 means,
    so every sibling repeats its sample on a second run."""
    llm = make_llm(impl)
    prompt = {"prompt_token_ids": list(range(10, 22))}
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=-2, n=3, ignore_eos=True)
    first, again = (llm.generate(prompt, params, use_tqdm=False)[0] for _ in range(2))
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in first.outputs]
    assert len({tuple(c.token_ids) for c in first.outputs}) == 3, "seeded siblings drew the same sample"


def test_stream_is_cumulative_and_matches_generate(impl):
    llm = make_llm(impl)
    prompts = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [30, 31]}]
    seen: dict = {}
    for step_outputs in llm.stream(prompts, GREEDY):
        for out in step_outputs:
            before = seen.get(out.request_id)
            if before is not None:
                assert out.outputs[0].token_ids[: len(before)] == before, "stream outputs must be cumulative"
            seen[out.request_id] = out.outputs[0].token_ids
    final = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert sorted(seen.values()) == sorted(o.outputs[0].token_ids for o in final)


def test_abort_mid_flight(impl):
    engine = make_llm(impl).engine
    engine.add_request("keep", [5, 6, 7], GREEDY)
    engine.add_request("drop", [8, 9, 10], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.abort("drop") and not engine.abort("unknown")
    finals = run_all(engine)
    dropped = finals["drop"].outputs[0]
    assert dropped.finish_reason == "abort" and 0 < len(dropped.token_ids) < 20
    assert finals["keep"].outputs[0].finish_reason == "length"
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)


def _hf_log_softmax(ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir("qwen3")), dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_logprobs_and_prompt_logprobs_match_transformers(impl):
    llm = make_llm(impl, enable_prefix_caching=True)
    prompt = [5, 9, 14, 20, 33, 41, 2, 7, 11]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    out = llm.generate({"prompt_token_ids": prompt}, params, use_tqdm=False)[0]
    completion = out.outputs[0]
    ref = _hf_log_softmax(prompt + completion.token_ids)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    for p in range(1, len(prompt)):
        entry = out.prompt_logprobs[p]
        assert entry[prompt[p]] == pytest.approx(float(ref[p - 1, prompt[p]]), abs=1e-4)
    assert len(completion.logprobs) == len(completion.token_ids)
    for t, (token, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
        row = ref[len(prompt) - 1 + t]
        assert entry[token] == pytest.approx(float(row[token]), abs=1e-4)
        assert entry[token] == pytest.approx(float(row.max()), abs=1e-4), "greedy picks the top logprob"
        assert len(entry) <= 3


def _rank_bounds(row: torch.Tensor, token: int, tol: float = 1e-4) -> tuple[int, int]:
    """The ranks vLLM V1's rule (the entries >= it, itself included) allows `token` in a
    reference row whose values differ from the engine's by float rounding (up to `tol`)."""
    value = float(row[token])
    return 1 + int((row > value + tol).sum()), int((row >= value - tol).sum())


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_logprobs_are_vllm_logprob_objects(impl, async_scheduling):
    """vLLM's reads of logprobs work: `logprobs[i][token].logprob / .rank / .decoded_token`, and
    the same for prompt_logprobs, while each value is still the float (arithmetic, comparisons).
    Against transformers: the value, and the rank of the sampled (or actual prompt) token, the
    entries at or above it in the raw distribution (sampled hot, so far outside the top k); the
    top k ranked 1..k; decoded_token is tokenizer.decode([id]), None with detokenize=False."""
    llm = make_llm(impl, async_scheduling=async_scheduling)
    tokenizer = llm.get_tokenizer()
    prompt = [5, 9, 14, 20, 33, 41, 2, 7, 11]
    params = SamplingParams(
        max_tokens=5, temperature=3.0, seed=3, ignore_eos=True, logprobs=2, prompt_logprobs=2
    )
    plain = dataclasses.replace(params, detokenize=False)
    out, raw = llm.generate([{"prompt_token_ids": prompt}] * 2, [params, plain], use_tqdm=False)
    completion = out.outputs[0]
    assert raw.outputs[0].token_ids == completion.token_ids, "detokenize changes no token"
    ref = _hf_log_softmax(prompt + completion.token_ids)
    positions = [(p - 1, prompt[p], out.prompt_logprobs[p]) for p in range(1, len(prompt))]
    positions += [
        (len(prompt) - 1 + t, tok, e)
        for t, (tok, e) in enumerate(zip(completion.token_ids, completion.logprobs))
    ]
    chosen_ranks = []
    for row, token, entry in positions:
        chosen = entry[token]
        assert (
            chosen.logprob == pytest.approx(float(ref[row, token]), abs=1e-4)
            and chosen + 0.0 == chosen.logprob
        )
        low, high = _rank_bounds(ref[row], token)
        assert low <= chosen.rank <= high
        chosen_ranks.append(chosen.rank)
        top = sorted((v for t, v in entry.items() if t != token or chosen.rank <= 2), reverse=True)
        assert [v.rank for v in top] == [1, 2]
        for t, v in entry.items():
            assert v.decoded_token == tokenizer.decode([t])
    assert max(chosen_ranks) > 2, "some sampled token lies outside the top 2"
    assert all(v.decoded_token is None for e in raw.outputs[0].logprobs for v in e.values())
    assert all(v.decoded_token is None for e in raw.prompt_logprobs[1:] for v in e.values())
    assert [[(t, v.rank) for t, v in e.items()] for e in raw.outputs[0].logprobs] == [
        [(t, v.rank) for t, v in e.items()] for e in completion.logprobs
    ]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
@pytest.mark.parametrize(("lost_step", "first_missing"), [(2, 5), (4, 13)], ids=["middle", "last"])
def test_lost_prompt_logprobs_chunk_fails_the_request_naming_the_token(
    impl, async_scheduling, lost_step, first_missing
):
    """Prompt logprobs a step computed but never stored (as async scheduling once dropped a
    step) must not come back as a list shorter than the prompt, shifted against its tokens:
    the request fails (finish_reason "error") with an error naming it and the first prompt
    token without an entry. A runner that loses one step's prompt logits stands in for the
    fault: a 14-token prompt in chunks of 4 (rows predicting tokens 1-4, 5-8, 9-12, 13), losing
    the second chunk's (the third finds the gap) or the last's (the first output token finds
    the list short). The engine serves on, the pool idle afterwards."""
    llm = make_llm(impl, async_scheduling=async_scheduling, max_num_batched_tokens=4)
    runner = llm.engine.runner
    execute, calls = runner.execute, []

    def lossy(batch):
        result = execute(batch)
        calls.append(bool(result.prompt_logits))
        if len(calls) == lost_step:
            assert result.prompt_logits, "the lost step carries prompt logits"
            result.prompt_logits = {}
        return result

    runner.execute = lossy
    prompt = {"prompt_token_ids": list(range(10, 24))}
    params = dataclasses.replace(GREEDY, prompt_logprobs=1)
    out = llm.generate(prompt, params, use_tqdm=False)[0]
    completion = out.outputs[0]
    assert completion.finish_reason == "error", (completion.finish_reason, len(out.prompt_logprobs))
    assert f"request {out.request_id!r}" in completion.error
    assert f"no entry for prompt token {first_missing} " in completion.error
    runner.execute = execute
    again = llm.generate(prompt, params, use_tqdm=False)[0]
    assert again.outputs[0].finish_reason == "length" and len(again.prompt_logprobs) == 14
    check_idle(llm.engine.block_manager.state(), runner.num_blocks)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_cumulative_logprob_sums_the_sampled_tokens(impl, async_scheduling):
    """CompletionOutput.cumulative_logprob (vLLM's): the sum of the sampled tokens' logprobs,
    per sample of n > 1, for any logprobs k (0 too), matching transformers; None when the
    request did not ask for logprobs."""
    llm = make_llm(impl, async_scheduling=async_scheduling)
    prompt = [5, 9, 14, 20, 33, 41, 2, 7, 11]
    base = SamplingParams(max_tokens=5, temperature=1.0, seed=7, ignore_eos=True)
    params = [dataclasses.replace(base, n=2, logprobs=2), dataclasses.replace(base, logprobs=0), base]
    outs = llm.generate([{"prompt_token_ids": prompt}] * 3, params, use_tqdm=False)
    for out in outs[:2]:
        for c in out.outputs:
            assert type(c.cumulative_logprob) is float
            sampled = [e[t] for t, e in zip(c.token_ids, c.logprobs)]
            assert len(sampled) == 5 and c.cumulative_logprob == pytest.approx(sum(sampled), abs=1e-9)
            ref = _hf_log_softmax(prompt + c.token_ids)
            want = sum(float(ref[len(prompt) - 1 + t, tok]) for t, tok in enumerate(c.token_ids))
            assert c.cumulative_logprob == pytest.approx(want, abs=1e-3)
    assert outs[0].outputs[0].token_ids != outs[0].outputs[1].token_ids
    assert outs[2].outputs[0].cumulative_logprob is None and outs[2].outputs[0].logprobs is None


def _admissions(llm) -> tuple[dict, dict]:
    """request id -> request.num_cached_tokens when the scheduler first scheduled it, and when
    it last did (a spy on Scheduler.schedule)."""
    first: dict = {}
    last: dict = {}
    schedule = llm.engine.scheduler.schedule

    def spy():
        output = schedule()
        for request, _ in output.scheduled:
            first.setdefault(request.request_id, request.num_cached_tokens)
            last[request.request_id] = request.num_cached_tokens
        return output

    llm.engine.scheduler.schedule = spy
    return first, last


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_num_cached_tokens_counts_the_prompts_prefix_cache_hit(impl, async_scheduling):
    """RequestOutput.num_cached_tokens (vLLM's): the prompt tokens the prefix cache served at
    the request's first admission: 0 for a first prompt, its full blocks but the one holding
    the last token (8 of 9 with blocks of 4) for a repeat, 0 with prompt_logprobs (no cache
    for those); for n > 1 the first sample's."""
    llm = make_llm(impl, enable_prefix_caching=True, async_scheduling=async_scheduling)
    prompt = {"prompt_token_ids": [5, 9, 14, 20, 33, 41, 2, 7, 11]}
    first = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    again, with_prompt_lps = llm.generate(
        [prompt, prompt], [GREEDY, dataclasses.replace(GREEDY, prompt_logprobs=1)], use_tqdm=False
    )
    assert (first.num_cached_tokens, again.num_cached_tokens, with_prompt_lps.num_cached_tokens) == (0, 8, 0)
    siblings = llm.generate(
        {"prompt_token_ids": [7, 7, 3, 8, 1, 2, 6]}, dataclasses.replace(GREEDY, n=2), use_tqdm=False
    )
    assert siblings[0].num_cached_tokens == 0, "sample 0 came first; sample 1's hit is not reported"


def test_num_cached_tokens_is_the_first_admissions_under_preemption(impl):
    """Preempted requests re-admitted later (request.num_cached_tokens set again, then counting
    their own cached blocks) report the hit of their first admission, as vLLM does."""
    llm = make_llm(impl, enable_prefix_caching=True, num_blocks=12, max_num_seqs=8)
    first_seen, last_seen = _admissions(llm)
    shared = [5, 9, 14, 20, 33, 41, 2, 7]
    prompts = [{"prompt_token_ids": shared + [i + 1, i + 2]} for i in range(6)]
    params = dataclasses.replace(GREEDY, max_tokens=12)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.engine.stats.num_preemptions > 0, "the pool was meant to force preemptions"
    got = [o.num_cached_tokens for o in outs]
    assert got == [first_seen[o.request_id] for o in outs]
    assert got != [last_seen[o.request_id] for o in outs], "a re-admission found more cached blocks"
    assert got[0] == 0 and 8 in got, "later requests found the shared prefix"


def test_chat_needs_a_template_and_uses_it(impl):
    llm = make_llm(impl)
    with pytest.raises(ValueError, match="chat template"):
        llm.chat([{"role": "user", "content": "hi"}])
    llm.get_tokenizer().chat_template = "{% for m in messages %}{{ m['content'] }}|{% endfor %}"
    out = llm.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False)[0]
    assert out.prompt == "hi|" and out.prompt_token_ids == llm.get_tokenizer().encode(
        "hi|", add_special_tokens=False
    )
    assert len(out.outputs[0].token_ids) == GREEDY.max_tokens


# ---- ModelRunner ------------------------------------------------------------------------------


def _model(impl):
    from enginespec.worker.flat_model import FlatModel

    return FlatModel.from_pretrained(
        tiny_model_dir("qwen3"),
        dtype=torch.float32,
        device="cpu",
        attention=impl.attention_backend(torch.device("cpu")),
    )


def _runner(impl, model, **kwargs):
    from enginespec.worker.runner import ModelRunner

    base = dict(block_size=4, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64)
    return ModelRunner(model, impl, **{**base, **kwargs})


def test_runner_sizes_the_cpu_pool_from_bytes(impl):
    from enginespec.worker.runner import kv_bytes_per_block

    model = _model(impl)
    per_block = kv_bytes_per_block(model, 4)
    assert per_block == 2 * model.num_layers * 4 * model.num_kv_heads * model.head_dim * 4
    assert _runner(impl, model, kv_cache_bytes=7 * per_block + 5).num_blocks == 7
    assert _runner(impl, model, num_blocks=3, kv_cache_bytes=7 * per_block).num_blocks == 3
    runner = _runner(impl, model)  # default budget, capped at max_num_seqs full-length requests
    assert runner.num_blocks == 4 * 16
    assert [tuple(c.shape) for c in runner.kv_caches] == [
        (2, 65, 4, model.num_kv_heads, model.head_dim)
    ] * model.num_layers
    with pytest.raises(ValueError, match="kv_cache_bytes"):
        _runner(impl, model, kv_cache_bytes=per_block - 1)
    with pytest.raises(ValueError, match="num_blocks"):
        _runner(impl, model, num_blocks=0)


def test_runner_swap_round_trip_and_drop(impl):
    model = _model(impl)
    runner = _runner(impl, model, num_blocks=8)
    gen = torch.Generator().manual_seed(0)
    for cache in runner.kv_caches:
        cache.copy_(torch.randn(cache.shape, generator=gen))
    saved = [c[:, [1, 4, 6]].clone() for c in runner.kv_caches]
    runner.swap_out("r", [1, 4, 6])
    for cache in runner.kv_caches:
        cache[:, :8].zero_()
    runner.swap_in("r", [7, 0, 3])
    for cache, before in zip(runner.kv_caches, saved):
        assert torch.equal(cache[:, [7, 0, 3]], before)
        assert not cache[:, [1, 2]].any()
    assert runner.num_swapped == 0
    with pytest.raises(ValueError, match="no swapped-out"):
        runner.swap_in("r", [1])
    runner.swap_out("s", [2])
    runner.drop("s")
    assert runner.num_swapped == 0


def test_closing_a_stream_early_aborts_and_frees_everything(impl):
    swap = "swap" in getattr(impl, "capabilities", ())
    llm = make_llm(impl, num_blocks=6, block_size=2, preemption_mode="swap" if swap else "recompute")
    prompts = [{"prompt_token_ids": list(range(10 + 5 * i, 14 + 5 * i))} for i in range(3)]
    stream = llm.stream(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    for _, _ in zip(range(6), stream):
        pass
    stream.close()
    engine = llm.engine
    assert not engine.has_unfinished and not engine.scheduler.has_unfinished
    assert engine.runner.num_swapped == 0, "an aborted request's host copy must be dropped at once"
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)


def _swapped_ids(engine) -> list[str]:
    from enginespec.spec import Status

    return [r.request_id for r in engine.scheduler.waiting if r.status == Status.SWAPPED]


def _first_swap(engine, prompts: list[list[int]], params) -> list[str]:
    """Add `prompts` as r0, r1, ... and step until some request is swapped out; its ids."""
    for i, ids in enumerate(prompts):
        engine.add_request(f"r{i}", ids, params)
    for _ in range(50):
        engine.step()
        if _swapped_ids(engine):
            return _swapped_ids(engine)
    raise AssertionError("the workload must swap a request out")


SWAP_PARAMS = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
SWAP_PROMPTS = [list(range(5 + 7 * i, 17 + 7 * i)) for i in range(4)]


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_a_swapped_out_request_aborts_and_survives_a_prefix_cache_reset(impl, async_scheduling):
    """While a request sits in host memory (SWAPPED, no device blocks): aborting it drops its
    host copy at once; with the running ones aborted, reset_prefix_cache succeeds (no block is
    referenced) and forgets every hash, and the swapped request, brought back into blocks
    that no longer carry its hashes, still ends with its unpressured greedy tokens; a later
    request sharing its prefix gets its own unpressured tokens. Both pools end full."""
    if "swap" not in getattr(impl, "capabilities", ()):
        pytest.skip(f"impl {impl.name!r} has no 'swap' capability")
    expected = {}
    for i, ids in enumerate([*SWAP_PROMPTS, SWAP_PROMPTS[3][:10] + [40, 41]]):
        expected[f"r{i}"] = make_llm(impl).generate({"prompt_token_ids": ids}, SWAP_PARAMS, use_tqdm=False)[0]
    for abort_swapped in (True, False):
        engine = make_llm(
            impl, num_blocks=14, preemption_mode="swap", async_scheduling=async_scheduling
        ).engine
        swapped = _first_swap(engine, SWAP_PROMPTS, SWAP_PARAMS)
        assert engine.runner.num_swapped == len(swapped)
        victims = swapped if abort_swapped else [r.request_id for r in engine.scheduler.running]
        engine.abort(victims)
        if abort_swapped:
            assert engine.runner.num_swapped == 0, "an aborted swapped request's host copy must go at once"
        else:
            assert engine.reset_prefix_cache() and not engine.block_manager.state().cached
            engine.add_request("r4", SWAP_PROMPTS[3][:10] + [40, 41], SWAP_PARAMS)
        finals = run_all(engine)
        for rid, out in finals.items():
            if rid in victims:
                assert out.outputs[0].finish_reason == "abort"
            else:
                assert out.outputs[0].token_ids == expected[rid].outputs[0].token_ids, rid
        assert engine.runner.num_swapped == 0
        check_idle(engine.block_manager.state(), engine.runner.num_blocks)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_pool_is_sized_by_a_profile_run(impl):
    """On CUDA the pool takes what gpu_memory_utilization leaves after weights and the largest
    step; num_gpu_blocks_override wins over the profile."""
    from enginespec.worker.runner import kv_bytes_per_block

    # A share 2 GiB above what this process (earlier tests' models and graphs) and any other
    # already hold: the sizing is checked whatever ran before, not only on an empty GPU.
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    utilization = min(1.0, (total - free + (2 << 30)) / total)
    llm = make_llm(impl, device="cuda", num_blocks=None, gpu_memory_utilization=utilization)
    runner = llm.engine.runner
    assert runner.num_blocks >= 1
    assert runner.num_blocks * kv_bytes_per_block(llm.engine.model, 4) <= 2 << 30
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, GREEDY, use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == GREEDY.max_tokens
    assert (
        make_llm(impl, device="cuda", num_blocks=None, num_gpu_blocks_override=5).engine.runner.num_blocks
        == 5
    )
