#!/usr/bin/env bash
# The forty-first session's first call: gpu_round40b.sh (CUDA tests, the whole decode sweep 1-256
# with its PNG, constrained_cost at one row, the t 0.6 workload) with this session's rope and
# server-fault tests added to its CUDA tests. One tar back: s41a_KIND_SHA.tgz.
#   bash benchmarks/gpu_round41a.sh SHA
TAG=s41a TEST_TIMEOUT=170 TEST_PATHS="tests/sample conformance/test_async_scheduling.py \
conformance/test_vllm_params.py tests/worker/test_flat_model.py tests/entrypoints/test_serving_faults.py" \
  exec bash "$(dirname "$0")/gpu_round40b.sh" "$@"
