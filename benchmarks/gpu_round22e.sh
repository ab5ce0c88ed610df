#!/usr/bin/env bash
# Twenty-second session, call 5 (issues 16 and 19): the whole suite with the fast impl on the
# H200 (gpu_round19b.sh's run without its 8B sweep), the failures again serially. One tar back.
# Usage (device machine, repo root; carry [".whl"]): bash benchmarks/gpu_round22e.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
args=(-p enginespec.conformance.plugin --impl=fast -q -rfEs -o cache_dir=/tmp/pytest_cache)
log="$out/pytest_fast_xdist_h200_$sha.log"
timeout "${SUITE_TIMEOUT:-330}" python3 -m pytest "${args[@]}" -n "${XDIST:-4}" --dist loadfile --durations=15 \
  conformance tests > "$log" 2>&1
echo "suite rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)" "$log" | head -20; tail -1 "$log"
if grep -qE "^(FAILED|ERROR)" "$log" && [ "$SECONDS" -lt 400 ]; then
  timeout $((440 - SECONDS)) python3 -m pytest "${args[@]}" --lf conformance tests > "$out/pytest_rerun_$sha.log" 2>&1
  echo "rerun rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)" "$out/pytest_rerun_$sha.log" | head; tail -1 "$out/pytest_rerun_$sha.log"
fi
cd "$out" && tar czf s22e_h200_"$sha".tgz ./*.log 2>/dev/null && rm -f ./*.log; ls
