"""The `enginespec` command line.

    enginespec generate --model MODEL --prompt "text" [--prompt ...] [--max-tokens 32] ...
                                  (a sampling flag left out takes the checkpoint's
                                  generation_config.json default, else greedy, 32 tokens)
    enginespec demo [--num-requests 16 --max-input-len 64 --max-output-len 32 --num-blocks 64]
    enginespec simulate [...]     (the control plane alone over a fake model; see simulate.py)
    enginespec serve MODEL [--host 127.0.0.1 --port 8000 --api-key K [K ...] ...]
                                  (an OpenAI-compatible server; see entrypoints/openai/;
                                  `serve --model MODEL`, vLLM's other form, is the same)

MODEL is a local checkpoint directory or, as vLLM users give it, a Hugging Face repo id whose
snapshot is already in the local hub cache (`--revision`; worker/hub_cache.py): nothing is
downloaded.

`python -m enginespec ...` is the same command line (for an environment whose scripts directory
is not on PATH).

The throughput benchmark is not part of the installed product: from a checkout, run
`python benchmarks/throughput.py` (`enginespec bench` says so and exits with status 2).

Bad input (a missing or corrupt checkpoint, an impossible setting) prints one line naming what
is wrong to stderr and exits with status 2, no traceback. Results go to stdout (a character
its encoding lacks as a backslash escape), progress bars and logs to stderr. Ctrl-C prints
"enginespec COMMAND: interrupted" and exits 130; a reader that closes the pipe early
(`| head -1`) ends the command quietly with status 141.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from typing import Optional, Sequence

from enginespec.entrypoints.openai.reasoning import PARSERS
from enginespec.entrypoints.openai.tool_parsers import PARSERS as TOOL_PARSERS

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a process Ctrl-C ended
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a writer whose reader left
# How soon a Ctrl-C whose KeyboardInterrupt was dropped is raised again (_interrupts_delivered)
REDELIVER_S = 0.05
MODEL_HELP = "a checkpoint directory, or a Hugging Face repo id in the local hub cache"
BENCH_MOVED = (
    "the throughput benchmark lives in the repository, not the package: "
    "run `python benchmarks/throughput.py` from a checkout (same flags)"
)


def _json_value(text: str):
    """A flag's JSON value (an ArgumentTypeError, argparse's usage error naming the flag, when
    the text is not JSON; json.loads as the type said "invalid loads value")."""
    try:
        return json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"must be JSON, got {text!r} ({e})") from e


# The flags whose JSON value is an object, so that vLLM's dotted form can fill it (_dotted_json).
JSON_OBJECT_FLAGS = (
    "--speculative-config",
    "--override-generation-config",
    "--compilation-config",
    "--hf-overrides",
    "--structured-outputs-config",
    "--default-chat-template-kwargs",
    "--profiler-config",
)


def vllm_spelling(argv: list[str]) -> tuple[list[str], dict[str, dict]]:
    """vLLM's spellings of flags, read as ours: an option's name (before any "." or "=") with
    underscores means the dashed one (`--speculative_config`), and a JSON object flag may be
    given key by key (`--speculative-config.num_speculative_tokens 3`, `--FLAG.a.b=V`, and
    `--FLAG.key+ V` / `--FLAG.key+=V1,V2` for list items): each value is JSON where it parses
    and a string where not. Returns (argv without the dotted options, flag -> the object they
    build); `merge_dotted` lays that over the flag's own JSON once argparse has read it."""
    out: list[str] = []
    dotted: dict[str, dict] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            out.extend(argv[i - 1 :])
            break
        if not arg.startswith("--"):
            out.append(arg)
            continue
        name, eq, value = arg.partition("=")
        head, dot, keys = name.partition(".")
        head = head.replace("_", "-")
        if not dot or head not in JSON_OBJECT_FLAGS:
            out.append(head + dot + keys + eq + value)
            continue
        if not eq:
            if i >= len(argv):
                raise argparse.ArgumentTypeError(f"{head}.{keys} expects a value")
            value = argv[i]
            i += 1
        _set_dotted(dotted.setdefault(head, {}), head, keys, value)
    return out, dotted


def _set_dotted(target: dict, flag: str, keys: str, text: str) -> None:
    """Set target[k1][k2]... (keys "k1.k2", "+" at the end: append the comma-separated items)."""
    append = keys.endswith("+")
    path = keys[:-1].split(".") if append else keys.split(".")
    if not all(path):
        raise argparse.ArgumentTypeError(f"{flag}.{keys}: empty key")
    if append:
        value = text.split(",")
    else:
        try:
            value = json.loads(text)
        except ValueError:
            value = text
    for key in path[:-1]:
        target = target.setdefault(key, {})
        if not isinstance(target, dict):
            raise argparse.ArgumentTypeError(f"{flag}.{keys}: {key} is not an object")
    last = path[-1]
    if append and isinstance(target.get(last), list):
        target[last] = target[last] + value
    else:
        target[last] = value


def merge_dotted(parser, ns: argparse.Namespace, dotted: dict[str, dict]) -> None:
    """Lay each flag's dotted keys over its JSON value (None: an empty object)."""
    from enginespec.worker.loader import deep_merge

    for flag, extra in dotted.items():
        dest = flag[2:].replace("-", "_")
        if not hasattr(ns, dest):
            parser.error(f"unrecognized arguments: {flag}.*")
        base = getattr(ns, dest)
        if base is None:
            base = {}
        if not isinstance(base, dict):
            parser.error(
                f"argument {flag}: its JSON must be an object to take {flag}.KEY values, got {base!r}"
            )
        merged = deep_merge(base, extra)
        check = _DOTTED_CHECKS.get(flag)
        if check is not None:  # the flag's own checks, over the object the keys built
            try:
                merged = check(json.dumps(merged))
            except argparse.ArgumentTypeError as e:
                parser.error(f"argument {flag}: {e}")
        setattr(ns, dest, merged)


