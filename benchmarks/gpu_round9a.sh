#!/usr/bin/env bash
# Device call of 2026-12-01's ninth session (issue 16): the sampler's faster fused draw (the pick
# from the candidates, one wave of 256 rows), rejection top-p's one-load chunk sums, the
# penalty pass that copies, logprobs in 8,192-token chunks. The suite with the fast impl over
# what they touch first, then the sampler table (draws checked against torch).
# Usage (device machine, repo root): bash benchmarks/gpu_round9a.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
plugin=(-p enginespec.conformance.plugin --impl=fast)
timeout 420 python3 -m pytest -q -p no:cacheprovider "${plugin[@]}" conformance tests/engine tests/entrypoints \
  tests/sample tests/kernels/test_sampling.py > "$out/pytest_fast_h200_$sha.log" 2>&1
echo "suite rc=$?"; grep -E "^(FAILED|ERROR)" "$out/pytest_fast_h200_$sha.log" | head; tail -1 "$out/pytest_fast_h200_$sha.log"
timeout 120 python3 benchmarks/bench_sampler.py --profile --check --json "$out/sampler_h200_$sha.json" > "$out/bench.log" 2>&1
echo "bench rc=$?"; grep -v "^ *$\|Warn\|warn_once" "$out/bench.log" | grep -v "^sampler_" | cut -c1-400
gzip -f "$out/pytest_fast_h200_$sha.log"; cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
