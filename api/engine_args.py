"""EngineArgs: every knob of one engine, under vLLM's EngineArgs names where one exists.

Ours beyond vLLM's: `impl` (which Implementation), `num_blocks` / `kv_cache_bytes` (the host
pool size on CPU), `preemption_mode` ("recompute" or "swap"), `device` ("auto", "cpu", "cuda",
"cuda:1"), `skip_tokenizer` (token ids in and out only), `compile_model` (torch.compile the
decoder: None = on for CUDA unless enforce_eager) and `compile_backend` (torch.compile's backend;
"aot_eager" traces without generating code). `async_scheduling` (vLLM's name; on by default) schedules
step n + 1 while step n runs, for steps the sampler can draw on the device (async_scheduling.py); False keeps every
step serial. `enforce_eager` (vLLM's name) turns CUDA graphs
and compilation off. `model_impl` (vLLM's name): "auto" (the default: "merged" for every
supported family), "merged" (our decoder wiring with q|k|v and gate|up merged into one GEMM
each, over the checkpoint's own modules: merged_decoder.py) or "transformers" (transformers'
own decoder forward). `tensor_parallel_size` (vLLM's name): shard the model over that many
ranks, one process each (rank 0 is the engine's own; worker/tp_group.py), gloo on the CPU and
one GPU per rank on CUDA. `warmup`: run throwaway requests through every path at construction
(engine/warmup.py), so the first generate() is as fast as later ones; None = on for CUDA.
`speculative_config` (vLLM's name): None, or a dict such as {"method": "ngram",
"num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4} or {"method":
"draft_model", "model": DRAFT_DIR, "num_speculative_tokens": 3}, either with vLLM's
"disable_by_batch_size" (no drafts in a step starting with that many running requests; 64 by
default, None for never: config.py says why)
(engine/spec_decode/config.py; validated when the engine is built).
`skinny_gemm` (ours): route the merged decoder's projection GEMMs of up to 32 rows through a
per-shape choice between cuBLAS and the Triton skinny GEMM / one-tile GEMV, measured on the
model's weights at startup (worker/skinny_linear.py; bf16/fp16 on CUDA only); None reads
ENGINESPEC_SKINNY_GEMM (0 = off), default on; ENGINESPEC_SKINNY_MAX_ROWS sets the row bound.
`max_cudagraph_capture_size` (vLLM's compilation-config name): steps whose requests carry more
than one token (prefill chunks beside decodes, speculative verification) replay a CUDA graph when
their tokens fit one of the mixed buckets up to this size (worker/cuda_graphs.py); None = 2048
(capped at max_num_batched_tokens), 0 = only decode steps replay graphs.
`max_logprobs` (vLLM's name, default 20): the most logprobs / prompt_logprobs a request may
ask; more is refused on add (a ValueError; the server's 400). -1 lifts the cap (the vocabulary
size is then the bound, as in vLLM).

`dtype` takes vLLM's names ("auto", "half", "float16", "bfloat16", "float", "float32"), a few
aliases ("fp16", "bf16", "fp32", "float64", "double") and their torch dtypes; anything else is a
ValueError naming dtype and the accepted values. "auto" on CUDA is vLLM's rule: the config.json
dtype, bfloat16 where that is float32 or missing. On the CPU "auto" is float32 whatever the
checkpoint (a deliberate difference: vLLM applies its rule there too where the CPU supports a
16-bit type); pass dtype="bfloat16" for half the weight and KV memory. The KV cache always takes the model's dtype.

`model` is what vLLM users give: a local checkpoint directory (`~` and relative paths taken),
or a Hugging Face repo id ("Qwen/Qwen3-0.6B") whose snapshot is already in the local hub cache
(HF_HUB_CACHE / HF_HOME; vLLM's `download_dir` instead when given, the cache its downloads
went to), at vLLM's `revision` (a branch, tag or commit; None: "main"; it does
not apply to a local directory). Nothing is downloaded, HF_HUB_OFFLINE set or not: an uncached
repo is a CheckpointNotFound naming the field, where it looked and the `hf download` command
(worker/hub_cache.py). `model` keeps the id as given (the served model name, /v1/models);
model_dir() is the directory loaded, resolved once per EngineArgs so that every process and
tensor-parallel rank loads one snapshot.

vLLM's arguments a ported `LLM(...)` passes every day, under vLLM's names and defaults:
`tokenizer` (a local directory or a cached repo id to load the tokenizer from instead of the
model's; None: the model's) and `tokenizer_revision` (its revision; None: `revision`, vLLM's
rule), `tokenizer_mode` ("auto" and "hf": transformers' AutoTokenizer; "slow": the same with
use_fast=False, which transformers 5 ignores: it has only its fast backend), `trust_remote_code`
(False; passed to transformers' AutoConfig and AutoTokenizer, so a checkpoint's own
configuration_*.py / tokenization_*.py may run; the decoder itself is always transformers' own
class for a supported architecture, never a checkpoint's modeling_*.py), `skip_tokenizer_init`
(False; True is our skip_tokenizer: no tokenizer, token ids in and out). Accepted, and no bound
here: `disable_log_stats` (the engine logs no periodic stats to disable; EngineStats and the
server's /metrics are kept either way), `disable_custom_all_reduce` (False; the tensor-parallel
all-reduce is torch.distributed's, NCCL or gloo, what vLLM's True falls back to: there is no
custom one to disable), `swap_space` (GiB, default 4: preemption_mode="swap"
copies a preempted request's blocks to host memory as they are, with no cap to map it to),
`max_seq_len_to_capture` (default 8192: the decode CUDA graphs are captured for contexts up to
max_model_len, so no context length falls back to eager; max_cudagraph_capture_size bounds the
tokens of a step, another thing). Accepted only at vLLM's default (the table UNSUPPORTED_VALUES),
any other value a ValueError "not supported by enginespec" naming the argument and what is
accepted: `quantization` (None), `enable_lora` (False), `pipeline_parallel_size` (1),
`distributed_executor_backend` (None or "mp": the tensor-parallel ranks are processes the engine
spawns on one host, vLLM's "mp"; "ray", "uni" and "external_launcher" are refused),
`data_parallel_size` (1: one engine; replicas are separate servers behind a router),
`kv_cache_dtype` ("auto": the pool takes the model's dtype), `cpu_offload_gb` (0), `load_format`
("auto" or "safetensors", the one format the loader reads), `logprobs_mode` ("raw_logprobs":
logprobs are log_softmax of the model's logits before any edit, temperature or cut, vLLM V1's
default; its processed and logits modes are refused), `logits_processors` (None or []: vLLM V1's
custom processor classes, or their qualified names, are not loaded; SamplingParams' logit_bias,
allowed_token_ids, bad_words, min_tokens and structured outputs are the edits there are). `generation_config` ("auto": the
model directory's generation_config.json; "vllm": its EOS ids but none of its sampling
defaults; or another local directory) and `override_generation_config` (a dict of that file's
sampling keys over its defaults) work as vLLM's (engine/generation_config.py).
vLLM's serve-line engine options, accepted at the values that change nothing here, any other
value the same "not supported by enginespec" error: `compilation_config` (None, {}, level or
mode 3, vLLM's VLLM_COMPILE: the decoder under torch.compile with CUDA graphs, what the engine
does on CUDA; enforce_eager and compile_model are its switches), `optimization_level` (vLLM's
-O: 1, 2 or 3, compiled with graphs; 0 is enforce_eager here), `max_num_partial_prefills` (1, vLLM V1's only
value), `structured_outputs_config` (None or vLLM's defaults: backend "auto", no other switch;
the grammars are the engine's own), `guided_decoding_backend` ("auto") and `config_format`
("auto" or "hf": the loader reads config.json). `enable_sleep_mode` (vLLM's) turns on the
engine's sleep mode: LLM.sleep(level=1) / wake_up(tags) / is_sleeping (worker/sleep.py).
`hf_overrides` (vLLM's dict form): config.json keys laid over the target checkpoint's before
anything reads it (worker/loader.py read_config_json, the one reader, and load_config over it):
the model built, max_model_len's derivation, dtype "auto", the EOS of config.json, the draft
checks (the target's config only: a draft loads as saved, as in vLLM) and every tensor-parallel
rank (the overrides travel in these pickled args). A key the config lacks is added; a nested
dict merges key by key (vLLM sets a top-level dict value whole: here a partial rope dict keeps
the checkpoint's rope_theta; a null rope_scaling or rope_parameters turns the rope scaling off,
rope_theta kept); overrides naming architectures or model_type build that family (its config
class and model); a value the loader refuses is its CheckpointError naming the key.
None or a dict with str keys, else a ValueError; vLLM's callable form is refused by name (a
function does not cross to the spawned engine and worker processes).
`profiler_config` (vLLM's): None, a ProfilerConfig or a dict of its fields, such as {"profiler":
"torch", "torch_profiler_dir": DIR}: LLM.start_profile / stop_profile (and the server's
/start_profile, /stop_profile) trace into DIR with its torch_profiler_* options; the fields this
engine cannot honour (delays, iteration limits and schedules, the "cuda" profiler) are a
ValueError naming them (api/profiler.py). Held as a ProfilerConfig once the args are built.
`max_num_seqs`, `enable_prefix_caching`, `enable_chunked_prefill` and `preemption_mode` also
take vLLM's None ("the engine chooses", what code forwarding an unset option passes): our
default for each (UNSET_DEFAULTS).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import torch

from enginespec.profiler import ProfilerConfig
from enginespec.spec import POLICIES, PREEMPTION_MODES, SchedulerConfig
from enginespec.spec.impl import FACTORIES as IMPL_FACTORIES
from enginespec.spec.params import SEED_RANGE  # torch.manual_seed's range, as SamplingParams.seed

# Mixed steps (prefill chunks, verification rows) of up to this many tokens replay CUDA graphs:
# outside a graph any step cost about 12 ms of launches on the H200 whatever its size, more than
# a 2048-token chunk's compute (benchmarks/RESULTS.md, the serving step trace).
DEFAULT_MAX_CUDAGRAPH_CAPTURE_SIZE = 2048

# vLLM V1's offline (LLM class) default on large GPUs and nano-vllm's default: a prefill step of
# this many tokens keeps the GPU busier than the host that launches it, where 8192 did not
# (benchmarks/RESULTS.md: the prefill phase was host-bound at 8192 on the H200).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 16384
MODEL_IMPLS = ("auto", "merged", "transformers")
DEFAULT_MAX_LOGPROBS = 20  # vLLM's: the most logprobs a request may ask (-1: no cap)  # EngineArgs.model_impl, FlatModel's model_impl

#: vLLM's environment switch ("1" or "true") that lets a chosen max_model_len pass the model's
#: max_positions, with a warning: rope runs on past the positions the model was trained on.
ALLOW_LONG_MAX_MODEL_LEN_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"

log = logging.getLogger(__name__)


def allow_long_max_model_len() -> bool:
    """Whether VLLM_ALLOW_LONG_MAX_MODEL_LEN allows a max_model_len past the model's positions:
    "1" or "true" (any case) on, unset, "", "0" or "false" off; anything else is a ValueError
    naming the variable (a typo must not silently refuse or allow)."""
    raw = os.environ.get(ALLOW_LONG_MAX_MODEL_LEN_ENV, "").strip().lower()
    if raw in ("1", "true"):
        return True
    if raw in ("", "0", "false"):
        return False
    raise ValueError(f"{ALLOW_LONG_MAX_MODEL_LEN_ENV} must be 1 or 0 (true or false), got {raw!r}")


_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float64": torch.float64,
    "double": torch.float64,
}


_BOOL_FIELDS = (
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "skip_tokenizer",
    "enforce_eager",
    "async_scheduling",
    "compile_model",
    "warmup",
    "skinny_gemm",
    "trust_remote_code",
    "disable_log_stats",
    "enable_lora",
    "skip_tokenizer_init",
    "disable_custom_all_reduce",
    "enable_sleep_mode",
)
# vLLM's Optional scheduler and cache options -> what None (vLLM's "engine chooses") means here:
# our own defaults, which are vLLM V1's choices for a generative model (its V0 chose recompute).
UNSET_DEFAULTS = {
    "max_num_seqs": 256,
    "enable_prefix_caching": True,
    "enable_chunked_prefill": True,
    "preemption_mode": "recompute",
}

_OPTIONAL_BOOLS = ("compile_model", "warmup", "skinny_gemm")  # None: derive it

# vLLM arguments accepted only at these values (vLLM's defaults, and what the loader reads):
# name -> (the values accepted, why no other is)
UNSUPPORTED_VALUES = {
    "quantization": ((None,), "weights load unquantized, in the dtype argument's dtype"),
    "enable_lora": ((False,), "no LoRA adapters"),
    "pipeline_parallel_size": ((1,), "one pipeline stage; tensor_parallel_size shards the model"),
    "distributed_executor_backend": (
        (None, "mp"),
        "tensor-parallel ranks are processes the engine spawns on one host, as vLLM's 'mp'",
    ),
    "data_parallel_size": ((1,), "one engine replica; run one per device group behind a router"),
    "kv_cache_dtype": (("auto",), "the KV cache takes the model's dtype"),
    "cpu_offload_gb": ((0,), "weights stay on the device"),
    "load_format": (("auto", "safetensors"), "the loader reads *.safetensors only"),
    "tokenizer_mode": (("auto", "hf", "slow"), "tokenizers load through transformers' AutoTokenizer"),
    "logprobs_mode": (
        ("raw_logprobs",),
        "logprobs are log_softmax of the model's logits before any edit, temperature or cut",
    ),
    "max_num_partial_prefills": (
        (1,),
        "vLLM V1's only value; long_prefill_token_threshold caps a prompt's chunk",
    ),
    "guided_decoding_backend": (("auto",), "structured outputs compile with the engine's own grammars"),
    "config_format": (
        ("auto", "hf"),
        "the loader reads the checkpoint's config.json (Hugging Face's format)",
    ),
    "logits_processors": (
        (None, []),
        "no custom logits processor runs; the logit edits are SamplingParams' own: logit_bias, "
        "allowed_token_ids, bad_words, min_tokens and structured outputs",
    ),
}


def _check_int(name: str, value, low: int, high: Optional[int]) -> None:
    """An int (not a bool) in [low, high] (high None: unbounded), or a ValueError naming it."""
    bound = f">= {low}" if high is None else f"in [{low}, {high}]"
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        raise ValueError(f"{name} must be an int {bound}, got {value!r}")


def _check_impl(impl) -> None:
    """A non-blank name for spec.load_impl, or an object with an Implementation's name and
    factories (load_impl checks it again, and resolves a name, when the engine is built). None
    and a blank name are load_impl's "not given" ($ENGINESPEC_IMPL, else the slow reference
    oracle): taken here they ran the oracle without a word, where LLM() and the CLI default to
    "fast" and the CLI refuses a blank --impl; any other object failed deep in the engine's
    build with an AttributeError, after the model had loaded."""
    if isinstance(impl, str):
        ok = bool(impl.strip())
    else:
        ok = impl is not None and all(hasattr(impl, a) for a in ("name", *IMPL_FACTORIES))
    if not ok:
        raise ValueError(
            "impl must name an implementation (fast, reference, an `enginespec.impls` entry point or "
            f"pkg.module[:attr]) or be an Implementation object, got {impl!r}"
        )


def _check_compile_backend(backend) -> None:
    """A backend torch.compile takes: a callable, or a name of torch._dynamo's registry (its
    debug ones, such as "aot_eager", included). Passed on unchecked, an unknown name was torch's
    InvalidBackend (a RuntimeError naming no engine argument) once the decoder compiled, after
    the model had loaded. The registry is read only for a value other than the default."""
    if callable(backend) or backend == "inductor":
        return
    from torch._dynamo import list_backends

    known = list_backends(exclude_tags=())
    if not isinstance(backend, str) or backend not in known:
        raise ValueError(
            f"compile_backend must be a callable or one of torch.compile's backends {known}, got {backend!r}"
        )


def _check_dtype(dtype) -> None:
    """ "auto", a name of _DTYPES, or one of their torch dtypes; a ValueError naming dtype
    otherwise (a torch.int8 or torch.bool model loads and then generates nothing)."""
    if isinstance(dtype, torch.dtype):
        ok = dtype in _DTYPES.values()
    else:
        ok = isinstance(dtype, str) and (dtype == "auto" or dtype in _DTYPES)
    if not ok:
        raise ValueError(
            f"dtype must be 'auto', one of {sorted(_DTYPES)} or their torch dtype "
            f"({sorted({str(d) for d in _DTYPES.values()})}), got {dtype!r}"
        )


# vLLM's StructuredOutputsConfig keys -> the values accepted (its defaults): the grammars are
# the engine's own (engine/structured_output.py), with no backend or switch to choose; the
# reasoning split is the server's --reasoning-parser
STRUCTURED_OUTPUTS_DEFAULTS = {
    "backend": ("auto",),
    "disable_fallback": (False,),
    "disable_any_whitespace": (False,),
    "disable_additional_properties": (False,),
    "reasoning_parser": ("",),
}
_STRUCTURED_OUTPUTS_SHOWN = {key: values[0] for key, values in STRUCTURED_OUTPUTS_DEFAULTS.items()}
# vLLM's compilation level / mode that is the engine's own: 3 (VLLM_COMPILE, vLLM's default)
_COMPILE_LEVELS = (3, "VLLM_COMPILE")


def _check_compilation(args: "EngineArgs") -> None:
    """optimization_level (vLLM's -O) and compilation_config at the values that are what the
    engine does (the module docstring); a ValueError naming the argument otherwise."""
    level = args.optimization_level
    if level is not None:
        _check_int("optimization_level", level, 0, 3)
        if level == 0:
            raise ValueError(
                "optimization_level=0 (vLLM's -O0: no compilation, no CUDA graphs) is not supported by "
                "enginespec under that name: pass enforce_eager=True (--enforce-eager); accepted: [1, 2, 3]"
            )
    config = args.compilation_config
    if isinstance(config, int) and not isinstance(config, bool):
        config = {"level": config}  # vLLM's integer form: the level
    if config is not None and not isinstance(config, dict):
        raise ValueError(f"compilation_config must be None, a level (int) or a dict, got {config!r}")
    for key, value in (config or {}).items():
        if key not in ("level", "mode") or isinstance(value, bool) or value not in _COMPILE_LEVELS:
            raise ValueError(
                f"compilation_config {{{key!r}: {value!r}}} is not supported by enginespec (the decoder is "
                "compiled with CUDA graphs by the engine's own rules; enforce_eager, compile_model and "
                "max_cudagraph_capture_size are its switches); accepted: {}, 3, {'level': 3}, {'mode': 3}"
            )


def _check_structured_outputs_config(config) -> None:
    """None, or a dict of STRUCTURED_OUTPUTS_DEFAULTS' keys at their accepted values."""
    if config is None:
        return
    if not isinstance(config, dict):
        raise ValueError(f"structured_outputs_config must be None or a dict, got {config!r}")
    for key, value in config.items():
        accepted = STRUCTURED_OUTPUTS_DEFAULTS.get(key)
        if accepted is None or type(value) is not type(accepted[0]) or value not in accepted:
            raise ValueError(
                f"structured_outputs_config {{{key!r}: {value!r}}} is not supported by enginespec (structured "
                f"outputs compile with the engine's own grammars; the server's --reasoning-parser splits "
                f"reasoning); accepted: {_STRUCTURED_OUTPUTS_SHOWN}"
            )


def _check_hf_overrides(overrides) -> None:
    """None, or a dict whose keys (nested dicts' too) are strings, as config.json's are: a
    ValueError naming hf_overrides otherwise. vLLM's other form, a function of the config, is
    refused by name: the engine and its tensor-parallel ranks are spawned processes that get
    these args pickled, and a function (a lambda, a closure, one of __main__) does not cross."""
    if overrides is None:
        return
    if callable(overrides):
        raise ValueError(
            f"hf_overrides as a function ({overrides!r}, vLLM's callable form) is not supported by "
            "enginespec: the engine and its tensor-parallel workers are spawned processes, and a "
            "function does not cross to them; give a dict of config.json keys and values"
        )
    if not isinstance(overrides, dict):
        raise ValueError(f"hf_overrides must be None or a dict of config.json keys, got {overrides!r}")
    stack = [overrides]
    while stack:
        for key, value in stack.pop().items():
            if not isinstance(key, str):
                raise ValueError(f"hf_overrides keys must be strings (config.json's), got {key!r}")
            if isinstance(value, dict):
                stack.append(value)


def _check_vllm_args(args: "EngineArgs") -> None:
    """The vLLM arguments of the module docstring: types and ranges, then UNSUPPORTED_VALUES."""
    _check_int("pipeline_parallel_size", args.pipeline_parallel_size, 1, None)
    _check_int("data_parallel_size", args.data_parallel_size, 1, None)
    _check_int("max_seq_len_to_capture", args.max_seq_len_to_capture, 1, None)
    _check_int("max_num_partial_prefills", args.max_num_partial_prefills, 1, None)
    _check_compilation(args)
    _check_structured_outputs_config(args.structured_outputs_config)
    _check_hf_overrides(args.hf_overrides)
    for name in ("swap_space", "cpu_offload_gb"):  # GiB
        value = getattr(args, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
            raise ValueError(f"{name} must be a number of GiB >= 0, got {value!r}")
    if args.tokenizer is not None and not isinstance(args.tokenizer, (str, os.PathLike)):
        raise ValueError(f"tokenizer must be None, a directory path or a repo id, got {args.tokenizer!r}")
    download_dir = args.download_dir
    if download_dir is not None and not (
        isinstance(download_dir, (str, os.PathLike)) and str(download_dir).strip()
    ):
        raise ValueError(f"download_dir must be None or a directory path (a hub cache), got {download_dir!r}")
    for name in ("revision", "tokenizer_revision"):
        value = getattr(args, name)
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise ValueError(f"{name} must be None or a branch, tag or commit hash, got {value!r}")
    source = args.generation_config
    if source not in ("auto", "vllm") and not (
        isinstance(source, (str, os.PathLike)) and Path(source).is_dir()
    ):
        raise ValueError(
            f"generation_config must be 'auto', 'vllm' or a directory (holding a generation_config.json), "
            f"got {source!r}"
        )
    override = args.override_generation_config
    if override is not None and not isinstance(override, dict):
        raise ValueError(f"override_generation_config must be None or a dict, got {override!r}")
    for name, (accepted, why) in UNSUPPORTED_VALUES.items():  # bools and numbers checked above
        value = getattr(args, name)
        if value not in accepted:
            raise ValueError(
                f"{name}={value!r} is not supported by enginespec ({why}); accepted: {list(accepted)}"
            )


def _check_sizes(args: "EngineArgs") -> None:
    """What of the lengths and the pool's size needs no model, checked on construction so that
    a bad value costs no checkpoint load: max_model_len's type and lower bound (its upper
    bound, the model's positions, in resolve_max_model_len), num_blocks and kv_cache_bytes (the
    runner checks them again), and with chunked prefill off a budget a chosen max_model_len
    cannot prefill in (check_prefill_budget). Each had been found only after the load."""
    value = args.max_model_len
    if value is not None and (
        not isinstance(value, int) or isinstance(value, bool) or not (value == -1 or value >= 2)
    ):
        raise ValueError(
            f"max_model_len must be None, -1 (both: the model's, fitted to the KV pool) or an int >= 2, "
            f"got {value!r}"
        )
    for name in ("num_blocks", "kv_cache_bytes"):
        if getattr(args, name) is not None:
            _check_int(name, getattr(args, name), 1, None)
    if args.max_num_batched_tokens is not None and args.chosen_max_model_len:
        args.check_prefill_budget(args.max_num_batched_tokens, value)


def _check_scheduling(args: "EngineArgs") -> None:
    """The scheduler's knobs under their EngineArgs names, before any model loads (SchedulerConfig
    checks them again under its own: `policy` is scheduling_policy there, and a typo found there
    cost a whole model load first). max_num_seqs is checked before this."""
    if args.scheduling_policy not in POLICIES:
        raise ValueError(f"scheduling_policy must be one of {list(POLICIES)}, got {args.scheduling_policy!r}")
    if args.preemption_mode not in PREEMPTION_MODES:
        raise ValueError(
            f"preemption_mode must be one of {list(PREEMPTION_MODES)}, got {args.preemption_mode!r}"
        )
    _check_int("long_prefill_token_threshold", args.long_prefill_token_threshold, 0, None)
    if args.max_num_batched_tokens is not None:  # below max_num_seqs is fine: fewer decodes a step
        _check_int("max_num_batched_tokens", args.max_num_batched_tokens, 1, None)


@dataclass
class EngineArgs:
    """Engine settings. None means "derive it": max_model_len from the model's
    max_position_embeddings, lowered to what the engine holds (-1, vLLM's "auto", the same);
    max_num_batched_tokens 16384 with chunked prefill (at least
    max_num_seqs), else at least max_model_len so every prompt fits one step."""

    model: Optional[str] = None
    impl: Any = "fast"  # as LLM(), AsyncLLM() and the CLI; "reference" is the oracle
    dtype: Union[str, torch.dtype] = "auto"
    seed: Optional[int] = 0
    block_size: int = 16
    max_model_len: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    max_num_seqs: Optional[int] = 256  # None: vLLM's "engine chooses", 256 (_resolve_unset)
    enable_prefix_caching: Optional[bool] = True  # None: vLLM's default, on (_resolve_unset)
    enable_chunked_prefill: Optional[bool] = True  # None: vLLM's default, on (_resolve_unset)
    long_prefill_token_threshold: int = 0
    scheduling_policy: str = "fcfs"
    gpu_memory_utilization: float = 0.9
    num_gpu_blocks_override: Optional[int] = None
    num_blocks: Optional[int] = None
    kv_cache_bytes: Optional[int] = None
    preemption_mode: Optional[str] = "recompute"  # None: vLLM's "engine chooses", recompute
    device: str = "auto"
    skip_tokenizer: bool = False
    enforce_eager: bool = False
    compile_model: Optional[bool] = None
    async_scheduling: bool = True
    compile_backend: str = "inductor"
    model_impl: str = "auto"
    tensor_parallel_size: int = 1
    warmup: Optional[bool] = None
    speculative_config: Optional[dict] = None
    skinny_gemm: Optional[bool] = None
    max_cudagraph_capture_size: Optional[int] = None
    max_logprobs: int = DEFAULT_MAX_LOGPROBS
    # vLLM's names and defaults (the module docstring: implemented, accepted, or refused)
    tokenizer: Optional[str] = None
    tokenizer_mode: str = "auto"
    trust_remote_code: bool = False
    skip_tokenizer_init: bool = False  # vLLM's name for skip_tokenizer (either one skips it)
    disable_log_stats: bool = False
    swap_space: float = 4
    max_seq_len_to_capture: int = 8192
    quantization: Optional[str] = None
    enable_lora: bool = False
    pipeline_parallel_size: int = 1
    distributed_executor_backend: Optional[str] = None
    disable_custom_all_reduce: bool = False
    data_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    cpu_offload_gb: float = 0
    revision: Optional[str] = None
    tokenizer_revision: Optional[str] = None
    download_dir: Optional[str] = None
    load_format: str = "auto"
    logprobs_mode: str = "raw_logprobs"
    logits_processors: Optional[list] = None
    generation_config: str = "auto"
    override_generation_config: Optional[dict] = None
    # vLLM's serve-line options, at the values that change nothing here (the module docstring)
    compilation_config: Union[int, dict, None] = None
    optimization_level: Optional[int] = None
    hf_overrides: Optional[dict] = None  # config.json keys merged over the target's (docstring)
    max_num_partial_prefills: int = 1
    structured_outputs_config: Optional[dict] = None
    guided_decoding_backend: str = "auto"
    enable_sleep_mode: bool = False
    config_format: str = "auto"
    profiler_config: Union[dict, ProfilerConfig, None] = None  # vLLM's; a ProfilerConfig once built

    def __post_init__(self) -> None:
        """Types and ranges of the fields checked here (a ValueError naming the field and its
        bound), before any model loads; only what needs the model (max_model_len against its
        positions, an unchosen max_model_len's fitting) is checked where it is resolved."""
        self._resolve_unset()
        self._dirs: dict = {}  # model_dir() / tokenizer_dir(), resolved once (model_dir says why)
        _check_impl(self.impl)
        for name in ("block_size", "max_num_seqs", "tensor_parallel_size"):
            _check_int(name, getattr(self, name), 1, None)
        _check_int("max_logprobs", self.max_logprobs, -1, None)
        _check_scheduling(self)
        _check_dtype(self.dtype)
        if self.num_gpu_blocks_override is not None:
            _check_int("num_gpu_blocks_override", self.num_gpu_blocks_override, 1, None)
        if self.seed is not None:
            _check_int("seed", self.seed, *SEED_RANGE)
        for name in _BOOL_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, bool) and not (value is None and name in _OPTIONAL_BOOLS):
                raise ValueError(f"{name} must be a bool, got {value!r}")
        util = self.gpu_memory_utilization
        if isinstance(util, bool) or not isinstance(util, (int, float)) or not 0.0 < util <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {util!r}")
        size = self.max_cudagraph_capture_size
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0):
            raise ValueError(f"max_cudagraph_capture_size must be None or an int >= 0, got {size!r}")
        if self.model_impl not in MODEL_IMPLS:
            raise ValueError(f"model_impl must be one of {list(MODEL_IMPLS)}, got {self.model_impl!r}")
        _check_sizes(self)
        _check_compile_backend(self.compile_backend)
        _check_vllm_args(self)
        self.profiler_config = ProfilerConfig.of(self.profiler_config)

    def _resolve_unset(self) -> None:
        """vLLM types these Optional, None meaning "the engine chooses", and code that forwards
        an unset option passes that None: it takes the default here (UNSET_DEFAULTS), so after
        construction each holds a value of its own type and is checked as one."""
        for name, default in UNSET_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, default)

    @classmethod
    def from_kwargs(cls, model: Optional[str], **kwargs) -> "EngineArgs":
        """Build from keyword arguments; unknown names are a TypeError listing them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"unknown engine argument(s) {unknown}; known: {sorted(known - {'model'})}")
        return cls(model=None if model is None else str(model), **kwargs)

    @staticmethod
    def add_cli_args(parser):
        """vLLM's: add `--model` and the engine's flags (the CLI's, vLLM's spellings:
        `--max-model-len 4k`, `--no-enable-prefix-caching`, ...) to an argparse parser or
        argument group, and return it. The namespace it parses holds every field, at the
        field's default unless given, and nothing else of ours: vLLM's scripts pass it on as
        `LLM(**vars(ns))` (generate.py, chat.py) or `EngineArgs.from_cli_args(ns)`
        (llm_engine_example.py), and both take it as it is."""
        from enginespec.entrypoints.cli import MODEL_HELP, add_engine_flags

        parser.add_argument("--model", help=MODEL_HELP)
        add_engine_flags(parser)
        parser.set_defaults(**{f.name: f.default for f in dataclasses.fields(EngineArgs)})
        return parser

    @classmethod
    def from_cli_args(cls, args) -> "EngineArgs":
        """vLLM's: the EngineArgs of a namespace parsed with add_cli_args' flags; its other
        attributes (a script's own flags) are left out, and the fields it lacks keep their
        defaults. Checked as any EngineArgs is (a ValueError naming the field)."""
        names = [f.name for f in dataclasses.fields(cls) if hasattr(args, f.name)]
        return cls(**{name: getattr(args, name) for name in names})

    def model_dir(self) -> Optional[str]:
        """The local directory `model` names (None without a model): the directory itself, or
        the snapshot of the cached Hugging Face repo `model` at `revision`
        (worker/hub_cache.py; CheckpointNotFound naming "model" otherwise). Resolved on the
        first call and kept in these args, which travel pickled to the engine process and to
        every tensor-parallel rank: all of them load the one snapshot, even if a download moves
        the ref meanwhile. `model` itself stays as given (the served name, metrics, /v1/models)."""
        if self.model is None:
            return None
        return self._dir("model", self.model, self.revision)

    def tokenizer_dir(self) -> Optional[str]:
        """The local directory of `tokenizer` (a directory or a cached repo id) at
        `tokenizer_revision`, which is `revision` when None (vLLM's rule); None when neither is
        given: the model's own directory (load_engine_tokenizer). A tokenizer_revision alone is
        the model's repo at that revision."""
        revision = self.tokenizer_revision or self.revision
        if self.tokenizer is None and (self.model is None or revision == self.revision):
            return None
        return self._dir("tokenizer", self.tokenizer or self.model, revision)

    def _dir(self, field: str, value, revision: Optional[str]) -> str:
        """resolve_checkpoint's answer for (field, value, revision), kept (model_dir)."""
        from enginespec.worker.hub_cache import resolve_checkpoint

        key = (field, str(value), revision)
        if key not in self._dirs:
            self._dirs[key] = resolve_checkpoint(
                value, field=field, revision=revision, cache_dir=self.download_dir
            )
        return self._dirs[key]

    def mixed_graph_tokens(self, max_num_batched_tokens: int) -> int:
        """The largest mixed-step graph's token count (see max_cudagraph_capture_size)."""
        size = self.max_cudagraph_capture_size
        size = DEFAULT_MAX_CUDAGRAPH_CAPTURE_SIZE if size is None else size
        return min(size, max_num_batched_tokens)

    @property
    def chosen_max_model_len(self) -> bool:
        """Whether the user chose max_model_len: None and -1 (vLLM's "auto") ask for the model's
        length, lowered to what the engine can hold (EngineCore._fit_max_model_len)."""
        return self.max_model_len not in (None, -1)

    def resolve_max_model_len(self, max_positions: int) -> int:
        """max_model_len, or the model's max_positions (worker.flat_model.max_positions: its
        max_position_embeddings, stretched by a linear, dynamic or yarn rope scaling) when None
        or -1; a ValueError outside [2, max_positions]. Past max_positions only where vLLM's
        VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 allows it, with a warning (the model's rope then covers
        the longer length: FlatModel.cover_positions)."""
        if not self.chosen_max_model_len:
            return max_positions
        value = self.max_model_len
        if (
            not isinstance(value, int)
            or value < 2
            or (value > max_positions and not allow_long_max_model_len())
        ):
            raise ValueError(
                f"max_model_len must be None, -1 (both: the model's, fitted to the KV pool) or an int in "
                f"[2, {max_positions}] (the model's max_position_embeddings, times a linear, dynamic or "
                f"yarn rope scaling's factor), got {value!r}; {ALLOW_LONG_MAX_MODEL_LEN_ENV}=1 allows a "
                f"longer one, at the risk of wrong output past the positions the model was trained on"
            )
        if value > max_positions:
            log.warning(
                "max_model_len %d is past the model's %d positions (max_position_embeddings, rope "
                "scaling included), allowed by %s=1: output past them may be wrong",
                value,
                max_positions,
                ALLOW_LONG_MAX_MODEL_LEN_ENV,
            )
        return value

    def seats(self, budget: int) -> int:
        """The scheduler's max_num_seqs for a step budget of `budget` tokens: max_num_seqs, or the
        budget when smaller (a budget below max_num_seqs is taken, as _check_scheduling says;
        no step could decode more than `budget` requests, and SchedulerConfig refuses a
        max_num_seqs above its budget)."""
        return min(self.max_num_seqs, budget)

    def check_prefill_budget(self, budget: int, max_model_len: int) -> None:
        """With chunked prefill off a chosen max_model_len must prefill in one step (vLLM's
        check; the bound here is the scheduler's add() rule, prompt + max_tokens - 1 <=
        max_num_batched_tokens): a ValueError otherwise."""
        if not self.enable_chunked_prefill and budget < max_model_len - 1:
            raise ValueError(
                f"max_num_batched_tokens ({budget}) is smaller than max_model_len ({max_model_len}) - 1 "
                f"with enable_chunked_prefill=False: a request of max_model_len tokens could never "
                f"prefill in one step; raise max_num_batched_tokens, lower max_model_len or enable "
                f"chunked prefill"
            )

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        """The scheduler's config for the resolved max_model_len. With chunked prefill off a
        chosen max_model_len must prefill in one step (check_prefill_budget, also checked on
        construction); a length the user did not choose is fitted instead (EngineCore)."""
        budget = self.max_num_batched_tokens
        if budget is None:
            budget = max(DEFAULT_MAX_NUM_BATCHED_TOKENS, self.max_num_seqs)
            if not self.enable_chunked_prefill:
                budget = max(budget, max_model_len)
        elif self.chosen_max_model_len:
            self.check_prefill_budget(budget, max_model_len)
        return SchedulerConfig(
            max_num_batched_tokens=budget,
            max_num_seqs=self.seats(budget),
            enable_chunked_prefill=self.enable_chunked_prefill,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            policy=self.scheduling_policy,
            preemption_mode=self.preemption_mode,
            max_model_len=max_model_len,
        )


def resolve_device(device) -> torch.device:
    """ "auto" -> cuda when available, else cpu."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for but CUDA is not available")
    return dev


def resolve_dtype(
    dtype, model_dir: Optional[str], device: torch.device, hf_overrides: Optional[dict] = None
) -> torch.dtype:
    """ "auto": float32 on CPU; on CUDA the checkpoint's dtype (config.json's, hf_overrides
    merged: an override of dtype / torch_dtype is what the config then says), bfloat16 if that
    is float32."""
    _check_dtype(dtype)
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype != "auto":
        return _DTYPES[dtype]
    if device.type != "cuda":
        return torch.float32
    saved = _config_dtype(model_dir, hf_overrides)
    return saved if saved in (torch.float16, torch.bfloat16) else torch.bfloat16


def _config_dtype(model_dir: Optional[str], hf_overrides: Optional[dict] = None) -> Optional[torch.dtype]:
    """config.json's dtype (hf_overrides merged), None where it has none or cannot be read (the
    loader then reports the file)."""
    from enginespec.worker.loader import CheckpointError, read_config_json

    if model_dir is None:
        return None
    try:
        config = read_config_json(model_dir, hf_overrides)
    except CheckpointError:
        return None
    for source in (hf_overrides or {}, config):  # an override's name wins over the file's other one
        name = source.get("dtype") or source.get("torch_dtype")
        if name:
            return _DTYPES.get(str(name))
    return None