_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def _token_count(text: str) -> int:
    """A count as vLLM's CLI reads one: "2048", "4k" / "25.6k" (k, m, g, t: powers of 1000,
    decimals allowed), "1K" (K, M, G, T: powers of 1024, whole numbers only). Anything else is
    an ArgumentTypeError (argparse's usage error naming the flag)."""
    text = text.strip()
    number, suffix = (text[:-1], text[-1]) if text[-1:] in _DECIMAL.keys() | _BINARY.keys() else (text, "")
    try:
        if suffix in _BINARY:
            return int(number) * _BINARY[suffix]
        if suffix:
            return int(float(number) * _DECIMAL[suffix])
        return int(number)
    except (ValueError, OverflowError):  # OverflowError: "infk"
        raise argparse.ArgumentTypeError(
            f"must be a whole number, optionally with a suffix k/m/g/t (x1000) or K/M/G/T (x1024; "
            f"whole numbers only), got {text!r}"
        ) from None


def _argv_text(text: str) -> str:
    """A text flag's value (a prompt, a stop string). Bytes of the command line that are not
    text in the locale's encoding (Latin-1 bytes under a UTF-8 locale) reach Python as lone
    surrogates (PEP 383's surrogateescape), which no tokenizer takes: the model loaded, then
    the tokenizer's "TextEncodeInput must be Union[...]" came out as the error. An
    ArgumentTypeError (argparse's usage error naming the flag) names the first such byte."""
    for i, char in enumerate(text):
        if "\ud800" <= char <= "\udfff":
            code = ord(char)
            what = f"byte 0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"{ascii(char)}"
            raise argparse.ArgumentTypeError(
                f"{what} at character {i} is not {sys.getfilesystemencoding()} text "
                f"(the locale's encoding, LANG / LC_ALL, must be the text's)"
            )
    return text


def impl_arg(text: str) -> str:
    """--impl: a non-blank impl name. load_impl reads an empty name as "not given" (then
    $ENGINESPEC_IMPL, else the reference), so `--impl "$IMPL"` with IMPL unset ran the slow
    oracle without a word; it is argparse's usage error (exit 2), as the conformance plugin's
    --impl= is."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"must name an impl (fast, reference, an `enginespec.impls` entry point or pkg.module[:attr]), "
            f"got {text!r}"
        )
    return text


def _token_count_or_auto(text: str) -> int:
    """--max-model-len: a _token_count, or "auto" / "-1" (-1: fit the length to the KV pool)."""
    return -1 if text.strip().lower() in ("auto", "-1") else _token_count(text)


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    """Engine knobs shared by generate, demo and serve, and the progress bar's switch."""
    add_engine_flags(p)
    p.add_argument("--no-tqdm", dest="use_tqdm", action="store_false", help="no progress bar")


