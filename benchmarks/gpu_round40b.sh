#!/usr/bin/env bash
# The fortieth session's one call (about 9.5 min): the CUDA tests of what changed since the
# last suite on the H200 (77ad9b5: the sampler's edits, dff509e and cfe5f1a), the whole decode
# sweep 1-256 rows with its PNG (issue 19's acceptance table), constrained_cost at one row with
# the step trace (the one-row bad-words question of the thirty-ninth session), then the t 0.6
# workload if time is left. One tar back: s40b_KIND_SHA.tgz.
#   bash benchmarks/gpu_round40b.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE "H[0-9]+" | tr A-Z a-z)
echo "device ${kind:-unknown}"; uptime
# TEST_PATHS (default below) and TEST_TIMEOUT (150 s) change the tests; TAG (s40b) names the tar
tests=${TEST_PATHS:-tests/sample conformance/test_async_scheduling.py conformance/test_vllm_params.py}
# shellcheck disable=SC2086  # TEST_PATHS is a list of paths
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -p enginespec.conformance.plugin -p no:cacheprovider --impl=fast -q -rfEs \
  $tests > "$out/pytest_$sha.log" 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$out/pytest_$sha.log" | tail -8
timeout 230 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1,2,4,8,16,32,64,128,256 \
  --out "$out/decode_sweep_${kind}_$sha.json" > "$out/sweep.log" 2>&1
echo "sweep rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate|decode steps, ms" "$out/sweep.log"
timeout $((500 - SECONDS)) python3 benchmarks/constrained_cost.py --batches 1 --tokens 128 \
  --cases greedy,t0.6,bad_words,bad_pair --out "$out/constrained_cost_$sha.json" > "$out/constrained.log" 2>&1
echo "constrained rc=$? after ${SECONDS}s"; grep -E "^\| " "$out/constrained.log"; tail -2 "$out/constrained.log"
left=$((570 - SECONDS)); [ $left -gt 100 ] && t06_workload t06_$sha $left "$sha" --repeat 3
cd "$out" && tar czf "${TAG:-s40b}_${kind:-gpu}_$sha.tgz" ./*.log ./*.json ./*.png 2>/dev/null && rm -f ./*.log ./*.json; ls
