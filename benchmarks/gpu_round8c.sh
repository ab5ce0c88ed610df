#!/usr/bin/env bash
# Device call C of 2026-12-01's eighth session (issues 16 and 19): loose top-p by rejection
# (sample/reject.py, kernels/reject_top_p.py), PDL on the RMSNorm and SiLU*up kernels, the
# one-tile GEMV over K up to 16,384. The CUDA tests of what changed first, then the sampler
# table (draws checked against torch), then the 8B shape at batch 1.
# Usage (device machine, repo root): bash benchmarks/gpu_round8c.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
plugin=(-p enginespec.conformance.plugin --impl=fast)
timeout 200 python3 -m pytest -q -p no:cacheprovider "${plugin[@]}" tests/sample/test_reject_top_p.py \
  tests/sample/test_device_sampler.py tests/sample/test_sampler.py tests/kernels/test_small_kernels.py \
  tests/kernels/test_pdl.py tests/kernels/test_skinny_gemm.py tests/worker/test_skinny_linear.py > "$out/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" "$out/tests.log" | head; tail -2 "$out/tests.log"
timeout 120 python3 benchmarks/bench_sampler.py --profile --check --json "$out/sampler_$sha.json" > "$out/bench.log" 2>&1
echo "bench rc=$?"; tail -24 "$out/bench.log" | cut -c1-160
timeout 220 python3 benchmarks/decode_sweep.py --git-commit "$sha" --shape qwen3-8b --batches 1 \
  --out "$out/decode_sweep_8b_b1_$sha.json" > "$out/sweep8b.log" 2>&1
echo "8b rc=$?"; grep -E "^\| 1 |LLM.generate" "$out/sweep8b.log"
python3 - "$out/decode_sweep_8b_b1_$sha.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d.get("skinny_gemm", {}).get("choices", []):
    print(r["n"], r["k"], r["variant"], r["choice"][:60], round(r["us"], 2), round(r["baseline_us"], 2))
PY
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