def add_engine_flags(p) -> None:
    """The engine's flags (vLLM's EngineArgs flag names), each one EngineArgs field, on an
    argparse parser or argument group: the CLI's, and `EngineArgs.add_cli_args`'s (which
    needs every dest to be a field, so that `EngineArgs(**vars(ns))` takes the namespace)."""
    from enginespec.engine_args import MODEL_IMPLS

    p.add_argument(
        "--impl",
        type=impl_arg,
        default="fast",
        help="fast (the default, as LLM()), reference, an installed backend's enginespec.impls entry point, "
        "or pkg.module[:attr]",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        help="auto (CUDA: the checkpoint's bfloat16/float16, bfloat16 for float32; CPU: float32), "
        "float32, bfloat16, float16 (half)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--seed", type=int, default=0, help="seed of the engine's random state (default 0)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block (default 16)")
    p.add_argument(
        "--max-model-len", type=_token_count_or_auto, default=None, help="tokens: 4096, 4k, 4K, or auto (-1)"
    )
    p.add_argument("--max-num-batched-tokens", type=_token_count, default=None, help="tokens: 8192, 8k, 8K")
    p.add_argument("--max-num-seqs", type=int, default=None, help="most requests in one step (default 256)")
    p.add_argument("--num-blocks", type=int, default=None, help="KV blocks of the pool (CPU)")
    p.add_argument("--kv-cache-bytes", type=int, default=None, help="KV pool budget in bytes (CPU)")
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="CUDA: the share of the GPU's memory in (0, 1] the engine may use, KV cache included "
        "(default 0.9; the CPU sizes its pool by --kv-cache-bytes)",
    )
    p.add_argument(
        "--num-gpu-blocks-override", type=int, default=None, help="KV blocks of the pool, on any device"
    )
    for name, does in (  # vLLM's names and our older short ones
        ("prefix-caching", "reuse the cached KV blocks of prompts' shared prefixes"),
        ("chunked-prefill", "split long prompts over several steps"),
    ):
        dest = "enable_" + name.replace("-", "_")
        p.add_argument(
            f"--enable-{name}", dest=dest, action="store_true", default=True, help=f"{does} (default)"
        )
        p.add_argument(
            f"--no-enable-{name}",
            f"--no-{name}",
            dest=dest,
            action="store_false",
            help=f"no {name.replace('-', ' ')}",
        )
    p.add_argument(
        "--long-prefill-token-threshold",
        type=int,
        default=0,
        help="at most this many prompt tokens of one request per step (default 0: no cap)",
    )
    p.add_argument(
        "--scheduling-policy",
        choices=("fcfs", "priority"),
        default="fcfs",
        help="fcfs: arrival order (default); priority: lower request priority first",
    )
    p.add_argument(
        "--preemption-mode",
        choices=("recompute", "swap"),
        default="recompute",
        help="what a preempted request's KV blocks become: recomputed later (default) or swapped to host memory",
    )
    p.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="no torch.compile, no CUDA graphs",
    )
    p.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="schedule step n + 1 while step n runs (default; vLLM's flag); --no-async-scheduling: every step serial",
    )
    p.add_argument(
        "--no-compile",
        dest="compile_model",
        action="store_const",
        const=False,
        default=None,
        help="keep CUDA graphs but run the decoder without torch.compile",
    )
    p.add_argument(
        "--model-impl",
        choices=MODEL_IMPLS,
        default=None,
        help="decoder wiring: merged q|k|v and gate|up GEMMs (auto) or transformers' own",
    )
    p.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=int,
        default=None,
        help="shard the model over this many ranks, one process (and GPU) each",
    )
    p.add_argument(
        "--speculative-config",
        type=_json_value,
        default=None,
        help='speculative decoding, as JSON with vLLM\'s names: \'{"method": "ngram", '
        '"num_speculative_tokens": 3, "prompt_lookup_max": 4}\' or \'{"method": "draft_model", '
        '"model": "DRAFT_DIR", "num_speculative_tokens": 3}\'; either takes '
        '"disable_by_batch_size": N (no drafts while N or more requests run; default 64, null: never); '
        "or key by key, as vLLM takes it: --speculative-config.num_speculative_tokens 3",
    )
    p.add_argument(
        "--max-cudagraph-capture-size",
        type=int,
        default=None,
        help="mixed steps (prefill chunks, verification) of up to this many tokens replay CUDA "
        "graphs (default 2048; 0: decode steps only)",
    )
    p.add_argument(
        "--max-logprobs",
        type=int,
        default=None,
        help="the most logprobs / prompt_logprobs a request may ask (default 20; -1: no cap)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="a local directory or a cached Hugging Face repo id to load the tokenizer from (default: the model's)",
    )
    p.add_argument(
        "--revision",
        default=None,
        help="the Hugging Face revision (branch, tag or commit) of a repo-id model in the local hub cache",
    )
    p.add_argument(
        "--tokenizer-revision",
        default=None,
        help="the tokenizer's revision in the local hub cache (default: --revision)",
    )
    p.add_argument(
        "--tokenizer-mode",
        choices=("auto", "hf", "slow"),
        default=None,
        help="auto/hf: transformers' AutoTokenizer; slow: use_fast=False (transformers 5 ignores it)",
    )
    p.add_argument(
        "--trust-remote-code",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="let transformers run the checkpoint's own config / tokenizer code (never its model code)",
    )
    p.add_argument(
        "--disable-log-stats",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="accepted for vLLM's command lines; the engine logs no periodic stats (/metrics stays)",
    )
    p.add_argument(
        "--generation-config",
        default=None,
        help="auto (the model's generation_config.json), vllm (none of its sampling defaults) or a directory",
    )
    p.add_argument(
        "--override-generation-config",
        type=_json_value,
        default=None,
        help='JSON sampling defaults over generation_config\'s, e.g. \'{"temperature": 0.5}\'',
    )
    _add_vllm_default_args(p)


def _add_vllm_default_args(p: argparse.ArgumentParser) -> None:
    """vLLM's engine flags that EngineArgs takes only at vLLM's defaults or with nothing to
    bound here (engine_args.py): a vLLM command line runs, and any other value is EngineArgs'
    one-line "not supported by enginespec" error naming it. Default None: not given."""
    p.add_argument(
        "--swap-space", type=float, default=None, help="accepted (GiB); swap copies blocks as they are"
    )
    p.add_argument(
        "--max-seq-len-to-capture", type=int, default=None, help="accepted; graphs cover max_model_len"
    )
    p.add_argument("--quantization", "-q", default=None, help="not supported (weights load unquantized)")
    p.add_argument("--kv-cache-dtype", default=None, help="auto only (the KV cache takes the model's dtype)")
    p.add_argument(
        "--logprobs-mode", default=None, help="raw_logprobs only (log_softmax of the unedited logits)"
    )
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=None, help="1 only")
    p.add_argument(
        "--distributed-executor-backend", default=None, help="mp only (TP ranks are spawned processes)"
    )
    p.add_argument("--data-parallel-size", "-dp", type=int, default=None, help="1 only (one replica)")
    p.add_argument(
        "--disable-custom-all-reduce",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="accepted; the tensor-parallel all-reduce is torch.distributed's (NCCL or gloo) either way",
    )
    p.add_argument(
        "--enable-lora",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="not supported (--no-enable-lora, vLLM's default, is accepted)",
    )
    p.add_argument("--cpu-offload-gb", type=float, default=None, help="0 only")
    p.add_argument(
        "--download-dir",
        default=None,
        help="the hub cache to find a repo-id model in (default: HF_HUB_CACHE's)",
    )
    p.add_argument("--load-format", default=None, help="auto or safetensors")
    _add_vllm_serve_line_args(p)


