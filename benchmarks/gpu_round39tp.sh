#!/usr/bin/env bash
# Tensor parallelism on two GPUs of one host (issue 18's figures, never taken: no two-GPU kind was
# lent until now), in one device call of at most ~9 min: the CUDA tests of
# tests/worker/test_tensor_parallel.py (TP=2 graphs against eager and TP=1, the all-reduce op
# captured), then benchmarks/tp.py's phases on the Qwen3-8B shape (all-reduce us eager and in a
# graph, batch-1 ms/token TP=1 against TP=2, the 256-request workload's throughput, rank 0's
# control cost). One tar back: tp_SHA.tgz.
#   bash benchmarks/gpu_round39tp.sh SHA        # on nvidia-h100-x2 or nvidia-h200-x2
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nvidia-smi topo -m 2>/dev/null | head -4
timeout 150 python3 -m pytest -p enginespec.conformance.plugin -p no:cacheprovider --impl=fast -q -rfEs \
  tests/worker/test_tensor_parallel.py -k "cuda" > "$out/pytest_tp_$sha.log" 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR|SKIP" "$out/pytest_tp_$sha.log" | tail -8
timeout "${TP_TIMEOUT:-400}" python3 benchmarks/tp.py --phases "${PHASES:-allreduce,latency,control,throughput}" \
  --out "$out/tp_h2_$sha.json" > "$out/tp.log" 2>&1
echo "tp rc=$? after ${SECONDS}s"; grep -vE "^\s*$" "$out/tp.log" | grep -vE "Warning|warn" | tail -60
cd "$out" && tar czf "tp_$sha.tgz" ./*.log ./*.json 2>/dev/null && rm -f ./*.log ./*.json; ls
