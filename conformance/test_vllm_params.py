"""What a vLLM user's offline code passes to SamplingParams and LLM.generate, answered the way
vLLM answers it. Tiny float32 models on CPU, through the `impl` fixture."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from enginespec.conformance.invariants import check_idle
from enginespec.spec import SamplingParams, StructuredOutputsParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def make_llm(impl, **kwargs):
    from enginespec.llm import LLM

    args = dict(dtype="float32", device="cpu", block_size=4, num_blocks=32, max_model_len=64)
    return LLM(str(tiny_model_dir("qwen3")), impl=impl, **{**args, **kwargs})


def test_priority_needs_the_priority_policy(impl):
    """vLLM refuses a priority under fcfs ("priority scheduling is not enabled"); it used to be
    ignored here."""
    llm = make_llm(impl)
    prompts = [{"prompt_token_ids": [5, 6]}, {"prompt_token_ids": [7, 8]}]
    greedy = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    with pytest.raises(ValueError, match="priority.*'fcfs'"):
        llm.generate(prompts, greedy, use_tqdm=False, priority=[0, 1])
    assert not llm.engine.has_unfinished
    assert len(llm.generate(prompts, greedy, use_tqdm=False, priority=[0, 0])) == 2
    ranked = make_llm(impl, scheduling_policy="priority")
    assert len(ranked.generate(prompts, greedy, use_tqdm=False, priority=[0, 1])) == 2


def _finish_order(llm, prompts, priority) -> list[int]:
    """Indexes of `prompts` in the order their requests finished."""
    greedy = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    ids = {p["prompt_token_ids"][0]: i for i, p in enumerate(prompts)}
    order = []
    for outs in llm.stream(prompts, greedy, priority=priority):
        order += [ids[o.prompt_token_ids[0]] for o in outs if o.finished]
    return order


def test_priority_takes_numpy_integers(impl):
    """A priority list built with numpy (list(np.argsort(...))) holds numpy integers; the
    engine refused them ("priority must be an int, got np.int64(2)") where every other integer
    argument, and Request itself, takes any integral number. They now rank as the same ints."""
    import numpy as np  # a dependency of enginespec (pyproject)

    llm = make_llm(impl, scheduling_policy="priority", max_num_seqs=1)
    prompts = [{"prompt_token_ids": [5 + i, 30]} for i in range(4)]
    ranks = [2, -1, 3, 0]
    assert _finish_order(llm, prompts, ranks) == [1, 3, 0, 2]
    assert _finish_order(llm, prompts, [np.int64(r) for r in ranks]) == [1, 3, 0, 2]
    assert _finish_order(llm, prompts, np.int32(1)) == [0, 1, 2, 3]  # one value for every prompt
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)


@pytest.mark.parametrize("best_of", [2, 4])
def test_best_of_is_refused_pointing_to_n(best_of):
    """vLLM V1 dropped best_of; a ported call gets a ValueError naming it and n (it was a
    TypeError about an unexpected keyword). None and 1, which change nothing, are accepted."""
    with pytest.raises(ValueError, match=r"best_of.*\bn\b"):
        SamplingParams(best_of=best_of)
    assert SamplingParams(best_of=1) == SamplingParams(best_of=None) == SamplingParams()


@pytest.mark.parametrize("processors", [[lambda ids, logits: logits], (print,), "f", 0])
def test_logits_processors_are_refused_by_name(processors):
    """vLLM's SamplingParams(logits_processors=[fn]) (V1 refuses per-request processors at add):
    a ValueError naming the field and the fields that edit logits here (it was a TypeError
    about an unexpected keyword). None and [] are taken and change nothing."""
    with pytest.raises(
        ValueError, match=r"SamplingParams\.logits_processors must be None or \[\].*logit_bias"
    ):
        SamplingParams(logits_processors=processors)
    assert SamplingParams(logits_processors=[]) == SamplingParams(logits_processors=None) == SamplingParams()
    assert SamplingParams(logits_processors=()) == SamplingParams()  # an empty tuple is no processor too


def test_assigning_a_field_says_how_to_change_one():
    """vLLM's generate example sets fields of llm.get_default_sampling_params() from its flags
    (`sampling_params.max_tokens = args.max_tokens`). SamplingParams is frozen here (validated
    once, shared by the engine), and the assignment was dataclasses' bare "cannot assign to
    field 'max_tokens'": it still raises (FrozenInstanceError, an AttributeError, for any
    name), now naming the field, why, and the dataclasses.replace call that does it checked
    (an unknown name: that it is none)."""
    params = SamplingParams()
    for name, value in (("max_tokens", 8), ("temperature", 0.5), ("stop", ["\n"])):
        with pytest.raises(dataclasses.FrozenInstanceError) as info:
            setattr(params, name, value)
        message = str(info.value)
        assert f"SamplingParams.{name}" in message and "frozen" in message
        assert f"dataclasses.replace(params, {name}={value!r})" in message
    with pytest.raises(dataclasses.FrozenInstanceError, match="not_a_field is not a field"):
        params.not_a_field = 1
    with pytest.raises(dataclasses.FrozenInstanceError, match="SamplingParams.top_p"):
        del params.top_p
    assert params == SamplingParams()
    assert dataclasses.replace(params, max_tokens=8).max_tokens == 8


BOS = 2  # "<s>" in the tiny checkpoint's tokenizer: a special token
CHAR = 40  # "E": a plain one
#: Draws a mix of the special and the plain token (seeded, so every impl sees the same ids).
MIXED = SamplingParams(max_tokens=8, temperature=1.0, seed=3, ignore_eos=True, allowed_token_ids=[BOS, CHAR])


def _one(llm, params, prompt=(5, 6, 7)):
    return llm.generate({"prompt_token_ids": list(prompt)}, params, use_tqdm=False)[0].outputs[0]


def test_seed_minus_one_means_unseeded(impl):
    """vLLM (since its PR 4531, after OpenAI) reads seed=-1 as no seed: SamplingParams stores
    None. It was kept as the seed -1, so every such request repeated one fixed stream: the
    two requests here drew the same tokens. Other negative seeds stay seeds."""
    assert SamplingParams(seed=-1).seed is None
    assert SamplingParams(seed=-1, temperature=0.7) == SamplingParams(temperature=0.7)
    assert SamplingParams(seed=-2).seed == -2
    llm = make_llm(impl)
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=-1, ignore_eos=True)
    a, b = llm.generate([{"prompt_token_ids": [5, 6, 7]}] * 2, params, use_tqdm=False)
    assert a.outputs[0].token_ids != b.outputs[0].token_ids


@pytest.mark.parametrize("seed", [2**64, 2**70, -(2**63) - 1])
def test_seed_outside_the_64_bit_range_is_a_value_error_naming_seed(seed):
    """The sampler keys a seeded row by its seed modulo 2**64 (torch.manual_seed's range,
    [-2**63, 2**64 - 1], as EngineArgs.seed), so seed=2**64 drew exactly the stream of seed=0:
    two requests a user seeded apart repeated each other. Such a seed is now refused; the ends
    of the range and seed -1 (unseeded) still pass."""
    with pytest.raises(ValueError, match=r"SamplingParams\.seed must be"):
        SamplingParams(seed=seed)
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1
    assert SamplingParams(seed=-(2**63)).seed == -(2**63)


def test_siblings_of_a_seed_at_the_top_of_the_range_stay_seeded(impl):
    """seed=2**64 - 1, n=3 gives siblings seed + index (vLLM's rule); the sums past the range
    are taken modulo 2**64, the seed the sampler keys them by, so the refusal of such seeds
    does not break n > 1: every sibling repeats its sample on a second run, and they differ."""
    llm = make_llm(impl)
    prompt = {"prompt_token_ids": list(range(10, 22))}
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=2**64 - 1, n=3, ignore_eos=True)
    first, again = (llm.generate(prompt, params, use_tqdm=False)[0] for _ in range(2))
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in first.outputs]
    assert len({tuple(c.token_ids) for c in first.outputs}) == 3, "seeded siblings drew the same sample"
    alone = SamplingParams(max_tokens=8, temperature=1.0, seed=0, ignore_eos=True)
    assert llm.generate(prompt, alone, use_tqdm=False)[0].outputs[0].token_ids == first.outputs[1].token_ids


def test_logprobs_minus_one_is_the_whole_vocabulary(impl):
    """vLLM's logprobs=-1 / prompt_logprobs=-1: every token's logprob at each position (it was
    a ValueError). The engine sets vocab_size on add, so the max_logprobs cap applies to that
    (the default cap of 20 refuses it, as vLLM's does) and an impl's Request never sees -1."""
    everything = SamplingParams(max_tokens=3, temperature=0.0, logprobs=-1, prompt_logprobs=-1)
    with pytest.raises(ValueError, match=r"logprobs.*greater than max allowed: 20"):
        _one(make_llm(impl), everything)
    llm = make_llm(impl, max_logprobs=-1)
    vocab = llm.engine.vocab_size
    out = llm.generate({"prompt_token_ids": [5, 6, 7]}, everything, use_tqdm=False)[0]
    same = dataclasses.replace(everything, logprobs=vocab, prompt_logprobs=vocab)
    want = llm.generate({"prompt_token_ids": [5, 6, 7]}, same, use_tqdm=False)[0]
    assert [len(e) for e in out.outputs[0].logprobs] == [vocab] * 3
    assert out.outputs[0].logprobs == want.outputs[0].logprobs
    assert out.prompt_logprobs[1:] == want.prompt_logprobs[1:] and len(out.prompt_logprobs[1]) == vocab
    for name in ("logprobs", "prompt_logprobs"):
        with pytest.raises(ValueError, match=f"{name}.*resolved by the engine"):
            impl.new_request("r", [1, 2], SamplingParams(**{name: -1}))


def test_text_settings_have_vllms_names_and_defaults():
    params = SamplingParams()
    assert (params.skip_special_tokens, params.spaces_between_special_tokens) == (True, True)


@pytest.mark.parametrize("name", ["stop", "stop_token_ids", "bad_words"])
def test_none_is_vllms_default_for_the_stop_and_ban_lists(name):
    """vLLM declares stop, stop_token_ids and bad_words Optional with None the default, so a
    ported call passes None (stop=args.stop); it means no stops, no bans. stop and bad_words
    used to refuse it ("must be a str or a list"); a non-list is still refused."""
    assert SamplingParams(**{name: None}) == SamplingParams()
    with pytest.raises(ValueError, match=name):
        SamplingParams(**{name: 5})


def test_skip_special_tokens_decides_whether_special_tokens_show(impl):
    llm = make_llm(impl)
    tok = llm.get_tokenizer()
    skipped = _one(llm, MIXED)
    assert {BOS, CHAR} <= set(skipped.token_ids), "the seed must draw both tokens for this test to bite"
    assert (
        skipped.text == tok.decode(skipped.token_ids, skip_special_tokens=True) and "<s>" not in skipped.text
    )
    for extra in ({}, {"stop": ["never"]}):  # decoded at the end, or id by id watching a stop string
        kept = _one(llm, dataclasses.replace(MIXED, skip_special_tokens=False, **extra))
        assert kept.token_ids == skipped.token_ids
        assert kept.text == tok.decode(kept.token_ids, skip_special_tokens=False) and "<s>" in kept.text
        spaced = dataclasses.replace(MIXED, skip_special_tokens=False, spaces_between_special_tokens=False)
        assert (
            _one(llm, dataclasses.replace(spaced, **extra)).text == kept.text
        )  # a fast tokenizer ignores it


def test_detokenize_false_returns_ids_and_empty_text(impl):
    assert SamplingParams().detokenize is True
    llm = make_llm(impl)
    with_text = _one(llm, MIXED)
    without = _one(llm, dataclasses.replace(MIXED, detokenize=False))
    assert without.token_ids == with_text.token_ids and with_text.text
    assert without.text == "" and without.finish_reason == "length"
    with pytest.raises(ValueError, match="stop.*detokenize"):  # vLLM refuses the pair too
        SamplingParams(stop=["x"], detokenize=False)


def test_max_tokens_none_runs_up_to_max_model_len(impl):
    """vLLM's meaning of None: the engine sets max_model_len - prompt length on add (the
    default stays 16); a min_tokens beyond that room is lowered with it."""
    assert SamplingParams().max_tokens == 16
    llm = make_llm(impl)
    greedy = SamplingParams(max_tokens=None, temperature=0.0, ignore_eos=True, min_tokens=50)
    out = _one(llm, greedy, prompt=range(5, 10))
    assert len(out.token_ids) == 64 - 5 and out.finish_reason == "length"
    out = _one(llm, greedy, prompt=range(4, 64))  # 60 tokens leave 4 outputs, under min_tokens
    assert len(out.token_ids) == 4 and out.finish_reason == "length"
    out = _one(llm, greedy, prompt=[5] * 64)  # exactly max_model_len: one token (vLLM's rule)
    assert len(out.token_ids) == 1 and out.finish_reason == "length"
    with pytest.raises(ValueError, match="max_model_len"):
        _one(llm, greedy, prompt=[5] * 65)
    assert not llm.engine.has_unfinished
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)


def test_max_tokens_past_max_model_len_ends_there(impl):
    """vLLM's engine ends a request at max_model_len with finish_reason "length" rather than
    refusing prompt + max_tokens > max_model_len (it was a ValueError: a 63-token prompt at
    max_model_len 64 was refused even at the default max_tokens of 16); min_tokens is lowered
    with it. Greedy ids equal a run asked for exactly the room."""
    llm = make_llm(impl)
    prompt = list(range(4, 54))  # 50 tokens: 14 outputs of room
    asked = _one(llm, SamplingParams(max_tokens=100, min_tokens=30, temperature=0.0, ignore_eos=True), prompt)
    exact = _one(llm, SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True), prompt)
    assert asked.finish_reason == "length" and asked.token_ids == exact.token_ids
    assert len(asked.token_ids) == 14
    assert len(_one(llm, SamplingParams(ignore_eos=True), list(range(4, 67))).token_ids) == 1  # 63 + 16 > 64
    assert not llm.engine.has_unfinished
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)


def test_max_tokens_none_keeps_the_pool_bound(impl):
    """The resolved max_tokens meets the same checks as a chosen one (here: the pool's)."""
    llm = make_llm(impl, num_blocks=8)  # 32 tokens of KV, under the chosen max_model_len of 64
    with pytest.raises(ValueError, match="num_blocks"):
        _one(llm, SamplingParams(max_tokens=None), prompt=[5, 6])
    assert not llm.engine.has_unfinished


def test_an_unresolved_max_tokens_never_reaches_a_request(impl):
    """Only the engine knows the model's length: an impl's Request refuses None, naming it."""
    with pytest.raises(ValueError, match="max_tokens"):
        impl.new_request("r", [1, 2], SamplingParams(max_tokens=None))


@pytest.mark.parametrize("bad", [True, 3, -1, "DELTA", None, 1.0])
def test_output_kind_takes_vllms_request_output_kind(bad):
    from enginespec.spec import RequestOutputKind

    assert SamplingParams().output_kind is RequestOutputKind.CUMULATIVE
    assert SamplingParams(output_kind=1).output_kind is RequestOutputKind.DELTA
    with pytest.raises(ValueError, match="SamplingParams.output_kind must be a RequestOutputKind"):
        SamplingParams(output_kind=bad)


def test_stream_honours_output_kind(impl):
    """LLM.stream under each output kind: DELTA outputs concatenate (per sample) to generate()'s
    output, the sample's last delta alone carries its finish_reason; FINAL_ONLY yields each
    request once, finished; CUMULATIVE's last output is generate()'s. n = 2 samples of different
    lengths (a stop token) and two prompts, so samples and requests finish at different steps."""
    from enginespec.spec import RequestOutputKind

    llm = make_llm(impl)
    prompts = [{"prompt_token_ids": [5, 6, 7]}, {"prompt_token_ids": [9, 4]}]
    base = SamplingParams(max_tokens=12, temperature=1.0, seed=3, n=2, logprobs=1, ignore_eos=True)
    want = llm.generate(prompts, base, use_tqdm=False)
    stop = want[0].outputs[1].token_ids[4]  # sample 1 of prompt 0 stops early
    base = dataclasses.replace(base, stop_token_ids=(stop,))
    want = llm.generate(prompts, base, use_tqdm=False)

    def run(kind):
        params = dataclasses.replace(base, output_kind=kind)
        return [out for step in llm.stream(prompts, params) for out in step]

    by_id = {}
    for out in run(RequestOutputKind.DELTA):
        by_id.setdefault(out.request_id, []).append(out)
    assert len(by_id) == 2
    for outs, final in zip(by_id.values(), want):
        for c in final.outputs:
            parts = [s for o in outs for s in o.outputs if s.index == c.index]
            assert sum((s.token_ids for s in parts), []) == c.token_ids
            assert "".join(s.text for s in parts) == c.text
            assert sum((s.logprobs for s in parts), []) == c.logprobs
            assert [s.finish_reason for s in parts] == [None] * (len(parts) - 1) + [c.finish_reason]
            assert parts[-1].cumulative_logprob == pytest.approx(c.cumulative_logprob)
        assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    finals = run(RequestOutputKind.FINAL_ONLY)
    assert [o.finished for o in finals] == [True, True]
    summary = lambda o: [(c.token_ids, c.text, c.finish_reason) for c in o.outputs]  # noqa: E731
    assert sorted(map(summary, finals)) == sorted(map(summary, want))
    cumulative = run(RequestOutputKind.CUMULATIVE)
    assert sorted(summary(o) for o in cumulative if o.finished) == sorted(map(summary, want))
    check_idle(llm.engine.block_manager.state(), llm.engine.block_manager.num_blocks)


def test_stream_never_shows_text_a_stop_string_takes_back(impl):
    """A running sample's streamed text holds back its tail while that tail may still begin a
    stop string (vLLM hides it the same way, as AsyncLLM and the server do here): CUMULATIVE
    texts only grow, each a prefix of generate()'s, and DELTA texts concatenate to it. The stop
    string here is two one-char tokens of the greedy output, so after its first token the text
    ends with a stop's prefix; LLM.stream used to show that char and then take it back (the
    deltas concatenated to one char more than the final text)."""
    from enginespec.spec import RequestOutputKind

    llm = make_llm(impl)
    prompt = {"prompt_token_ids": [5, 6, 7]}
    base = SamplingParams(max_tokens=10, temperature=0.0, allowed_token_ids=list(PLAIN))
    text = llm.generate(prompt, base, use_tqdm=False)[0].outputs[0].text
    k = next(k for k in range(1, len(text) - 1) if text.find(text[k : k + 2]) == k)
    params = dataclasses.replace(base, stop=(text[k : k + 2],))
    want = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
    assert (want.text, want.finish_reason) == (text[:k], "stop")

    def texts(kind):
        streamed = llm.stream(prompt, dataclasses.replace(params, output_kind=kind))
        return [c.text for step in streamed for out in step for c in out.outputs]

    cumulative = texts(RequestOutputKind.CUMULATIVE)
    assert all(want.text.startswith(t) for t in cumulative), cumulative
    assert cumulative[-1] == want.text
    assert "".join(texts(RequestOutputKind.DELTA)) == want.text
    check_idle(llm.engine.block_manager.state(), llm.engine.block_manager.num_blocks)


def test_stream_delta_carries_prompt_logprobs_once(impl):
    """Under DELTA an output carries only what is new, prompt logprobs included (vLLM pops
    them into the first output that has them): the deltas' prompt_logprobs concatenate to
    generate()'s, the leading None once. Every delta used to repeat the whole list (here 2
    samples of 5 tokens: the list came 5 times or more)."""
    from enginespec.spec import RequestOutputKind

    llm = make_llm(impl)
    prompt = {"prompt_token_ids": [5, 6, 7, 8]}
    params = SamplingParams(max_tokens=5, temperature=1.0, seed=3, n=2, ignore_eos=True, prompt_logprobs=1)
    want = llm.generate(prompt, params, use_tqdm=False)[0].prompt_logprobs
    delta = dataclasses.replace(params, output_kind=RequestOutputKind.DELTA)
    outs = [out for step in llm.stream(prompt, delta) for out in step]
    assert len(outs) > 1
    assert sum((out.prompt_logprobs or [] for out in outs), []) == want


# ---- vLLM's request extras: bad_words, truncate_prompt_tokens, logprobs=True, extra_args

#: plain characters of the tiny tokenizer ("E" .. "J"): one token each, so a word's text is its ids
PLAIN = tuple(range(CHAR, CHAR + 6))


def _pairs(ids) -> set:
    return set(zip(ids, ids[1:]))


def test_bad_words_are_never_generated(impl):
    """vLLM's bad_words (it was a TypeError): a one-token word is never drawn, a two-token word
    never completed, with or without async scheduling. The ban reads the newest output token,
    so with async scheduling the engine resolves the step before (as for a grammar) and the
    draw stays on the device: every decode step of the banned run is still async. Seeded draws
    over six plain characters, so the free run holds both words and the banned run must avoid
    them."""
    from enginespec.engine.async_scheduling import deferrable

    llm = make_llm(impl)
    tok = llm.get_tokenizer()
    base = SamplingParams(max_tokens=16, temperature=1.0, seed=11, ignore_eos=True, allowed_token_ids=PLAIN)
    free = _one(llm, base).token_ids
    single = free[0]
    pair = next(p for p in zip(free, free[1:]) if single not in p)
    banned = dataclasses.replace(base, bad_words=[tok.decode([single]), " " + tok.decode(list(pair))])
    assert banned.bad_words_token_ids == ()  # tokenized by the engine, on add
    stats = llm.engine.stats
    steps, async_steps = stats.num_steps, stats.num_async_steps
    out = _one(llm, banned).token_ids
    assert single not in out and pair not in _pairs(out) and len(out) == 16
    if deferrable([impl.new_request("probe", [1], base, arrival_time=0.0)]):
        assert stats.num_async_steps - async_steps == stats.num_steps - steps  # none serial
    assert _one(make_llm(impl, async_scheduling=False), banned).token_ids == out
    ids = dataclasses.replace(base, bad_words_token_ids=[[single], list(pair)])  # the same, as ids
    assert _one(llm, ids).token_ids == out


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bad_words": ["ok", ""]}, "bad_words must be non-empty strings"),
        ({"bad_words": [b"x"]}, "bad_words must be non-empty strings"),
        ({"bad_words_token_ids": [[1], []]}, "bad_words_token_ids must be non-empty"),
        ({"bad_words_token_ids": [[1, -2]]}, "bad_words_token_ids must hold token ids"),
        ({"bad_words_token_ids": [[t] for t in range(129)]}, "at most 128 token sequences"),
    ],
)
def test_bad_words_bounds(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


class _OneIdPerWord:
    """A tokenizer giving each CJK character word one id, the same with a space before it (so
    with_bad_words_tokens adds one sequence a word)."""

    def encode(self, text, add_special_tokens=True):
        return [ord(text.strip()) - 0x4E00]


def test_bad_words_take_exactly_128_sequences():
    """The bound is inclusive (vLLM's VLLM_MAX_NUM_BAD_WORDS = 128), given as ids or tokenized."""
    assert len(SamplingParams(bad_words_token_ids=[[t] for t in range(128)]).bad_words_token_ids) == 128
    words = [chr(0x4E00 + i) for i in range(128)]
    tokenized = SamplingParams(bad_words=words).with_bad_words_tokens(_OneIdPerWord())
    assert tokenized.bad_words_token_ids == tuple((i,) for i in range(128))
    with pytest.raises(ValueError, match="bad_words must be at most 128 token sequences once tokenized"):
        SamplingParams(bad_words=[*words, chr(0x4E00 + 128)]).with_bad_words_tokens(_OneIdPerWord())


def test_bad_words_are_checked_on_add(impl):
    """Against the vocabulary and vLLM's bound of 128 sequences once tokenized; one bad
    request leaves nothing queued."""
    llm = make_llm(impl)
    assert SamplingParams(bad_words=["a", "a", "b"]).bad_words == ("a", "b")  # repeats dropped
    with pytest.raises(ValueError, match=r"bad_words_token_ids must be token ids < vocab_size \(96\)"):
        _one(llm, SamplingParams(bad_words_token_ids=[[96]]))
    words = [chr(0x4E00 + i) * 2 for i in range(129)]  # 129 words, one sequence each here
    with pytest.raises(ValueError, match="bad_words must be at most 128 token sequences"):
        _one(llm, SamplingParams(bad_words=words))
    assert not llm.engine.has_unfinished


def test_truncate_prompt_tokens_keeps_the_last_tokens(impl):
    """vLLM's truncate_prompt_tokens (it was a TypeError): k keeps the prompt's last k tokens,
    -1 up to max_model_len; k above max_model_len, 0 and below -1 are ValueErrors naming it."""
    llm = make_llm(impl)
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    prompt = list(range(5, 25))
    cut = llm.generate({"prompt_token_ids": prompt}, dataclasses.replace(greedy, truncate_prompt_tokens=6))[0]
    assert cut.prompt_token_ids == prompt[-6:]
    assert cut.outputs[0].token_ids == _one(llm, greedy, prompt[-6:]).token_ids
    whole = dataclasses.replace(greedy, truncate_prompt_tokens=-1)
    assert llm.generate({"prompt_token_ids": prompt}, whole)[0].prompt_token_ids == prompt
    assert dataclasses.replace(greedy, truncate_prompt_tokens=64).truncate_prompt_tokens == 64
    with pytest.raises(ValueError, match=r"truncate_prompt_tokens must be <= max_model_len \(64\)"):
        _one(llm, dataclasses.replace(greedy, truncate_prompt_tokens=65))
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match=r"truncate_prompt_tokens must be (an int|None, -1)"):
            SamplingParams(truncate_prompt_tokens=bad)
    assert not llm.engine.has_unfinished


