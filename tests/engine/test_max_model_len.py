"""A max_model_len the user did not choose is fitted to the KV pool (EngineCore._fit_max_model_len)."""

from __future__ import annotations

import logging

import pytest

from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _llm(**kwargs):
    from enginespec.llm import LLM

    return LLM(
        str(tiny_model_dir("qwen3")), impl="fast", dtype="float32", device="cpu", block_size=4, **kwargs
    )


def test_the_models_length_is_lowered_to_what_the_pool_holds(caplog):
    with caplog.at_level(logging.WARNING, logger="enginespec.engine.engine_core"):
        llm = _llm(num_blocks=8)  # 32 tokens, under the tiny model's 256 positions
    assert llm.engine.max_model_len == 32 == llm.engine.scheduler_config.max_model_len
    assert "max_model_len lowered" in caplog.text
    capped = llm.generate(  # past the fitted length: ends there ("length"), as vLLM's engine does
        {"prompt_token_ids": [5] * 20}, SamplingParams(max_tokens=13, ignore_eos=True), use_tqdm=False
    )
    assert len(capped[0].outputs[0].token_ids) == 12 and capped[0].outputs[0].finish_reason == "length"
    out = llm.generate(
        {"prompt_token_ids": [5] * 20}, SamplingParams(max_tokens=12, ignore_eos=True), use_tqdm=False
    )
    assert len(out[0].outputs[0].token_ids) == 12  # a request of the fitted length runs


def test_a_chosen_length_stays_and_the_pool_refuses_what_it_cannot_hold(caplog):
    with caplog.at_level(logging.WARNING, logger="enginespec.engine.engine_core"):
        llm = _llm(num_blocks=8, max_model_len=64)
    assert llm.engine.max_model_len == 64
    # said at startup (vLLM refuses to start there), not first at a request's refusal
    assert (
        "max_model_len 64 (chosen) is more than the KV pool holds (8 blocks of 4: 32 tokens)" in caplog.text
    )
    with pytest.raises(ValueError, match="num_blocks"):
        llm.generate({"prompt_token_ids": [5] * 20}, SamplingParams(max_tokens=13), use_tqdm=False)
    # a max_tokens the user did not set (or set past the room) is not reported as theirs
    with pytest.raises(ValueError, match=r"max_tokens \(None: all 44 tokens max_model_len \(64\) leaves\)"):
        llm.generate({"prompt_token_ids": [5] * 20}, SamplingParams(max_tokens=None), use_tqdm=False)
    with pytest.raises(
        ValueError, match=r"max_tokens \(500, cut to the 44 tokens max_model_len \(64\) leaves\)"
    ):
        llm.generate({"prompt_token_ids": [5] * 20}, SamplingParams(max_tokens=500), use_tqdm=False)


