"""Draft-model speculation (speculative_config method "draft_model") through the engine: greedy
output equals plain greedy (transformers' `generate`, as in test_parity) token for token, under
preemption by recompute and by swap, chunked prefill, prefix caching, aborts and async
scheduling; the draft's own pool follows the spec (consistent after every step, idle at the
end: rejected drafts trimmed, mirrors freed on finish, abort and preemption).

Three drafts of the tiny qwen3's vocabulary: the target itself (every draft accepted), the
target with a noisy head (some accepted, some rejected: the mirror's catch-up keeps only the
agreed prefix) and an unrelated random checkpoint (almost nothing accepted).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from enginespec.conformance.invariants import check_idle, check_pool
from enginespec.conformance.strategies import engine_workloads
from enginespec.conformance.test_parity import (
    MAX_TOKENS,
    _forced,
    check_outputs,
    engine_for,
    run_workload,
    tiny_vocab,
)
from enginespec.conformance.test_spec_decode import run_sampled
from enginespec.testing.checkpoints import make_checkpoint, tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")
K = 3
_DRAFTS: dict = {}


def draft_model(impl, kind: str):
    """A FlatModel draft of the tiny qwen3's vocabulary (module doc), loaded once per impl."""
    from enginespec.worker.flat_model import FlatModel

    key = (id(impl), kind)
    if key not in _DRAFTS:
        path = tiny_model_dir("qwen3")
        if kind == "other":
            path = make_checkpoint("qwen3", path.parent / "qwen3-draft-other", seed=1)
        model = FlatModel.from_pretrained(
            path, dtype=torch.float32, device="cpu", attention=impl.attention_backend(torch.device("cpu"))
        )
        if kind == "noisy":
            head = model.hf_model.get_output_embeddings().weight
            gen = torch.Generator().manual_seed(0)
            with torch.no_grad():
                head.add_(0.5 * head.std() * torch.randn(head.shape, generator=gen))
        _DRAFTS[key] = (model, path)
    return _DRAFTS[key]


def draft_engine(impl, workload, kind: str, disable_by_batch_size=None, k: int = K, **engine_args):
    """An engine over the shared tiny qwen3 with a draft model of `kind` proposing up to k
    drafts; its drafter's pool is checked after every step (the step is wrapped)."""
    from enginespec.engine.engine_core import EngineCore

    model, path = draft_model(impl, kind)
    config = {"method": "draft_model", "model": str(path), "num_speculative_tokens": k}
    config["disable_by_batch_size"] = disable_by_batch_size
    base = engine_for(impl, "qwen3", workload, speculative_config=None, **engine_args)
    args = dataclasses.replace(base.args, speculative_config=config)
    engine = EngineCore(args, model=base.model, tokenizer=base.tokenizer, draft_model=model)
    drafter = engine.spec.drafter
    step = engine.step

    def checked_step(*a, **kw):
        outputs = step(*a, **kw)
        check_pool(drafter.block_manager.state(), drafter.block_manager.num_blocks)
        return outputs

    engine.step = checked_step
    return engine


def check_run(engine, workload) -> None:
    finals = run_workload(engine, workload)
    check_outputs(workload, finals, "qwen3")
    check_idle(engine.block_manager.state(), engine.runner.num_blocks)
    drafter = engine.spec.drafter
    check_idle(drafter.block_manager.state(), drafter.block_manager.num_blocks)
    assert len(drafter) == 0, "a draft mirror outlived its request"
    assert not any(r.spec_token_ids for r in engine.scheduler.running)