def test_logprobs_true_means_one(impl):
    """vLLM reads logprobs=True (and prompt_logprobs=True) as 1; they were ValueErrors."""
    assert SamplingParams(logprobs=True, prompt_logprobs=True) == SamplingParams(
        logprobs=1, prompt_logprobs=1
    )
    assert SamplingParams(logprobs=False).logprobs == 0
    llm = make_llm(impl)
    one = _one(llm, SamplingParams(max_tokens=3, temperature=0.0, logprobs=1))
    assert _one(llm, SamplingParams(max_tokens=3, temperature=0.0, logprobs=True)).logprobs == one.logprobs


def test_extra_args_pass_through(impl):
    """vLLM's extra_args (it was a TypeError): a dict kept as given, read by nothing in the
    engine, so the output is the one without it; anything but a dict is refused."""
    params = SamplingParams(max_tokens=3, temperature=0.0, extra_args={"plugin": [1, 2]})
    assert params.extra_args == {"plugin": [1, 2]}
    llm = make_llm(impl)
    plain = dataclasses.replace(params, extra_args=None)
    assert _one(llm, params).token_ids == _one(llm, plain).token_ids
    with pytest.raises(ValueError, match="extra_args must be None or a dict"):
        SamplingParams(extra_args=[("plugin", 1)])


