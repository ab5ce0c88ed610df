"""vLLM's everyday constructor arguments: a ported `LLM(model=..., trust_remote_code=True,
tokenizer=..., swap_space=4, ...)` runs; `tokenizer`, `tokenizer_mode` and `trust_remote_code`
reach the loader; what enginespec does not do (quantization, LoRA, pipeline parallelism, ...) is
a ValueError naming the argument and what is accepted, never a TypeError for an unknown name."""

from __future__ import annotations

import pytest
import torch

from enginespec.engine_args import EngineArgs
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import EOS_ID, VOCAB_SIZE, tiny_model_dir, write_tokenizer

pytestmark = pytest.mark.usefixtures("torch_one_thread")
SMALL = dict(dtype="float32", device="cpu", block_size=4, num_blocks=32, max_model_len=64)


@pytest.fixture(scope="module")
def word_tokenizer_dir(tmp_path_factory):
    """A tokenizer alone (no config.json): word-level, "w5 w6" -> [5, 6], unlike the model's
    own character tokenizer."""
    path = tmp_path_factory.mktemp("word_tokenizer")
    write_tokenizer(path, VOCAB_SIZE, EOS_ID)
    return path


def test_a_ported_vllm_llm_call_runs(impl, word_tokenizer_dir):
    """The call of the issue: every argument was a TypeError ("unknown engine argument(s)")."""
    from enginespec.llm import LLM

    llm = LLM(
        model=str(tiny_model_dir("qwen3")),
        impl=impl,
        trust_remote_code=True,
        tokenizer=str(word_tokenizer_dir),
        disable_log_stats=True,
        swap_space=4,
        quantization=None,
        revision=None,
        download_dir=None,
        tokenizer_mode="auto",
        max_seq_len_to_capture=8192,
        enable_lora=False,
        **SMALL,
    )
    assert llm.get_tokenizer().encode("w5 w6") == [5, 6]  # the tokenizer= directory's
    out = llm.generate(
        ["w5 w6 w7"], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), use_tqdm=False
    )
    assert out[0].prompt_token_ids == [5, 6, 7] and len(out[0].outputs[0].token_ids) == 3


def test_vllm_defaults_are_accepted_silently():
    args = EngineArgs.from_kwargs(
        None,
        quantization=None,
        enable_lora=False,
        pipeline_parallel_size=1,
        distributed_executor_backend="mp",
        disable_custom_all_reduce=True,  # a multi-GPU script's usual flag: what our TP all-reduce is
        data_parallel_size=1,
        kv_cache_dtype="auto",
        cpu_offload_gb=0,
        revision=None,
        download_dir=None,
        load_format="safetensors",
        tokenizer_mode="slow",
        swap_space=0.5,
        max_seq_len_to_capture=32768,
        disable_log_stats=True,
        logprobs_mode="raw_logprobs",
    )
    assert EngineArgs() == EngineArgs(load_format="auto", tokenizer_mode="auto", swap_space=4)
    assert (args.tokenizer, args.trust_remote_code, args.load_format) == (None, False, "safetensors")


@pytest.mark.parametrize(
    "name, value, accepted",
    [
        ("quantization", "awq", "None"),
        ("enable_lora", True, "False"),
        ("pipeline_parallel_size", 2, "1"),
        ("distributed_executor_backend", "ray", "None, 'mp'"),
        ("data_parallel_size", 2, "1"),
        ("kv_cache_dtype", "fp8", "'auto'"),
        ("cpu_offload_gb", 4, "0"),
        ("load_format", "pt", "'auto', 'safetensors'"),
        ("tokenizer_mode", "mistral", "'auto', 'hf', 'slow'"),
        ("logprobs_mode", "processed_logprobs", "'raw_logprobs'"),
        ("logprobs_mode", "raw_logits", "'raw_logprobs'"),
    ],
)
def test_what_enginespec_does_not_do_is_a_value_error_naming_it(name, value, accepted):
    from enginespec.llm import LLM

    message = rf"{name}={value!r} is not supported by enginespec \(.+\); accepted: \[{accepted}\]"
    with pytest.raises(ValueError, match=message):
        EngineArgs.from_kwargs(None, **{name: value})
    with pytest.raises(ValueError, match=message):  # refused before anything loads
        LLM("/nowhere", **{name: value})


@pytest.mark.parametrize(
    "name, value",
    [
        ("swap_space", -1),
        ("swap_space", True),
        ("swap_space", float("inf")),
        ("cpu_offload_gb", "0"),
        ("max_seq_len_to_capture", 0),
        ("pipeline_parallel_size", 0),
        ("trust_remote_code", "yes"),
        ("disable_log_stats", None),
        ("enable_lora", 0),
        ("tokenizer", 3),
    ],
)
def test_vllm_args_refuse_a_bad_type_or_range_naming_the_field(name, value):
    with pytest.raises(ValueError, match=name):
        EngineArgs(**{name: value})


