#!/usr/bin/env bash
# One H200 call for issue 17's serving figures: the server (engine core in its own process) at
# saturation against LLM.generate on the same workload and run, then the server at half the
# saturating request rate measured in the first run (Poisson arrivals).
# Usage (device machine, repo root, the server's wheels carried in .whl/):
#   bash benchmarks/gpu_serving.sh [extra benchmarks.serving flags]
# Device time: about 2 min for the first run (checkpoint synthesis, two warm-ups, the offline
# run), under 1 min for the second.
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
tree=$(mktemp -d)
python3 tools/link_tree.py "$tree" || { echo "tools/link_tree.py failed"; exit 1; }
export PYTHONPATH=$tree:$PWD${PYTHONPATH:+:$PYTHONPATH}  # the spawned engine process inherits it
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$out/gpu.txt"
timeout 400 python3 -m benchmarks.serving --request-rate inf --offline --out "$out/serving_inf.json" "$@" \
  > "$out/serving_inf.log" 2>&1 || { tail -40 "$out/serving_inf.log"; exit 1; }
rate=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['serve']['request_throughput'] / 2)" \
  "$out/serving_inf.json")
echo "half the saturating rate: $rate req/s"
timeout 150 python3 -m benchmarks.serving --request-rate "$rate" --out "$out/serving_half.json" \
  --step-trace "$out/steps_half.json" "$@" \
  > "$out/serving_half.log" 2>&1 || { tail -40 "$out/serving_half.log"; exit 1; }
python3 - "$out/serving_inf.json" "$out/serving_half.json" <<'PY'
import json, sys
inf, half = (json.load(open(p)) for p in sys.argv[1:])
s, h = inf["serve"], half["serve"]
print(f"offline {inf['offline']['output_tok_s']:.0f} tok/s; server {s['output_tok_s']:.0f} tok/s; "
      f"ratio {inf['serve_over_offline']:.3f} (target >= 0.9)")
print(f"saturation: TTFT p50/p99 {s['ttft']['p50_ms']:.1f}/{s['ttft']['p99_ms']:.1f} ms, "
      f"ITL p50/p99 {s['itl']['p50_ms']:.2f}/{s['itl']['p99_ms']:.2f} ms")
print(f"half rate {h['request_rate']:.3f} req/s: TTFT p50/p99 {h['ttft']['p50_ms']:.1f}/{h['ttft']['p99_ms']:.1f} ms, "
      f"ITL p50/p99 {h['itl']['p50_ms']:.2f}/{h['itl']['p99_ms']:.2f} ms "
      f"(p99/p50 {h['itl']['p99_ms'] / h['itl']['p50_ms']:.2f}; target p99 <= 2x the median decode step)")
steps = h.get("steps")
if steps:
    print(f"half rate, engine step gaps p50/p99 {steps['gap']['p50_ms']:.2f}/{steps['gap']['p99_ms']:.2f} ms; by prefill tokens:")
    for k, b in steps["by_prefill_tokens"].items():
        print(f"  {k}: {b['num_steps']} steps, p50/p99 {b['p50_ms']:.2f}/{b['p99_ms']:.2f} ms")
print("exact lengths:", s["exact_output_lengths"], h["exact_output_lengths"], "failed:", s["failed"], h["failed"],
      "server exit:", s["server_exit_status"], h["server_exit_status"])
PY