def test_min_tokens_over_allowed_ids_that_all_stop_is_refused_naming_both(impl):
    """allowed_token_ids of stop tokens only (the EOS, a stop_token_ids entry) with min_tokens:
    min_tokens bans every allowed id until that many tokens are out, so no token could be
    drawn; the engine drew token 0, an id the request never allowed ([0, 0, 3] for an allowed
    [3] and min_tokens 2). It is refused on add, naming both fields; other requests unaffected."""
    llm = make_llm(impl)
    eos = llm.engine.tokenizer.eos_token_id
    for params in (
        SamplingParams(max_tokens=4, min_tokens=2, allowed_token_ids=[eos]),
        SamplingParams(max_tokens=4, min_tokens=1, allowed_token_ids=[7, 9], stop_token_ids=[7, 9]),
        # min_tokens bans the EOS under ignore_eos too (vLLM's rule), so nothing is left there either
        SamplingParams(max_tokens=3, min_tokens=2, allowed_token_ids=[eos], ignore_eos=True),
    ):
        with pytest.raises(
            ValueError, match=r"allowed_token_ids .* are all stop ids or the EOS, and min_tokens \(\d\)"
        ):
            _one(llm, params)
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)
    # still fine: a non-stop id allowed beside them, the EOS alone without min_tokens
    fine = [
        SamplingParams(max_tokens=3, min_tokens=2, allowed_token_ids=[eos, 9], temperature=0.0),
        SamplingParams(max_tokens=3, allowed_token_ids=[eos], ignore_eos=True),
        SamplingParams(max_tokens=3, allowed_token_ids=[eos]),
    ]
    assert _one(llm, fine[0]).token_ids[:2] == [9, 9]
    assert _one(llm, fine[1]).token_ids == [eos] * 3
    assert _one(llm, fine[2]).token_ids == [eos]


