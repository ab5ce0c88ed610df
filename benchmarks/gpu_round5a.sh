#!/usr/bin/env bash
# Device call A of 2026-12-01 (fifth session). First a cold start by phase on a fresh machine
# (the profile-run fix of the fourth session, unmeasured there), then the CUDA tests of the new
# one-tile GEMV and of swap/graphs/async, then decode steps by batch size with the host's wait
# per step (is batch 1 bound by the host or the GPU?), default (cuBLAS) against skinny_gemm=true
# (which now times the one-tile GEMV shapes too), and the pressure run's swap mode.
# Usage (device machine, repo root): bash benchmarks/gpu_round5a.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
cold_first_call first_call
timeout 90 python3 -m pytest -p enginespec.conformance.plugin --impl=fast -q -rfEs -p no:cacheprovider \
  tests/kernels/test_skinny_gemm.py tests/worker/test_skinny_linear.py \
  conformance/test_parity.py::test_forced_swap_on_cuda conformance/test_parity.py::test_greedy_parity_on_cuda \
  tests/worker/test_cuda_graphs.py::test_graph_replay_equals_eager \
  conformance/test_async_scheduling.py::test_async_equals_serial_on_cuda > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; tail -4 "$out/pytest.log"
timeout 160 python3 benchmarks/decode_sweep.py --git-commit "$sha" --out "$out/sweep.json" --profile \
  --batches 1,2,4,8,16,32,64,128,256 > "$out/sweep.log" 2>&1; echo "sweep rc=$?"
grep -E "^\||batch-1" "$out/sweep.log"
timeout 160 python3 benchmarks/decode_sweep.py --git-commit "$sha" --out "$out/sweep_skinny.json" --profile \
  --batches 1,2,4,8,16,32,64 --engine-arg skinny_gemm=true > "$out/sweep_skinny.log" 2>&1
echo "sweep skinny rc=$?"; grep -E "^\||batch-1" "$out/sweep_skinny.log"
timeout 60 python3 benchmarks/pressure.py --git-commit "$sha" --modes swap --out "$out/pressure_swap.json" \
  > "$out/pressure.log" 2>&1; echo "pressure rc=$?"
grep -E "^pressure" "$out/pressure.log"
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; ls
