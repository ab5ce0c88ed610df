#!/usr/bin/env bash
# Device call B of 2026-12-01 (fifth session): who sets the pace of a batch-1 decode step.
# Call A found the host never waiting on the GPU at 1-64 rows (decode_sweep's wait_ms ~7 us)
# and the one-tile GEMV cutting device time without moving the step. step_anatomy.py times
# each host phase and the GPU's share; the first run starts cold with TORCH_LOGS=recompiles
# (why a cold start still compiles the decoder three times) and writes a profiler trace.
# Usage (device machine, repo root): bash benchmarks/gpu_round5b.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
TORCH_LOGS=recompiles timeout 200 python3 benchmarks/step_anatomy.py --git-commit "$sha" --batch 1 \
  --out "$out/anatomy_b1.json" --trace "$out/trace_b1.json.gz" > "$out/anatomy_b1.log" 2>&1
echo "anatomy b1 rc=$?"; grep -E "^batch|Recompiling|triggered by|guard" "$out/anatomy_b1.log" | cut -c1-300 | head -20
timeout 150 python3 benchmarks/step_anatomy.py --git-commit "$sha" --batch 1 --engine-arg skinny_gemm=true \
  --out "$out/anatomy_b1_skinny.json" > "$out/anatomy_b1_skinny.log" 2>&1
echo "anatomy b1 skinny rc=$?"; grep -E "^batch" "$out/anatomy_b1_skinny.log"
timeout 120 python3 benchmarks/step_anatomy.py --git-commit "$sha" --batch 64 \
  --out "$out/anatomy_b64.json" > "$out/anatomy_b64.log" 2>&1
echo "anatomy b64 rc=$?"; grep -E "^batch" "$out/anatomy_b64.log"
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