@pytest.mark.parametrize("chosen", [{}, {"max_model_len": 8}])
@pytest.mark.parametrize("sizing", [{"num_blocks": 1}, {"kv_cache_bytes": 512}])
def test_a_pool_of_one_token_is_refused_at_startup_naming_the_pool(chosen, sizing):
    """A pool that holds fewer than 2 tokens (block_size 1, one block) can serve no request: a
    request is at least a prompt token and an output token. Construction says so, naming the
    pool's settings and the bound. Unchosen, the fitted length 1 reached SchedulerConfig and
    the error named max_model_len ("must be None or >= 2, got 1"), a setting the user never
    gave; chosen, the engine started and refused every request. (512 bytes: one block of one
    token, K and V of 2 layers, 2 kv heads of 16 float32.)"""
    from enginespec.llm import LLM

    with pytest.raises(ValueError, match=r"holds 1 token.*num_blocks.*at least 2"):
        LLM(
            str(tiny_model_dir("qwen3")), impl="fast", dtype="float32", device="cpu", block_size=1,
            **sizing, **chosen,
        )  # fmt: skip
    ok = LLM(
        str(tiny_model_dir("qwen3")), impl="fast", dtype="float32", device="cpu", block_size=1, num_blocks=2
    )
    assert ok.engine.max_model_len == 2  # two tokens: one prompt token and one output token
    out = ok.generate({"prompt_token_ids": [5]}, SamplingParams(max_tokens=None), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 1


def test_a_pool_that_holds_the_models_length_changes_nothing():
    assert _llm(num_blocks=64).engine.max_model_len == 256


def test_num_gpu_blocks_override_sizes_the_cpu_pool_too():
    """vLLM's name for a fixed pool (its tests force preemption with it) is honoured on the CPU
    as on CUDA, ahead of num_blocks; it was ignored there (a 32-block pool for an asked 5)."""
    llm = _llm(num_gpu_blocks_override=6, num_blocks=40)
    assert llm.engine.runner.num_blocks == 6
    with pytest.raises(ValueError, match="num_gpu_blocks_override"):
        _llm(num_gpu_blocks_override=0)


def test_without_chunked_prefill_the_models_length_is_lowered_to_one_step(caplog):
    """With chunked prefill off a request must prefill in one step (prompt + max_tokens - 1 <=
    max_num_batched_tokens), so a length the user did not choose is lowered to budget + 1 as it
    is to the pool: a max_tokens=None request (all the room up to max_model_len) was refused on
    every prompt, the model's 256 needing a step of 255 tokens."""
    with caplog.at_level(logging.WARNING, logger="enginespec.engine.engine_core"):
        llm = _llm(num_blocks=64, enable_chunked_prefill=False, max_num_batched_tokens=16, max_num_seqs=4)
    assert llm.engine.max_model_len == 17 == llm.engine.scheduler_config.max_model_len
    assert "max_num_batched_tokens" in caplog.text
    out = llm.generate(
        {"prompt_token_ids": [5] * 10}, SamplingParams(max_tokens=None, ignore_eos=True), use_tqdm=False
    )
    assert len(out[0].outputs[0].token_ids) == 7 and out[0].outputs[0].finish_reason == "length"


def test_a_chosen_length_one_step_cannot_prefill_is_refused_without_chunked_prefill():
    """vLLM's SchedulerConfig refuses max_num_batched_tokens < max_model_len with chunked prefill
    off; here the bound is the add() rule's (a request of max_model_len tokens computes all but
    its last token in one step), so 17 tokens take a budget of 16."""
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(16\).*max_model_len \(18\)"):
        _llm(
            num_blocks=64,
            enable_chunked_prefill=False,
            max_num_batched_tokens=16,
            max_num_seqs=4,
            max_model_len=18,
        )
    llm = _llm(
        num_blocks=64,
        enable_chunked_prefill=False,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        max_model_len=17,
    )
    assert llm.engine.max_model_len == 17


@pytest.mark.parametrize("num_blocks, fitted", [(8, 32), (64, 256)])
def test_minus_one_asks_for_the_fitted_length_as_vllms_auto_does(num_blocks, fitted):
    """vLLM's max_model_len=-1 (the CLI's "auto") fits the length to the KV pool: here what a
    max_model_len left unset gets. It was a ValueError."""
    assert _llm(num_blocks=num_blocks, max_model_len=-1).engine.max_model_len == fitted


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    """A tiny qwen3 that states 12 positions (default rope: nothing stretches them)."""
    from enginespec.testing.checkpoints import make_checkpoint

    return make_checkpoint(
        "qwen3", tmp_path_factory.mktemp("short") / "qwen3", max_position_embeddings=12, seed=3
    )


def _short_llm(path, **kwargs):
    from enginespec.llm import LLM

    return LLM(str(path), impl="fast", dtype="float32", device="cpu", block_size=4, num_blocks=16, **kwargs)


def _hf_greedy(path, ids: list[int], num: int) -> list[int]:
    """transformers' own greedy continuation (full forwards, no cache)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, attn_implementation="eager")
    out = list(ids)
    with torch.no_grad():
        for _ in range(num):
            out.append(int(hf.eval()(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids) :]


def test_a_length_past_the_models_positions_is_refused_naming_vllms_override(short_model, monkeypatch):
    """vLLM refuses a chosen max_model_len over the checkpoint's positions and names the switch
    that allows it; the refusal here named no way past it."""
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    with pytest.raises(ValueError, match=r"an int in \[2, 12\].*VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"):
        _short_llm(short_model, max_model_len=20)
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "maybe")
    with pytest.raises(ValueError, match="VLLM_ALLOW_LONG_MAX_MODEL_LEN must be 1 or 0"):
        _short_llm(short_model, max_model_len=20)


@pytest.mark.parametrize("model_impl", ["merged", "transformers"])
def test_vllms_override_serves_past_the_models_positions(short_model, monkeypatch, caplog, model_impl):
    """With VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (vLLM's switch) a chosen max_model_len past
    max_position_embeddings is served, with a warning, and rope runs on past the stated
    positions as transformers' own forward does: it was refused whatever the environment said,
    and the merged decoder's cos/sin table ended at the stated 12 positions."""
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    with caplog.at_level(logging.WARNING):
        llm = _short_llm(short_model, max_model_len=20, model_impl=model_impl)
    assert llm.engine.max_model_len == 20
    assert "max_position_embeddings" in caplog.text and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in caplog.text
    prompt = [7, 3, 9, 11, 5, 8, 2, 6, 10, 4, 9, 12, 3, 7, 5]  # 15 ids: past the 12 positions
    out = llm.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(max_tokens=None, temperature=0, ignore_eos=True),
        use_tqdm=False,
    )[0].outputs[0]
    assert out.finish_reason == "length"
    assert out.token_ids == _hf_greedy(short_model, prompt, 5)
