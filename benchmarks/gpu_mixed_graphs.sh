#!/usr/bin/env bash
# One H200 call for the mixed-step CUDA graphs (issues 17 and 20): the graph tests on CUDA,
# n-gram speculation at batch 1, the end-to-end temperature-0.6 run, then the serving pair
# (saturation and half rate, with the engine's step trace). Logs under $OUT.
# Usage (device machine, repo root, server wheels carried in .whl/): bash benchmarks/gpu_mixed_graphs.sh SHA
set -u
sha=${1:?commit}
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
tree=$(mktemp -d); python3 tools/link_tree.py "$tree" || exit 1
( export PYTHONPATH=$tree:$PWD
  timeout 150 python3 -m pytest -p enginespec.conformance.plugin --impl=fast -q -x -p no:cacheprovider \
    tests/worker/test_cuda_graphs.py tests/worker/test_compiled.py conformance/test_spec_decode*.py \
    > "$out/tests.log" 2>&1; echo "tests rc=$? $(tail -1 "$out/tests.log")"
  timeout 120 python3 benchmarks/spec_decode.py --shape qwen3-0.6b --k 4 --num-prompts 2 --max-tokens 128 \
    --skip-throughput --out "$out/spec.json" > "$out/spec.log" 2>&1; echo "spec rc=$?"; tail -12 "$out/spec.log"
  timeout 150 python3 benchmarks/throughput.py --impl fast --git-commit "$sha" --repeat 2 --first-call --skip-hf \
    --skip-big --skip-latency --skip-profile --temperature 0.6 --out "$out/t06.json" > "$out/t06.log" 2>&1
  echo "t06 rc=$?"; grep -iE "floor|first|startup|warm" "$out/t06.log" | tail -8 )
bash benchmarks/gpu_serving.sh > "$out/serving.log" 2>&1; echo "serving rc=$?"; tail -25 "$out/serving.log"
cd "$out" && tar czf logs.tgz *.log *.json 2>/dev/null; ls