def _add_vllm_serve_line_args(p) -> None:
    """vLLM's engine flags of everyday serve lines, taken only at values that change nothing
    here (EngineArgs' module docstring); default None: not given."""
    p.add_argument(
        "--compilation-config",
        type=_json_value,
        default=None,
        help="accepted: {}, 3 or {\"level\"/\"mode\": 3} (vLLM's default: compiled decoder, CUDA graphs, "
        "what the engine does; --enforce-eager and --no-compile switch them off)",
    )
    p.add_argument(
        "-O",
        "--optimization-level",
        type=int,
        default=None,
        help="accepted: 1, 2, 3 (vLLM's -O: compiled, CUDA graphs); for -O0 use --enforce-eager",
    )
    p.add_argument(
        "--hf-overrides",
        type=_json_value,
        default=None,
        help="JSON object of config.json keys laid over the checkpoint's before the model is built "
        '(vLLM\'s), e.g. \'{"max_position_embeddings": 65536}\'; a nested object merges key by key',
    )
    p.add_argument("--max-num-partial-prefills", type=int, default=None, help="1 only (vLLM V1's only value)")
    p.add_argument(
        "--structured-outputs-config",
        type=_json_value,
        default=None,
        help='accepted: {} or {"backend": "auto"} (structured outputs compile with the engine\'s own grammars)',
    )
    p.add_argument(
        "--guided-decoding-backend", default=None, help="auto only (vLLM's older name of the backend)"
    )
    p.add_argument(
        "--enable-sleep-mode",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="sleep mode (vLLM's): with --enable-dev-endpoints, POST /sleep?level=1 moves the weights to "
        "host memory and frees the KV cache, POST /wake_up restores them",
    )
    p.add_argument("--config-format", default=None, help="auto or hf (the loader reads config.json)")
    p.add_argument(
        "--profiler-config",
        type=_json_value,
        default=None,
        help='vLLM\'s profiler config, e.g. \'{"profiler": "torch", "torch_profiler_dir": "/tmp/traces"}\' '
        "(or key by key, vLLM's dotted form): the server's POST /start_profile and /stop_profile "
        "trace the engine into that directory (VLLM_TORCH_PROFILER_DIR's older way works too); a field "
        "the engine cannot honour is refused by name",
    )


_ENGINE_KEYS = (
    "dtype",
    "device",
    "block_size",
    "max_model_len",
    "max_num_batched_tokens",
    "max_num_seqs",
    "num_blocks",
    "kv_cache_bytes",
    "gpu_memory_utilization",
    "num_gpu_blocks_override",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "long_prefill_token_threshold",
    "scheduling_policy",
    "preemption_mode",
    "enforce_eager",
    "async_scheduling",
    "compile_model",
    "model_impl",
    "tensor_parallel_size",
    "speculative_config",
    "max_cudagraph_capture_size",
    "max_logprobs",
    "tokenizer",
    "tokenizer_mode",
    "trust_remote_code",
    "disable_log_stats",
    "generation_config",
    "override_generation_config",
    "swap_space",
    "max_seq_len_to_capture",
    "quantization",
    "kv_cache_dtype",
    "pipeline_parallel_size",
    "distributed_executor_backend",
    "data_parallel_size",
    "disable_custom_all_reduce",
    "enable_lora",
    "cpu_offload_gb",
    "revision",
    "tokenizer_revision",
    "download_dir",
    "load_format",
    "logprobs_mode",
    "compilation_config",
    "optimization_level",
    "hf_overrides",
    "max_num_partial_prefills",
    "structured_outputs_config",
    "guided_decoding_backend",
    "enable_sleep_mode",
    "config_format",
    "profiler_config",
)


def _engine_kwargs(ns: argparse.Namespace) -> dict:
    """The engine arguments given on the command line (None = leave the engine's default)."""
    return {k: getattr(ns, k) for k in _ENGINE_KEYS if getattr(ns, k) is not None}


def _parser() -> argparse.ArgumentParser:
    from enginespec import __version__

    parser = argparse.ArgumentParser(prog="enginespec", description="enginespec: a specified LLM engine core")
    parser.add_argument("--version", action="version", version=f"enginespec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text for prompts from a local checkpoint")
    gen.add_argument("--model", required=True, help=MODEL_HELP)
    gen.add_argument(
        "--prompt", type=_argv_text, action="append", required=True, help="a prompt (repeat for several)"
    )
    # The sampling flags default to None (not given): generation_config.json's value, else
    # GENERATE_DEFAULTS' (_sampling_params).
    gen.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="most tokens to generate per sample (default: generation_config's max_new_tokens, else 32)",
    )
    gen.add_argument(
        "--temperature", type=float, default=None, help="0 = greedy (default: generation_config's, else 0)"
    )
    gen.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="nucleus sampling: in (0, 1] (default: generation_config's, else 1: off)",
    )
    gen.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="sample among the k likeliest tokens (default: generation_config's, else 0: all)",
    )
    gen.add_argument("--n", type=int, default=1, help="samples per prompt")
    gen.add_argument(
        "--stop", type=_argv_text, action="append", default=[], help="a stop string (repeatable)"
    )
    gen.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")
    _add_engine_args(gen)
    demo = sub.add_parser("demo", help="throughput demo on a tiny random model (CPU friendly)")
    demo.add_argument(
        "--family",
        default="qwen3",
        choices=("qwen3", "qwen2", "llama", "mistral"),
        help="architecture of the tiny random model (default qwen3)",
    )
    demo.add_argument("--num-requests", type=int, default=16, help="requests in the workload (default 16)")
    demo.add_argument(
        "--min-input-len", type=int, default=8, help="shortest random prompt, in tokens (default 8)"
    )
    demo.add_argument(
        "--max-input-len", type=int, default=64, help="longest random prompt, in tokens (default 64)"
    )
    demo.add_argument(
        "--max-output-len",
        type=int,
        default=32,
        help="longest output; each is uniform in [1, this] (default 32)",
    )
    demo.add_argument(
        "--shared-prefix-len",
        type=int,
        default=16,
        help="tokens every prompt starts with, for the prefix cache to hit (default 16; 0: none)",
    )
    _add_engine_args(demo)
    _add_serve_parser(sub)
    sub.add_parser(
        "simulate", help="the scheduler over a fake model (options: enginespec simulate -h)", add_help=False
    )
    sub.add_parser("bench", help=f"moved: {BENCH_MOVED}", add_help=False)
    sub.add_parser(
        "collect-env", help="versions, GPUs and settings for a bug report (--json)", add_help=False
    )
    return parser


