#!/usr/bin/env bash
# Issue 16's cold start: the startup's Triton compiles in worker processes
# (ENGINESPEC_COMPILE_PROCESSES=N, kernels/compile_procs.py) against threads alone (0). First the
# compile tests on CUDA with the workers on (stops there if they fail), then cold starts on empty
# caches, printing startup by phase, the GEMM tuning by part, the workers' totals and the
# tuning's rejected candidates and baseline keys (equal every way); then a second start on the
# last one's caches (every variant found cached: no worker started).
#   bash benchmarks/gpu_compile_procs_ab.sh SHA [N...]    # ~5 min on a cold machine
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}; shift
python3 -c "import inspect, triton.runtime.jit as j; print(inspect.getsource(j.JITFunction.preload))" \
  > "$out/triton_preload.log" 2>&1
ENGINESPEC_COMPILE_PROCESSES=16 timeout 150 python3 -m pytest -p enginespec.conformance.plugin --impl=fast \
  -q -x tests/kernels/test_compile_procs.py tests/kernels/test_compile_only.py tests/engine/test_warmup.py \
  tests/sample/test_precompile.py > "$out/pytest_procs.log" 2>&1
rc=$?; echo "pytest (processes on) rc=$rc"; tail -3 "$out/pytest_procs.log"
if [ $rc = 0 ]; then
  for n in 0 "${@:-16}"; do
    ENGINESPEC_COMPILE_PROCESSES=$n cold_first_call cold_procs$n --hook-startup >/dev/null
    grep -E "^startup|^  load|^  warm-up|^  GEMM|^  compile processes" "$out/cold_procs$n.log"
  done
  # a second start on the last cold start's caches: every variant cached, no worker started
  second_start second_start --hook-startup >/dev/null
  grep -E "^startup|^  load|^  compile processes" "$out/second_start.log"
fi
cd "$out" && tar czf compile_procs_h200_$S.tgz ./*.json ./*.log 2>/dev/null && rm -f ./*.json ./*.log; ls
