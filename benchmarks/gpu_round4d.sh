#!/usr/bin/env bash
# Device call D of 2026-12-01 (fourth session): why a cold start compiles the decoder three
# times (TORCH_LOGS=recompiles), and the half-rate serving run at threshold 128 once more.
# Usage (device machine, repo root, server wheels in .whl/): bash benchmarks/gpu_round4d.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
TORCH_LOGS=recompiles,graph_breaks timeout 140 python3 benchmarks/first_call_compiles.py --num-requests 16 \
  --temperature 0.6 --out "$out/first_call_small.json" > "$out/recompiles.log" 2>&1; echo "recompiles rc=$?"
grep -E "__recompiles|guard|Recompiling|startup|load " "$out/recompiles.log" | cut -c1-400 | head -30
serve_at half_t128_q8_b 21.4 --serve-arg=--long-prefill-token-threshold=128
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