def _port(text: str) -> int:
    """A TCP port in [0, 65535] (an ArgumentTypeError: argparse's usage error, exit 2)."""
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port in [0, 65535], got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    """A finite number of seconds >= 0 (an ArgumentTypeError: argparse's usage error, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


# The longest --send-timeout: TCP_USER_TIMEOUT is an int of milliseconds (about 24.8 days).
MAX_SEND_TIMEOUT_S = (2**31 - 1) // 1000


def _send_seconds(text: str) -> float:
    """--send-timeout: seconds in [0, MAX_SEND_TIMEOUT_S] (an ArgumentTypeError: argparse's
    usage error, exit 2)."""
    value = _seconds(text)
    if value > MAX_SEND_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_SEND_TIMEOUT_S} seconds, got {text!r}")
    return value


def _add_serve_parser(sub) -> None:
    """`serve`: vLLM's server flags where they mean the same, plus the engine's."""
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server over one engine")
    serve.add_argument("model", nargs="?", default=None, help=MODEL_HELP)
    serve.add_argument(
        "--model",
        dest="model_flag",
        default=None,
        help="the same, as vLLM's --model names it (`vllm serve --model DIR`); give one of the two",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    serve.add_argument("--port", type=_port, default=8000, help="TCP port to listen on (default 8000)")
    serve.add_argument(
        "--api-key",
        nargs="+",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1/*, KEY one of these (vLLM's flag; "
        "without it, the VLLM_API_KEY environment variable's key, as vLLM)",
    )
    serve.add_argument("--served-model-name", nargs="+", default=None, help="model name(s) in the API")
    serve.add_argument("--chat-template", default=None, help="a Jinja chat template file (or the text)")
    serve.add_argument(
        "--trust-request-chat-template",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="use a request's own chat_template (vLLM's flag; without it such a request is a 400)",
    )
    serve.add_argument(
        "--enable-log-requests",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="log each request (its prompt, prompt ids and sampling params) at INFO as it is received (vLLM's flag)",
    )
    serve.add_argument(
        "--disable-log-requests",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="accepted for vLLM's command lines: requests are logged only with --enable-log-requests",
    )
    serve.add_argument(
        "--max-log-len",
        type=int,
        default=None,
        help="with --enable-log-requests: at most this many prompt characters and ids a line (default: all)",
    )
    serve.add_argument(
        "--enable-prompt-tokens-details",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="usage.prompt_tokens_details.cached_tokens: prompt tokens served from the prefix cache (vLLM's flag)",
    )
    serve.add_argument(
        "--max-waiting-requests",
        type=int,
        default=1024,
        help="samples that may wait beyond --max-num-seqs before requests get 503 (bounded queue; default 1024)",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=30.0,
        help="seconds in-flight requests get on SIGTERM (default 30)",
    )
    serve.add_argument(
        "--send-timeout",
        type=_send_seconds,
        default=60.0,
        help="drop a connection whose client, with response bytes waiting, takes too little of them "
        "(under about 64 KB) for this many seconds, aborting its request (Linux's TCP_USER_TIMEOUT; "
        "0: none; default 60, as nginx's send_timeout)",
    )
    serve.add_argument(
        "--enable-request-id-headers",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="put X-Request-Id on every response: the request's own, else a fresh id (vLLM's flag)",
    )
    serve.add_argument(
        "--enable-server-load-tracking",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="GET /load answers the generation requests in flight, {\"server_load\": N} (vLLM's flag; "
        "without it, 0)",
    )
    serve.add_argument(
        "--enable-dev-endpoints",
        action="store_true",
        help="/dev/state, /dev/pause, ..., /reset_prefix_cache, /sleep, /wake_up, /is_sleeping",
    )
    serve.add_argument(
        "--engine-in-process",
        action="store_true",
        help="run the engine on a thread of the server process, not a process of its own (debugging)",
    )
    serve.add_argument(
        "--uvicorn-log-level",
        choices=("critical", "error", "warning", "info", "debug", "trace"),
        default="warning",
        help="uvicorn's log level (vLLM's flag; default warning)",
    )
    _add_chat_reply_args(serve)
    _add_chat_default_args(serve)
    _add_vllm_frontend_args(serve)
    _add_cors_args(serve)
    _add_http_args(serve)
    _add_server_extension_args(serve)
    _add_engine_args(serve)
    serve.set_defaults(impl="fast")


def _add_chat_reply_args(serve) -> None:
    """How chat replies are read: the reasoning parser and tool calls (vLLM's flags)."""
    serve.add_argument(
        "--reasoning-parser",
        choices=sorted(PARSERS),
        default=None,
        help="chat replies' <think>...</think> part as message.reasoning, the rest as content (vLLM's flag)",
    )
    serve.add_argument(
        "--enable-auto-tool-choice",
        action=argparse.BooleanOptionalAction,
        default=False,
        help='tool_choice "auto": parse the tool calls of chat replies (needs --tool-call-parser; vLLM\'s flag)',
    )
    serve.add_argument(
        "--tool-call-parser",
        choices=list(TOOL_PARSERS),
        default=None,
        help="the tool-call format of the model's replies (vLLM's names): hermes (Qwen2.5, Qwen3), "
        "llama3_json (Llama 3.1, 3.2 Instruct), mistral (Mistral Instruct v0.3 and later)",
    )


def _role_name(text: str) -> str:
    """--response-role: a non-blank role name (an ArgumentTypeError: argparse's usage error)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must be a role name (assistant, ...), got {text!r}")
    return text


def _add_chat_default_args(serve) -> None:
    """vLLM's server-wide defaults of the chat and completion bodies (serving.ServerContext)."""
    from enginespec.chat_utils import CONTENT_FORMATS

    serve.add_argument(
        "--response-role",
        type=_role_name,
        default="assistant",
        help="the role of chat replies to a prompt that ends in a generation prompt (default assistant; vLLM's flag)",
    )
    serve.add_argument(
        "--return-tokens-as-token-ids",
        action=argparse.BooleanOptionalAction,
        default=False,
        help='logprobs name tokens "token_id:N" unless a request sets return_tokens_as_token_ids (vLLM\'s flag)',
    )
    serve.add_argument(
        "--enable-force-include-usage",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="every stream ends with its usage chunk, as if stream_options.include_usage were true (vLLM's flag)",
    )
    serve.add_argument(
        "--chat-template-content-format",
        choices=CONTENT_FORMATS,
        default="auto",
        help='message content as the chat template gets it: a string, or OpenAI\'s [{"type": "text", ...}] '
        "parts (openai); auto (default): what the template reads (vLLM's flag)",
    )


def _chat_template_kwargs_arg(text: str) -> dict:
    """--default-chat-template-kwargs: a JSON object of chat-template variables. Not JSON, not an
    object, or naming a variable the chat call sets itself (chat_utils.RESERVED_KWARGS: every
    chat request would be refused for it) is an ArgumentTypeError (argparse's usage error naming
    the flag, exit 2)."""
    from enginespec.chat_utils import RESERVED_KWARGS

    value = _json_value(text)
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f'must be a JSON object, e.g. \'{{"enable_thinking": false}}\', got {text!r}'
        )
    reserved = sorted(k for k in value if k in RESERVED_KWARGS)
    if reserved:
        raise argparse.ArgumentTypeError(
            f"names variables the chat call sets itself: {reserved} (not settable: {', '.join(RESERVED_KWARGS)})"
        )
    return value


