#!/usr/bin/env bash
# Device call of the eighteenth session (issue 19): the full decode sweep of the 0.6B shape (1-256
# rows, the table and PNG the issue asks for) with the per-kernel profile of a 4-row step, a
# 16-row step's profile, then (PROFILE_1=1) batch 1's, all with PDL on (read the critical column),
# and the 8B shape at batch 1 in the time the call has left. The runs share one skinny GEMM table
# (ENGINESPEC_SKINNY_TABLE): only the first tunes. Everything comes back in one tar.
# Usage (device machine, repo root): bash benchmarks/gpu_round18a.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
export ENGINESPEC_SKINNY_TABLE=/tmp/skinny_table_18a.json
sweep() {  # sweep NAME TIMEOUT ARGS...: one decode_sweep.py run, its table and profile printed
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 benchmarks/decode_sweep.py --git-commit "$sha" "$@" \
    --out "$out/sweep_${name}_h200_$sha.json" > "$out/sweep_$name.log" 2>&1
  echo "$name rc=$? at ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate" "$out/sweep_$name.log"
  [ "${name#prof}" != "$name" ] || [ "$name" = all ] && python3 -m benchmarks.sweep_profile "$out/sweep_${name}_h200_$sha.json"
}
sweep all 300 --profile --profile-batch 4
sweep prof16 120 --batches 16 --profile --profile-batch 16 --latency-tokens 0
[ "${PROFILE_1:-0}" = 1 ] && sweep prof1 100 --batches 1 --profile --profile-batch 1 --latency-tokens 0
left=$((580 - SECONDS))
if [ "$left" -gt 80 ]; then sweep 8b "$left" --shape qwen3-8b --batches 1; else echo "8B not run: ${left}s left"; fi
cp "$ENGINESPEC_SKINNY_TABLE" "$out/" 2>/dev/null
cd "$out" && tar czf s18a_h200_"$sha".tgz ./*.log ./*.json ./*.png 2>/dev/null && rm -f ./*.log ./*.png ./*.json; ls
