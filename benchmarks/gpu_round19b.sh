#!/usr/bin/env bash
# Device call 2 of the nineteenth session: the whole suite (conformance and tests) with the fast
# impl on one H200 in one call, in XDIST (default 6; 4 took 330+ s by the twenty-ninth session) pytest-xdist workers (whole files a worker:
# --dist loadfile), the server's wheels from .whl/ when carried; then the failures again, alone
# and serially (a test that sized its KV pool by free memory while other workers held some
# could fail only in parallel: both runs are reported); then, in the time left, the Qwen3-8B
# shape's batch-1 decode (SWEEP_8B=0: not; RERUN_END, default 540 s, bounds the rerun). One tar back,
# named TAG (default s19b).
# Usage (device machine, repo root; carry [".whl"]): bash benchmarks/gpu_round19b.sh SHA
# SUITE_PATHS (default "conformance tests") runs part of it: the suite outgrew one 400 s call by
# the thirty-ninth session (1,958 of ~2,000 tests ran), so a full run is two calls, e.g.
#   SUITE_PATHS="conformance tests/kernels tests/sample tests/testing" TAG=s40a ...
#   SUITE_PATHS="tests/api tests/benchmarks tests/engine tests/entrypoints tests/impls tests/worker tests/test_*.py" TAG=s40b ...
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
args=(-p enginespec.conformance.plugin --impl=fast -q -rfEs -o cache_dir=/tmp/pytest_cache)
log="$out/pytest_fast_xdist_h200_$sha.log"
timeout "${SUITE_TIMEOUT:-450}" python3 -m pytest "${args[@]}" -vv -n "${XDIST:-6}" --dist loadfile --durations=15 \
  ${SUITE_PATHS:-conformance tests} > "$log" 2>&1
echo "suite rc=$? after ${SECONDS}s"; failed=$(grep -oE "(FAILED|ERROR) [^ ]+::[^ ]+" "$log" | cut -d" " -f2 | sort -u); echo "$failed" | head -20; tail -1 "$log"
if [ -n "$failed" ]; then  # the failures again, serially
  timeout $((${RERUN_END:-540} - SECONDS)) python3 -m pytest "${args[@]}" $failed > "$out/pytest_rerun_$sha.log" 2>&1
  echo "rerun rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)" "$out/pytest_rerun_$sha.log" | head; tail -1 "$out/pytest_rerun_$sha.log"
fi
left=$((580 - SECONDS))
if [ "${SWEEP_8B:-1}" = 0 ]; then
  echo "8B sweep not run: SWEEP_8B=0"
elif [ "$left" -gt 70 ]; then
  timeout "$left" python3 benchmarks/decode_sweep.py --git-commit "$sha" --shape qwen3-8b --batches 1 \
    --out "$out/decode_sweep_8b_h200_$sha.json" > "$out/sweep8b.log" 2>&1
  echo "8B sweep rc=$?"; grep -E "^\| [0-9]|LLM.generate" "$out/sweep8b.log"
else
  echo "8B sweep not run: ${left}s left"
fi
cd "$out" && tar czf "${TAG:-s19b}"_h200_"$sha".tgz ./*.log ./*.json 2>/dev/null && rm -f ./*.log ./*.json; ls
