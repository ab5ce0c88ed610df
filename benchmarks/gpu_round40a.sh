#!/usr/bin/env bash
# Prepared in the thirty-ninth session for the next device call (about 5 min; an H200, a fresh
# start, nothing else running): what a constrained request costs a decode step on a clean H200
# after the fixed bans (c1c38eb, dff509e), with the step trace's wall and host wait per case,
# which says whether one-row bad words' excess (1.2-1.3x on H100s) is host work or a wait; then
# the sweep at 1 and 8 rows (batch-1 LLM.generate by medians). One tar back: s40a_h200_SHA.tgz.
#   bash benchmarks/gpu_round40a.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader; uptime
timeout 300 python3 benchmarks/constrained_cost.py --batches 1,8,32 --tokens 128 \
  --out "$out/constrained_cost_$sha.json" > "$out/constrained.log" 2>&1
echo "constrained rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]" "$out/constrained.log"
timeout 150 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1,8 \
  --out "$out/decode_sweep_$sha.json" > "$out/sweep.log" 2>&1
echo "sweep rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate|decode steps, ms" "$out/sweep.log"
cd "$out" && tar czf "s40a_h200_$sha.tgz" ./*.log ./*.json 2>/dev/null && rm -f ./*.log ./*.json; ls
