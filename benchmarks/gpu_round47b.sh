#!/usr/bin/env bash
# The forty-seventh session's second call (about 4 min): is batch-1 `LLM.generate` slower after
# the engine has served a 256-row batch? Call 1's sweep gave its decode steps a median of 1.018
# ms against 0.724 for the sweep's own batch-1 steps (host-bound both, the host waiting 5-7 us).
# Three processes, one engine each: (1) generate_b1_probe on a fresh engine (and a cProfile of
# one call), (2) the sweep at 1 row then generate, (3) the sweep at 1 and 256 rows then generate.
# One tar back: s47b_KIND_SHA.tgz.
#   bash benchmarks/gpu_round47b.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind)
echo "device ${kind:-unknown}"; uptime
timeout 150 python3 benchmarks/generate_b1_probe.py --tokens 128 --reps 4 --cprofile "$out/cprof_fresh_$sha.txt" \
  --out "$out/b1probe_$sha.json" > "$out/b1probe.log" 2>&1
echo "probe rc=$? after ${SECONDS}s"; grep -E "wall_ms|steps_after|collections" "$out/b1probe.log"
for batches in 1 1,256; do
  tag=${batches/,/_}
  timeout 150 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches "$batches" \
    --out "$out/sweep_${tag}_$sha.json" > "$out/sweep_$tag.log" 2>&1
  echo "sweep $batches rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate|decode steps, ms" "$out/sweep_$tag.log"
done
cd "$out" && tar czf "${TAG:-s47b}_${kind:-gpu}_$sha.tgz" ./*.log ./*.json ./*.txt 2>/dev/null && rm -f ./*.log ./*.json ./*.txt ./*.png; ls
