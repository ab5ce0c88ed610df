#!/usr/bin/env bash
# Issue 19: folded layers' fused calls with each row's norm scale in the GEMM epilogue (the
# "rscale" variants, worker/skinny_linear.py; ENGINESPEC_ROW_SCALE unset) against what they ran
# before (=0: the unit-weight norm first, fused into the GEMM's prologue or its own launch). In
# one call on one machine: TESTS (if set) on CUDA; the projections' table at 1-32 rows (norm
# against rscale, benchmarks/skinny_gemm_table.py); decode steps at 1-32 rows both ways in two
# interleaved rounds, with batch-1 `LLM.generate`; the t 0.6 workload both ways if time is left.
#   TESTS="..." bash benchmarks/gpu_row_scale_ab.sh SHA     # ~8-9 min on a fresh machine
# TABLE=0 skips the table, ROUNDS=1 takes one round of sweeps, WORKLOAD=0 skips the workload (a
# short call: about 2 min of command on a fresh machine).
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}; kind=$(gpu_kind); kind=${kind:-gpu}; stop=${DEADLINE:-560}
if [ -n "${TESTS:-}" ]; then
  # shellcheck disable=SC2086  # TESTS is a list of paths
  timeout "${TEST_TIMEOUT:-170}" python3 -m pytest -p enginespec.conformance.plugin --impl=fast -q -rfE -n "${WORKERS:-4}" --dist loadfile $TESTS \
    > "$out/pytest_$S.log" 2>&1
  echo "tests rc=$? after ${SECONDS}s"; tail -3 "$out/pytest_$S.log"
fi
[ "${TABLE:-1}" = 0 ] || timeout 150 python3 benchmarks/skinny_gemm_table.py --rows 1,2,4,8,16,32 --out "$out/table_$S.json" \
  > "$out/table_$S.log" 2>&1
echo "table rc=$? after ${SECONDS}s"; grep -E "^\| (qkv|gate_up)|^rows" "$out/table_$S.log"
for round in $(seq "${ROUNDS:-2}"); do
  for on in 0 1; do
    [ $((stop - SECONDS)) -lt 80 ] && { echo "out of time before rs${on}_$round"; continue; }
    ENGINESPEC_ROW_SCALE=$on timeout 150 python3 benchmarks/decode_sweep.py --git-commit "$S" --steps 20 \
      --batches 1,2,4,8,16,32 --out "$out/rs${on}_$round.json" > "$out/rs${on}_$round.log" 2>&1
    echo "rs${on}_$round rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate" "$out/rs${on}_$round.log"
  done
done
for on in $([ "${WORKLOAD:-1}" = 0 ] || echo 0 1); do
  [ $((stop - SECONDS)) -lt 110 ] && { echo "out of time before t06_rs$on"; continue; }
  ENGINESPEC_ROW_SCALE=$on t06_workload "t06_rs$on" 100 "$S" --repeat 2
done
cd "$out" && tar czf "row_scale_${kind}_$S.tgz" ./*.json ./*.log 2>/dev/null && find . -maxdepth 1 -type f ! -name "row_scale_*" -delete; ls
