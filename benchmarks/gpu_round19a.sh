#!/usr/bin/env bash
# Device call 1 of the nineteenth session: the fused norms of fa7db2b and the one-launch gathers
# of 5505a56, each against the tree without it, on one machine start. First the CUDA tests of
# the skinny GEMM, the gathers, the graphs and greedy parity on this tree; then gpu_round11a.sh's
# interleaved sweeps (ROUNDS, default 2; BATCHES, default 1,4,8,16) of this tree and the variants
# in .dev_carry/variants (made here with make_variant.sh: `base` = 8d91fbe's skinny_gemm.py,
# `nogather` = b854ce9's skinny_ops.py), each tree tuning its own picks; then every sweep's
# fused-norm picks (benchmarks.sweep_profile --choices). Everything in one tar.
# Usage (device machine, repo root; carry [".dev_carry"]): bash benchmarks/gpu_round19a.sh SHA
set -u
sha=${1:?commit}
export TESTS=${TESTS:-1} ROUNDS=${ROUNDS:-2} BATCHES=${BATCHES:-1,4,8,16} SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-110}
export TEST_TIMEOUT=${TEST_TIMEOUT:-200} TEST_FILES=${TEST_FILES:-"tests/kernels/test_gather_rows.py \
  tests/kernels/test_skinny_gemm.py tests/worker/test_skinny_linear.py tests/worker/test_cuda_graphs.py \
  conformance/test_parity.py::test_greedy_parity_on_cuda"}
bash benchmarks/gpu_round11a.sh "$sha"
source benchmarks/gpu_common.sh
gpu_setup || exit 1
for f in "$out"/sweep_*_r1_*.json; do python3 -m benchmarks.sweep_profile --choices "$f"; done
cd "$out" && tar czf s19a_h200_"$sha".tgz ./*.json ./*.tgz 2>/dev/null && rm -f ./sweep_*.json ./logs.tgz; ls