def test_allowed_ids_that_bad_words_ban_are_refused_naming_both(impl):
    """A one-token bad word bans its id at every step, so allowed_token_ids all among such words
    leave nothing ever to draw, and, under min_tokens, allowed ids all among those words, the
    stop ids and the EOS leave nothing until then: the engine drew token 0, an id the request
    never allowed ([0, 0, 0, 0] for allowed [10] with bad word "<10>"; [0, 0, 3] for allowed
    [eos, 10] and min_tokens 2). Refused on add, naming the fields; other requests unaffected;
    a bad word of several tokens bans nothing for sure, so it still runs."""
    llm = make_llm(impl)
    tokenizer = llm.engine.tokenizer
    eos, word = tokenizer.eos_token_id, tokenizer.decode([10])
    for params, match in (
        (
            SamplingParams(max_tokens=4, allowed_token_ids=[10], bad_words=[word]),
            r"allowed_token_ids.*bad_words",
        ),
        (
            SamplingParams(max_tokens=4, allowed_token_ids=[10, 12], bad_words_token_ids=[[10], [12]]),
            r"allowed_token_ids.*bad_words",
        ),
        (
            SamplingParams(max_tokens=4, min_tokens=2, allowed_token_ids=[eos, 10], bad_words=[word]),
            r"allowed_token_ids.*bad_words.*min_tokens \(2\)",
        ),
    ):
        with pytest.raises(ValueError, match=match):
            _one(llm, params)
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)
    free = SamplingParams(
        max_tokens=3, allowed_token_ids=[10, 12], bad_words_token_ids=[[12, 10]], temperature=0.0
    )
    assert set(_one(llm, free).token_ids) <= {10, 12}
    two = SamplingParams(max_tokens=3, min_tokens=2, allowed_token_ids=[eos, 10, 12], bad_words=[word])
    assert _one(llm, two).token_ids[:2] == [12, 12]  # 10 banned, the EOS held by min_tokens


