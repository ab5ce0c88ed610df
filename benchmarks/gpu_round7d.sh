#!/usr/bin/env bash
# Device call D of 2026-12-01 (seventh session). Issue 19: who makes a batch-1 step's host time
# grow with max_num_seqs (the sweep's batch-1 steps took ~0.6 ms of host time with
# max_num_seqs=8 and 1.0-1.26 ms with 256, over the same 0.73 ms graph): step_anatomy's phases
# and cProfile at both. Issue 16: the 256-request workload at temperature 0.6, first call and
# warm, with the decode kernels' PDL and the two-wave split bound.
# Usage (device machine, repo root): bash benchmarks/gpu_round7d.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
for m in 8 256; do
  timeout 100 python3 benchmarks/step_anatomy.py --git-commit "$sha" --batch 1 --engine-arg max_num_seqs=$m \
    --generate-tokens 128 --cprofile "$out/cprofile_b1_m$m.txt" --out "$out/anatomy_b1_m$m.json" > "$out/anatomy_m$m.log" 2>&1
  echo "anatomy max_num_seqs=$m rc=$?"; grep -E "^batch|^weight|generate" "$out/anatomy_m$m.log" | cut -c1-300
  head -32 "$out/cprofile_b1_m$m.txt" | tail -24 | cut -c1-150
done
c="--impl fast --git-commit $sha --repeat 3 --first-call --skip-hf --skip-big --skip-latency --skip-profile"
timeout 120 python3 benchmarks/throughput.py $c --temperature 0.6 --out "$out/t06.json" > "$out/t06.log" 2>&1
echo "t06 rc=$?"; grep -iE "floor|wall|first" "$out/t06.log" | grep -v "it/s" | tail -6
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
