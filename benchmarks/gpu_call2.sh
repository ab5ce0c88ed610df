#!/usr/bin/env bash
# Device call 2 of 2026-12-01: what compiles inside a first generate() on cold caches
# (benchmarks/first_call_compiles.py), then the serving pair. Usage: bash benchmarks/gpu_call2.sh
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
tree=$(mktemp -d); python3 tools/link_tree.py "$tree" >/dev/null || exit 1
( export PYTHONPATH=$tree:$PWD
  TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 200 python3 benchmarks/first_call_compiles.py \
    --temperature 0.6 --out "$out/first_call.json" > "$out/first_call.log" 2>&1; echo "first_call rc=$?"
  grep -v "it/s\]" "$out/first_call.log" | grep -v Warming | head -60 )
bash benchmarks/gpu_serving.sh > "$out/serving.log" 2>&1; echo "serving rc=$?"; tail -12 "$out/serving.log"
cd "$out" && tar czf logs.tgz *.log *.json 2>/dev/null; ls
