"""The `enginespec` command line: generate on a sharded save_pretrained checkpoint, one-line
errors naming what is wrong with a corrupt checkpoint, the demo and simulate subcommands."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from enginespec.testing.checkpoints import tiny_model_dir

GEN_FLAGS = [
    "--max-tokens",
    "5",
    "--dtype",
    "float32",
    "--device",
    "cpu",
    "--no-tqdm",
    "--num-blocks",
    "16",
    "--block-size",
    "4",
]


pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory) -> Path:
    """The tiny qwen3 checkpoint re-saved by transformers in several safetensors shards."""
    from transformers import AutoModelForCausalLM

    src = tiny_model_dir("qwen3")
    dst = tmp_path_factory.mktemp("sharded") / "qwen3"
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    model.save_pretrained(str(dst), max_shard_size="40KB")
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, dst / f.name)
    assert len(list(dst.glob("*.safetensors"))) > 1, "expected a sharded checkpoint"
    assert (dst / "model.safetensors.index.json").is_file()
    return dst


@pytest.fixture
def impl_arg(request, impl) -> str:
    """The --impl string the suite runs under (an outside impl's name may not be loadable)."""
    from enginespec.conformance.plugin import impl_target

    return impl_target(request.config)


def run_cli(argv, capsys) -> tuple[int, str, str]:
    from enginespec.entrypoints.cli import main

    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_generate_on_a_sharded_checkpoint(impl, impl_arg, sharded_dir, capsys):
    from enginespec.llm import LLM
    from enginespec.spec import SamplingParams

    rc, out, err = run_cli(
        [
            "generate",
            "--model",
            str(sharded_dir),
            "--prompt",
            "abc",
            "--prompt",
            "hello",
            "--impl",
            impl_arg,
            *GEN_FLAGS,
        ],
        capsys,
    )
    assert rc == 0, err
    llm = LLM(
        str(tiny_model_dir("qwen3")), impl=impl, dtype="float32", device="cpu", num_blocks=16, block_size=4
    )
    expected = llm.generate(["abc", "hello"], SamplingParams(max_tokens=5, temperature=0.0), use_tqdm=False)
    blocks = out.split("=== prompt ")[1:]
    assert len(blocks) == 2
    for block, ref in zip(blocks, expected):
        lines = block.splitlines()
        assert lines[0].endswith(repr(ref.prompt))
        assert lines[1] == ref.outputs[0].text
        assert f"finish_reason={ref.outputs[0].finish_reason}" in lines[2]


def test_console_script_runs_generate(sharded_dir):
    """The installed `enginespec` entry point, in a fresh process."""
    exe = shutil.which("enginespec")
    cmd = [exe] if exe else [sys.executable, "-m", "enginespec.entrypoints.cli"]
    proc = subprocess.run(
        [*cmd, "generate", "--model", str(sharded_dir), "--prompt", "abc", *GEN_FLAGS],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "=== prompt 0: 'abc'" in proc.stdout and "finish_reason=" in proc.stdout


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _truncate_a_shard(d: Path) -> str:
    shard = sorted(d.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    return shard.name


def _drop_a_shard(d: Path) -> str:
    shard = sorted(d.glob("*.safetensors"))[-1]
    shard.unlink()
    return shard.name


def _drop_config(d: Path) -> str:
    (d / "config.json").unlink()
    return "config.json"


def _bad_architecture(d: Path) -> str:
    config = json.loads((d / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (d / "config.json").write_text(json.dumps(config))
    return "GPT2LMHeadModel"


def _garbled_config(d: Path) -> str:
    (d / "config.json").write_text("{not json")
    return "config.json"


def _garbled_tokenizer(d: Path) -> str:
    (d / "tokenizer.json").write_text("{not json")
    return f"tokenizer in {d}"


CORRUPTIONS = {
    "truncated shard": _truncate_a_shard,
    "missing shard": _drop_a_shard,
    "missing config": _drop_config,
    "unsupported architecture": _bad_architecture,
    "garbled config": _garbled_config,
    "garbled tokenizer": _garbled_tokenizer,
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corrupt_checkpoint_fails_naming_the_fault(impl_arg, sharded_dir, tmp_path, capsys, name):
    d = _copy(sharded_dir, tmp_path / "ckpt")
    needle = CORRUPTIONS[name](d)
    rc, out, err = run_cli(
        ["generate", "--model", str(d), "--prompt", "abc", "--impl", impl_arg, *GEN_FLAGS], capsys
    )
    assert rc == 2
    assert needle in err, f"error should name {needle!r}: {err!r}"
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_missing_directory_fails_naming_it(capsys, tmp_path):
    missing = tmp_path / "nowhere"
    rc, _, err = run_cli(["generate", "--model", str(missing), "--prompt", "x", *GEN_FLAGS], capsys)
    assert rc == 2 and str(missing) in err and "does not exist" in err


def test_generate_takes_a_repo_id_from_the_hub_cache_with_its_revisions(capsys, tmp_path, monkeypatch):
    """`generate --model org/name --revision R --tokenizer-revision R`, as vLLM's command lines
    give a model: the cached snapshot's output, the same as its directory's; an uncached repo
    is the one-line error naming the field and the download command."""
    from enginespec.testing.checkpoints import make_checkpoint, write_hub_cache

    cache = tmp_path / "hub"
    write_hub_cache(tiny_model_dir("qwen3"), cache, "org/tiny")
    v2 = write_hub_cache(make_checkpoint("qwen3", tmp_path / "v2", seed=1), cache, "org/tiny", ref="v2")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    argv = ["--prompt", "abc", *GEN_FLAGS]
    rc, direct, _ = run_cli(["generate", "--model", str(v2), *argv], capsys)
    assert rc == 0
    rc, out, _ = run_cli(
        ["generate", "--model", "org/tiny", "--revision", "v2", "--tokenizer-revision", "v2", *argv], capsys
    )
    assert rc == 0 and out == direct
    rc, _, err = run_cli(["generate", "--model", "org/absent", *argv], capsys)
    assert rc == 2 and "model 'org/absent' does not exist" in err and "hf download org/absent" in err
    assert len(err.strip().splitlines()) == 1


def test_bad_flag_value_is_one_line(capsys, sharded_dir):
    rc, _, err = run_cli(
        ["generate", "--model", str(sharded_dir), "--prompt", "x", "--max-tokens", "0", "--no-tqdm"], capsys
    )
    assert rc == 2 and "max_tokens" in err


@pytest.mark.parametrize(
    "flags, field",
    [(["--max-tokens", "0"], "max_tokens"), (["--n", "0"], "n"), (["--temperature", "-1"], "temperature"),
     (["--top-p", "1.5"], "top_p"), (["--top-k", "-2"], "top_k")],
)  # fmt: skip
def test_a_bad_sampling_flag_is_refused_before_the_model_loads(flags, field, capsys, monkeypatch):
    """A sampling flag's value SamplingParams refuses is the one-line error naming the field
    (exit 2) before any model is loaded: it came only after the whole load."""
    import enginespec.llm

    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(enginespec.llm, "LLM", no_load)
    rc, _, err = run_cli(["generate", "--model", "unused", "--prompt", "x", "--no-tqdm", *flags], capsys)
    assert rc == 2 and field in err and "loaded before" not in err, err


def test_demo_runs_and_reports(impl_arg, capsys):
    rc, out, err = run_cli(
        [
            "demo",
            "--impl",
            impl_arg,
            "--num-requests",
            "6",
            "--min-input-len",
            "2",
            "--max-input-len",
            "10",
            "--max-output-len",
            "6",
            "--shared-prefix-len",
            "8",
            "--num-blocks",
            "16",
            "--block-size",
            "2",
            "--max-num-seqs",
            "4",
            "--max-num-batched-tokens",
            "16",
            "--no-tqdm",
        ],
        capsys,
    )
    assert rc == 0, err
    for needle in ("tok/s", "steps", "prefix hit rate", "preemptions"):
        assert needle in out
    hit = float(out.split("prefix hit rate ")[1].split("%")[0])
    assert hit > 0, "every prompt shares an 8-token prefix: the cache must hit"


def test_demo_result_counts(impl):
    from enginespec.entrypoints.demo import run_demo

    result = run_demo(
        impl=impl,
        num_requests=5,
        min_input_len=1,
        max_input_len=6,
        max_output_len=4,
        shared_prefix_len=0,
        use_tqdm=False,
        num_blocks=3,
        block_size=4,
        max_num_seqs=4,
    )
    assert result.num_requests == 5 and 5 <= result.num_output_tokens <= 20
    assert result.num_preemptions > 0, "three 4-token blocks for five requests must preempt"
    assert result.num_steps > 0 and result.num_blocks == 3


def test_demo_seed_flag_reaches_the_demo(capsys, monkeypatch):
    """`enginespec demo --seed N` seeds the demo's checkpoint, workload and engine (the flag
    was parsed and then dropped: every seed ran seed 0)."""
    from enginespec.entrypoints import demo

    seen = {}

    def fake_run_demo(**kwargs):
        seen.update(kwargs)
        raise ValueError("stop here")

    monkeypatch.setattr(demo, "run_demo", fake_run_demo)
    rc, _, err = run_cli(["demo", "--seed", "7", "--no-tqdm"], capsys)
    assert rc == 2 and "stop here" in err
    assert seen["seed"] == 7


def test_simulate_forwards(capsys):
    rc, out, err = run_cli(["simulate", "--num-requests", "3", "--quiet"], capsys)
    assert rc == 0, err
    assert out.strip()


@pytest.mark.parametrize(
    "flags, named", [(["--block-size", "0"], "block_size"), (["--impl", "nope"], "nope")]
)
def test_simulate_bad_input_is_a_one_line_usage_error(capsys, flags, named):
    rc, _, err = run_cli(["simulate", "--quiet", *flags], capsys)
    assert (
        rc == 2 and named in err and "Traceback" not in err and err.startswith("enginespec simulate: error:")
    )


def test_an_impl_module_in_the_current_directory_gets_the_clis_hint(capsys, tmp_path, monkeypatch):
    """The `enginespec` script leaves the current directory off sys.path, so `--impl mybackend`
    with mybackend.py right there is unknown; the error told the CLI's user to run `python -m
    pytest`. It names `python -m enginespec`, the CLI's way to put the directory on the path."""
    (tmp_path / "es_here_backend.py").write_text("IMPL = None\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    rc, _, err = run_cli(["simulate", "--quiet", "--impl", "es_here_backend"], capsys)
    assert rc == 2 and "'es_here_backend' is in the current directory" in err
    assert "`python -m enginespec`" in err, err


def test_simulate_step_limit_grows_with_the_workload_and_still_catches_a_stuck_run(capsys, monkeypatch):
    """A fixed 100,000-step guard reported `--num-requests 100000` (that many steps of real work)
    as stuck, on stdout; the guard now grows with the workload and speaks on stderr."""
    from enginespec.entrypoints import simulate

    tokens = simulate.SHARED_PREFIX_LEN + simulate.MAX_INPUT_LEN + simulate.MAX_OUTPUT_LEN
    assert simulate.step_limit(100_000) > 100_000 // 2 + 100_000 * tokens  # arrivals + a token a step
    monkeypatch.setattr(simulate, "step_limit", lambda n: 3)
    rc, out, err = run_cli(["simulate", "--quiet", "--num-requests", "8"], capsys)
    assert rc == 1 and "did not finish within 3 steps" in err and "did not finish" not in out


def test_bench_points_to_the_benchmark_script(capsys):
    """The product never imports benchmarks/: `enginespec bench` names the script instead."""
    rc, out, err = run_cli(["bench", "--shape", "tiny"], capsys)
    assert rc == 2 and "benchmarks/throughput.py" in err and not out


def test_collect_env_reports_versions_devices_and_settings(capsys, monkeypatch):
    """`enginespec collect-env` (vLLM's collect-env): the library versions torch and the rest
    report, what torch sees of CUDA, and the ENGINESPEC_* settings, as lines or as JSON."""
    import transformers

    monkeypatch.setenv("ENGINESPEC_PROBE_SETTING", "on")
    rc, out, err = run_cli(["collect-env", "--json"], capsys)
    assert rc == 0, err
    info = json.loads(out)
    assert info["torch"] == torch.__version__ and info["transformers"] == transformers.__version__
    assert info["cuda build"] == (torch.version.cuda or "none (CPU build)")
    if torch.cuda.is_available():  # a count, then a line a device
        assert info["gpus"] == f"{torch.cuda.device_count()} visible" and "GiB" in info["gpu 0"]
    else:
        assert info["gpus"] == "none visible" and "gpu 0" not in info
    assert info["ENGINESPEC_PROBE_SETTING"] == "on" and info["cpus"] == str(os.cpu_count())
    assert "PATH" not in info  # only the engine's, Triton's, CUDA's and torch's settings
    rc, out, _ = run_cli(["collect-env"], capsys)
    assert rc == 0 and any(line.split()[:2] == ["torch", torch.__version__] for line in out.splitlines())


def test_collect_env_reports_the_enginespec_that_runs(capsys, monkeypatch):
    """The enginespec line is the imported package's own version and folder: it was the
    installed distribution's metadata, which a source tree on sys.path (PYTHONPATH,
    tools/link_tree.py) shadows, so a report named the version of code that was not running.
    Where the two differ the installed one is shown beside it."""
    import enginespec

    where = os.path.dirname(enginespec.__file__)
    rc, out, err = run_cli(["collect-env", "--json"], capsys)
    assert rc == 0 and json.loads(out)["enginespec"].startswith(f"{enginespec.__version__} ({where}"), err
    monkeypatch.setattr(enginespec, "__version__", "9.9.9")  # another tree's version than the install's
    rc, out, err = run_cli(["collect-env", "--json"], capsys)
    assert rc == 0 and json.loads(out)["enginespec"].startswith(
        f"9.9.9 ({where}; installed distribution: "
    ), err


def test_collect_env_counts_the_gpus_it_lists(capsys, monkeypatch):
    """With GPUs visible the report still has its "gpus" entry (a count, as "none visible" is
    without), then one line a device; the key was missing on a CUDA machine."""
    props = type("Props", (), dict(name="Probe GPU", major=9, minor=0, total_memory=80 * 2**30))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    rc, out, err = run_cli(["collect-env", "--json"], capsys)
    assert rc == 0, err
    info = json.loads(out)
    assert info["gpus"] == "2 visible" and "gpu 2" not in info
    assert info["gpu 1"] == "Probe GPU, compute capability 9.0, 80.0 GiB"


def test_engine_flags_reach_engine_args():
    from enginespec.entrypoints.cli import _engine_kwargs, _parser

    base = ["demo", "--device", "cpu"]
    defaults = _engine_kwargs(_parser().parse_args(base))
    assert defaults["enforce_eager"] is False and defaults["async_scheduling"] is True
    assert "compile_model" not in defaults  # None: the engine decides (on for CUDA)
    flags = _engine_kwargs(
        _parser().parse_args(base + ["--enforce-eager", "--no-async-scheduling", "--no-compile"])
    )
    assert (flags["enforce_eager"], flags["async_scheduling"], flags["compile_model"]) == (True, False, False)
    # vLLM's spelling of the default, which its launch scripts pass (it was "unrecognized arguments")
    assert _engine_kwargs(_parser().parse_args(base + ["--async-scheduling"]))["async_scheduling"] is True


# vLLM's boolean flags, each a --FLAG / --no-FLAG pair there (argparse.BooleanOptionalAction
# for every bool field of its EngineArgs and FrontendArgs): the namespace attribute each sets
VLLM_BOOL_FLAGS = {
    "--enforce-eager": "enforce_eager",
    "--trust-remote-code": "trust_remote_code",
    "--disable-log-stats": "disable_log_stats",
    "--enable-lora": "enable_lora",
    "--disable-custom-all-reduce": "disable_custom_all_reduce",
}
VLLM_SERVE_BOOL_FLAGS = {
    "--trust-request-chat-template": "trust_request_chat_template",
    "--enable-log-requests": "enable_log_requests",
    "--disable-log-requests": "disable_log_requests",
    "--enable-prompt-tokens-details": "enable_prompt_tokens_details",
    "--enable-request-id-headers": "enable_request_id_headers",
    "--enable-auto-tool-choice": "enable_auto_tool_choice",
    "--allow-credentials": "allow_credentials",
    "--return-tokens-as-token-ids": "return_tokens_as_token_ids",
    "--enable-force-include-usage": "enable_force_include_usage",
}


@pytest.mark.parametrize("flag", [*VLLM_BOOL_FLAGS, *VLLM_SERVE_BOOL_FLAGS])
def test_vllms_boolean_flags_take_their_no_form(flag):
    """vLLM's --no-enforce-eager, --no-trust-remote-code, --no-enable-log-requests, ... (a
    launch script's explicit "off", or one overriding an earlier flag) were "unrecognized
    arguments" here: each flag was store_true, with no --no- form."""
    from enginespec.entrypoints.cli import _parser, vllm_spelling

    dest = {**VLLM_BOOL_FLAGS, **VLLM_SERVE_BOOL_FLAGS}[flag]
    no = "--no-" + flag[2:]
    commands = [["serve", "/m"]]
    if flag in VLLM_BOOL_FLAGS:
        commands += [["demo"], ["generate", "--model", "/m", "--prompt", "x"]]
    for command in commands:
        assert getattr(_parser().parse_args([*command, flag]), dest) is True
        assert getattr(_parser().parse_args([*command, no]), dest) is False
        assert getattr(_parser().parse_args([*command, flag, no]), dest) is False  # the last one wins
        underscored, _ = vllm_spelling([*command, "--" + no[2:].replace("-", "_")])
        assert getattr(_parser().parse_args(underscored), dest) is False


def test_a_tp_serve_lines_disable_custom_all_reduce_reaches_engine_args():
    """vLLM's `serve --tensor-parallel-size 2 --disable-custom-all-reduce`, a multi-GPU launch
    line's usual flag, was "unrecognized arguments"."""
    from enginespec.engine_args import EngineArgs
    from enginespec.entrypoints.cli import _engine_kwargs, _parser

    ns = _parser().parse_args(["serve", "/m", "-tp", "2", "--disable-custom-all-reduce"])
    assert EngineArgs.from_kwargs(ns.model, **_engine_kwargs(ns)).disable_custom_all_reduce is True


@pytest.mark.parametrize(
    "flags, prefix, chunked",
    [
        ([], True, True),
        (["--no-enable-prefix-caching"], False, True),  # vLLM's names
        (["--no-enable-chunked-prefill", "--enable-prefix-caching"], True, False),
        (["--no-prefix-caching", "--no-chunked-prefill"], False, False),  # the short ones
    ],
)
def test_caching_and_chunking_flags_take_vllms_names(flags, prefix, chunked):
    from enginespec.entrypoints.cli import _engine_kwargs, _parser

    kw = _engine_kwargs(_parser().parse_args(["demo", *flags]))
    assert (kw["enable_prefix_caching"], kw["enable_chunked_prefill"]) == (prefix, chunked)


def test_speculative_config_that_is_not_json_is_a_usage_error_saying_so(capsys):
    with pytest.raises(SystemExit) as exited:  # argparse's usage error
        run_cli(["generate", "--model", "/m", "--prompt", "x", "--speculative-config", "{bad"], capsys)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--speculative-config: must be JSON" in err and "{bad" in err


def test_a_port_out_of_range_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exited:  # argparse's usage error
        run_cli(["serve", "/nowhere", "--port", "70000"], capsys)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--port" in err and "65535" in err


def test_serve_with_a_setting_the_engine_refuses_prints_one_line(sharded_dir):
    """The engine process refuses the pool; the front end prints one line, no traceback."""
    argv = ["serve", str(sharded_dir), "--device", "cpu", "--num-blocks", "0", "--port", "0"]
    code = "import sys; from enginespec.entrypoints.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "num_blocks" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("name", ["unsupported architecture", "truncated shard"])
def test_serve_with_a_checkpoint_the_engine_refuses_prints_one_line(sharded_dir, tmp_path, name):
    """The front end loads the tokenizer fine; the engine process refuses the checkpoint with
    the loader's CheckpointError, a ValueError subclass: one line naming the fault, exit 2 (a
    RuntimeError and a traceback, exit 1, before: the refusal was matched by its type's name)."""
    d = _copy(sharded_dir, tmp_path / "ckpt")
    needle = CORRUPTIONS[name](d)
    argv = ["serve", str(d), "--device", "cpu", "--num-blocks", "16", "--port", "0"]
    code = "import sys; from enginespec.entrypoints.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_an_engine_refusal_of_a_value_error_subclass_is_a_value_error():
    """A request the engine process refuses with a ValueError subclass is the client's
    ValueError (the server's 400), as a plain ValueError is."""
    from enginespec.engine.core_messages import ErrorInfo
    from enginespec.entrypoints.openai.engine_client import _as_exception
    from enginespec.worker.loader import CheckpointError, CheckpointNotFound

    for exc in (ValueError("v"), CheckpointError("c"), CheckpointNotFound("n")):
        info = ErrorInfo.of(exc)
        assert info.is_value_error and type(_as_exception(info)) is ValueError, exc
    assert not ErrorInfo.of(RuntimeError("r")).is_value_error
    assert ErrorInfo.of(CheckpointNotFound("n")).is_a("FileNotFoundError")


def test_tensor_parallel_size_flag_reaches_engine_args(capsys, sharded_dir):
    from enginespec.engine_args import EngineArgs
    from enginespec.entrypoints.cli import _engine_kwargs, _parser

    assert "tensor_parallel_size" not in _engine_kwargs(_parser().parse_args(["demo"]))
    ns = _parser().parse_args(["serve", str(sharded_dir), "--tensor-parallel-size", "2"])
    assert EngineArgs.from_kwargs(ns.model, **_engine_kwargs(ns)).tensor_parallel_size == 2
    argv = ["generate", "--model", str(sharded_dir), "--prompt", "x", "--no-tqdm"]
    rc, _, err = run_cli(argv + ["--tensor-parallel-size", "0"], capsys)
    assert rc == 2 and "tensor_parallel_size" in err


def test_max_logprobs_flag_reaches_engine_args(sharded_dir):
    from enginespec.engine_args import EngineArgs
    from enginespec.entrypoints.cli import _engine_kwargs, _parser

    assert "max_logprobs" not in _engine_kwargs(_parser().parse_args(["demo"]))  # the engine's 20
    assert EngineArgs().max_logprobs == 20
    for value in ("5", "-1"):
        ns = _parser().parse_args(["serve", str(sharded_dir), "--max-logprobs", value])
        assert EngineArgs.from_kwargs(ns.model, **_engine_kwargs(ns)).max_logprobs == int(value)


def test_vllm_loading_flags_reach_engine_args(tmp_path):
    """vLLM's --tokenizer, --tokenizer-mode, --trust-remote-code and --disable-log-stats (an
    argparse usage error before)."""
    from enginespec.engine_args import EngineArgs
    from enginespec.entrypoints.cli import _engine_kwargs, _parser

    ns = _parser().parse_args(["serve", "/m"])
    args = EngineArgs.from_kwargs(ns.model, **_engine_kwargs(ns))
    assert (args.tokenizer, args.tokenizer_mode, args.trust_remote_code, args.disable_log_stats) == (
        None,
        "auto",
        False,
        False,
    )
    flags = [
        "--tokenizer",
        str(tmp_path),
        "--tokenizer-mode",
        "slow",
        "--trust-remote-code",
        "--disable-log-stats",
    ]
    for command in (["serve", "/m"], ["generate", "--model", "/m", "--prompt", "x"], ["demo"]):
        ns = _parser().parse_args(command + flags)
        args = EngineArgs.from_kwargs(ns.model if command[0] != "demo" else None, **_engine_kwargs(ns))
        assert (args.tokenizer, args.tokenizer_mode, args.trust_remote_code, args.disable_log_stats) == (
            str(tmp_path),
            "slow",
            True,
            True,
        )


def test_serve_uses_the_tokenizer_flags_directory(tmp_path):
    """The server process loads its own tokenizer (for /tokenize, prompts and streaming): from
    --tokenizer's directory, not the model's."""
    import httpx

    from enginespec.testing.checkpoints import EOS_ID, VOCAB_SIZE, write_tokenizer
    from tests.entrypoints.remote_server import RemoteServer

    write_tokenizer(tmp_path, VOCAB_SIZE, EOS_ID)  # word level: "w5 w6" -> [5, 6]
    flags = ["--tokenizer", str(tmp_path), "--trust-remote-code", "--disable-log-stats"]
    server = RemoteServer(tiny_model_dir("qwen3"), flags + ["--num-blocks", "16", "--dtype", "float32"])
    try:
        reply = httpx.post(server.url("/tokenize"), json={"prompt": "w5 w6"}, timeout=30)
        assert reply.status_code == 200 and reply.json()["tokens"] == [5, 6], reply.text
    finally:
        assert server.terminate() == 0


@pytest.mark.parametrize(
    "flags, want",
    [
        (["--max-model-len", "4k"], {"max_model_len": 4000}),  # vLLM's: k, m, g decimal
        (["--max-model-len", "1K"], {"max_model_len": 1024}),  # K, M, G binary
        (["--max-model-len", "25.6k"], {"max_model_len": 25600}),
        (["--max-model-len", "auto"], {"max_model_len": -1}),  # fit to the pool
        (["--max-model-len", "-1"], {"max_model_len": -1}),
        (["--max-model-len", "2048"], {"max_model_len": 2048}),
        (["--max-num-batched-tokens", "8k"], {"max_num_batched_tokens": 8000}),
        (["--max-num-batched-tokens", "2M"], {"max_num_batched_tokens": 2 * 2**20}),
    ],
)
def test_token_counts_take_vllms_human_readable_forms(flags, want):
    from enginespec.entrypoints.cli import _engine_kwargs, _parser

    kw = _engine_kwargs(_parser().parse_args(["demo", *flags]))
    assert {k: kw[k] for k in want} == want


@pytest.mark.parametrize(
    "flags",
    [
        ["--max-model-len", "1.5K"],
        ["--max-model-len", "4q"],
        ["--max-model-len", "infk"],
        ["--max-num-batched-tokens", "auto"],
    ],
)
def test_a_token_count_it_cannot_read_is_a_usage_error(flags, capsys):
    from enginespec.entrypoints.cli import _parser

    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(["demo", *flags])
    assert exited.value.code == 2 and flags[0] in capsys.readouterr().err


def test_generation_config_flags_take_vllms_names():
    from enginespec.entrypoints.cli import _engine_kwargs, _parser

    flags = ["--generation-config", "vllm", "--override-generation-config", '{"temperature": 0.5}']
    kw = _engine_kwargs(_parser().parse_args(["demo", *flags]))
    assert (kw["generation_config"], kw["override_generation_config"]) == ("vllm", {"temperature": 0.5})


def test_an_unknown_uvicorn_log_level_is_a_usage_error(capsys):
    """--uvicorn-log-level takes uvicorn's levels (vLLM's choices): any other word was a
    KeyError traceback from uvicorn's config, after the engine had loaded the model."""
    from enginespec.entrypoints.cli import _parser

    assert _parser().parse_args(["serve", "/m", "--uvicorn-log-level", "info"]).uvicorn_log_level == "info"
    with pytest.raises(SystemExit) as exited:
        _parser().parse_args(["serve", "/m", "--uvicorn-log-level", "bogus"])
    assert exited.value.code == 2 and "--uvicorn-log-level" in capsys.readouterr().err


VLLM_DEFAULT_FLAGS = {  # vLLM's flags that EngineArgs takes at vLLM's defaults (engine_args.py)
    "--swap-space": ("8", "swap_space", 8.0),
    "--max-seq-len-to-capture": ("4096", "max_seq_len_to_capture", 4096),
    "--kv-cache-dtype": ("auto", "kv_cache_dtype", "auto"),
    "--pipeline-parallel-size": ("1", "pipeline_parallel_size", 1),
    "--distributed-executor-backend": ("mp", "distributed_executor_backend", "mp"),
    "--data-parallel-size": ("1", "data_parallel_size", 1),
    "--cpu-offload-gb": ("0", "cpu_offload_gb", 0),
    "--load-format": ("safetensors", "load_format", "safetensors"),
    "--logprobs-mode": ("raw_logprobs", "logprobs_mode", "raw_logprobs"),
}


@pytest.mark.parametrize(
    "command", [["serve", "/m"], ["generate", "--model", "/m", "--prompt", "x"], ["demo"]]
)
def test_vllms_engine_flags_at_their_defaults_reach_engine_args(command):
    """A vLLM command line with its engine flags at vLLM's defaults (--swap-space 8,
    --kv-cache-dtype auto, ...) runs: they were "unrecognized arguments", though EngineArgs
    takes them; not given, EngineArgs keeps its own defaults."""
    from enginespec.engine_args import EngineArgs
    from enginespec.entrypoints.cli import _engine_kwargs, _parser

    argv = command + [part for flag, (value, _, _) in VLLM_DEFAULT_FLAGS.items() for part in (flag, value)]
    ns = _parser().parse_args(argv + ["-pp", "1"])
    args = EngineArgs.from_kwargs(getattr(ns, "model", None), **_engine_kwargs(ns))
    assert {name: getattr(args, name) for _, name, _ in VLLM_DEFAULT_FLAGS.values()} == {
        name: want for _, name, want in VLLM_DEFAULT_FLAGS.values()
    }
    default = EngineArgs.from_kwargs(None, **_engine_kwargs(_parser().parse_args(command)))
    assert (default.swap_space, default.quantization, default.enable_lora) == (4, None, False)


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--quantization", "awq"], "quantization"),
        (["-q", "fp8"], "quantization"),
        (["-pp", "2"], "pipeline_parallel_size"),
        (["--distributed-executor-backend", "ray"], "distributed_executor_backend"),
        (["-dp", "2"], "data_parallel_size"),
        (["--kv-cache-dtype", "fp8"], "kv_cache_dtype"),
        (["--enable-lora"], "enable_lora"),
        (["--logprobs-mode", "processed_logprobs"], "logprobs_mode"),
    ],
)
def test_vllms_engine_flags_the_engine_cannot_honour_are_its_one_line_error(flags, named):
    """Such a flag at another value is EngineArgs' ValueError naming it ("not supported by
    enginespec"), which main() prints in one line: not argparse's "unrecognized arguments"."""
    from enginespec.engine_args import EngineArgs
    from enginespec.entrypoints.cli import _engine_kwargs, _parser

    ns = _parser().parse_args(["serve", "/m", *flags])
    with pytest.raises(ValueError, match=f"{named}.*not supported by enginespec"):
        EngineArgs.from_kwargs(ns.model, **_engine_kwargs(ns))


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "soon"])
def test_a_shutdown_timeout_that_is_not_seconds_is_a_usage_error(capsys, value):
    with pytest.raises(SystemExit) as exited:  # argparse's usage error
        run_cli(["serve", "/nowhere", "--shutdown-timeout", value], capsys)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--shutdown-timeout" in err and repr(value) in err


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "soon", "2147484"])
def test_a_send_timeout_that_is_not_seconds_within_tcp_s_bound_is_a_usage_error(capsys, value):
    """--send-timeout is TCP_USER_TIMEOUT, an int of milliseconds: past 2147483 s the kernel
    would refuse it (or Python overflow) only once the server binds."""
    with pytest.raises(SystemExit) as exited:  # argparse's usage error
        run_cli(["serve", "/nowhere", "--send-timeout", value], capsys)
    err = capsys.readouterr().err
    assert exited.value.code == 2 and "--send-timeout" in err and repr(value) in err


def test_version_prints_the_package_version(capsys):
    from enginespec import __version__

    with pytest.raises(SystemExit) as exited:
        run_cli(["--version"], capsys)
    assert exited.value.code == 0 and capsys.readouterr().out.strip() == f"enginespec {__version__}"


def test_serve_takes_the_checkpoint_as_vllms_model_flag_too(capsys, monkeypatch):
    """`vllm serve --model DIR` (the form of vLLM's docker images and older scripts) names the
    checkpoint as MODEL does (it was a usage error: "the following arguments are required:
    model"); both forms at once must agree, and one of them is required."""
    from enginespec.entrypoints.openai import api_server

    served = []
    monkeypatch.setattr(api_server, "run_server", lambda ns: served.append(ns.model) or 0)
    for argv in (["--model", "/m"], ["/m"], ["/m", "--model", "/m"]):
        assert run_cli(["serve", *argv, "--port", "0"], capsys)[0] == 0
    assert served == ["/m"] * 3
    for argv, named in ((["/m", "--model", "/n"], "got MODEL '/m' and --model '/n'"), ([], "got none")):
        with pytest.raises(SystemExit) as exited:  # argparse's usage error
            run_cli(["serve", *argv], capsys)
        assert exited.value.code == 2 and named in capsys.readouterr().err


def _undescribed_options(help_text: str) -> list[str]:
    """The option entries of argparse's --help output that carry no description: an entry is
    its invocation line ("  --flag METAVAR", no two-space gap before text) and nothing after."""
    entries: list[list[str]] = []
    for line in help_text.splitlines():
        if line.startswith("  -"):
            entries.append([line.strip()])
        elif entries and line.startswith("   ") and line.strip():
            entries[-1].append(line.strip())
        else:  # a blank line or a section title ends the entry
            entries.append([])
    return [e[0] for e in entries if len(e) == 1 and "  " not in e[0] and not e[0].startswith("-h")]


@pytest.mark.parametrize("command", ["generate", "demo", "serve", "simulate", "collect-env"])
def test_every_subcommands_help_describes_each_of_its_flags(command, capsys, monkeypatch):
    """`enginespec COMMAND --help` exits 0 and says what each flag does. Twenty-odd engine flags
    (--seed, --max-num-seqs, --gpu-memory-utilization, --enable-prefix-caching, ...), serve's
    --port, and most of generate's, demo's and simulate's own were listed with no word."""
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exit_info:
        from enginespec.entrypoints.cli import main

        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: enginespec {command}")
    assert _undescribed_options(out) == []


@pytest.mark.parametrize("command", ["generate", "demo", "serve", "simulate", "collect-env"])
def test_every_subcommands_help_opens_with_whole_sentences(command, capsys, monkeypatch):
    """The text between `enginespec COMMAND --help`'s usage and its options is whole: collect-env's
    stopped at its docstring's first line, "...to know of the machine (vLLM's"."""
    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        from enginespec.entrypoints.cli import main

        main([command, "--help"])
    out = capsys.readouterr().out
    second = out.split("\n\n")[1]  # after the usage: the description, or the first section
    description = "" if second.startswith(("options:", "positional arguments:")) else second.strip()
    if description:  # generate, demo and serve have none: their help line is in `enginespec --help`
        assert description.count("(") == description.count(")"), description
        assert description.count("`") % 2 == 0 and description.endswith((".", ")")), description


def test_vllms_dotted_and_underscored_json_flags_build_the_same_config(capsys, monkeypatch):
    """vLLM's documented CLI forms of a JSON flag: `--speculative-config.KEY VALUE` (or
    `=VALUE`, nested keys, values read as JSON where they parse, else as strings) and
    `--speculative_config` mean what `--speculative-config '{...}'` does, and dotted keys are
    laid over a JSON given with them. They were 'unrecognized arguments'."""
    from enginespec.entrypoints.openai import api_server

    served = []
    monkeypatch.setattr(api_server, "run_server", lambda ns: served.append(ns.speculative_config) or 0)
    wanted = {
        "method": "draft_model",
        "model": "/d",
        "num_speculative_tokens": 3,
        "disable_by_batch_size": None,
    }
    forms = (
        ["--speculative-config", json.dumps(wanted)],
        ["--speculative_config", json.dumps(wanted)],
        [
            "--speculative-config.method",
            "draft_model",
            "--speculative-config.model=/d",
            "--speculative_config.num_speculative_tokens",
            "3",
            "--speculative-config.disable_by_batch_size=null",
        ],
        ["--speculative-config", '{"method": "draft_model", "model": "/x", "disable_by_batch_size": 8}']
        + ["--speculative-config.model", "/d", "--speculative-config.num_speculative_tokens", "3"]
        + ["--speculative-config.disable_by_batch_size", "null"],
    )
    for argv in forms:
        assert run_cli(["serve", "/m", "--port", "0", *argv], capsys)[0] == 0
    assert served == [wanted] * len(forms)
    for argv, named in (
        (["--speculative-config.model"], "--speculative-config.model expects a value"),
        (["--speculative-config", "[1]", "--speculative-config.model", "/d"], "its JSON must be an object"),
    ):
        with pytest.raises(SystemExit) as exited:  # argparse's usage error
            run_cli(["serve", "/m", *argv], capsys)
        assert exited.value.code == 2 and named in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--prompt", "--stop"])
def test_command_line_bytes_that_are_not_text_are_a_usage_error_naming_the_flag(flag, capsys):
    """Latin-1 bytes under a UTF-8 locale ("caf\\xe9") reach Python's argv as a lone surrogate
    (surrogateescape). generate loaded the model, then printed the tokenizer's
    "TextEncodeInput must be Union[...]"; it is argparse's usage error naming the flag and the
    byte, before the model loads."""
    from enginespec.entrypoints.cli import main

    argv = ["generate", "--model", str(tiny_model_dir("qwen3")), "--prompt", "ok", *GEN_FLAGS]
    argv += [flag, "caf\udce9"]
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert f"argument {flag}: byte 0xe9 at character 3 is not" in err.splitlines()[-1]


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--model", "/nonexistent", "--prompt", "x"],
        ["demo", "--num-requests", "1", "--max-output-len", "1", "--device", "cpu", "--no-tqdm"],
        ["serve", "/nonexistent"],
        ["simulate", "--quiet", "--num-requests", "1"],
    ],
    ids=lambda argv: argv[0],
)
@pytest.mark.parametrize("value", ["", " "])
def test_a_blank_impl_is_a_usage_error_not_the_oracle(argv, value, capsys):
    """load_impl reads an empty name as "not given": `--impl "$IMPL"` with IMPL unset ran
    $ENGINESPEC_IMPL or the slow reference impl without a word (the conformance plugin's
    `--impl=` is already a usage error). Every subcommand's --impl refuses a blank name."""
    from enginespec.entrypoints.cli import main

    with pytest.raises(SystemExit) as exited:
        main([*argv, "--impl", value])
    assert exited.value.code == 2
    assert "argument --impl: must name an impl" in capsys.readouterr().err


