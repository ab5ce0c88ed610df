#!/usr/bin/env bash
# One H200 call (under the device's 10-minute limit) for the engine figures of issue 6: the
# throughput harness (greedy, three timed runs with the median reported, serial vs async
# scheduling, transformers on 64 of the prompts, batch-1 latency, decode profile), the same
# workload sampled at temperature 0.8, then the whole suite with --impl=fast.
# Usage (device machine, repo root): bash benchmarks/gpu_engine.sh <git-sha> [extra throughput.py flags]
# Device time: about 4 min for the greedy harness on a fresh machine (compilation and
# transformers' run are most of it), 1.5 min for the sampled run, 1.5 min for the chat-settings
# run (first call on a fresh LLM beside the warm median), 2.5 min for the suite: near the limit;
# benchmarks/gpu_sampling.sh has the sampling figures (issue 16) on their own. The
# Qwen3-8B-shaped run (the harness without --skip-big: 8B checkpoint synthesis, about 3 min
# more) needs a call of its own.
set -u
sha=${1:-unknown}; shift || true
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1  # the repository root: `benchmarks.*` for the scripts
# enginespec installs under one import name through package-dir, so a bare checkout on
# PYTHONPATH is not enough. The device has no network to build a wheel: when enginespec is not
# installed, import it from tools/link_tree.py's symlink tree and load the pytest plugin by name
# (a tree registers no entry points).
plugin=""
if ! python3 -c "import enginespec" 2>/dev/null; then
  tree=$(mktemp -d)
  python3 tools/link_tree.py "$tree" || { echo "tools/link_tree.py failed"; exit 1; }
  export PYTHONPATH=$tree:$PWD
  plugin="-p enginespec.conformance.plugin"
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$out/gpu.txt"
timeout 300 python3 benchmarks/throughput.py --impl fast --git-commit "$sha" --repeat 3 \
  --compare-scheduling --hf-num-requests 64 --skip-big --out "$out/throughput.json" "$@" \
  > "$out/bench.log" 2>&1
grep "^\[bench\]\|^  \|^enginespec" "$out/bench.log" | tail -20
timeout 130 python3 benchmarks/throughput.py --impl fast --git-commit "$sha" --temperature 0.8 \
  --skip-hf --skip-big --skip-latency --out "$out/throughput_t08.json" > "$out/bench_t08.log" 2>&1
grep "^  engine\|^  floor\|^  gpu busy\|host waited" "$out/bench_t08.log"
# Qwen3's chat settings; the first generate() on a fresh LLM beside the warm median
timeout 110 python3 benchmarks/throughput.py --impl fast --git-commit "$sha" --chat --first-call --repeat 3 \
  --skip-hf --skip-big --skip-latency --skip-profile --out "$out/throughput_chat.json" > "$out/bench_chat.log" 2>&1
grep "^  engine\|^  floor\|^  startup\|^  first call" "$out/bench_chat.log"
timeout 150 python3 -m pytest $plugin --impl=fast -q conformance tests/kernels 2>&1 \
  | tee "$out/pytest_fast.log" | tail -3
