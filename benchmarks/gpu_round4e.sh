#!/usr/bin/env bash
# Device call E, written on 2026-12-01 (fourth session) and refused there (no device time left):
# after the profile-run fix (two compiled graphs, not three), the CUDA swap, graph and async
# tests, a cold start by phase with the first call, and the pressure run's swap mode with its
# host time, and the server at saturation against offline (not re-measured since mixed graphs
# read 8-token query blocks up to 512 tokens). Usage (device machine, repo root, server wheels
# in .whl/): bash benchmarks/gpu_round4e.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
timeout 70 python3 -m pytest -p enginespec.conformance.plugin --impl=fast -q -rfEs -p no:cacheprovider \
  conformance/test_parity.py::test_forced_swap_on_cuda conformance/test_parity.py::test_greedy_parity_on_cuda \
  tests/worker/test_cuda_graphs.py::test_graph_replay_equals_eager conformance/test_async_scheduling.py::test_async_equals_serial_on_cuda > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$out/pytest.log"
cold_first_call first_call
timeout 60 python3 benchmarks/pressure.py --git-commit "$sha" --modes swap --out "$out/pressure_swap.json" \
  > "$out/pressure.log" 2>&1; echo "pressure rc=$?"
grep -E "^pressure" "$out/pressure.log"
timeout 300 python3 -m benchmarks.serving --request-rate inf --offline --out "$out/serving_inf.json" \
  > "$out/serving_inf.log" 2>&1; echo "saturation rc=$?"
grep -iE "offline|ratio|tok/s" "$out/serving_inf.log" | grep -v "it/s" | tail -4
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; ls
