#!/usr/bin/env bash
# Device call C of 2026-12-01 (seventh session): the whole suite with --impl=fast on the H200
# (PDL on the attention, merge and q|k|v kernels, the two-wave split bound, the L2 prefetch's
# CUDA test), verbose so a cut run still shows what passed. The parts not reached last round
# (tests/worker, the rest of tests/kernels, tests/sample, tests/testing) run first.
# Usage (device machine, repo root): bash benchmarks/gpu_round7c.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
timeout 530 python3 -m pytest -p enginespec.conformance.plugin --impl=fast -v -rfEs -p no:cacheprovider \
  --durations=15 tests/worker tests/kernels tests/sample tests/testing conformance tests/engine \
  tests/entrypoints tests/impls tests/benchmarks tests/test_layout.py > "$out/pytest_fast_$sha.log" 2>&1
echo "pytest exit: $?"
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest_fast_$sha.log" | grep -v " PASSED" | tail -25
grep -c " PASSED" "$out/pytest_fast_$sha.log"; grep -E " (FAILED|ERROR)" "$out/pytest_fast_$sha.log" | head -20
grep -A17 "slowest 15" "$out/pytest_fast_$sha.log" | cut -c1-150
cd "$out" && gzip -9 "pytest_fast_$sha.log"; ls