# JSON_OBJECT_FLAGS whose value has checks beyond "an object": run again over what the dotted
# keys built (merge_dotted), so `--FLAG.key V` is refused as `--FLAG '{"key": V}'` would be.
_DOTTED_CHECKS = {"--default-chat-template-kwargs": _chat_template_kwargs_arg}


def _add_vllm_frontend_args(serve) -> None:
    """vLLM's frontend flags of chat rendering, logging and the tokenizer endpoint
    (api_server.frontend_flags carries them to serving.ServerContext)."""
    serve.add_argument(
        "--default-chat-template-kwargs",
        type=_chat_template_kwargs_arg,
        default=None,
        metavar="JSON",
        help='chat-template variables for every chat request, e.g. \'{"enable_thinking": false}\' (Qwen3); '
        "a request's chat_template_kwargs override them key by key (vLLM's flag)",
    )
    serve.add_argument(
        "--exclude-tools-when-tool-choice-none",
        action=argparse.BooleanOptionalAction,
        default=False,
        help='a request\'s tools do not reach the chat template when its tool_choice is "none" (vLLM\'s flag)',
    )
    serve.add_argument(
        "--enable-log-outputs",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="with --enable-log-requests: also log each choice's output (text, token ids, finish reason), "
        "cut as the request log is, at INFO when it finishes (vLLM's flag)",
    )
    serve.add_argument(
        "--enable-log-deltas",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --enable-log-outputs: also log each delta a stream sends, at INFO "
        "(vLLM's flag, on by default; --no-enable-log-deltas keeps only the finished output)",
    )
    serve.add_argument(
        "--enable-tokenizer-info-endpoint",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="serve GET /tokenizer_info: the tokenizer's configuration and the chat template (vLLM's flag)",
    )
    serve.add_argument(
        "--log-error-stack",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="log the stack trace of every error the API answers, at ERROR (vLLM's flag; "
        "default: VLLM_SERVER_DEV_MODE's, an integer, off when unset or 0)",
    )


def _add_cors_args(serve) -> None:
    """vLLM's CORS flags (api_server.cors_options says why none is the default)."""
    serve.add_argument(
        "--allowed-origins",
        type=_json_value,
        default=None,
        help='CORS: a JSON list of origins browsers may call from, e.g. \'["http://localhost:3000"]\' or \'["*"]\' '
        "(vLLM's flag; default none: no CORS headers)",
    )
    serve.add_argument("--allowed-methods", type=_json_value, default=["*"], help="CORS methods (JSON list)")
    serve.add_argument("--allowed-headers", type=_json_value, default=["*"], help="CORS headers (JSON list)")
    serve.add_argument(
        "--allow-credentials",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="CORS: allow credentials",
    )


def _add_http_args(serve) -> None:
    """vLLM's HTTP-layer flags (api_server.fastapi_options, tls_options, access_log): the access
    log, the proxy's path prefix, TLS files for uvicorn, the OpenAPI docs routes."""
    serve.add_argument(
        "--disable-uvicorn-access-log",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="no uvicorn access log (the default here; vLLM's flag); --no-disable-uvicorn-access-log: "
        "a line a request at --uvicorn-log-level info, as vLLM's default",
    )
    serve.add_argument(
        "--disable-access-log-for-endpoints",
        default=None,
        metavar="PATHS",
        help="comma-separated paths whose requests the access log leaves out, e.g. /health,/metrics "
        "(vLLM's flag; with --no-disable-uvicorn-access-log)",
    )
    serve.add_argument(
        "--root-path",
        default=None,
        help="the path prefix a proxy serves this server under, e.g. /llm (FastAPI's root_path; vLLM's flag): "
        "routes answer with and without it, and the docs name it",
    )
    serve.add_argument(
        "--ssl-keyfile", default=None, help="TLS: the private key file (PEM; needs --ssl-certfile)"
    )
    serve.add_argument(
        "--ssl-certfile", default=None, help="TLS: the certificate chain file (PEM): serve HTTPS"
    )
    serve.add_argument(
        "--ssl-ca-certs",
        default=None,
        help="TLS: the CA certificates that client certificates are checked against",
    )
    serve.add_argument(
        "--ssl-cert-reqs",
        type=int,
        default=None,
        help="TLS: client certificates: 0 none (default), 1 optional, 2 required (Python's ssl.CERT_*)",
    )
    serve.add_argument(
        "--ssl-ciphers",
        default=None,
        help="TLS: the ciphers offered, an OpenSSL cipher list (default uvicorn's, TLSv1)",
    )
    serve.add_argument(
        "--disable-fastapi-docs",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="no /docs, /redoc or /openapi.json (vLLM's flag)",
    )


