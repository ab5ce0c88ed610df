#!/usr/bin/env bash
# The forty-third session's call: how an uncaught Ctrl-C exits on the device's Python 3.12 and
# torch 2.11 (sigint_exit_probe.sh; at 9338d86 also the TP Ctrl-C test's script, since removed), the
# second half's failures of s43a again serially (collect-env's GPU count, the request log then
# the README's AsyncLLM example in one process: the cached-memory release between them, the
# TP Ctrl-C tests), then, on an H200 only, the whole decode sweep with its PNG and the t 0.6
# workload (issue 19's figures at this commit). One tar back: s43b_KIND_SHA.tgz.
#   bash benchmarks/gpu_round43a.sh SHA      # carry .whl
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind); echo "device ${kind:-unknown}"
bash benchmarks/sigint_exit_probe.sh 2>&1 | tee "$out/sigint_probe.log"
timeout 240 python3 -m pytest -p enginespec.conformance.plugin -p no:cacheprovider --impl=fast -q -rfEs \
  tests/entrypoints/test_cli.py tests/testing/test_fixtures.py tests/entrypoints/test_request_log.py \
  "tests/worker/test_tensor_parallel.py::test_ctrl_c_during_a_tp_generate_ends_the_script_promptly_with_no_worker_left" \
  tests/test_readme.py > "$out/pytest_$sha.log" 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest_$sha.log" | tail -8
if [ "$kind" = h200 ] && [ $SECONDS -lt 330 ]; then
  timeout 230 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1,2,4,8,16,32,64,128,256 \
    --out "$out/decode_sweep_${kind}_$sha.json" > "$out/sweep.log" 2>&1
  echo "sweep rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate|decode steps, ms" "$out/sweep.log"
  left=$((575 - SECONDS)); [ $left -gt 100 ] && t06_workload t06_$sha $left "$sha" --repeat 3
else
  echo "sweep not run: ${kind} (issue 19's figures are the H200's), ${SECONDS}s"
fi
cd "$out" && tar czf "${TAG:-s43b}_${kind:-gpu}_$sha.tgz" ./*.log ./*.json ./*.png 2>/dev/null && rm -f ./*.log ./*.json; ls
