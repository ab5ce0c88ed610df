#!/usr/bin/env bash
# Device call B of 2026-12-01 (fourth session): cold startup by phase and the first call, the
# server at half rate with long_prefill_token_threshold 128 (finer mixed buckets), and the
# pressure run (a quarter of the KV pool, recompute against swap, and the whole pool).
# Usage (device machine, repo root, server wheels in .whl/): bash benchmarks/gpu_round4b.sh SHA
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
grep -E "^startup|compile at|load |engine ready" "$out/first_call.log" | head -20
timeout 200 python3 -m benchmarks.serving --request-rate 21.4 --out "$out/serving_half_t128.json" \
  --serve-arg=--long-prefill-token-threshold=128 --step-trace "$out/steps_half_t128.json" \
  > "$out/serving_half_t128.log" 2>&1; echo "serving rc=$?"
python3 - "$out/serving_half_t128.json" <<'PY'
import json, sys
h = json.load(open(sys.argv[1])); s = h["serve"]
print(f"half rate {s['request_rate']:.2f} req/s, threshold 128: TTFT p50/p99 {s['ttft']['p50_ms']:.1f}/{s['ttft']['p99_ms']:.1f} ms, "
      f"ITL p50/p99 {s['itl']['p50_ms']:.2f}/{s['itl']['p99_ms']:.2f} ms, {s['output_tok_s']:.0f} tok/s")
print(json.dumps(s.get("steps", h.get("steps")), indent=1)[:1500])
PY
timeout 170 python3 benchmarks/pressure.py --git-commit "$sha" --baseline --out "$out/pressure.json" \
  > "$out/pressure.log" 2>&1; echo "pressure rc=$?"
grep -E "^pressure" "$out/pressure.log"
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; ls
