#!/usr/bin/env bash
# Device call D of 2026-12-01 (fourth session): why a cold start compiles the decoder three
# times (TORCH_LOGS=recompiles), and the half-rate serving run at threshold 128 once more.
# Usage (device machine, repo root, server wheels in .whl/): bash benchmarks/gpu_round4d.sh SHA
set -u
sha=${1:?commit}
out=${OUT:-/tmp/out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
fi
tree=$(mktemp -d); python3 tools/link_tree.py "$tree" >/dev/null || exit 1
export PYTHONPATH=$tree:$PWD:/tmp/site
TORCH_LOGS=recompiles,graph_breaks timeout 140 python3 benchmarks/first_call_compiles.py --num-requests 16 \
  --temperature 0.6 --out "$out/first_call_small.json" > "$out/recompiles.log" 2>&1; echo "recompiles rc=$?"
grep -E "__recompiles|guard|Recompiling|startup|load " "$out/recompiles.log" | cut -c1-400 | head -30
timeout 150 python3 -m benchmarks.serving --request-rate 21.4 --out "$out/serving_half_t128_q8_b.json" \
  --serve-arg=--long-prefill-token-threshold=128 --step-trace "$out/steps_half_t128_q8_b.json" \
  > "$out/serving.log" 2>&1; echo "serving rc=$?"
python3 - "$out/serving_half_t128_q8_b.json" <<'PY'
import json, sys
h = json.load(open(sys.argv[1])); s = h["serve"]
print(f"half rate {s['request_rate']:.2f} req/s, threshold 128, q8: TTFT p50/p99 {s['ttft']['p50_ms']:.1f}/{s['ttft']['p99_ms']:.1f} ms, "
      f"ITL p50/p99 {s['itl']['p50_ms']:.2f}/{s['itl']['p99_ms']:.2f} ms, {s['output_tok_s']:.0f} tok/s")
print(json.dumps(s.get("steps", h.get("steps")), indent=1)[:900])
PY
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
