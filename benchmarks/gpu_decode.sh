#!/usr/bin/env bash
# Two H200 calls (each under the device's 10-minute limit) for issue 19's decode figures.
# Usage (device machine, repo root): bash benchmarks/gpu_decode.sh <git-sha> a|b
#   a: the skinny GEMM's before/after table per projection (benchmarks/skinny_gemm_table.py:
#      cuBLAS vs the kernel's measured best at rows 1/4/16/64, ~1-2.5 min with Triton compiles),
#      the baseline decode sweep with the batch-1 kernel profile (decode_sweep.py, ~2-3 min on a
#      fresh machine: checkpoint synthesis and torch.compile are most of it), then the GPU tests
#      of the new kernels and the dispatch (~1 min).
#   b: the same sweep with EngineArgs.skinny_gemm on (startup adds the measured tuning, ~1 min
#      cold), then the Qwen3-8B-shaped sweep at four batch sizes (checkpoint synthesis ~3 min).
# Outputs under $OUT: skinny_table.json, sweep.json, sweep_skinny.json, sweep_8b.json and logs.
# The PNG for RESULTS.md is drawn on the CPU box from the JSON(s):
#   python benchmarks/decode_sweep.py --plot-from sweep.json --compare sweep_skinny.json --png decode_sweep.png
set -u
sha=${1:-unknown}
part=${2:-a}
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
plugin=""
if ! python3 -c "import enginespec" 2>/dev/null; then  # as gpu_engine.sh: the symlink tree
  tree=$(mktemp -d)
  python3 tools/link_tree.py "$tree" || { echo "tools/link_tree.py failed"; exit 1; }
  export PYTHONPATH=$tree:$PWD
  plugin="-p enginespec.conformance.plugin"
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$out/gpu.txt"
sweep() {  # name timeout flags...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 benchmarks/decode_sweep.py --git-commit "$sha" --out "$out/$name.json" "$@" \
    > "$out/$name.log" 2>&1
  echo "== $name (exit $?)"; grep -v "^{" "$out/$name.log" | grep "^|\|^batch\|^PNG\|^matplotlib\|Error" | head -60
}
if [ "$part" = a ]; then
  timeout 170 python3 benchmarks/skinny_gemm_table.py --out "$out/skinny_table.json" > "$out/skinny_table.log" 2>&1
  echo "== skinny_table (exit $?)"; tail -30 "$out/skinny_table.log"
  sweep sweep 230 --profile
  timeout 120 python3 -m pytest $plugin --impl=fast -q tests/kernels/test_skinny_gemm.py \
    tests/worker/test_skinny_linear.py 2>&1 | tee "$out/pytest_skinny.log" | tail -5
else
  sweep sweep_skinny 250 --profile --engine-arg skinny_gemm=true
  sweep sweep_8b 320 --shape qwen3-8b --batches 1,4,16,64 --latency-tokens 64
fi
