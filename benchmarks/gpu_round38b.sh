#!/usr/bin/env bash
# The thirty-eighth session's second device call (about 4 min): where batch-1 LLM.generate's
# ms/token goes outside its decode steps (call 1: 0.747 ms/token against decode steps of 0.636
# in the same generate, traced), by generate_b1_probe.py's split of each call (before the first
# step ends, the decode steps, after the last), then the t 0.6 workload (3 warm runs).
# One tar back: s38b_h200_SHA.tgz.   bash benchmarks/gpu_round38b.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
timeout 150 python3 benchmarks/generate_b1_probe.py --tokens 128 --reps 5 \
  --out "$out/generate_b1_probe_$sha.json" > "$out/probe.log" 2>&1
echo "probe rc=$? after ${SECONDS}s"; tail -6 "$out/probe.log"
t06_workload t06_$sha 200 "$sha"
cd "$out" && tar czf "s38b_h200_$sha.tgz" ./*.log ./*.json 2>/dev/null && rm -f ./*.log ./*.json; ls
