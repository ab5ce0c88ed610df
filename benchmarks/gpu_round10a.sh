#!/usr/bin/env bash
# Device calls of 2026-12-02's tenth session (issue 19): decode attention from the raw q|k|v rows
# (kernels/decode_attention.py: norm, rotary, K/V write and attention in one launch).
#   part "a": the CUDA tests that cover it, then the 0.6B decode sweep (1, 4, 16, 64 rows, with
#     LLM.generate at batch 1) with the fused kernel off and on (ENGINESPEC_FUSED_DECODE=0/1,
#     same machine), then the batch-1 per-kernel profile with PDL off;
#   part "b": the 8B shape at batch 1 (sweep row + LLM.generate), fused off and on.
# Usage (device machine, repo root): bash benchmarks/gpu_round10a.sh SHA a|b
set -u
sha=${1:?commit}; part=${2:?a or b}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
plugin=(-p enginespec.conformance.plugin --impl=fast)
if [ "$part" = a ]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider "${plugin[@]}" tests/kernels/test_decode_attention.py \
    tests/kernels/test_paged_attention.py tests/impls/test_fast_examples.py tests/worker/test_cuda_graphs.py \
    tests/worker/test_compiled.py conformance/test_engine.py > "$out/pytest.log" 2>&1
  echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head; tail -1 "$out/pytest.log"
  for fused in 0 1; do
    ENGINESPEC_FUSED_DECODE=$fused timeout 150 python3 benchmarks/decode_sweep.py --git-commit "$sha" \
      --batches 1,4,16,64 --out "$out/sweep_fused${fused}_h200_$sha.json" > "$out/sweep$fused.log" 2>&1
    echo "sweep fused=$fused rc=$?"; grep -E "^\| [0-9]|LLM.generate" "$out/sweep$fused.log"
  done
  ENGINESPEC_PDL=0 timeout 90 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1 --latency-tokens 0 \
    --profile --profile-steps 10 --out "$out/sweep_prof1_pdl0_$sha.json" > "$out/prof1.log" 2>&1
  echo "prof1 rc=$?"; grep -E "^\||profile" "$out/prof1.log" | head -30 | cut -c1-160
else
  for fused in 0 1; do
    ENGINESPEC_FUSED_DECODE=$fused timeout 250 python3 benchmarks/decode_sweep.py --git-commit "$sha" --shape qwen3-8b \
      --batches 1 --out "$out/sweep_8b_fused${fused}_h200_$sha.json" > "$out/sweep8b$fused.log" 2>&1
    echo "8b fused=$fused rc=$?"; grep -E "^\| [0-9]|LLM.generate" "$out/sweep8b$fused.log"
  done
fi
cd "$out" && rm -f *.png && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
