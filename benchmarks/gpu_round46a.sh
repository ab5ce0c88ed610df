#!/usr/bin/env bash
# The forty-sixth session's first call (about 9.5 min): the CUDA tests of what changed since the
# last whole suite on the device (982089c: the api, the server's entry points, the benchmarks'
# harnesses, the spec-combination conformance file) in six xdist workers, launch_cost_probe.py
# (the prefill projections' host time a launch, both BLAS libraries), the whole decode sweep
# 1-256 rows with its PNG (issue 19's table), then the t 0.6 workload in the time left.
# One tar back: s46a_KIND_SHA.tgz.
#   bash benchmarks/gpu_round46a.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind)
echo "device ${kind:-unknown}"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
tests=${TEST_PATHS:-tests/api tests/entrypoints tests/benchmarks tests/engine/spec_decode conformance/test_spec_combos.py conformance/test_vllm_params.py conformance/test_async_scheduling.py conformance/test_spec_distribution.py}
# shellcheck disable=SC2086  # TEST_PATHS is a list of paths
timeout "${TEST_TIMEOUT:-220}" python3 -m pytest -p enginespec.conformance.plugin -p no:cacheprovider --impl=fast -q -rfEs \
  -n "${XDIST:-6}" --dist loadfile $tests > "$out/pytest_$sha.log" 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)" "$out/pytest_$sha.log" | head -20; tail -1 "$out/pytest_$sha.log"
for blas in default cublaslt; do  # the prefill projections' host cost per launch, idle and busy
  timeout 60 python3 benchmarks/launch_cost_probe.py --blas $blas --out "$out/launch_cost_$blas.json" 2>&1 | tee "$out/launch_cost_$blas.log"
done
timeout 230 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1,2,4,8,16,32,64,128,256 \
  --out "$out/decode_sweep_${kind}_$sha.json" > "$out/sweep.log" 2>&1
echo "sweep rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate|decode steps, ms" "$out/sweep.log"
left=$((575 - SECONDS)); [ $left -gt 90 ] && t06_workload t06_$sha $left "$sha"
cd "$out" && tar czf "${TAG:-s46a}_${kind:-gpu}_$sha.tgz" ./*.log ./*.json ./*.png 2>/dev/null && rm -f ./*.log ./*.json; ls
