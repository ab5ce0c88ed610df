#!/usr/bin/env bash
# Issue 19: the tiled kernel's row-scale statistics late (ENGINESPEC_LATE_ROW_STATS unset: the
# rows' load right after the PDL wait, reduced after the K loop) against early (=0: reduced
# before the loop, which holds the loop's loads back a round trip; the fifty-third session's
# profile found the tuning keeping the norm launch over the row-scale tiles at 4-16 rows, 57
# RMSNorm launches a 4-row step). In one call on one machine: TESTS (if set) on CUDA; decode
# steps at 1-32 rows both ways in ROUNDS (2) interleaved rounds, each setting on its own tuning
# table (the fingerprint records the switch), with batch-1 `LLM.generate` and each run's
# row-scale picks; the t 0.6 workload both ways if time is left (WORKLOAD=0: not).
#   TESTS="..." bash benchmarks/gpu_late_stats_ab.sh SHA
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}; kind=$(gpu_kind); kind=${kind:-gpu}; stop=${DEADLINE:-560}; echo "device $kind"
if [ -n "${TESTS:-}" ]; then
  # shellcheck disable=SC2086  # TESTS is a list of paths
  timeout "${TEST_TIMEOUT:-170}" python3 -m pytest -p enginespec.conformance.plugin --impl=fast -q -rfE -n "${WORKERS:-4}" --dist loadfile $TESTS \
    > "$out/pytest_$S.log" 2>&1
  echo "tests rc=$? after ${SECONDS}s"; tail -3 "$out/pytest_$S.log"
fi
for round in $(seq "${ROUNDS:-2}"); do
  for late in 0 1; do
    [ $((stop - SECONDS)) -lt 80 ] && { echo "out of time before late${late}_$round"; continue; }
    ENGINESPEC_LATE_ROW_STATS=$late timeout 150 python3 benchmarks/decode_sweep.py --git-commit "$S" --steps 20 \
      --batches 1,2,4,8,16,32 --out "$out/late${late}_$round.json" > "$out/late${late}_$round.log" 2>&1
    echo "late${late}_$round rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate" "$out/late${late}_$round.log"
  done
done
python3 - "$out" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/late*_1.json")):
    for c in json.load(open(f)).get("skinny_gemm", {}).get("choices", []):
        if c["variant"].startswith("rscale") or c["variant"] in ("plain", "silu"):
            print(f.rsplit("/", 1)[1], c["rows"], c["n"], c["variant"], c["choice"][12:80], round(c["us"], 2))
PY
for late in $([ "${WORKLOAD:-1}" = 0 ] || echo 0 1); do
  [ $((stop - SECONDS)) -lt 110 ] && { echo "out of time before t06_late$late"; continue; }
  ENGINESPEC_LATE_ROW_STATS=$late t06_workload "t06_late$late" 100 "$S" --repeat 2
done
cd "$out" && tar czf "late_stats_${kind}_$S.tgz" ./*.json ./*.log 2>/dev/null && find . -maxdepth 1 -type f ! -name "late_stats_*" -delete; ls