def test_one_token_bad_words_over_the_whole_vocabulary_are_refused(impl):
    """Without allowed_token_ids, one-token bad words that ban every id of the vocabulary (a
    vocabulary of at most 128 ids, the bound on bad words: the tiny checkpoint's 96) left
    nothing to draw and the request drew token 0 ([0, 0, 0], "length"), as allowed ids all
    banned did before the add check refused those; so, under min_tokens, did words banning all
    but the stop ids and the EOS. Both are refused on add, naming bad_words (and min_tokens);
    the EOS left free alone is drawn and ends the request."""
    llm = make_llm(impl)
    vocab, eos = llm.engine.vocab_size, llm.engine.tokenizer.eos_token_id
    assert vocab <= 128
    but_eos = [[t] for t in range(vocab) if t != eos]
    for params, match in (
        (
            SamplingParams(max_tokens=3, bad_words_token_ids=[[t] for t in range(vocab)]),
            rf"the vocabulary's {vocab} ids \(no allowed_token_ids\) are all banned by one-token bad_words",
        ),
        (
            SamplingParams(max_tokens=3, min_tokens=2, bad_words_token_ids=but_eos),
            r"the vocabulary's .* are all stop ids, the EOS or banned by bad_words, and min_tokens \(2\)",
        ),
    ):
        with pytest.raises(ValueError, match=match):
            _one(llm, params)
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)
    out = _one(llm, SamplingParams(max_tokens=3, temperature=0.0, bad_words_token_ids=but_eos))
    assert (out.token_ids, out.finish_reason) == ([eos], "stop")


