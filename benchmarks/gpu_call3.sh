#!/usr/bin/env bash
# Device call 3 of 2026-12-01: first-call compiles on cold caches (after the aligned scratch),
# the 1-4 row decode sweep with the skinny GEMM's new GEMV-like candidates, and the server at
# half rate with long_prefill_token_threshold 256. Usage: bash benchmarks/gpu_call3.sh SHA
set -u
sha=${1:?commit}
out=${OUT:-/tmp/out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
fi
tree=$(mktemp -d); python3 tools/link_tree.py "$tree" >/dev/null || exit 1
export PYTHONPATH=$tree:$PWD:/tmp/site
TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 200 python3 benchmarks/first_call_compiles.py \
  --temperature 0.6 --out "$out/first_call.json" > "$out/first_call.log" 2>&1; echo "first_call rc=$?"
grep -E "^startup|compile at" "$out/first_call.log" | head -20
timeout 200 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1,2,4 --profile \
  --engine-arg skinny_gemm=true --out "$out/sweep_skinny.json" > "$out/sweep.log" 2>&1; echo "sweep rc=$?"
grep -v "it/s" "$out/sweep.log" | tail -30
timeout 200 python3 -m benchmarks.serving --request-rate 21.4 --out "$out/serving_half_t256.json" \
  --serve-arg=--long-prefill-token-threshold=256 --step-trace "$out/steps_half_t256.json" \
  > "$out/serving_half_t256.log" 2>&1; echo "serving rc=$?"
python3 - "$out/serving_half_t256.json" <<'PY'
import json, sys
h = json.load(open(sys.argv[1])); s = h["serve"]
print(f"half rate {s['request_rate']:.2f} req/s, threshold 256: TTFT p50/p99 {s['ttft']['p50_ms']:.1f}/{s['ttft']['p99_ms']:.1f} ms, "
      f"ITL p50/p99 {s['itl']['p50_ms']:.2f}/{s['itl']['p99_ms']:.2f} ms, {s['output_tok_s']:.0f} tok/s")
print(json.dumps(s.get("steps", h.get("steps")), indent=1)[:1500])
PY
cd "$out" && tar czf logs.tgz *.log *.json 2>/dev/null; ls
