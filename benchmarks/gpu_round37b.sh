#!/usr/bin/env bash
# The thirty-seventh session's third device call (about 4 min): what a constrained request costs
# a decode step on the 0.6B shape (benchmarks/constrained_cost.py: greedy, t 0.6, bad_words and a
# regex constraint at 1, 8 and 32 rows), then torch.profiler over the t 0.6 workload's own
# prefill steps (`host_phases --torch-profile-prefill`, the thirty-fifth session's item).
# One tar back: s37b_h200_SHA.tgz.   bash benchmarks/gpu_round37b.sh SHA   (carry .whl: xgrammar)
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
timeout 200 python3 benchmarks/constrained_cost.py --batches 1,8,32 --tokens 128 \
  --out "$out/constrained_cost_h200_$sha.json" > "$out/constrained.log" 2>&1
echo "constrained rc=$? after ${SECONDS}s"; grep -E "^\| " "$out/constrained.log"; tail -3 "$out/constrained.log"
timeout 200 python3 -m benchmarks.host_phases --temperature 0.6 \
  --torch-profile-prefill "$out/prefill_torch.txt" > "$out/hp_torch.log" 2>&1
echo "torch-profile rc=$? after ${SECONDS}s"; grep -E "^wall|prefill|profiled" "$out/hp_torch.log"
head -40 "$out/prefill_torch.txt" 2>/dev/null | cut -c1-60,100-200
cd "$out" && tar czf "s37b_h200_$sha.tgz" ./*.log ./*.txt ./*.json 2>/dev/null && rm -f ./*.log ./*.txt ./*.json; ls