def test_demo_hit_rate_is_the_prompt_tokens_the_cache_served(impl, monkeypatch):
    """The demo's "prefix hit rate" is vLLM's: prompt tokens served by the prefix cache over
    prompt tokens, for the run's requests (RequestOutput.num_cached_tokens over prompt lengths).
    It read the pool's block counters, which count every lookup: a waiting request the pool
    could not admit yet was counted each step, and a preempted request's re-admission counted
    its own blocks as hits, so a tight pool reported a rate its prompts never had."""
    from enginespec.entrypoints.demo import run_demo
    from enginespec.llm import LLM

    runs: list = []
    generate = LLM.generate

    def spy(self, *args, **kwargs):
        outs = generate(self, *args, **kwargs)
        runs.append(outs)
        return outs

    monkeypatch.setattr(LLM, "generate", spy)
    result = run_demo(
        impl=impl,
        num_requests=6,
        min_input_len=9,
        max_input_len=16,
        max_output_len=8,
        shared_prefix_len=0,
        use_tqdm=False,
        num_blocks=7,
        block_size=4,
        max_num_seqs=4,
    )
    assert result.num_preemptions > 0, "seven 4-token blocks for six such requests must preempt"
    outputs = runs[-1]  # the workload's run (the text sample before it is one request)
    served = sum(o.num_cached_tokens for o in outputs)
    assert result.prefix_hit_rate == pytest.approx(served / result.num_prompt_tokens)