#: After a 10, bad words ban 10 and 12: a request allowed only those (and stop ids) has nothing
#: left but its stop ids at its second token; the bias makes its first token a 10.
EMPTYING = dict(bad_words_token_ids=[[10, 12], [10, 10]], logit_bias={10: 100})


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "random"])
def test_min_tokens_yields_where_bad_words_leave_only_stop_ids(impl, async_scheduling, temperature):
    """allowed_token_ids and bad words (never to emit) outrank min_tokens (a soft lower bound):
    where, mid-generation, bad words of several tokens have banned every allowed id but the stop
    ids, the min_tokens ban yields, the request draws an allowed stop id and ends "stop" below
    min_tokens. It drew token 0, never allowed ([10, 0, 10, 3] for the first case), greedy and
    random, serial and async. A stop id ends it with its stop_reason; at the max_tokens-th
    token the stop wins over the length, as a stop does at any other token."""
    llm = make_llm(impl, async_scheduling=async_scheduling)
    eos = llm.engine.tokenizer.eos_token_id
    common = dict(EMPTYING, temperature=temperature, seed=1)
    for params, want, reason in (
        (
            SamplingParams(max_tokens=4, min_tokens=3, allowed_token_ids=[eos, 10, 12], **common),
            [10, eos],
            None,
        ),
        (
            SamplingParams(
                max_tokens=4, min_tokens=3, allowed_token_ids=[7, 10, 12], stop_token_ids=[7], **common
            ),
            [10, 7],
            7,
        ),
        (
            SamplingParams(max_tokens=2, min_tokens=2, allowed_token_ids=[eos, 10, 12], **common),
            [10, eos],
            None,
        ),
    ):
        out = _one(llm, params)
        assert (out.token_ids, out.finish_reason, out.stop_reason) == (want, "stop", reason), params
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["serial", "async"])
def test_bad_words_that_leave_no_allowed_id_end_that_request_alone_with_an_error(impl, async_scheduling):
    """Where bad words of several tokens ban every allowed id mid-generation and no stop id is
    allowed either, no token can be drawn: the request ends "error" there, naming
    allowed_token_ids, bad_words_token_ids and the output token, and shows only its allowed
    tokens. It drew token 0 ([10, 0, 10, 0], "length"). The other requests of the batch give
    what they give alone; min_tokens changes nothing (no stop id to yield to)."""
    llm = make_llm(impl, async_scheduling=async_scheduling)
    plain = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    seeded = SamplingParams(max_tokens=5, temperature=1.0, seed=4, ignore_eos=True)
    alone = [_one(llm, plain, (8, 9)).token_ids, _one(llm, seeded, (9, 8)).token_ids]
    for extra in ({}, {"min_tokens": 3}):
        empties = SamplingParams(
            max_tokens=4, allowed_token_ids=[10, 12], temperature=0.0, logprobs=1, **EMPTYING, **extra
        )
        prompts = [{"prompt_token_ids": p} for p in ([8, 9], [5, 6, 7], [9, 8])]
        outs = [o.outputs[0] for o in llm.generate(prompts, [plain, empties, seeded], use_tqdm=False)]
        assert (outs[1].token_ids, outs[1].finish_reason, len(outs[1].logprobs)) == ([10], "error", 1)
        named = (
            r"output token 1\b.*allowed_token_ids \[10, 12\].*bad_words_token_ids \[\[10, 12\], \[10, 10\]\]"
        )
        assert re.search(named, outs[1].error), outs[1].error
        assert [outs[0].token_ids, outs[2].token_ids] == alone
        assert outs[0].finish_reason == outs[2].finish_reason == "length"
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)


