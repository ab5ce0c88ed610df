"""The `enginespec` command line as a shell runs it: `python -m enginespec`, Ctrl-C, a reader
that closes the pipe early, pool sizes the host cannot hold, and the checkpoint's
generation_config.json under `generate`. Each case is one fresh process (or one in-process
call) on the tiny qwen3 checkpoint."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from enginespec.testing.checkpoints import tiny_model_dir

pytestmark = pytest.mark.usefixtures("torch_one_thread")

CLI = [sys.executable, "-m", "enginespec.entrypoints.cli"]
CPU = ["--device", "cpu", "--dtype", "float32", "--no-tqdm"]


def _env() -> dict:
    """The test's environment for a child process: its sys.path (so the child imports this
    tree), one torch thread (the suite's CPUs are shared)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "OMP_NUM_THREADS": "1"}


def run_cli(argv, capsys) -> tuple[int, str, str]:
    from enginespec.entrypoints.cli import main

    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_python_dash_m_enginespec_is_the_cli():
    """`python -m enginespec ...` (the package run as a module) is the `enginespec` script: it
    said "No module named enginespec.__main__" and exited 1."""
    from enginespec import __version__

    proc = subprocess.run(
        [sys.executable, "-m", "enginespec", "--version"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"enginespec {__version__}"
    proc = subprocess.run(
        [sys.executable, "-m", "enginespec", "generate"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert proc.returncode == 2 and "the following arguments are required: --model" in proc.stderr


@pytest.mark.parametrize("missing", ["fastapi", "uvicorn", "prometheus_client"])
def test_serve_without_the_serve_extra_says_to_install_it(missing):
    """`enginespec serve` on an install without the `serve` extra: one line naming the missing
    package and the extra, status 1, before any engine is built. It was a ModuleNotFoundError
    traceback ending in "No module named 'fastapi'" (or uvicorn's), the extra unnamed."""
    code = (
        f"import sys; sys.modules[{missing!r}] = None  # import it: ImportError, as if not installed\n"
        "from enginespec.entrypoints.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    argv = [sys.executable, "-c", code, "serve", str(tiny_model_dir("qwen3")), *CPU[:4]]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(), timeout=120)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.splitlines() == [
        f"enginespec serve: error: the server needs the {missing} package: pip install 'enginespec[serve]'"
    ]


def test_ctrl_c_during_generate_exits_130_without_a_traceback():
    """SIGINT while generate runs (the user's Ctrl-C) ends the process with status 130 and one
    line on stderr; it printed a KeyboardInterrupt traceback from deep inside the model."""
    prompts = [arg for i in range(64) for arg in ("--prompt", f"p{i}")]
    argv = [*CLI, "generate", "--model", str(tiny_model_dir("qwen3")), *prompts, "--device", "cpu"]
    argv += ["--dtype", "float32", "--max-tokens", "200", "--ignore-eos", "--max-num-seqs", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        seen = ""
        while "Processed prompts" not in seen:  # tqdm's bar: generate() is under way
            char = proc.stderr.read(1)
            assert char, f"generate ended before it was interrupted: {seen!r}"
            seen += char
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert err.rstrip().splitlines()[-1] == "enginespec generate: interrupted"


def _children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (read from /proc: no psutil in the suite)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _stat(int(entry))[1:2] == [str(pid)]:
            found.append(int(entry))
    return found


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command name (state, ppid, ...); [] once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _alive(pid: int) -> bool:
    return _stat(pid)[:1] not in ([], ["Z"], ["X"])


@pytest.mark.parametrize("reach", ["terminal", "process"])
def test_ctrl_c_during_tensor_parallel_generate_ends_promptly_with_no_worker_left(reach):
    """`enginespec generate ... -tp 2` on the CPU, interrupted while it generates: the terminal's
    Ctrl-C (SIGINT to the whole foreground process group, the workers included) and `kill -INT`
    of the command alone both end it with status 130 and the one line, within seconds, and no
    worker outlives it. It took 16 s: rank 0 waited 5 s for a worker to die, then shutdown 10 s
    for a polite stop the workers, blocked in the interrupted step's collective, never read."""
    prompts = [arg for i in range(64) for arg in ("--prompt", f"p{i}")]
    argv = [*CLI, "generate", "--model", str(tiny_model_dir("qwen3")), *prompts, *CPU[:4]]
    argv += ["--max-tokens", "200", "--ignore-eos", "--max-num-seqs", "1", "-tp", "2"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), start_new_session=True
    )
    try:
        seen = ""
        while "Processed prompts" not in seen:  # tqdm's bar: generate() is under way
            char = proc.stderr.read(1)
            assert char, f"generate ended before it was interrupted: {seen!r}"
            seen += char
        workers = _children(proc.pid)
        assert workers, "no tensor-parallel worker found"
        if reach == "terminal":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.rstrip().splitlines()[-1] == "enginespec generate: interrupted"
    deadline = time.monotonic() + 2.0  # an orphan is reaped by init a moment after its parent
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [pid for pid in workers if _alive(pid)]
    for pid in survivors:  # never leave one running, whatever the verdict
        os.kill(pid, signal.SIGKILL)
    assert not survivors, "a worker outlived the interrupted command"


def test_a_closed_stdout_is_not_a_broken_pipe_traceback():
    """`enginespec generate ... | head -1`: the reader is gone before the results are printed.
    The process exits 141 (the shell's status for a SIGPIPE death) with nothing on stderr; it
    printed a BrokenPipeError traceback (or Python's 'Exception ignored ... BrokenPipeError'
    when the output fit the buffer)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # no reader: every write to the pipe is EPIPE
    argv = [*CLI, "generate", "--model", str(tiny_model_dir("qwen3")), "--prompt", "abc", *CPU]
    try:
        proc = subprocess.run(
            [*argv, "--max-tokens", "3"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert "BrokenPipeError" not in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "flag, value, named",
    [
        ("--num-blocks", "10000000000000", "num_blocks"),
        ("--num-gpu-blocks-override", "10000000000000", "num_gpu_blocks_override"),
        ("--kv-cache-bytes", str(10**17), "kv_cache_bytes"),
    ],
)
def test_a_kv_pool_the_host_cannot_hold_is_one_line_naming_the_flag(capsys, flag, value, named):
    """A typo of a few zeros in the pool size: the allocator's RuntimeError came out as a
    traceback with exit status 1; it is the one-line usage error naming the setting."""
    argv = ["generate", "--model", str(tiny_model_dir("qwen3")), "--prompt", "x", *CPU, flag, value]
    capsys.readouterr()  # a first build of the checkpoint writes its progress bar to stderr
    rc, out, err = run_cli([*argv, "--block-size", "4"], capsys)
    assert rc == 2 and not out
    assert err.startswith("enginespec generate: error:") and len(err.strip().splitlines()) == 1
    # the runner's check against free memory names it first; the allocator's refusal, where the
    # free memory cannot be read or the check passed, names it too ("could not be allocated")
    assert named in err and ("host memory available" in err or "could not be allocated" in err)


@pytest.fixture
def model_with_defaults(tmp_path) -> Path:
    """The tiny checkpoint with a generation_config.json that asks for 3 new tokens."""
    src = tiny_model_dir("qwen3")
    dst = shutil.copytree(src, tmp_path / "qwen3")
    config = json.loads((src / "generation_config.json").read_text())
    (dst / "generation_config.json").write_text(json.dumps({**config, "max_new_tokens": 3}))
    return dst


def _token_counts(out: str) -> list[int]:
    """The tokens= count of each completion's closing "(finish_reason=..., tokens=N)" line."""
    lines = [line for line in out.splitlines() if line.startswith("(finish_reason=")]
    return [int(line.split("tokens=")[1].rstrip(")")) for line in lines]


@pytest.mark.parametrize(
    "flags, tokens",
    [
        ([], 3),  # the checkpoint's max_new_tokens
        (["--override-generation-config", '{"max_new_tokens": 2}'], 2),
        (["--generation-config", "vllm"], 32),  # none of the file's defaults: the CLI's own
        (["--max-tokens", "4"], 4),  # the user's flag wins
        (["--max-tokens", "4", "--override-generation-config", '{"max_new_tokens": 2}'], 4),
    ],
)
def test_generate_takes_the_checkpoints_defaults_where_no_flag_chose(
    capsys, model_with_defaults, flags, tokens
):
    """generate's sampling flags left out take generation_config.json's defaults (and
    --override-generation-config's), as the README says of every way in; generate built its
    SamplingParams from its own flag defaults, so both were silently ignored."""
    argv = ["generate", "--model", str(model_with_defaults), "--prompt", "abc", *CPU, "--ignore-eos", *flags]
    rc, out, err = run_cli(argv, capsys)
    assert rc == 0, err
    assert _token_counts(out) == [tokens]


@pytest.mark.parametrize("seed", [str(2**63), str(-(2**63) - 1)])
def test_simulate_with_a_seed_beyond_64_bits_is_a_usage_error(capsys, seed):
    """The fake model hashes its seed as a signed 64-bit int: a larger --seed crashed the first
    step with struct.error's traceback (exit 1); it is the one-line error naming the bound."""
    rc, out, err = run_cli(["simulate", "--quiet", "--seed", seed], capsys)
    assert rc == 2 and not out and "Traceback" not in err
    assert err.startswith("enginespec simulate: error: seed must be an int in [") and seed in err


def test_text_stdout_cannot_encode_is_escaped_not_an_error():
    """On a stdout whose encoding lacks a character of the results (ASCII here; a Latin-1 or
    cp1252 file redirect alike), printing the finished results raised UnicodeEncodeError, a
    ValueError: the command printed "error: 'ascii' codec can't encode ..." and exited 2 with
    the generated text lost. The character is written as a backslash escape instead."""
    argv = [*CLI, "generate", "--model", str(tiny_model_dir("qwen3")), "--prompt", "caf\u00e9", *CPU]
    proc = subprocess.run(
        [*argv, "--max-tokens", "2"],
        capture_output=True,
        text=True,
        env={**_env(), "PYTHONIOENCODING": "ascii"},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "=== prompt 0: 'caf\\xe9'"
    assert "(finish_reason=length, tokens=2)" in proc.stdout
