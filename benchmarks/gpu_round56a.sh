#!/usr/bin/env bash
# The fifty-sixth and fifty-seventh sessions' call: first the CUDA tests of what they changed (sleep mode and weight updates on a GPU:
# tests/api/test_sleep_mode_cuda.py, test_weight_update_cuda.py; weight updates under tensor parallelism; the server's new
# routes and flags, the Responses API's tools, --profiler-config, whose engines run where the tests say), then, in the time left (END, default 560 s), the first half of the suite
# (conformance, tests/kernels, tests/sample, tests/testing, tests/benchmarks, tests/test_*.py),
# both with --impl=fast and 8 xdist workers, failures rerun serially. One tar back.
#   bash benchmarks/gpu_round56a.sh SHA        (carry [".whl"])
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind); echo "device ${kind:-unknown}"
args=(-p enginespec.conformance.plugin --impl=fast -q -rfEs -o cache_dir=/tmp/pytest_cache)
# run_part NAME SECONDS PATHS...: the files, -vv a test a line; failures rerun serially
run_part() {
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest "${args[@]}" -vv -n 8 --dist loadfile --durations=10 "$@" \
    > "$out/pytest_${name}_$sha.log" 2>&1
  echo "$name rc=$? after ${SECONDS}s"; tail -1 "$out/pytest_${name}_$sha.log"
  local failed; failed=$(grep -oE "(FAILED|ERROR) [^ ]+::[^ ]+" "$out/pytest_${name}_$sha.log" | cut -d" " -f2 | sort -u)
  echo "$failed" | head -20
  if [ -n "$failed" ] && [ $((END - SECONDS)) -gt 30 ]; then  # shellcheck disable=SC2086
    timeout $((END - SECONDS)) python3 -m pytest "${args[@]}" -vv $failed > "$out/pytest_${name}_rerun_$sha.log" 2>&1
    echo "$name rerun rc=$?"; grep -E "^(FAILED|ERROR)" "$out/pytest_${name}_rerun_$sha.log" | head; tail -1 "$out/pytest_${name}_rerun_$sha.log"
  fi
}
END=${END:-560}
run_part changed $(( END < 240 ? END - 20 : 220 )) tests/api/test_sleep_mode_cuda.py tests/api/test_weight_update_cuda.py tests/api/test_sleep_mode.py \
  tests/api/test_weight_update.py tests/worker/test_sleep.py \
  tests/entrypoints/test_vllm_client_paths.py tests/entrypoints/test_vllm_frontend_flags.py \
  tests/entrypoints/test_http_flags.py tests/entrypoints/test_profile_routes.py tests/entrypoints/test_routes.py \
  tests/entrypoints/test_serve.py tests/entrypoints/test_chat_defaults.py tests/api/test_async_llm.py \
  tests/api/test_llm_profile.py tests/entrypoints/test_grammar_parking.py \
  tests/worker/test_tp_weight_update.py tests/api/test_profiler_config.py tests/entrypoints/test_responses_tools.py
left=$((END - 40 - SECONDS))
if [ $left -gt 90 ]; then
  run_part first_half $left conformance tests/kernels tests/sample tests/testing tests/benchmarks tests/test_*.py
else
  echo "first half not run: ${left}s left"
fi
cd "$out" && tar czf "s56_${kind}_$sha.tgz" ./*.log 2>/dev/null && rm -f ./*.log; ls
