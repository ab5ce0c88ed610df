#!/usr/bin/env bash
# Where issues 16 and 19 stand, in one device call (about 7-8 min on a fresh machine): the decode
# sweep of the 0.6B shape at 1-256 rows (its table, batch 1 through `LLM.generate`, the PNG
# RESULTS.md shows, a kernel profile of PROFILE_BATCH rows, default 1), then the temperature-0.6
# workload (`throughput.py --repeat RUNS --first-call`, default 3 runs: warm wall over floor,
# first call over warm, startup on the sweep's caches). TESTS="file ..." runs those test files
# first, on CUDA with the fast impl (stops there if they fail). One tar back: state_KIND_SHA.tgz
# (KIND: the card that ran it, h100 or h200; a call for an H200 may get an H100).
#   bash benchmarks/gpu_state.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind); kind=${kind:-gpu}
if [ -n "${TESTS:-}" ]; then
  # shellcheck disable=SC2086  # TESTS is a list of paths
  timeout 150 python3 -m pytest -p enginespec.conformance.plugin --impl=fast -q -rfEs $TESTS \
    > "$out/pytest_$sha.log" 2>&1
  rc=$?; echo "tests rc=$rc"; tail -2 "$out/pytest_$sha.log"
  [ $rc = 0 ] || { cd "$out" && tar czf "state_${kind}_$sha.tgz" ./*.log && rm -f ./*.log; exit 1; }
fi
timeout "${SWEEP_TIMEOUT:-300}" python3 benchmarks/decode_sweep.py --git-commit "$sha" --profile \
  --profile-batch "${PROFILE_BATCH:-1}" --out "$out/decode_sweep_${kind}_$sha.json" > "$out/sweep.log" 2>&1
echo "sweep rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate" "$out/sweep.log"
python3 -c 'import json, sys; print("host:", json.load(open(sys.argv[1]))["env"].get("host"))' \
  "$out/decode_sweep_${kind}_$sha.json" 2>/dev/null  # load average and Python speed of this start
python3 -m benchmarks.sweep_profile "$out/decode_sweep_${kind}_$sha.json" 2>&1 | head -40
t06_workload t06_$sha "${WORKLOAD_TIMEOUT:-240}" "$sha" --repeat "${RUNS:-3}" --first-call
cd "$out" && tar czf "state_${kind}_$sha.tgz" ./*.log ./*.json ./*.png 2>/dev/null && rm -f ./*.log ./*.json ./*.png; ls
