#!/usr/bin/env bash
# Device call B of 2026-12-01 (seventh session), issue 19: the decode split count bounded by
# two waves (the probe's best picks, kernels/paged_attention.py), and the L2 weight prefetch
# (worker/weight_prefetch.py) A/B: ENGINESPEC_L2_PREFETCH=1 and =next at batch 1-8 (the fused
# rows, where it applies), =0 over the whole sweep. First the CUDA tests of the changed parts.
# Ran at aae49b0; the prefetch was removed after it (slower: RESULTS.md, seventh session).
# Usage (device machine, repo root): bash benchmarks/gpu_round7b.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
plugin=(-p enginespec.conformance.plugin --impl=fast)
timeout 100 python3 -m pytest -q -p no:cacheprovider "${plugin[@]}" tests/kernels/test_paged_attention.py \
  tests/kernels/test_pdl.py tests/worker/test_weight_prefetch.py > "$out/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)|Error" "$out/tests.log" | head; tail -2 "$out/tests.log"
for mode in 1 next; do
  ENGINESPEC_L2_PREFETCH=$mode timeout 110 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1,2,4,8 \
    --out "$out/sweep_pf$mode.json" > "$out/sweep_pf$mode.log" 2>&1; echo "sweep prefetch=$mode rc=$?"
  grep -E "^\| [0-9]|batch-1" "$out/sweep_pf$mode.log" | head -6
done
ENGINESPEC_L2_PREFETCH=0 timeout 170 python3 benchmarks/decode_sweep.py --git-commit "$sha" --out "$out/sweep.json" \
  > "$out/sweep.log" 2>&1; echo "sweep prefetch=0 rc=$?"; grep -E "^\||batch-1" "$out/sweep.log" | head -14
python3 - "$out" <<'PY'
import json, sys, os
for name in ("sweep_pf1.json", "sweep_pfnext.json", "sweep.json"):
    path = os.path.join(sys.argv[1], name)
    if os.path.exists(path):
        d = json.load(open(path)); g = d.get("generate_batch1") or {}
        rows = {r["batch"]: r for r in d.get("rows", [])}
        print(name, "generate b1 ms/token", round(g.get("ms_per_token", 0), 4),
              "graph ms", {b: round(r.get("graph_ms") or r.get("decode_graph_ms") or 0, 3) for b, r in rows.items() if b <= 8})
PY
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log *.png; ls
