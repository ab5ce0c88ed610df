#!/usr/bin/env bash
# The forty-seventh session's last call (about 9.5 min): the CUDA tests of the session's changes
# (vLLM's script names and LLM.start_profile, the runner's finished ids of unbuilt steps, the
# refused add's speculative counters, the new kernel and bound tests) in six xdist workers,
# verbose, the failures again serially, then the t 0.6 workload in the time left (the runner's
# change is on every step's path). One tar back: s47c_KIND_SHA.tgz.
#   bash benchmarks/gpu_round47c.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind)
echo "device ${kind:-unknown}"
tests=${TEST_PATHS:-tests/api tests/engine tests/worker tests/kernels conformance/test_engine.py conformance/test_parity.py conformance/test_vllm_params.py}
args=(-p enginespec.conformance.plugin -p no:cacheprovider --impl=fast -rfEs -o cache_dir=/tmp/pytest_cache)
# shellcheck disable=SC2086  # TEST_PATHS is a list of paths
timeout "${TEST_TIMEOUT:-360}" python3 -m pytest "${args[@]}" -v -n "${XDIST:-6}" --dist loadfile \
  $tests > "$out/pytest_v_$sha.log" 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E " (FAILED|ERROR) " "$out/pytest_v_$sha.log" | head -20
grep -cE " PASSED " "$out/pytest_v_$sha.log"; tail -2 "$out/pytest_v_$sha.log"
if grep -qE " (FAILED|ERROR) " "$out/pytest_v_$sha.log"; then
  grep -oE "(FAILED|ERROR) [^ ]+::[^ ]+" "$out/pytest_v_$sha.log" | awk '{print $2}' | sort -u | head -12 > /tmp/failed.txt
  timeout $((470 - SECONDS)) python3 -m pytest "${args[@]}" -q $(cat /tmp/failed.txt) > "$out/pytest_rerun_$sha.log" 2>&1
  echo "rerun rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)|Error|assert" "$out/pytest_rerun_$sha.log" | head -30; tail -1 "$out/pytest_rerun_$sha.log"
fi
left=$((570 - SECONDS)); [ $left -gt 90 ] && t06_workload t06_$sha $left "$sha"
cd "$out" && tar czf "${TAG:-s47c}_${kind:-gpu}_$sha.tgz" ./*.log ./*.json 2>/dev/null && rm -f ./*.log ./*.json; ls
