#!/usr/bin/env bash
# Device call of the twelfth session: the suite with the fast impl on CUDA after the one-tile
# GEMV's row loop (every decode step of up to 4 rows may take it) and the 64-row bound of the
# one-launch decode attention: conformance, tests/engine, tests/entrypoints, tests/worker,
# tests/impls and the attention, PDL and skinny GEMM kernels' tests. Then, in the time the call
# has left (one call is at most 600 s), the Qwen3-8B shape's batch-1 decode. The suite outgrew
# 470 s at 46978b3 (759 of 789 tests), so it now has SUITE_TIMEOUT (default 540) s, which leaves
# the 8B run too little: SUITE=0 runs the 8B shape alone.
# Usage (device machine, repo root): [SUITE=0] bash benchmarks/gpu_round12b.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
plugin=(-p enginespec.conformance.plugin --impl=fast)
dirs=(conformance tests/engine tests/entrypoints tests/worker tests/impls tests/kernels/test_decode_attention.py
      tests/kernels/test_paged_attention.py tests/kernels/test_pdl.py tests/kernels/test_skinny_gemm.py)
log="$out/pytest_fast_h200_$sha.log"
if [ "${SUITE:-1}" = 1 ]; then
  timeout "${SUITE_TIMEOUT:-540}" python3 -m pytest -q -p no:cacheprovider "${plugin[@]}" "${dirs[@]}" > "$log" 2>&1
  echo "suite rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)" "$log" | head; tail -1 "$log"
  gzip -f "$log"
fi
left=$((575 - SECONDS))
if [ "$left" -gt 60 ]; then
  timeout "$left" python3 benchmarks/decode_sweep.py --git-commit "$sha" --shape qwen3-8b --batches 1 \
    --out "$out/decode_sweep_8b_h200_$sha.json" > "$out/sweep8b.log" 2>&1
  echo "8B sweep rc=$?"; grep -E "^\| [0-9]|LLM.generate" "$out/sweep8b.log"; gzip -f "$out/sweep8b.log"
else
  echo "8B sweep not run: ${left}s left"
fi
ls "$out"
