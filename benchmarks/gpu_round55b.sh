#!/usr/bin/env bash
# The fifty-fifth session's second call, by the card that comes:
# - an H200: issue 19's H200 figures (gpu_round53a.sh: the sweep 1-256 with its PNG, batch-1
#   LLM.generate, the 8B shape's batch 1, the t 0.6 workload);
# - an H100: who uses the CPU while batch-1 LLM.generate is host-bound (generate_b1_probe.py's
#   per-thread CPU, RUNS fresh processes, default 2: the first tunes afresh, the rest load its table),
#   then (SUITE=0: not) gpu_round53a.sh's H100 half of the suite (SUITE_PATHS, SUITE_TIMEOUT).
#   bash benchmarks/gpu_round55b.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind); echo "device ${kind:-unknown}"
[ "$kind" = h200 ] && exec bash benchmarks/gpu_round53a.sh "$sha"
for run in $(seq "${RUNS:-2}"); do
  timeout 150 python3 benchmarks/generate_b1_probe.py --tokens "${TOKENS:-512}" --reps 4 \
    --out "$out/b1_probe_${kind}_r${run}_$sha.json" > "$out/b1_probe_r$run.log" 2>&1
  echo "probe $run rc=$? after ${SECONDS}s"; grep -E "^(wall_ms|steps_after|many)" "$out/b1_probe_r$run.log"
done
(cd "$out" && tar czf "s55b_${kind}_$sha.tgz" ./*.log ./*.json 2>/dev/null && rm -f ./*.log ./*.json)
[ "${SUITE:-1}" = 0 ] || exec bash benchmarks/gpu_round53a.sh "$sha"
ls "$out"
