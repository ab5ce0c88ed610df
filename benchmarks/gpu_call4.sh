#!/usr/bin/env bash
# Device call 4 of 2026-12-01 (issue 20): speculation on vs off on the nano-vllm workload
# (greedy and temperature 0.6; n-gram k=4 with adaptive drafting, and always-rejected drafts),
# then the draft-model run (Qwen3-8B-shaped target, 0.6B-shaped draft) at batch 1 and 32.
# Usage: bash benchmarks/gpu_call4.sh
set -u
out=${OUT:-/tmp/out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
tree=$(mktemp -d); python3 tools/link_tree.py "$tree" >/dev/null || exit 1
export PYTHONPATH=$tree:$PWD
timeout 280 python3 benchmarks/spec_decode.py --skip-batch1 --out "$out/spec_throughput.json" \
  > "$out/spec_throughput.log" 2>&1; echo "spec throughput rc=$?"
grep -E "throughput vs off|^t0" "$out/spec_throughput.log" | cut -c1-400
timeout 250 python3 benchmarks/spec_decode_draft.py --shape qwen3-8b --draft-shape qwen3-0.6b --k 4 \
  --batch-sizes 1 32 --max-tokens 64 --out "$out/spec_draft_8b.json" > "$out/spec_draft.log" 2>&1
echo "draft rc=$?"; grep -v "it/s" "$out/spec_draft.log" | tail -15 | cut -c1-400
cd "$out" && tar czf logs.tgz *.log *.json 2>/dev/null; ls
