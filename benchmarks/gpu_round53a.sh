#!/usr/bin/env bash
# The fifty-third session's call, by the card that comes:
# - an H200 (issue 19's targets are H200 figures; none since the row scale went on by default,
#   2ac2605): the whole decode sweep 1-256 with its PNG and batch-1 `LLM.generate`, the Qwen3-8B
#   shape's batch 1, then the t 0.6 workload in the time left;
# - an H100 (those figures were taken on one last session at the same kernels): half the suite
#   with the fast impl on CUDA (SUITE_PATHS, default the conformance/kernels/sample/testing half,
#   which holds the last sessions' new conformance files), through gpu_round19b.sh.
# One tar back: s53a_KIND_SHA.tgz.
#   bash benchmarks/gpu_round53a.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind); echo "device ${kind:-unknown}"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ "$kind" != h200 ]; then
  SUITE_TIMEOUT=${SUITE_TIMEOUT:-480} RERUN_END=560 SWEEP_8B=0 TAG=s53a_$kind XDIST=${XDIST:-8} \
    SUITE_PATHS=${SUITE_PATHS:-conformance tests/kernels tests/sample tests/testing} \
    exec bash benchmarks/gpu_round19b.sh "$sha"
fi
timeout 230 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1,2,4,8,16,32,64,128,256 \
  --out "$out/decode_sweep_${kind}_$sha.json" > "$out/sweep.log" 2>&1
echo "sweep rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate|decode steps, ms" "$out/sweep.log"
timeout 120 python3 benchmarks/decode_sweep.py --git-commit "$sha" --shape qwen3-8b --batches 1 \
  --out "$out/decode_sweep_8b_${kind}_$sha.json" > "$out/sweep8b.log" 2>&1
echo "8B rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate" "$out/sweep8b.log"
left=$((570 - SECONDS)); [ $left -gt 100 ] && t06_workload t06_$sha $left "$sha" --repeat 3
cd "$out" && tar czf "s53a_${kind}_$sha.tgz" ./*.log ./*.json ./*.png 2>/dev/null && rm -f ./*.log ./*.json ./*.png; ls