def test_vllm_args_take_the_bounds_of_their_ranges():
    """The smallest value of each range is accepted (a CUDA-graph capture length of 1, no swap
    or offload space), as vLLM takes them."""
    args = EngineArgs(max_seq_len_to_capture=1, swap_space=0, cpu_offload_gb=0.0)
    assert (args.max_seq_len_to_capture, args.swap_space, args.cpu_offload_gb) == (1, 0, 0.0)


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.complex64, "int8", ["float32"]])
def test_dtype_must_name_a_float_type(dtype):
    """vLLM's dtype names ("auto", "half", "float16", "bfloat16", "float", "float32") and the
    torch dtypes they stand for. A torch.int8 or torch.bool was taken as it was: the model
    loaded in it and generate() returned empty outputs, no error; a list was a TypeError."""
    with pytest.raises(ValueError, match="dtype"):
        EngineArgs(dtype=dtype)


def test_dtype_takes_vllms_names_and_their_torch_dtypes():
    from enginespec.engine_args import resolve_dtype

    cpu = torch.device("cpu")
    for name, want in [("half", torch.float16), ("float16", torch.float16), ("bfloat16", torch.bfloat16)]:
        assert resolve_dtype(EngineArgs(dtype=name).dtype, None, cpu) is want
    assert resolve_dtype(EngineArgs(dtype="float").dtype, None, cpu) is torch.float32
    assert resolve_dtype(EngineArgs(dtype=torch.bfloat16).dtype, None, cpu) is torch.bfloat16
    assert resolve_dtype(EngineArgs(dtype="auto").dtype, None, cpu) is torch.float32  # on the CPU


