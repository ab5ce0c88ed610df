#!/usr/bin/env bash
# Device call E of 2026-12-01 (seventh session), the last. The CUDA pool-sizing test after the
# tests that ran before it in call C (it failed there: 12.6 GB already held by earlier tests'
# models and graphs; the test now asks for 2 GiB above what is in use), then the Qwen3-8B
# shape at batch 1 (issue 19: at most 1.25x its weight floor) with the decode kernels' PDL and
# the two-wave split bound.
# Usage (device machine, repo root): bash benchmarks/gpu_round7e.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
timeout 110 python3 -m pytest -q -p no:cacheprovider -p enginespec.conformance.plugin --impl=fast \
  tests/worker/test_cuda_graphs.py tests/worker/test_compiled.py \
  conformance/test_engine.py::test_cuda_pool_is_sized_by_a_profile_run > "$out/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" "$out/tests.log" | head; tail -1 "$out/tests.log"
timeout 130 python3 benchmarks/step_anatomy.py --git-commit "$sha" --shape qwen3-8b --batch 1 \
  --engine-arg max_num_seqs=256 --generate-tokens 64 --out "$out/anatomy_8b.json" > "$out/anatomy_8b.log" 2>&1
echo "anatomy 8b rc=$?"; grep -E "^batch|^startup|^weight|generate" "$out/anatomy_8b.log" | cut -c1-300
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
