#!/usr/bin/env bash
# Device call B of 2026-12-01 (fourth session): cold startup by phase and the first call, the
# server at half rate with long_prefill_token_threshold 128 (finer mixed buckets), and the
# pressure run (a quarter of the KV pool, recompute against swap, and the whole pool).
# Usage (device machine, repo root, server wheels in .whl/): bash benchmarks/gpu_round4b.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
cold_first_call first_call
serve_at half_t128 21.4 --serve-arg=--long-prefill-token-threshold=128
timeout 170 python3 benchmarks/pressure.py --git-commit "$sha" --baseline --out "$out/pressure.json" \
  > "$out/pressure.log" 2>&1; echo "pressure rc=$?"
grep -E "^pressure" "$out/pressure.log"
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; ls