class _InterruptedInFinalizer:
    """Its __del__ raises SIGINT in this process: Python's KeyboardInterrupt lands inside the
    finalizer, where it is printed and dropped (what test_cli_process saw under load)."""

    def __del__(self):
        import signal

        signal.raise_signal(signal.SIGINT)


@pytest.mark.skipif(not hasattr(__import__("signal"), "setitimer"), reason="needs signal.setitimer")
def test_a_ctrl_c_that_lands_in_a_finalizer_still_interrupts_the_command(monkeypatch, capsys):
    """A Ctrl-C whose KeyboardInterrupt Python dropped inside a __del__ let the command run to
    its end and exit 0; main() now raises it again outside the finalizer: status 130, the one
    interrupted line, and no "Exception ignored" report."""
    import time

    from enginespec.entrypoints import cli

    finished = []

    def command(argv):
        _InterruptedInFinalizer()  # collected at once: the signal arrives inside its __del__
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:  # the command's own work, interruptible
            sum(range(1000))
        finished.append(True)
        return 0

    monkeypatch.setattr(cli, "_main", command)
    assert cli.main(["generate"]) == cli.EXIT_INTERRUPTED
    err = capsys.readouterr().err
    assert not finished and err.rstrip().splitlines()[-1] == "enginespec generate: interrupted"
    assert "Exception ignored" not in err