@pytest.mark.parametrize("name", ["recompute", "swap", "prefix_hit", "chunk_priority_abort"])
@pytest.mark.parametrize("async_scheduling", [False, True])
def test_greedy_parity_with_a_noisy_draft(impl, name, async_scheduling):
    """Forced paths (preemption, swap, prefix hit, chunks and an abort) with a draft whose
    proposals are partly accepted: greedy parity, both pools consistent and idle at the end."""
    if name == "swap" and "swap" not in getattr(impl, "capabilities", ()):
        pytest.skip(f"impl {impl.name!r} has no 'swap' capability")
    workload = _forced(name, True)
    engine = draft_engine(impl, workload, "noisy", async_scheduling=async_scheduling)
    check_run(engine, workload)
    stats = engine.stats.spec_decode
    assert stats.num_draft_tokens > 0, "no draft was verified"
    if name in ("recompute", "swap"):
        assert engine.stats.num_preemptions > 0, "the pool was meant to force a preemption"


def test_greedy_parity_with_draft_models_on_generated_workloads(impl):
    """Hypothesis workloads (preemption by recompute and swap common, chunks, prefix hits,
    aborts, n > 1) with a noisy or unrelated draft, async scheduling on or off."""
    swap = "swap" in getattr(impl, "capabilities", ())
    verified = [0]

    @seed(21)
    @settings(max_examples=max(1, settings.default.max_examples // 2))
    @given(
        workload=engine_workloads(
            vocab=tiny_vocab("qwen3"), max_requests=4, max_tokens=MAX_TOKENS, swap=swap
        ),
        kind=st.sampled_from(["noisy", "other"]),
        async_scheduling=st.booleans(),
    )
    def check(workload, kind, async_scheduling):
        engine = draft_engine(impl, workload, kind, async_scheduling=async_scheduling)
        check_run(engine, workload)
        verified[0] += engine.stats.spec_decode.num_draft_tokens

    check()
    assert verified[0] > 0, "no draft was verified over the examples"


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_draft_model_disabled_by_batch_size_catches_up_when_drafting_resumes(impl, async_scheduling):
    """disable_by_batch_size=2 with the target as its own draft: no drafts while two or three
    requests run, then the last one's mirror catches up on every token it missed and its
    drafts are all accepted; greedy parity, both pools idle at the end."""
    from enginespec.conformance.test_spec_decode import _staggered, recorded

    workload = _staggered()
    engine = draft_engine(impl, workload, "same", 2, async_scheduling=async_scheduling)
    log = recorded(engine)
    check_run(engine, workload)
    assert all(not ids for running, ids in log if running >= 2), log
    assert any(ids for running, ids in log if running == 1), log
    stats = engine.stats.spec_decode
    assert 0 < stats.num_accepted_tokens == stats.num_draft_tokens


def test_a_full_draft_pool_drafts_nothing_and_output_is_unchanged(impl):
    """A draft pool with room for no request's catch-up: no drafts, greedy parity, pools idle."""
    workload = _forced("recompute", True)
    engine = draft_engine(impl, workload, "same")
    drafter = engine.spec.drafter
    drafter.block_manager = impl.new_block_manager(1, workload.block_size, False)
    check_run(engine, workload)
    assert engine.stats.spec_decode.num_draft_tokens == 0


def test_num_speculative_tokens_past_max_model_len_sizes_the_draft_pool_as_max_model_len_does(impl):
    """No request can take more drafts than max_model_len allows, so a larger
    num_speculative_tokens gets the draft pool of max_model_len + 1 (not k - 1 fed-back
    drafts' blocks per request: k = 10**9 was a failed multi-terabyte allocation) and greedy
    parity with every draft accepted."""
    workload = _forced("recompute", True)
    engine = draft_engine(impl, workload, "same", k=1000, max_model_len=12)
    bounded = draft_engine(impl, workload, "same", k=13, max_model_len=12)
    pool = engine.spec.drafter.block_manager.num_blocks
    assert pool == bounded.spec.drafter.block_manager.num_blocks, pool
    check_run(engine, workload)
    stats = engine.stats.spec_decode
    assert 0 < stats.num_accepted_tokens == stats.num_draft_tokens


def test_acceptance_follows_how_close_the_draft_is(impl):
    """The target as its own draft: every draft accepted; a noisy head: some; an unrelated
    random model: fewer. Per-request counters add up to the engine's."""
    workload = _forced("recompute", True)
    rates = {}
    for kind in ("same", "noisy", "other"):
        engine = draft_engine(impl, workload, kind)
        finals = run_workload(engine, workload)
        check_outputs(workload, finals, "qwen3")
        stats = engine.stats.spec_decode
        per_sample = [c.spec_decode for out in finals.values() for c in out.outputs]
        assert sum(p.num_draft_tokens for p in per_sample) == stats.num_draft_tokens
        assert sum(p.num_accepted_tokens for p in per_sample) == stats.num_accepted_tokens
        assert len(stats.acceptance_rate_per_pos) == K
        rates[kind] = stats.acceptance_rate
    assert rates["same"] == 1.0, rates
    assert 0.0 < rates["noisy"] < 1.0, rates
    assert rates["other"] < rates["noisy"], rates


def test_sampled_requests_with_a_draft_model_under_preemption(impl):
    """Sampled rows verified by rejection sampling against greedy drafts (q one-hot: exact,
    verify.py) while the pool forces preemption: lengths and ids valid, both pools idle."""
    from enginespec.spec import SamplingParams

    workload = _forced("recompute", True)
    engine = draft_engine(impl, workload, "same")
    params = SamplingParams(max_tokens=6, temperature=0.8, top_k=5, ignore_eos=True)
    run_sampled(engine, workload, params)
    drafter = engine.spec.drafter
    check_idle(drafter.block_manager.state(), drafter.block_manager.num_blocks)
    assert engine.stats.num_preemptions > 0 and engine.stats.spec_decode.num_accepted_tokens > 0


def _tiny_engine_with_draft(impl, draft_path):
    """An EngineCore over the tiny qwen3 with draft_path as its draft (k = 2)."""
    from enginespec.engine.engine_core import EngineCore
    from enginespec.engine_args import EngineArgs

    config = {"method": "draft_model", "model": str(draft_path), "num_speculative_tokens": 2}
    args = EngineArgs(
        model=str(tiny_model_dir("qwen3")),
        impl=impl,
        dtype="float32",
        device="cpu",
        num_blocks=16,
        speculative_config=config,
    )
    return EngineCore(args)


def test_a_draft_of_another_vocabulary_is_refused(impl, tmp_path):
    path = make_checkpoint("qwen3", tmp_path / "wide", vocab_size=tiny_vocab("qwen3") + 32)
    with pytest.raises(ValueError, match=r"speculative_config\.model.*vocab_size"):
        _tiny_engine_with_draft(impl, path)


def test_a_missing_draft_checkpoint_names_speculative_config_model(impl, tmp_path):
    """The draft's path is the user's speculative_config.model: the error says so (it named only
    the directory), and stays a CheckpointNotFound (a ValueError and a FileNotFoundError)."""
    from enginespec.worker.loader import CheckpointNotFound

    with pytest.raises(
        CheckpointNotFound, match=r"speculative_config\.model: .*no-such-draft.*does not exist"
    ):
        _tiny_engine_with_draft(impl, tmp_path / "no-such-draft")


def test_a_draft_is_checked_against_the_max_model_len_the_engine_serves(impl, tmp_path, monkeypatch):
    """A target of 128 positions whose pool holds 48 tokens serves at max_model_len 48 (lowered,
    as without a draft), so a draft reaching 64 positions is accepted; with a pool of the
    target's 128 positions the same draft is refused, naming both bounds and vLLM's
    VLLM_ALLOW_LONG_MAX_MODEL_LEN, under which it serves (its rope table used to end at 64)."""
    from enginespec.engine.engine_core import EngineCore
    from enginespec.engine_args import EngineArgs
    from enginespec.spec import SamplingParams

    target = make_checkpoint("qwen3", tmp_path / "target", max_position_embeddings=128)
    draft = make_checkpoint("qwen3", tmp_path / "draft", max_position_embeddings=64, seed=1)
    config = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2}

    def engine(num_blocks):
        args = EngineArgs(
            model=str(target),
            impl=impl,
            dtype="float32",
            device="cpu",
            block_size=16,
            num_blocks=num_blocks,
            speculative_config=config,
        )
        return EngineCore(args)

    assert engine(3).max_model_len == 48
    with pytest.raises(
        ValueError,
        match=r"max_position_embeddings \(64, .*\) must be >= max_model_len \(128\).*VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
    ):
        engine(8)
    # vLLM's switch lets the draft run past its positions, as it lets the target past its own:
    # the draft's rope covers the length served, and drafts past position 64 are proposed
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    served = engine(8)
    assert served.max_model_len == 128
    table = served.draft_model.merged.rope_table
    assert table is None or table.shape[0] >= 128
    served.add_request("long", [5, 6, 7] * 30, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    finals = {}
    while served.has_unfinished:
        finals.update({o.request_id: o for o in served.step() if o.finished})
    assert len(finals["long"].outputs[0].token_ids) == 12
    assert served.stats.spec_decode.num_draft_tokens > 0


def test_the_warm_up_leaves_the_spec_counters_zero_and_linked(impl):
    """The warm-up's drafts are not counted, and the engine's counters stay the decoder's (the
    metrics and benchmarks read engine.stats.spec_decode after a CUDA engine's warm-up)."""
    workload = _forced("recompute", True)
    engine = draft_engine(impl, workload, "same", warmup=True)
    assert engine.warmup_report is not None
    stats = engine.stats.spec_decode
    assert stats is engine.spec.stats and stats.num_draft_tokens == 0
    check_run(engine, workload)
    assert engine.stats.spec_decode.num_accepted_tokens > 0


def test_a_failed_draft_forward_fails_no_request(impl):
    """The draft model raising mid-proposal (after some of its forwards ran) fails that step
    before anything is scheduled: no request fails, the mirrors stay sound (a draft fed to a
    forward that never ran is not counted as computed), greedy parity holds, pools end idle."""
    workload = _forced("recompute", True)
    engine = draft_engine(impl, workload, "noisy")
    runner = engine.spec.drafter.runner
    execute, calls = runner.execute, [0]

    def flaky(batch):
        calls[0] += 1
        if calls[0] == 5:
            raise RuntimeError("injected draft fault")
        return execute(batch)

    runner.execute = flaky
    check_run(engine, workload)
    assert calls[0] > 5 and engine.stats.num_failed_steps == 1


@pytest.mark.parametrize("phase", ["execute", "sample"])
def test_a_failed_target_step_frees_the_draft_mirrors(impl, phase):
    """A fault in the target's step while drafts are scheduled fails that step's requests
    ("error"); their mirrors go with them, and later requests still follow greedy."""
    from enginespec.conformance.strategies import EngineRequestSpec as R

    workload = dataclasses.replace(
        _forced("prefix_hit", True),
        requests=(R("a", tuple(range(10, 22)), 6), R("b", tuple(range(30, 40)), 6)),
    )
    engine = draft_engine(impl, workload, "same")
    fired = []

    def hook(name):
        if name == phase and not fired and any(r.spec_token_ids for r in engine.scheduler.running):
            fired.append(name)
            raise RuntimeError("injected")

    engine.fault_hook = hook
    finals = run_workload(engine, workload)
    assert fired and {c.finish_reason for out in finals.values() for c in out.outputs} == {"error"}
    drafter = engine.spec.drafter
    check_idle(drafter.block_manager.state(), drafter.block_manager.num_blocks)
    assert len(drafter) == 0
    engine.fault_hook = None
    check_run(engine, dataclasses.replace(workload, requests=(R("c", tuple(range(10, 22)), 6),)))
