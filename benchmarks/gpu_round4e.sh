#!/usr/bin/env bash
# Device call E of 2026-12-01 (fourth session): after the profile-run fix (two compiled graphs,
# not three), one capture warm-up pass and unsynchronised swap-outs: the CUDA swap and graph
# tests, a cold start by phase with the first call, and the pressure run's swap mode.
# Usage (device machine, repo root): bash benchmarks/gpu_round4e.sh SHA
set -u
sha=${1:?commit}
out=${OUT:-/tmp/out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
tree=$(mktemp -d); python3 tools/link_tree.py "$tree" >/dev/null || exit 1
export PYTHONPATH=$tree:$PWD
timeout 70 python3 -m pytest -p enginespec.conformance.plugin --impl=fast -q -rfEs -p no:cacheprovider \
  conformance/test_parity.py::test_forced_swap_on_cuda conformance/test_parity.py::test_greedy_parity_on_cuda \
  tests/worker/test_cuda_graphs.py::test_graph_replay_equals_eager conformance/test_async_scheduling.py::test_async_equals_serial_on_cuda > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$out/pytest.log"
TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 110 python3 benchmarks/first_call_compiles.py \
  --temperature 0.6 --out "$out/first_call.json" > "$out/first_call.log" 2>&1; echo "first_call rc=$?"
grep -E "^startup|load " "$out/first_call.log"
timeout 60 python3 benchmarks/pressure.py --git-commit "$sha" --modes swap --out "$out/pressure_swap.json" \
  > "$out/pressure.log" 2>&1; echo "pressure rc=$?"
grep -E "^pressure" "$out/pressure.log"
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; ls