@pytest.mark.skipif(not hasattr(__import__("signal"), "setitimer"), reason="needs signal.setitimer")
def test_one_ctrl_c_does_not_interrupt_the_commands_clean_up_again(monkeypatch, capsys):
    """One Ctrl-C is one KeyboardInterrupt: the clean-up it unwinds through (a finally block
    that takes a while: releasing requests, settling a step) runs to its end. The redelivery
    timer kept raising it every REDELIVER_S until main() was left, cutting every such clean-up
    short as a second Ctrl-C would."""
    import signal
    import time

    from enginespec.entrypoints import cli

    cleaned = []

    def command(argv):
        try:
            signal.raise_signal(signal.SIGINT)
            time.sleep(5.0)  # interrupted above, never reached
        finally:
            deadline = time.monotonic() + 10 * cli.REDELIVER_S
            while time.monotonic() < deadline:
                sum(range(1000))
            cleaned.append(True)
        return 0

    monkeypatch.setattr(cli, "_main", command)
    assert cli.main(["generate"]) == cli.EXIT_INTERRUPTED
    assert cleaned, "the clean-up was interrupted by a Ctrl-C that was already delivered"
    assert capsys.readouterr().err.rstrip().splitlines()[-1] == "enginespec generate: interrupted"


@pytest.mark.skipif(not hasattr(__import__("signal"), "setitimer"), reason="needs signal.setitimer")
def test_an_embedding_programs_alarm_still_fires_and_survives_main(monkeypatch):
    """main() called in-process by a program that keeps its own SIGALRM watchdog (signal.alarm,
    pytest-timeout's signal method): with no Ctrl-C, the program's handler still runs while a
    command does, and its timer is not cancelled when main() returns. The SIGALRM handler was
    replaced for every command (a foreign alarm swallowed) and the timer always zeroed."""
    import signal
    import time

    from enginespec.entrypoints import cli

    fired = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(signum))
    try:

        def command(argv):
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            deadline = time.monotonic() + 2.0
            while not fired and time.monotonic() < deadline:
                sum(range(1000))
            signal.setitimer(signal.ITIMER_REAL, 30.0)  # the watchdog, armed again for later
            return 0

        monkeypatch.setattr(cli, "_main", command)
        assert cli.main(["generate"]) == 0
        assert fired == [signal.SIGALRM], "the program's own alarm was swallowed during the command"
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert remaining > 0, "main() cancelled the program's timer"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _subparsers(parser):
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices
    return {}


