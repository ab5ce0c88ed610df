#!/usr/bin/env bash
# Device call 3 of 2026-12-01: first-call compiles on cold caches (after the aligned scratch),
# the 1-4 row decode sweep with the skinny GEMM's new GEMV-like candidates, and the server at
# half rate with long_prefill_token_threshold 256. Usage: bash benchmarks/gpu_call3.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
cold_first_call first_call
timeout 200 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1,2,4 --profile \
  --engine-arg skinny_gemm=true --out "$out/sweep_skinny.json" > "$out/sweep.log" 2>&1; echo "sweep rc=$?"
grep -v "it/s" "$out/sweep.log" | tail -30
serve_at half_t256 21.4 --serve-arg=--long-prefill-token-threshold=256
cd "$out" && tar czf logs.tgz *.log *.json 2>/dev/null; ls
