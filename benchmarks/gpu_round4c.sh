#!/usr/bin/env bash
# Device call C of 2026-12-01 (fourth session): the server at half rate with threshold 128 and
# mixed graphs reading 8-token query blocks up to 512 tokens; temperature 0.6 end to end; a cold
# start with the Triton JIT hook on from construction; the Qwen3-8B shape at chat settings.
# Usage (device machine, repo root, server wheels in .whl/): bash benchmarks/gpu_round4c.sh SHA
set -u
sha=${1:?commit}
out=${OUT:-/tmp/out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
fi
tree=$(mktemp -d); python3 tools/link_tree.py "$tree" >/dev/null || exit 1
export PYTHONPATH=$tree:$PWD:/tmp/site
TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) timeout 150 python3 benchmarks/first_call_compiles.py \
  --temperature 0.6 --hook-startup --out "$out/first_call.json" > "$out/first_call.log" 2>&1; echo "first_call rc=$?"
grep -E "^startup|load |first call" "$out/first_call.log" | head -5
grep -c "startup compile" "$out/first_call.log"
timeout 150 python3 -m benchmarks.serving --request-rate 21.4 --out "$out/serving_half_t128_q8.json" \
  --serve-arg=--long-prefill-token-threshold=128 --step-trace "$out/steps_half_t128_q8.json" \
  > "$out/serving.log" 2>&1; echo "serving rc=$?"
python3 - "$out/serving_half_t128_q8.json" <<'PY'
import json, sys
h = json.load(open(sys.argv[1])); s = h["serve"]
print(f"half rate {s['request_rate']:.2f} req/s, threshold 128, q8: TTFT p50/p99 {s['ttft']['p50_ms']:.1f}/{s['ttft']['p99_ms']:.1f} ms, "
      f"ITL p50/p99 {s['itl']['p50_ms']:.2f}/{s['itl']['p99_ms']:.2f} ms, {s['output_tok_s']:.0f} tok/s")
print(json.dumps(s.get("steps", h.get("steps")), indent=1)[:900])
PY
c="--impl fast --git-commit $sha --repeat 3 --first-call --skip-hf --skip-big --skip-latency --skip-profile"
timeout 100 python3 benchmarks/throughput.py $c --temperature 0.6 --out "$out/t06.json" > "$out/t06.log" 2>&1; echo "t06 rc=$?"
grep -iE "floor|wall|first" "$out/t06.log" | grep -v "it/s" | tail -6
timeout 230 python3 benchmarks/throughput.py $c --shape qwen3-8b --chat --out "$out/chat_8b.json" > "$out/chat_8b.log" 2>&1; echo "8b rc=$?"
grep -iE "floor|wall|first|startup" "$out/chat_8b.log" | grep -v "it/s" | tail -8
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