def _positive_int(text: str) -> int:
    """A whole number >= 1 (an ArgumentTypeError: argparse's usage error naming the flag, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def _add_server_extension_args(serve) -> None:
    """vLLM's flags that shape the HTTP server around the routes (api_server.h11_options,
    load_middleware, apply_log_config): request-header limits, the user's own ASGI middleware, a
    logging configuration file. Default None / []: not given (vLLM's defaults then apply)."""
    serve.add_argument(
        "--h11-max-incomplete-event-size",
        type=_positive_int,
        default=None,
        metavar="BYTES",
        help="the most bytes of a request head (request line and headers) not yet complete that "
        "uvicorn's h11 parser holds; past it, a 400 (vLLM's flag; default 4194304, vLLM's; given, the "
        "server runs uvicorn's h11 protocol even where httptools is installed)",
    )
    serve.add_argument(
        "--h11-max-header-count",
        type=_positive_int,
        default=None,
        metavar="N",
        help="the most header fields a request may carry; more is a 431 (vLLM's flag; default 256)",
    )
    serve.add_argument(
        "--middleware",
        action="extend",
        nargs="+",
        default=[],
        metavar="IMPORT.PATH",
        help="an ASGI middleware class, or an async function(request, call_next) for "
        "@app.middleware('http'), by import path, e.g. mypkg.layers.Audit (vLLM's flag; repeatable, "
        "each outside the ones before it)",
    )
    serve.add_argument(
        "--log-config-file",
        default=None,
        metavar="PATH",
        help="a JSON logging configuration (logging.config.dictConfig's schema) for uvicorn's and "
        "enginespec's loggers, in place of the defaults (vLLM's flag; default: the "
        "VLLM_LOGGING_CONFIG_PATH environment variable's file)",
    )


def _serve_model(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> None:
    """Set ns.model from the positional MODEL or vLLM's --model (exactly one of them, or
    both naming the same model); else argparse's usage error (exit 2) saying so."""
    given = {ns.model, ns.model_flag} - {None}
    if len(given) != 1:
        which = "got none" if not given else f"got MODEL {ns.model!r} and --model {ns.model_flag!r}"
        parser.error(f"serve: give the model once, as MODEL or as --model ({which})")
    ns.model = given.pop()


def _serve(ns: argparse.Namespace) -> int:
    """Run the server; 1 with one line naming the package and the extra when the `serve`
    extra is not installed (before any engine is built: run_server imports uvicorn first)."""
    try:
        import uvicorn  # noqa: F401 - run_server's; checked here so that it fails before the engine

        from enginespec.entrypoints.openai.api_server import run_server
    except ModuleNotFoundError as e:
        if not e.name or e.name.partition(".")[0] == "enginespec":  # ours missing: a broken install
            raise
        print(
            f"enginespec serve: error: the server needs the {e.name} package: pip install 'enginespec[serve]'",
            file=sys.stderr,
        )
        return 1
    return run_server(ns)


# generate's sampling where neither its flag nor the checkpoint's generation_config.json (with
# --generation-config / --override-generation-config) chose: greedy, 32 tokens.
GENERATE_DEFAULTS = {"max_tokens": 32, "temperature": 0.0, "top_p": 1.0, "top_k": 0}


def _sampling_params(ns: argparse.Namespace, file_defaults: dict):
    """generate's SamplingParams. Each field: its flag if given, else the generation config's
    default (file_defaults: SamplingParams field -> value, as GenerationDefaults.sampling holds
    them), else GENERATE_DEFAULTS'. A fixed --seed seeds the request only when it samples."""
    from enginespec.spec import SamplingParams

    chosen = {**GENERATE_DEFAULTS, **file_defaults}
    chosen.update({k: getattr(ns, k) for k in GENERATE_DEFAULTS if getattr(ns, k) is not None})
    return SamplingParams(
        **chosen,
        n=ns.n,
        stop=tuple(ns.stop),
        ignore_eos=ns.ignore_eos,
        seed=ns.seed if chosen["temperature"] > 0 else None,
    )


def _check_given_sampling(ns: argparse.Namespace) -> None:
    """generate's sampling flags that were given, through SamplingParams' own checks before the
    model loads: a bad --max-tokens, --n or --temperature was reported only after a load that
    can take minutes. The checkpoint's generation_config fills only the flags not given, so a
    value refused here alone is refused after the load too (ValueError naming the field)."""
    from enginespec.spec import SamplingParams

    given = {k: getattr(ns, k) for k in GENERATE_DEFAULTS if getattr(ns, k) is not None}
    SamplingParams(**given, n=ns.n, stop=tuple(ns.stop), ignore_eos=ns.ignore_eos)


def _generate(ns: argparse.Namespace) -> int:
    from enginespec.llm import LLM

    _check_given_sampling(ns)
    llm = LLM(ns.model, impl=ns.impl, seed=ns.seed, **_engine_kwargs(ns))
    params = _sampling_params(ns, llm.engine.generation.sampling)
    outputs = llm.generate(ns.prompt, params, use_tqdm=ns.use_tqdm)
    for i, out in enumerate(outputs):
        print(f"=== prompt {i}: {out.prompt!r}")
        for completion in out.outputs:
            label = f"[{completion.index}] " if len(out.outputs) > 1 else ""
            print(f"{label}{completion.text}")
            print(f"{label}(finish_reason={completion.finish_reason}, tokens={len(completion.token_ids)})")
    return 0


def _demo(ns: argparse.Namespace) -> int:
    from enginespec.entrypoints.demo import run_demo

    result = run_demo(
        family=ns.family,
        impl=ns.impl,
        num_requests=ns.num_requests,
        min_input_len=ns.min_input_len,
        max_input_len=ns.max_input_len,
        max_output_len=ns.max_output_len,
        shared_prefix_len=ns.shared_prefix_len,
        seed=ns.seed,
        use_tqdm=ns.use_tqdm,
        **_engine_kwargs(ns),
    )
    print(result.summary())
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one subcommand; returns the exit status: 2 with a one-line message on bad input,
    EXIT_INTERRUPTED with "enginespec COMMAND: interrupted" on Ctrl-C (no traceback), and
    EXIT_BROKEN_PIPE, silently, when stdout's reader went away (`enginespec generate ... | head`).
    Every result is flushed before returning, so a closed pipe is met here, not at exit."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and not argv[0].startswith("-") else None
    restore = _escape_unencodable_stdout()
    try:
        with _interrupts_delivered():
            status = _main(argv)
        sys.stdout.flush()
        return status
    except KeyboardInterrupt:
        print(f"enginespec{' ' + command if command else ''}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_BROKEN_PIPE
    finally:
        restore()


@contextlib.contextmanager
def _interrupts_delivered():
    """Inside, a Ctrl-C always ends the block with KeyboardInterrupt. Python raises it at the
    next bytecode, and where that is a finalizer (a __del__, a generator or weakref callback
    the garbage collector runs) it is reported through sys.unraisablehook as "Exception ignored
    in ..." and dropped: the command ran on to its end and exited 0 (test_cli_process saw it
    under load). So, inside, a KeyboardInterrupt dropped on the main thread is not reported:
    it arms a one-shot SIGALRM that raises it again after REDELIVER_S (again if that one is
    dropped too), and a block that ends normally with one still dropped raises it then.
    A KeyboardInterrupt that was not dropped is never raised again (the clean-up it unwinds
    through runs to its end, as under one Ctrl-C), and SIGINT's handler is left alone. SIGALRM
    is taken over only once one was dropped; its handler and timer are then given back as
    they were when the block ends (an embedding program's alarm, pytest-timeout's). Only on
    the main thread and where the platform has setitimer."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return
    dropped = [False]
    taken: list = []  # (the SIGALRM handler, the timer) before the first redelivery was armed
    previous_hook = sys.unraisablehook

    def on_alarm(signum, frame):
        if dropped[0]:
            dropped[0] = False
            raise KeyboardInterrupt

    def hook(unraisable) -> None:
        is_interrupt = isinstance(unraisable.exc_value, KeyboardInterrupt)
        if not is_interrupt or threading.current_thread() is not threading.main_thread():
            previous_hook(unraisable)
            return
        dropped[0] = True
        if not taken:
            taken.append((signal.signal(signal.SIGALRM, on_alarm), signal.getitimer(signal.ITIMER_REAL)))
        signal.setitimer(signal.ITIMER_REAL, REDELIVER_S)

    def give_back() -> bool:
        """The hook, SIGALRM's handler and timer back as they were; whether one is still dropped."""
        if sys.unraisablehook is hook:
            sys.unraisablehook = previous_hook
        if taken:
            handler, timer = taken.pop()
            signal.setitimer(signal.ITIMER_REAL, *timer)
            signal.signal(signal.SIGALRM, handler)
        came, dropped[0] = dropped[0], False
        return came

    sys.unraisablehook = hook
    try:
        yield
    except BaseException:
        give_back()
        raise
    if give_back():  # its KeyboardInterrupt was dropped, and the command ran to its end
        raise KeyboardInterrupt


def _escape_unencodable_stdout():
    """Let stdout write what its encoding cannot (generated text on an ASCII or Latin-1
    stdout: a file redirect under a legacy locale, PYTHONIOENCODING) as backslash escapes, as
    Python's stderr does, for the duration of one command; returns the undo. Strict, the print
    of a finished result raised UnicodeEncodeError, a ValueError: the results were lost behind
    "error: 'ascii' codec can't encode ..." and exit status 2."""
    stream = sys.stdout
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is None or getattr(stream, "errors", None) != "strict":
        return lambda: None
    try:
        reconfigure(errors="backslashreplace")
    except (ValueError, OSError):  # closed, or a stream that refuses
        return lambda: None

    def restore() -> None:
        try:
            reconfigure(errors="strict")
        except (ValueError, OSError):
            pass

    return restore


def _discard_stdout() -> None:
    """Point stdout's descriptor at /dev/null, so the interpreter's flush at exit does not meet
    the closed pipe again (Python's documented recipe for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout is no file (captured, replaced)
        pass


def _main(argv: list[str]) -> int:
    if argv and argv[0] == "bench":
        print(f"enginespec bench: {BENCH_MOVED}", file=sys.stderr)
        return EXIT_USAGE
    if argv and argv[0] == "collect-env":
        from enginespec.entrypoints.collect_env import main as collect_env_main

        return collect_env_main(argv[1:])
    if argv and argv[0] == "simulate":
        from enginespec.entrypoints.simulate import main as simulate_main

        try:
            return simulate_main(argv[1:]) or 0
        except (ValueError, TypeError, FileNotFoundError) as e:
            print(f"enginespec simulate: error: {e}", file=sys.stderr)
            return EXIT_USAGE
    parser = _parser()
    try:
        argv, dotted = vllm_spelling(argv)
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    ns = parser.parse_args(argv)
    merge_dotted(parser, ns, dotted)
    if ns.command == "serve":
        _serve_model(parser, ns)
    try:
        run = {"generate": _generate, "demo": _demo, "serve": _serve}[ns.command]
        return run(ns)
    except (ValueError, TypeError, FileNotFoundError) as e:
        print(f"enginespec {ns.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
