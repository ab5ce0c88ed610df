#!/usr/bin/env bash
# The thirty-eighth session's first device call (about 5 min): the CUDA tests the thirty-seventh
# session could not run (the grammar mask's pinned upload under torch's sync debug mode, the
# compile workers' test isolated by knobs.cache.scope()), the structured-output and sampler
# tests beside them (bad words now drawn on the device: the sampler and async-scheduling tests),
# then what a constrained request costs a decode step after 52a0ec2
# (benchmarks/constrained_cost.py at 1, 8 and 32 rows), and batch-1 LLM.generate's steps traced
# (decode_sweep.py at 1 and 8 rows). One tar back: s38a_h200_SHA.tgz.
#   bash benchmarks/gpu_round38a.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
timeout 200 python3 -m pytest -p enginespec.conformance.plugin -p no:cacheprovider --impl=fast -q -rfEs \
  tests/kernels/test_compile_procs.py tests/sample conformance/test_async_scheduling.py conformance/test_vllm_params.py \
  > "$out/pytest_$sha.log" 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$out/pytest_$sha.log" | tail -8
# batch-1 LLM.generate with its decode steps traced (median/mean/p90 of the walls, the host's
# wait): is the gap between LLM.generate and the sweep's step outliers, or the host's pace?
timeout 170 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1,8 \
  --out "$out/decode_sweep_h200_$sha.json" > "$out/sweep.log" 2>&1
echo "sweep rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate|decode steps, ms" "$out/sweep.log"
timeout 300 python3 benchmarks/constrained_cost.py --batches 1,8,32 --tokens 128 \
  --out "$out/constrained_cost_h200_$sha.json" > "$out/constrained.log" 2>&1
echo "constrained rc=$? after ${SECONDS}s"; grep -E "^\| " "$out/constrained.log"; tail -3 "$out/constrained.log"
cd "$out" && tar czf "s38a_h200_$sha.tgz" ./*.log ./*.json 2>/dev/null && rm -f ./*.log ./*.json; ls
