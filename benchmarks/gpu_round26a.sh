#!/usr/bin/env bash
# Twenty-sixth session, call 1 (issues 16 and 19): the norms folded into the projections
# (MergedDecoder.fold_norms, on by default on CUDA). First the CUDA tests of the row-scaled
# kernels and greedy parity on CUDA (float32: every row count takes the folded layers); then the
# temperature-0.6 workload and the decode steps at 16-256 rows, folded (default) and not
# (ENGINESPEC_FOLD_NORMS=0), one after the other in the same call.
#   bash benchmarks/gpu_round26a.sh SHA    # ~9 min on a cold machine; nothing to carry
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
timeout 170 python3 -m pytest -q -rfEs -p enginespec.conformance.plugin --impl=fast \
  tests/kernels/test_small_kernels.py tests/kernels/test_decode_attention.py \
  conformance/test_parity.py -k "cuda or row or folded or qkv or silu or matches" > $out/test.log 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)" $out/test.log | head; tail -1 $out/test.log
for fold in 1 0; do
  ENGINESPEC_FOLD_NORMS=$fold t06_workload t06_fold$fold 170 $S --first-call
done
for fold in 1 0; do
  left=$((590 - SECONDS)); [ "$left" -lt 60 ] && { echo "sweep fold=$fold not run: ${left}s left"; continue; }
  ENGINESPEC_FOLD_NORMS=$fold timeout "$left" python3 benchmarks/decode_sweep.py --git-commit $S \
    --batches 16,64,128,256 --latency-tokens 0 --out $out/sweep_fold$fold.json > $out/sweep_fold$fold.log 2>&1
  echo "sweep fold=$fold rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]" $out/sweep_fold$fold.log
done
cd $out && tar czf s26a_h200_$S.tgz *.json *.log 2>/dev/null && find . -maxdepth 1 -type f ! -name "s26a_*" -delete; ls $out