def test_every_default_a_flags_help_states_is_its_default():
    """A help line that says '(default N)' (or 'default N;' later in it) states the flag's real
    default, in every subcommand (a flag left None is resolved by EngineArgs): a user reads the
    help, not the code."""
    import re

    from enginespec.entrypoints.cli import _parser

    checked = []
    for name, sub in _subparsers(_parser()).items():
        for action in sub._actions:
            stated = re.search(r"\bdefault (-?\d+(?:\.\d+)?)\b", action.help or "")
            if stated is None or action.default is None:  # None: EngineArgs resolves it
                continue
            assert float(action.default) == float(stated.group(1)), (name, action.option_strings)
            checked.append((name, action.dest))
    assert {("demo", "num_requests"), ("serve", "port"), ("generate", "seed")} <= set(checked)


def test_a_subcommand_and_generates_model_and_prompt_are_required(capsys):
    """`enginespec` alone, or `generate` without --model or --prompt, is a usage error (2)."""
    from enginespec.entrypoints.cli import _parser

    for argv in ([], ["generate", "--prompt", "hi"], ["generate", "--model", "/m"]):
        with pytest.raises(SystemExit) as exit_:
            _parser().parse_args(argv)
        assert exit_.value.code == 2, argv
    assert "required" in capsys.readouterr().err


def test_vllms_serve_switches_are_off_and_generate_draws_one_sample_by_default():
    """vLLM's defaults: each of serve's on/off flags off (a --disable-log-requests on by default
    would refuse --enable-log-requests as giving both), and one sample per prompt."""
    from enginespec.entrypoints.cli import _parser

    ns = _parser().parse_args(["serve", "/m"])
    assert {dest: getattr(ns, dest) for dest in VLLM_SERVE_BOOL_FLAGS.values()} == dict.fromkeys(
        VLLM_SERVE_BOOL_FLAGS.values(), False
    )
    assert _parser().parse_args(["generate", "--model", "/m", "--prompt", "hi"]).n == 1
