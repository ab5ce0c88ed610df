#!/usr/bin/env bash
# The fifty-third session's second call, by the card that comes: an H200 takes issue 19's H200
# figures (gpu_round53a.sh's H200 branch: the sweep 1-256 with its PNG, the 8B shape, the
# workload); an H100 takes where 1, 4, 8 and 16-row decode steps go by kernel with the row scale
# on (the default since 2ac2605; the forty-fourth session's table was taken before it), through
# decode_sweep.py --profile and sweep_profile's top kernels. One tar back: s53b_KIND_SHA.tgz.
#   bash benchmarks/gpu_round53b.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind); echo "device ${kind:-unknown}"
[ "$kind" = h200 ] && exec bash benchmarks/gpu_round53a.sh "$sha"
for b in ${BATCHES:-8 4 16 1}; do
  timeout 120 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches "$b" --latency-tokens 0 \
    --profile --profile-batch "$b" --out "$out/prof_${b}.json" > "$out/prof_${b}.log" 2>&1
  echo "== $b rows rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]" "$out/prof_${b}.log"
  python3 -m benchmarks.sweep_profile "$out/prof_${b}.json" 2>&1 | head -40
done
cd "$out" && tar czf "s53b_${kind:-gpu}_$sha.tgz" ./*.log ./*.json 2>/dev/null && rm -f ./*.log ./*.json; ls
