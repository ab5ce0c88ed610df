#!/usr/bin/env bash
# The forty-sixth session's second call: call 1's CUDA tests again, verbose (each result as it
# lands, so a run cut off by its time limit still names its failures), then the failures
# serially. One tar back: s46b_KIND_SHA.tgz.
#   bash benchmarks/gpu_round46b.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind)
echo "device ${kind:-unknown}"
tests=${TEST_PATHS:-tests/api tests/entrypoints tests/benchmarks tests/engine/spec_decode conformance/test_spec_combos.py conformance/test_vllm_params.py conformance/test_async_scheduling.py conformance/test_spec_distribution.py}
args=(-p enginespec.conformance.plugin -p no:cacheprovider --impl=fast -rfEs -o cache_dir=/tmp/pytest_cache)
# shellcheck disable=SC2086  # TEST_PATHS is a list of paths
timeout "${TEST_TIMEOUT:-380}" python3 -m pytest "${args[@]}" -v -n "${XDIST:-6}" --dist loadfile --durations=20 \
  $tests > "$out/pytest_v_$sha.log" 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E " (FAILED|ERROR) " "$out/pytest_v_$sha.log" | head -20; tail -3 "$out/pytest_v_$sha.log"
if grep -qE " (FAILED|ERROR) " "$out/pytest_v_$sha.log"; then
  grep -oE "(FAILED|ERROR) [^ ]+::[^ ]+" "$out/pytest_v_$sha.log" | awk '{print $2}' | sort -u > /tmp/failed.txt
  timeout $((560 - SECONDS)) python3 -m pytest "${args[@]}" -q $(cat /tmp/failed.txt) > "$out/pytest_rerun_$sha.log" 2>&1
  echo "rerun rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)|Error|assert" "$out/pytest_rerun_$sha.log" | head -30; tail -1 "$out/pytest_rerun_$sha.log"
fi
cd "$out" && tar czf "${TAG:-s46b}_${kind:-gpu}_$sha.tgz" ./*.log 2>/dev/null && rm -f ./*.log; ls
