#!/usr/bin/env bash
# The thirty-eighth session's third device call (about 2 min): generate_b1_probe.py with the
# Python cyclic collections logged per call: was call 2's one slow 129-token generate (166 ms
# against 96) a gen-2 collection? One tar back: s38c_SHA.tgz.   bash benchmarks/gpu_round38c.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
timeout 150 python3 benchmarks/generate_b1_probe.py --tokens 128 --reps 6 \
  --out "$out/generate_b1_probe_gc_$sha.json" > "$out/probe.log" 2>&1
echo "probe rc=$? after ${SECONDS}s"; tail -8 "$out/probe.log" | cut -c1-600
nvidia-smi --query-gpu=name --format=csv,noheader
cd "$out" && tar czf "s38c_$sha.tgz" ./*.log ./*.json 2>/dev/null && rm -f ./*.log ./*.json; ls
