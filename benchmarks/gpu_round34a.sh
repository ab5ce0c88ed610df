#!/usr/bin/env bash
# The workload's prefill steps on the host (issue 19; benchmarks/RESULTS.md, thirty-second
# session's item 3): a 16,384-token step's `execute` takes about 35 ms of host in the workload and
# 18.5-23.5 ms synced. Four processes of `host_phases.py --temperature 0.6`, one machine:
#   1. as shipped, with the caching allocator's counters and the GC's pauses;
#   2. the same under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (a retry's cudaFree);
#   3. --prefill-sync: the device idle at each prefill execute's start (execute falls to the
#      synced figure if launching behind a busy device is the cost);
#   4. --profile-prefill: a cProfile of the prefill executes (which calls hold the time).
# One tar back: s34a_h200_SHA.tgz.   bash benchmarks/gpu_round34a.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
hp() {  # hp NAME [host_phases args...]
  local name=$1; shift
  timeout 170 python3 -m benchmarks.host_phases --temperature 0.6 "$@" > "$out/hp_$name.log" 2>&1
  echo "== $name rc=$? after ${SECONDS}s"; grep -E "^wall|prefill|<=8 |CUDA allocator|cyclic GC|profiled" "$out/hp_$name.log"
}
hp default --alloc-stats --gc
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True hp expandable --alloc-stats
hp presync --prefill-sync
hp profiled --profile-prefill "$out/prefill_profile.txt"
head -45 "$out/prefill_profile.txt" 2>/dev/null | cut -c1-150
cd "$out" && tar czf "s34a_h200_$sha.tgz" ./*.log ./*.txt 2>/dev/null && rm -f ./*.log ./*.txt; ls