def test_a_request_refused_at_its_last_token_ends_error_and_the_batch_still_finishes(impl):
    """The refused request's own finish leaves that step's finishes ("error", not "length" at
    its max_tokens-th token), and only it: a request of the batch that reaches its max_tokens
    at that same step still ends "length" with its tokens."""
    llm = make_llm(impl)
    plain = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    empties = SamplingParams(max_tokens=2, allowed_token_ids=[10, 12], temperature=0.0, **EMPTYING)
    alone = _one(llm, plain, (8, 9)).token_ids
    prompts = [{"prompt_token_ids": p} for p in ([8, 9], [5, 6, 7])]
    outs = [o.outputs[0] for o in llm.generate(prompts, [plain, empties], use_tqdm=False)]
    assert (outs[1].token_ids, outs[1].finish_reason) == ([10], "error")
    assert (outs[0].token_ids, outs[0].finish_reason) == (alone, "length")
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)


def test_min_tokens_over_stop_only_allowed_ids_under_a_grammar_is_checked_after_its_marker(impl):
    """A grammar masks the row from the first token, and min_tokens yields to it (the request
    ends "stop"), so allowed ids that are all stop ids are taken with min_tokens there. Before
    a start marker no grammar masks the row: allowed stop ids under min_tokens then leave
    nothing to draw, and are refused on add as without a grammar."""
    llm = make_llm(impl)
    eos = llm.engine.tokenizer.eos_token_id
    common = dict(max_tokens=3, min_tokens=2, allowed_token_ids=[eos], temperature=0.0)
    out = _one(llm, SamplingParams(structured_outputs=StructuredOutputsParams(regex="a*"), **common))
    assert out.finish_reason == "stop"
    marked = StructuredOutputsParams(regex="a*", start_after_token_ids=[9])
    with pytest.raises(ValueError, match=r"allowed_token_ids .* are all stop ids or the EOS, and min_tokens"):
        _one(llm, SamplingParams(structured_outputs=marked, **common))
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)


def test_a_refusal_inside_a_speculative_steps_tokens_keeps_the_tokens_before_it(impl):
    """Under ngram speculative decoding a step brings several tokens: where its second is one the
    hard constraints refuse (after 10, 14 every allowed id is banned), the request ends "error"
    at that output token (2, counted over the whole output), showing the step's tokens before
    it."""
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2, "prompt_lookup_min": 1}
    llm = make_llm(impl, speculative_config=spec)
    words = [[10, 10], [10, 12], [10, 14, 10], [10, 14, 12], [10, 14, 14]]
    params = SamplingParams(
        max_tokens=6,
        allowed_token_ids=[10, 12, 14],
        bad_words_token_ids=words,
        logit_bias={10: 100},
        temperature=0.0,
    )
    out = _one(llm, params, (5, 10, 14, 6, 7, 10, 14, 6))  # the drafts propose 14 after 10
    assert (out.token_ids, out.finish_reason) == ([10, 14], "error")
    assert re.search(r"output token 2 \(0-based\)", out.error), out.error
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)


