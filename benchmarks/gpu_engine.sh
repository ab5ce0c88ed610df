#!/usr/bin/env bash
# One H200 call for the engine figures (issue 6): throughput harness first, then the GPU tests.
# Usage (device machine, repo root): bash benchmarks/gpu_engine.sh <git-sha> [extra bench flags]
set -u
sha=${1:-unknown}; shift || true
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$out/gpu.txt"
timeout 330 python3 benchmarks/throughput.py --impl fast --git-commit "$sha" --out "$out/throughput.json" "$@" \
  2>&1 | tee "$out/bench.log" | grep -v "it/s\]" | tail -60
timeout 120 python3 -m pytest -p conformance.plugin --impl=fast -q -m gpu conformance 2>&1 | tee "$out/pytest_gpu.log" | tail -15
# The whole suite with the fast impl on the GPU (issue 6 acceptance); what is left of the call.
timeout 240 python3 -m pytest -p conformance.plugin --impl=fast -q -x conformance kernels 2>&1 \
  | tee "$out/pytest_fast_all.log" | tail -15
