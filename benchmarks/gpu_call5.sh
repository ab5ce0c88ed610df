#!/usr/bin/env bash
# Device call 5 of 2026-12-01: the sampler's CUDA tests (device path and the spread cut against
# torch) and graph replay vs eager, speculation on greedy with disable_by_batch_size 64 against
# off on the nano-vllm workload, then the sampler bench. Usage: bash benchmarks/gpu_call5.sh
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
tree=$(mktemp -d); python3 tools/link_tree.py "$tree" >/dev/null || exit 1
export PYTHONPATH=$tree:$PWD
timeout 80 python3 -m pytest -p enginespec.conformance.plugin --impl=fast -q -p no:cacheprovider \
  tests/sample/test_device_sampler.py tests/worker/test_cuda_graphs.py -k "cuda or replay" > "$out/tests.log" 2>&1
echo "tests rc=$? $(tail -1 "$out/tests.log")"
timeout 160 python3 benchmarks/spec_decode.py --skip-batch1 --skip-rejected --temperatures 0 \
  --disable-by-batch-size 64 --out "$out/spec_t0.json" > "$out/spec_t0.log" 2>&1; echo "spec rc=$?"
grep -E "throughput vs off" "$out/spec_t0.log"
timeout 50 python3 benchmarks/bench_sampler.py --profile --check --json "$out/sampler.json" > "$out/sampler.log" 2>&1
echo "sampler rc=$?"; grep -v "^\s*$" "$out/sampler.log" | tail -25 | cut -c1-200
cd "$out" && tar czf logs.tgz *.log *.json 2>/dev/null; ls
