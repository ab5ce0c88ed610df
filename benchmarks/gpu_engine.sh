#!/usr/bin/env bash
# One H200 call for the engine figures (issue 6): the throughput harness (serial and async
# scheduling, transformers, batch-1 latency, profile, the Qwen3-8B-shaped run), then the GPU tests.
# Usage (device machine, repo root): bash benchmarks/gpu_engine.sh <git-sha> [extra bench flags]
# Device time: about 6 min for the harness without --skip-big, 1.5 min for `-m gpu`, 3 min for
# the whole suite; split across calls if the 10-minute limit of one call is near.
set -u
sha=${1:-unknown}; shift || true
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$out/gpu.txt"
timeout 420 python3 benchmarks/throughput.py --impl fast --git-commit "$sha" --compare-scheduling \
  --hf-num-requests 64 --out "$out/throughput.json" "$@" > "$out/bench.log" 2>&1
grep "^\[bench\]\|^  \|^enginespec" "$out/bench.log" | tail -20
timeout 120 python3 -m pytest -p conformance.plugin --impl=fast -q -m gpu conformance 2>&1 \
  | tee "$out/pytest_gpu.log" | tail -5