def test_bad_words_alone_outrank_min_tokens_and_end_a_request_they_leave_nothing(impl):
    """Without allowed_token_ids, bad words of two tokens over the tiny vocabulary (96 ids, under
    the 128 words' bound) can ban every id after a 10: where they leave only the EOS, min_tokens
    yields and the request ends "stop" at it; where they leave nothing, it ends "error" there,
    naming allowed_token_ids None. Bad words are hard constraints whether or not allowed ids
    are given."""
    llm = make_llm(impl)
    vocab, eos = llm.engine.vocab_size, llm.engine.tokenizer.eos_token_id
    common = dict(max_tokens=5, min_tokens=3, logit_bias={10: 100}, temperature=0.0)
    but_eos = SamplingParams(bad_words_token_ids=[[10, t] for t in range(vocab) if t != eos], **common)
    out = _one(llm, but_eos)
    assert (out.token_ids, out.finish_reason, out.stop_reason) == ([10, eos], "stop", None)
    every = SamplingParams(bad_words_token_ids=[[10, t] for t in range(vocab)], **common)
    out = _one(llm, every)
    assert (out.token_ids, out.finish_reason) == ([10], "error")
    assert re.search(r"output token 1\b.*allowed_token_ids None \(every id\)", out.error), out.error
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)


@pytest.fixture(scope="module")
def held_llms(impl):
    """One engine per async_scheduling setting, built on first use."""
    built: dict = {}

    def get(async_scheduling: bool):
        if async_scheduling not in built:
            built[async_scheduling] = make_llm(impl, async_scheduling=async_scheduling)
        return built[async_scheduling]

    return get


def _ban(words, past) -> set:
    """vLLM's bad-words rule, written out again: the last token of each word whose other tokens
    end the output so far."""
    return {
        w[-1] for w in words if len(w) - 1 <= len(past) and list(past[len(past) - len(w) + 1 :]) == w[:-1]
    }


EOS_ID = 3  # the tiny qwen3's
HARD_IDS = [EOS_ID, 7, 10, 12, 14]


def _emptying(allowed, min_tokens, stop_seven, temperature, async_scheduling):
    """An example whose bans empty its allowed ids after its favoured first token, 10."""
    return example(
        allowed=allowed,
        words=[[10, 12], [10, 10]],
        min_tokens=min_tokens,
        favoured=10,
        stop_seven=stop_seven,
        temperature=temperature,
        async_scheduling=async_scheduling,
    )


@settings(max_examples=40, deadline=None)
@_emptying([EOS_ID, 10, 12], 3, False, 0.0, True)  # min_tokens yields to the EOS
@_emptying([7, 10, 12], 4, True, 1.0, False)  # to the stop id 7
@_emptying([10, 12], 2, False, 1.0, True)  # nothing to yield to: "error"
@given(
    allowed=st.lists(st.sampled_from(HARD_IDS), min_size=1, max_size=4, unique=True),
    words=st.lists(st.lists(st.sampled_from(HARD_IDS[1:]), min_size=2, max_size=2), max_size=6),
    min_tokens=st.integers(0, 4),
    favoured=st.sampled_from(HARD_IDS[1:]),
    stop_seven=st.booleans(),
    temperature=st.sampled_from([0.0, 1.0]),
    async_scheduling=st.booleans(),
)
def test_hard_constraints_are_never_broken_and_outrank_min_tokens(
    held_llms, allowed, words, min_tokens, favoured, stop_seven, temperature, async_scheduling
):
    """Any allowed_token_ids, bad words of two tokens, min_tokens, stop ids and a favoured id
    (logit_bias): no output id is
    one its allowed ids or bad words refuse; a stop id comes before min_tokens only as the last
    id of a "stop" finish where nothing else was left (min_tokens yields to the hard
    constraints); "error" only where nothing at all was left; "length" at max_tokens."""
    llm = held_llms(async_scheduling)
    stops = {EOS_ID, 7} if stop_seven else {EOS_ID}
    params = SamplingParams(
        max_tokens=5,
        min_tokens=min_tokens,
        allowed_token_ids=allowed,
        bad_words_token_ids=words,
        logit_bias={favoured: 100},  # so that bad words starting with it bite
        stop_token_ids=[7] if stop_seven else None,
        temperature=temperature,
        seed=2,
    )
    if min_tokens and set(allowed) <= stops:
        with pytest.raises(ValueError, match="min_tokens"):
            _one(llm, params)
        return
    out = _one(llm, params)
    ids = out.token_ids
    for k, token in enumerate(ids):
        free = set(allowed) - _ban(words, ids[:k])
        assert token in free, (k, ids)
        if k < min_tokens and token in stops:
            assert not free - stops and k == len(ids) - 1, (k, ids)
    if out.finish_reason == "error":
        assert not set(allowed) - _ban(words, ids), ids
        assert "allowed_token_ids" in out.error and "bad_words_token_ids" in out.error
    elif out.finish_reason == "length":
        assert len(ids) == 5 and not (ids[-1] in stops and len(ids) > min_tokens)
    else:
        assert out.finish_reason == "stop" and ids[-1] in stops, (out.finish_reason, ids)
