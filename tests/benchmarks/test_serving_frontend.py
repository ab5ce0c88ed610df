"""benchmarks/serving_frontend.py on a CPU, tiny: every stream gets a frame per step plus its
finish, through the SSE generators and through the app over uvicorn's h11 protocol. It had
rotted unseen (its fake deltas lacked the num-cached-tokens field RequestStream unpacks)."""

from __future__ import annotations

import json

import pytest

from benchmarks import serving_frontend


@pytest.mark.parametrize("http", [False, True], ids=["generators", "http"])
def test_every_stream_gets_its_frames(http, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    argv = ["--num-streams", "3", "--num-steps", "4", "--repeats", "1", *(["--http"] if http else [])]
    serving_frontend.main(argv)
    out = json.loads(capsys.readouterr().out)
    (run,) = out["runs"]
    assert run["num_tokens"] == 12
    assert run["num_frames"] >= 3 * 4 and run["num_bytes"] > 0
    assert out["best_us_per_token"] == pytest.approx(1e6 * run["cpu_s"] / 12)
