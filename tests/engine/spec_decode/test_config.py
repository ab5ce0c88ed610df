"""SpeculativeConfig's draft-model fields: vLLM's names, the method inferred from `model`, and
a field of the other method refused by name."""

from __future__ import annotations

import pytest

from enginespec.engine.spec_decode import SpecDecoder, SpeculativeConfig


def test_a_model_makes_a_draft_model_config():
    cfg = SpeculativeConfig.of({"model": "/ckpt/draft", "num_speculative_tokens": 5})
    assert (cfg.method, cfg.model, cfg.num_speculative_tokens) == ("draft_model", "/ckpt/draft", 5)
    assert SpeculativeConfig.of({"method": "draft_model", "model": "d"}).prompt_lookup_max is None
    assert SpeculativeConfig.of({"num_speculative_tokens": 2}).method == "ngram"


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"method": "draft_model"}, "speculative_config.model"),
        ({"method": "draft_model", "model": ""}, "speculative_config.model"),
        ({"method": "draft_model", "model": "d", "prompt_lookup_max": 3}, "prompt_lookup_max"),
        ({"method": "ngram", "model": "d"}, "speculative_config.model"),
        ({"model": "d", "num_speculative_tokens": 0}, "num_speculative_tokens"),
    ],
)
def test_bad_draft_model_configs_name_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        SpeculativeConfig.of(bad)


def test_the_decoder_needs_the_engine_to_build_a_model_drafter():
    cfg = SpeculativeConfig.of({"model": "d"})
    with pytest.raises(ValueError, match="draft_model"):
        SpecDecoder(cfg, sampler=None, device="cpu", max_model_len=64)


@pytest.mark.parametrize("bad", [1, 0, -4, True, 2.5, "8"])
def test_disable_by_batch_size_must_be_an_int_of_at_least_two(bad):
    with pytest.raises(ValueError, match=r"speculative_config\.disable_by_batch_size must be an int >= 2"):
        SpeculativeConfig.of({"num_speculative_tokens": 2, "disable_by_batch_size": bad})


def test_disable_by_batch_size_is_vllms_name_for_either_method_64_by_default_none_for_never():
    assert SpeculativeConfig.of({"num_speculative_tokens": 2}).disable_by_batch_size == 64
    assert SpeculativeConfig.of({"disable_by_batch_size": None}).disable_by_batch_size is None
    assert SpeculativeConfig.of({"disable_by_batch_size": 2}).disable_by_batch_size == 2
    cfg = SpeculativeConfig.of({"model": "d", "disable_by_batch_size": 8})
    assert (cfg.method, cfg.disable_by_batch_size) == ("draft_model", 8)


def test_vllms_other_keys_are_accepted_at_values_that_change_nothing():
    """Deployments copy vLLM configs with draft_tensor_parallel_size 1, disable_logprobs and
    disable_log_stats: accepted and dropped, as EngineArgs accepts vLLM's engine arguments at
    their defaults."""
    cfg = SpeculativeConfig.of(
        {
            "model": "d",
            "num_speculative_tokens": 3,
            "draft_tensor_parallel_size": 1,
            "disable_logprobs": False,
            "disable_log_stats": False,
            "quantization": None,
            "revision": None,
            "max_model_len": None,
        }
    )
    assert cfg == SpeculativeConfig(method="draft_model", model="d", num_speculative_tokens=3)


@pytest.mark.parametrize(
    "key, value",
    [
        ("draft_tensor_parallel_size", 2),
        ("draft_tensor_parallel_size", True),
        ("quantization", "fp8"),
        ("max_model_len", 512),
        ("disable_logprobs", "no"),
    ],
)
def test_vllms_other_keys_at_other_values_are_refused_by_name(key, value):
    with pytest.raises(ValueError, match=rf"speculative_config\.{key}=.*accepted"):
        SpeculativeConfig.of({"model": "d", key: value})


def test_an_unknown_key_lists_the_accepted_vllm_keys_too():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['lookahead'\].*draft_tensor_parallel_size"):
        SpeculativeConfig.of({"lookahead": 2})


def test_the_draft_positions_the_metrics_show_stop_at_what_a_request_can_hold():
    """A request holds at most max_model_len - 1 drafts (one position is its last token), so a
    larger num_speculative_tokens (accepted, as vLLM accepts it; the draft pool is sized as for
    max_model_len) shows that many per-position series, not k: k = 10**9 had made the server
    register a series for every position (1.2 s at 100,000 and a 21 MiB /metrics scrape) and
    LLM.get_metrics() build a list of 10**9 zeros. A k within the bound shows k."""
    from enginespec.engine.core_proc import engine_info
    from enginespec.engine.engine_core import EngineCore
    from enginespec.engine_args import EngineArgs
    from enginespec.metrics_reader import metrics_snapshot
    from enginespec.testing.checkpoints import tiny_model_dir

    for k, shown in ((10**9, 31), (32, 31), (31, 31), (3, 3)):
        engine = EngineCore(
            EngineArgs(
                model=str(tiny_model_dir("qwen3")), impl="reference", dtype="float32", device="cpu",
                num_blocks=16, max_model_len=32, speculative_config={"num_speculative_tokens": k},
            )
        )  # fmt: skip
        assert engine.num_draft_positions == shown, k
        assert engine_info(engine).num_speculative_tokens == shown, k
        per_pos = [
            m
            for m in metrics_snapshot(engine, "m")
            if m.name == "vllm:spec_decode_num_accepted_tokens_per_pos"
        ]
        assert [len(m.values) for m in per_pos] == [shown], k


def test_a_draft_revision_is_a_name_of_the_draft_method():
    """speculative_config.revision (vLLM's key) picks the draft repo's snapshot: a branch, tag
    or commit hash, for method "draft_model" only (an n-gram drafter has no checkpoint)."""
    assert SpeculativeConfig.of({"model": "d", "revision": "v2"}).revision == "v2"
    for bad in ("", " ", 3):
        with pytest.raises(ValueError, match=r"speculative_config\.revision must be None or a branch"):
            SpeculativeConfig.of({"model": "d", "revision": bad})
    with pytest.raises(ValueError, match=r"speculative_config\.revision is a 'draft_model' field"):
        SpeculativeConfig.of({"method": "ngram", "revision": "v2"})
