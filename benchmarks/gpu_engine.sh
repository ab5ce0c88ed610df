#!/usr/bin/env bash
# One H200 call for the engine figures (issue 6): the throughput harness (greedy, three timed
# runs with the median reported, serial vs async scheduling, transformers, batch-1 latency,
# profile, the Qwen3-8B-shaped run), the same workload sampled at temperature 0.8 with its
# profile, then the GPU tests.
# Usage (device machine, repo root): bash benchmarks/gpu_engine.sh <git-sha> [extra bench flags]
# Device time: about 6 min for the greedy harness on a fresh machine (compilation, the 8B
# checkpoint's synthesis and transformers' run are most of it), 1.5 min for the sampled run,
# 1 min for `-m gpu`; the whole suite (`pytest -p conformance.plugin --impl=fast conformance`)
# takes 2 min more, so give it its own call when the 10-minute limit of one call is near.
set -u
sha=${1:-unknown}; shift || true
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$out/gpu.txt"
timeout 420 python3 benchmarks/throughput.py --impl fast --git-commit "$sha" --repeat 3 \
  --compare-scheduling --hf-num-requests 64 --out "$out/throughput.json" "$@" > "$out/bench.log" 2>&1
grep "^\[bench\]\|^  \|^enginespec" "$out/bench.log" | tail -20
timeout 120 python3 benchmarks/throughput.py --impl fast --git-commit "$sha" --temperature 0.8 \
  --skip-hf --skip-big --skip-latency --out "$out/throughput_t08.json" > "$out/bench_t08.log" 2>&1
grep "^  engine\|^  floor\|^  gpu busy" "$out/bench_t08.log"
timeout 100 python3 -m pytest -p conformance.plugin --impl=fast -q -m gpu conformance 2>&1 \
  | tee "$out/pytest_gpu.log" | tail -3
