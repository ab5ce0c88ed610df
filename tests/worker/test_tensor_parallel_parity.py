"""Tensor parallelism on the CPU (gloo, two processes): greedy parity of TP=2 with TP=1 and with
transformers, under preemption by swap and by recompute and with prefix-cache hits, for Qwen3,
Llama and Qwen2 (biases, and one KV head, so the head is replicated on both ranks); and a dead
worker is an EngineDeadError naming it, with no hang and no process left behind.

One TP=2 engine per config (module scope, parametrized: pytest closes one before it opens the
next, and a process holds one process group at a time). Each config's engine dies in its last
test, each in a different way: killed between steps, killed while rank 0 is mid-step, crashed
by a control message it cannot obey. Only the tests of these engines live here: under pytest-xdist's
per-test distribution a worker may run some of a config's tests and not its last, so its
engine stays open until the module ends, and another TP test of this module would find the
process's group taken (test_tensor_parallel.py builds its own engines).
"""

from __future__ import annotations

import os
import signal

import pytest

from enginespec import LLM, SamplingParams
from enginespec.testing.checkpoints import make_checkpoint
from enginespec.worker.tp_group import EngineDeadError
from tests.worker.tp_common import (
    PROMPTS,
    _assert_same_up_to_tie,
    _generate,
    _processes_alive,
    _transformers_greedy,
)

pytestmark = pytest.mark.usefixtures("torch_one_thread")

# A pool of 6 two-token blocks for 3 running requests of 12 tokens: preemption is certain.
TIGHT = dict(block_size=2, num_blocks=6, max_num_batched_tokens=16, max_num_seqs=3)
CONFIGS = {
    "qwen3-swap": ("qwen3", {}, dict(TIGHT, preemption_mode="swap"), "kill-between-steps"),
    "llama-recompute": ("llama", {}, dict(TIGHT, preemption_mode="recompute"), "kill-mid-step"),
    # also a tied head over a vocabulary of 95 (the second shard padded by one row)
    "qwen2-one-kv-head": (
        "qwen2",
        dict(num_key_value_heads=1, tie_word_embeddings=True, vocab_size=95),
        {},
        "crash",
    ),
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def config(request, tmp_path_factory):
    family, overrides, engine_kwargs, death = CONFIGS[request.param]
    path = make_checkpoint(family, tmp_path_factory.mktemp(request.param), **overrides)
    kwargs = dict(impl="fast", dtype="float32", device="cpu", **engine_kwargs)
    with LLM(str(path), tensor_parallel_size=2, **kwargs) as tp2:
        yield path, kwargs, tp2, death
    assert not _processes_alive(tp2), "a worker outlived LLM.close()"


def test_greedy_parity_with_tp1_and_transformers(config):
    path, kwargs, tp2, _ = config
    got = _generate(tp2)
    tp1 = LLM(str(path), **kwargs)
    want = _generate(tp1)
    if "num_blocks" in kwargs:  # the tight pool preempted, by the configured mode, on both
        assert tp2.engine.stats.num_preemptions > 0
    assert tp2.engine.runner.num_swapped == 0, "a swapped copy outlived its request"
    for prompt, tokens, tokens1 in zip(PROMPTS, got, want):
        ref, logits = _transformers_greedy(path, list(prompt))
        _assert_same_up_to_tie(tokens, ref, logits, f"TP=2 vs transformers on {prompt}")
        _assert_same_up_to_tie(tokens, tokens1, logits, f"TP=2 vs TP=1 on {prompt}")


def test_prompt_logprobs_match_tp1(config):
    """Several logits gathers in one step (the sampled rows, then each request's prompt rows)
    and steps that sample nothing (mid-prompt chunks) keep the ranks in step."""
    path, kwargs, tp2, _ = config
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True, prompt_logprobs=1)
    prompts = [{"prompt_token_ids": list(p)} for p in PROMPTS]
    got = tp2.generate(prompts, params, use_tqdm=False)
    want = LLM(str(path), **kwargs).generate(prompts, params, use_tqdm=False)
    for a, b, prompt in zip(got, want, PROMPTS):
        for t, (x, y) in enumerate(zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]), start=1):
            token = prompt[t]
            assert abs(x[token] - y[token]) < 1e-4, f"{prompt}: prompt logprob of position {t}"


def test_a_traceback_of_the_users_own_after_a_tp_engine_has_no_rank_prefix(config, capsys):
    """Building the engine joined rank 0 (the user's process) to the process group, and torch's
    init_process_group replaced sys.excepthook with one prefixing every line of every uncaught
    traceback with "[rank0]: ", for the rest of the process, once more per engine built."""
    import sys

    try:
        raise ValueError("the user's own error")
    except ValueError:
        sys.excepthook(*sys.exc_info())
    err = capsys.readouterr().err
    assert "ValueError: the user's own error" in err and "[rank0]" not in err, err


def test_worker_death_is_an_engine_error(config, monkeypatch):
    import torch.distributed as dist

    _, _, tp2, death = config
    tp = tp2.engine.tensor_parallel
    worker = tp.processes[0]
    if death == "crash":  # the worker raises, reports its traceback and exits 1
        tp.conns[0].send(("no-such-message",))
        expected = r"worker rank 1 .* exited with code 1(.|\n)*no-such-message"
    else:
        os.kill(worker.pid, signal.SIGKILL)
        expected = r"worker rank 1 .* exited with code -9"
        if death == "kill-mid-step":  # rank 0 does not look first: a collective finds it dead
            worker.join()
            monkeypatch.setattr(tp, "check_alive", lambda: None)
    with pytest.raises(EngineDeadError, match=expected):
        _generate(tp2)
    assert not _processes_alive(tp2) and not dist.is_initialized()
    with pytest.raises(EngineDeadError):  # and stays dead, without hanging
        _generate(tp2)