@pytest.fixture
def hf_calls(monkeypatch):
    """Every AutoConfig / AutoTokenizer.from_pretrained call's (class name, path, kwargs)."""
    from transformers import AutoConfig, AutoTokenizer

    calls = []
    for cls in (AutoConfig, AutoTokenizer):
        original = cls.from_pretrained

        def record(path, *args, _cls=cls, _original=original, **kwargs):
            calls.append((_cls.__name__, str(path), kwargs))
            return _original(path, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", record)
    return calls


@pytest.mark.parametrize("trust", [False, True])
def test_trust_remote_code_reaches_autoconfig_and_autotokenizer(impl, hf_calls, trust):
    from enginespec.llm import LLM

    model_dir = str(tiny_model_dir("qwen3"))
    LLM(model_dir, impl=impl, trust_remote_code=trust, **SMALL)
    ours = {name: kw.get("trust_remote_code") for name, path, kw in hf_calls if path == model_dir}
    assert ours == {"AutoConfig": trust, "AutoTokenizer": trust}, hf_calls


@pytest.mark.parametrize("mode, use_fast", [("auto", True), ("hf", True), ("slow", False)])
def test_tokenizer_mode_slow_asks_for_the_slow_tokenizer(hf_calls, mode, use_fast):
    from enginespec.engine.engine_core import load_engine_tokenizer

    model_dir = str(tiny_model_dir("qwen3"))
    tokenizer = load_engine_tokenizer(EngineArgs(model=model_dir, tokenizer_mode=mode))
    assert tokenizer is not None
    (kwargs,) = [kw for name, _, kw in hf_calls if name == "AutoTokenizer"]
    assert kwargs["use_fast"] is use_fast and kwargs["local_files_only"] is True


def test_tokenizer_directory_must_exist_and_hold_one(tmp_path, word_tokenizer_dir, monkeypatch):
    """vLLM's tokenizer= is a local directory, with tokenizer files but no config.json needed
    (the engine and the server load it the same way), or a hub name, which must be in the
    local hub cache (tests/api/test_model_from_hub_cache.py): nothing is downloaded."""
    from enginespec.engine.engine_core import load_engine_tokenizer

    model_dir = str(tiny_model_dir("qwen3"))
    assert load_engine_tokenizer(EngineArgs(model=model_dir, tokenizer=word_tokenizer_dir)).encode("w9") == [
        9
    ]
    assert load_engine_tokenizer(EngineArgs(model=model_dir, tokenizer="x", skip_tokenizer=True)) is None
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    with pytest.raises(ValueError, match="tokenizer 'Qwen/Qwen3-0.6B' does not exist.*nothing is downloaded"):
        load_engine_tokenizer(EngineArgs(model=model_dir, tokenizer="Qwen/Qwen3-0.6B"))
    with pytest.raises(ValueError, match="tokenizer '.*missing' does not exist: no local directory"):
        load_engine_tokenizer(EngineArgs(model=model_dir, tokenizer=str(tmp_path / "missing")))
    with pytest.raises(ValueError, match="tokenizer directory .* has none of"):
        load_engine_tokenizer(EngineArgs(model=model_dir, tokenizer=str(tmp_path)))


def test_skip_tokenizer_init_is_vllms_name_for_skip_tokenizer(impl):
    """vLLM's LLM(..., skip_tokenizer_init=True) (token ids in, token ids out, text "") was a
    TypeError, unknown engine argument; it is skip_tokenizer under vLLM's name."""
    from enginespec.llm import LLM

    llm = LLM(str(tiny_model_dir("qwen3")), impl=impl, skip_tokenizer_init=True, **SMALL)
    assert llm.get_tokenizer() is None
    greedy = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    (out,) = llm.generate({"prompt_token_ids": [5, 6, 7]}, greedy, use_tqdm=False)
    assert (len(out.outputs[0].token_ids), out.outputs[0].text) == (3, "")
    assert EngineArgs().skip_tokenizer_init is False
    with pytest.raises(ValueError, match="skip_tokenizer_init"):
        EngineArgs(skip_tokenizer_init="yes")


def test_enable_prefix_caching_none_is_vllms_default_on(impl):
    """vLLM's EngineArgs types enable_prefix_caching as Optional[bool] with None meaning its
    default (on), and code that forwards an unset option passes that None. It was refused
    ("must be a bool"); it now means on: the same prompt's second run is served by the cache."""
    from enginespec.llm import LLM

    assert EngineArgs(enable_prefix_caching=None).enable_prefix_caching is True
    llm = LLM(str(tiny_model_dir("qwen3")), impl=impl, enable_prefix_caching=None, **SMALL)
    prompt = {"prompt_token_ids": list(range(5, 15))}  # 10 ids: two full blocks of 4 to cache
    one = SamplingParams(max_tokens=1, temperature=0)
    assert [llm.generate(prompt, one, use_tqdm=False)[0].num_cached_tokens for _ in range(2)] == [0, 8]


def test_scheduler_options_left_none_take_vllms_defaults(impl):
    """vLLM's EngineArgs types max_num_seqs, enable_chunked_prefill and preemption_mode as
    Optional with None meaning "the engine chooses", and code that forwards an unset option
    passes that None. Each was refused ("must be an int >= 1", "must be a bool", "must be one
    of"); None now means our default for it: 256 seats, chunked prefill on, recompute."""
    from enginespec.llm import LLM

    unset = dict(max_num_seqs=None, enable_chunked_prefill=None, preemption_mode=None)
    args = EngineArgs(**unset)
    assert (args.max_num_seqs, args.enable_chunked_prefill, args.preemption_mode) == (256, True, "recompute")
    llm = LLM(str(tiny_model_dir("qwen3")), impl=impl, **unset, **SMALL)
    config = llm.engine.scheduler.config
    assert (config.max_num_seqs, config.enable_chunked_prefill, config.preemption_mode) == (
        256,
        True,
        "recompute",
    )
    greedy = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    (out,) = llm.generate({"prompt_token_ids": [5, 6, 7]}, greedy, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 3


def test_engine_args_default_to_the_impl_every_door_defaults_to():
    """vLLM's way to an async engine, `AsyncLLM.from_engine_args(EngineArgs(model=...))`, ran
    the reference oracle: EngineArgs defaulted to impl "reference" while LLM(), AsyncLLM() and
    the command line default to "fast" (the product; the oracle is for tests)."""
    import inspect

    from enginespec.async_llm import AsyncLLM
    from enginespec.llm import LLM

    assert EngineArgs().impl == "fast"
    for door in (LLM.__init__, AsyncLLM.__init__):
        assert inspect.signature(door).parameters["impl"].default == EngineArgs().impl


def test_logits_processors_are_refused_by_name_and_none_is_taken():
    """vLLM's logits-processor examples pass LLM(logits_processors=[TheirClass]) (V1's
    plugin interface): that was a TypeError calling the name unknown, beside a list of fifty
    others. It is vLLM's argument, so it is taken at vLLM's default (None, or no processor) and
    any processor is a ValueError saying enginespec runs none and which edits it does run."""
    from enginespec.llm import LLM

    class TargetTokenProcessor:  # what a vLLM user's module defines
        pass

    EngineArgs.from_kwargs(None, logits_processors=None)
    EngineArgs.from_kwargs(None, logits_processors=[])
    for value in ([TargetTokenProcessor], ["vllm.test_utils:DummyLogitsProcessor"]):
        with pytest.raises(ValueError, match=r"logits_processors=.* is not supported by enginespec") as info:
            LLM("/nowhere", logits_processors=value)  # refused before anything loads
        assert "logit_bias" in str(info.value) and "structured outputs" in str(info.value)
