#!/usr/bin/env bash
# Device call E of 2026-12-01 (sixth session), the last: what the sampler's candidates see on
# the min-p + top-p rows that got slow at 759cd92 (sampler_probe.py --quick), then the whole
# suite with --impl=fast on the H200 (the sampler's new candidates, the fused path uncompiled
# and the GEMV's PDL on, both by default), verbose so a cut run still shows what passed.
# Usage (device machine, repo root): bash benchmarks/gpu_round6e.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
timeout 45 python3 benchmarks/sampler_probe.py "$out/probe_$sha.json" --quick > "$out/probe.log" 2>&1
echo "probe rc=$?"; grep -E '"(draw|scan|cand|argmax)' "$out/probe.log"
timeout 370 python3 -m pytest -p enginespec.conformance.plugin --impl=fast -v -rfEs -p no:cacheprovider \
  --durations=15 conformance tests > "$out/pytest_fast_$sha.log" 2>&1
echo "pytest exit: $?"
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest_fast_$sha.log" | grep -v " PASSED" | tail -25
grep -c " PASSED" "$out/pytest_fast_$sha.log"; grep -E " (FAILED|ERROR)" "$out/pytest_fast_$sha.log" | head -20
cd "$out" && gzip -9 "pytest_fast_$sha.log"; rm -f probe.log; ls
