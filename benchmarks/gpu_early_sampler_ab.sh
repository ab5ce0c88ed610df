#!/usr/bin/env bash
# Issue 16's cold start: the sampler's compile-only launches issued before the GEMM tuning
# (ENGINESPEC_EARLY_SAMPLER_PRECOMPILE=1, engine/engine_core.py) against the default (issued at
# the warm-up's start, 8.2-8.5 s of it in the twenty-ninth session). Two cold starts on empty
# caches, the default first, each printing startup by phase, the GEMM tuning by part and its
# rejected candidates and baseline keys (equal both ways unless another thread broke a tuning
# graph's capture); then the engine and sampler tests on CUDA with the switch on.
#   bash benchmarks/gpu_early_sampler_ab.sh SHA    # ~5 min on a cold machine; carry [".whl"] not needed
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
for early in 0 1; do
  ENGINESPEC_EARLY_SAMPLER_PRECOMPILE=$early cold_first_call cold_early$early --hook-startup >/dev/null
  grep -E "^startup|^  load|^  warm-up|^  GEMM" "$out/cold_early$early.log"
done
ENGINESPEC_EARLY_SAMPLER_PRECOMPILE=1 timeout 150 python3 -m pytest -p enginespec.conformance.plugin --impl=fast \
  -q -x tests/engine/test_warmup.py tests/sample tests/kernels/test_compile_only.py > "$out/pytest_early.log" 2>&1
echo "pytest (early on) rc=$?"; tail -1 "$out/pytest_early.log"
cd "$out" && tar czf early_sampler_h200_$S.tgz ./*.json ./*.log 2>/dev/null && rm -f ./*.json ./*.log; ls
