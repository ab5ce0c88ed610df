#!/usr/bin/env bash
# One H200 call (about 6-7 min) for the figures of issue 16, 0.6B Qwen3 shape:
#   1. the sampler alone at 256 x 151936: argmax vs the device path at temperature 0.6, chat
#      settings (top-k 20 / top-p 0.8, the top-k/top-p-only case) and mixed settings
#      (benchmarks/bench_sampler.py);
#   2. LLM(...) startup in fresh processes, cold caches then warm caches (benchmarks/startup.py);
#   3. temperature 0.6 and chat settings (temperature 0.7, top_p 0.8, top_k 20): the first
#      generate() on a fresh LLM beside the median of two warm runs (benchmarks/throughput.py
#      --first-call --repeat 3);
#   4. the pressure run: the KV pool capped at a quarter of what the workload needs, preemption
#      by recompute vs by swap (benchmarks/pressure.py).
# A short table at the end; JSON and logs under $OUT.
# Usage (device machine, repo root): bash benchmarks/gpu_sampling.sh <git-sha>
set -u
sha=${1:-unknown}
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if ! python3 -c "import enginespec" 2>/dev/null; then  # as in gpu_engine.sh: a symlink tree
  tree=$(mktemp -d)
  python3 tools/link_tree.py "$tree" || { echo "tools/link_tree.py failed"; exit 1; }
  export PYTHONPATH=$tree:$PWD
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader | tee "$out/gpu.txt"
timeout 100 python3 benchmarks/bench_sampler.py --json "$out/sampler.json" > "$out/sampler.log" 2>&1
cat "$out/sampler.log" | tail -12
# cold and warm-cache starts in fresh cache folders; later runs reuse those caches
cache=$(mktemp -d)
timeout 240 python3 benchmarks/startup.py --git-commit "$sha" --cache-root "$cache" \
  --out "$out/startup.json" > "$out/startup.log" 2>&1
grep "^startup" "$out/startup.log"
export TORCHINDUCTOR_CACHE_DIR=$cache/inductor TRITON_CACHE_DIR=$cache/triton
common="--impl fast --git-commit $sha --repeat 3 --first-call --skip-hf --skip-big --skip-latency --skip-profile"
timeout 110 python3 benchmarks/throughput.py $common --temperature 0.6 --out "$out/t06.json" > "$out/t06.log" 2>&1
grep "^  engine\|^  floor\|^  wall/floor\|^  startup\|^  first call" "$out/t06.log"
timeout 110 python3 benchmarks/throughput.py $common --chat --out "$out/chat.json" > "$out/chat.log" 2>&1
grep "^  engine\|^  floor\|^  wall/floor\|^  startup\|^  first call" "$out/chat.log"
timeout 170 python3 benchmarks/pressure.py --git-commit "$sha" --temperature 0.6 --out "$out/pressure.json" \
  > "$out/pressure.log" 2>&1
grep "^pressure" "$out/pressure.log"
python3 benchmarks/sampling_table.py "$out" | tee "$out/table.txt"
