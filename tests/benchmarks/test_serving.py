"""The serving benchmark on a CPU: a tiny shape, a handful of requests, a real server process,
and the offline run beside it. No timing is asserted: only that every request got exactly its
requested tokens, that the JSON holds every field, and that the server exited cleanly."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks import serving
from enginespec.testing.checkpoints import make_checkpoint
from enginespec.testing.workload import Workload


def test_poisson_arrivals_are_seeded_and_inf_sends_at_once():
    assert serving.arrival_offsets(4, math.inf, 0) == [0.0] * 4
    a = serving.arrival_offsets(50, 10.0, 3)
    assert a == serving.arrival_offsets(50, 10.0, 3) and a[0] == 0.0
    assert all(x < y for x, y in zip(a, a[1:]))


def test_summary_counts_tokens_frames_and_failures():
    workload = Workload([[1, 2], [3]], [3, 2])
    ok = serving.RequestResult(sent=0.0, frame_times=[0.1, 0.2, 0.4], num_tokens=3, done=0.4)
    bad = serving.RequestResult(sent=0.0, error="HTTP 503")
    out = serving.summarize([ok, bad], workload, wall=2.0)
    assert out["completed"] == 1 and out["failed"] == 1 and out["errors"] == ["HTTP 503"]
    assert out["output_tokens"] == 3 and not out["exact_output_lengths"]
    # the gaps 100 and 200 ms pooled; p99 interpolated between them, as numpy.percentile does
    assert out["ttft"]["p50_ms"] == 100.0 and abs(out["itl"]["p99_ms"] - 199.0) < 1e-6


def test_smoke_run_against_a_real_server_and_offline(tmp_path):
    out_file = tmp_path / "serve.json"
    model_dir = make_checkpoint("tiny", tmp_path / "tiny", dtype=torch.float32)
    argv = ["--model-dir", str(model_dir), "--device", "cpu", "--num-requests", "6", "--max-input-len", "24"]
    argv += ["--max-output-len", "8", "--warmup-requests", "2", "--request-rate", "40", "--offline"]
    argv += ["--out", str(out_file), "--serve-arg=--num-blocks=128", "--engine-arg", "num_blocks=128"]
    argv += ["--client-processes", "2"]  # results come back in workload order (exact lengths)
    argv += ["--step-trace", str(tmp_path / "steps.json")]
    assert serving.main(argv) == 0
    report = json.loads(out_file.read_text())
    serve = report["serve"]
    assert serve["completed"] == 6 and serve["failed"] == 0 and serve["exact_output_lengths"]
    assert serve["server_exit_status"] == 0
    for key in ("ttft", "itl"):
        assert set(serve[key]) == {"p50_ms", "p99_ms", "mean_ms"}
    assert report["offline"]["output_tokens"] == serve["output_tokens"]
    assert report["serve_over_offline"] > 0
    steps = serve["steps"]  # the engine's own step trace, from the server process
    assert steps["num_steps"] >= 2 and steps["gap"]["p50_ms"] > 0
    assert sum(b["num_steps"] for b in steps["by_prefill_tokens"].values()) == steps["num_steps"] - 1


def _answer_with(handler) -> serving.RequestResult:
    """One request through serving._one against an in-process HTTP handler."""
    import asyncio
    import time

    import httpx

    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            return await serving._one(http, "http://x/v1/completions", {}, 0.0, time.perf_counter())

    return asyncio.run(go())


def test_a_refused_request_still_records_when_it_ended():
    """A request the server refuses (HTTP 400) left done at 0.0, so a run whose requests all
    failed (say a prompt over --max-model-len) reported wall_s of minus the machine's uptime and
    a negative throughput."""
    import httpx

    result = _answer_with(lambda request: httpx.Response(400, json={"error": {"message": "too long"}}))
    assert result.error.startswith("HTTP 400") and result.done >= result.sent > 0
    out = serving.summarize([result], Workload([[1]], [1]), wall=result.done - result.sent)
    assert out["wall_s"] >= 0 and out["failed"] == 1 and out["request_throughput"] == 0


def test_a_frame_carrying_several_tokens_is_one_arrival():
    import httpx

    frames = [{"choices": [{"token_ids": [1, 2, 3]}]}, {"choices": [{"token_ids": [4]}]}]
    body = "".join(f"data: {json.dumps(f)}\n\n" for f in frames) + "data: [DONE]\n\n"
    result = _answer_with(lambda request: httpx.Response(200, text=body))
    assert result.error is None and result.num_tokens == 4 and len(result.frame_times) == 2


def test_warmup_requests_zero_means_no_warm_up(tmp_path):
    """--warmup-requests 0 (which serve_run handles: it skips an empty warm-up) crashed before
    the server started: make_workload(0) raised "num_requests must be an int >= 1"."""
    model_dir = make_checkpoint("tiny", tmp_path / "tiny", dtype=torch.float32)
    args = serving.build_parser().parse_args(["--num-requests", "3", "--warmup-requests", "0"])
    timed, warm = serving._workloads(args, model_dir)
    assert len(timed.prompts) == 3 and warm.prompts == [] and warm.output_lens == []


@pytest.mark.parametrize("rate", ["0", "-2", "nan"])
def test_a_request_rate_that_is_not_positive_is_refused_at_parse_time(rate, capsys):
    """It was refused only by arrival_offsets, after the server had started and warmed up
    (minutes for a real checkpoint); "nan" was not refused at all."""
    with pytest.raises(SystemExit) as done:
        serving.build_parser().parse_args(["--request-rate", rate])
    assert done.value.code == 2 and "--request-rate" in capsys.readouterr().err


def test_percentiles_interpolate_as_vllms_benchmark_reports_them():
    """vLLM's benchmark_serving takes numpy.percentile (linear between ranks); the nearest-rank
    rule reported p50 of [1, 2, 3, 4] ms as 2 ms instead of 2.5 ms (the median)."""
    import random

    import numpy as np

    assert serving._pcts([0.001, 0.002, 0.003, 0.004])["p50_ms"] == pytest.approx(2.5)
    rng = random.Random(0)
    for n in (1, 2, 3, 7, 100, 257):
        values = [rng.expovariate(20.0) for _ in range(n)]
        got = serving._pcts(values)
        for q in (50, 99):
            assert got[f"p{q}_ms"] == pytest.approx(np.percentile(values, q) * 1e3), (n, q)


def test_summary_tpot_and_e2el_per_request():
    """TPOT = (last token frame - first) / (tokens - 1) per request, a one-token request left out
    (its TPOT is undefined); E2EL = end of the stream - send."""
    workload = Workload([[1], [2], [3]], [5, 1, 3])
    five = serving.RequestResult(sent=0.0, frame_times=[0.2, 0.3, 0.6], num_tokens=5, done=0.7)
    one = serving.RequestResult(sent=1.0, frame_times=[1.05], num_tokens=1, done=1.1)
    three = serving.RequestResult(sent=0.5, frame_times=[0.6, 0.8], num_tokens=3, done=0.9)
    out = serving.summarize([five, one, three], workload, wall=1.1)
    assert out["exact_output_lengths"] and out["output_tokens"] == 9
    assert out["tpot"]["mean_ms"] == pytest.approx((100.0 + 100.0) / 2)
    assert out["tpot_mean_ms"] == pytest.approx(100.0)
    assert out["e2el"]["p50_ms"] == pytest.approx(400.0) and out["e2el"]["mean_ms"] == pytest.approx(400.0)
    assert out["ttft"]["p50_ms"] == pytest.approx(100.0)


@pytest.mark.parametrize("module", ["serving", "serving_frontend"])
def test_help_describes_every_flag(module):
    import importlib

    parser = importlib.import_module(f"benchmarks.{module}").build_parser()
    bare = [a.option_strings for a in parser._actions if a.option_strings and not a.help]
    assert not bare, bare


def test_frontend_refuses_zero_repeats_at_parse_time(capsys):
    """--repeats 0 crashed after the tokenizer load with "min() arg is an empty sequence"."""
    from benchmarks import serving_frontend

    with pytest.raises(SystemExit) as done:
        serving_frontend.build_parser().parse_args(["--repeats", "0"])
    assert done.value.code == 2 and "--repeats" in capsys.readouterr().err
