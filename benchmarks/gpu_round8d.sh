#!/usr/bin/env bash
# Device call D of 2026-12-01's eighth session: the suite with --impl=fast on CUDA over what
# calls B and C did not run (the engine, async scheduling and parity with the logits head in
# the decode graphs and loose top-p by rejection), as far as the session's last device time
# goes. Usage (device machine, repo root): bash benchmarks/gpu_round8d.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
timeout 400 python3 -m pytest -v -p no:cacheprovider -p enginespec.conformance.plugin --impl=fast -rfE \
  conformance tests/engine tests/entrypoints tests/worker > "$out/suite.log" 2>&1
echo "suite rc=$? ($sha)"; grep -E "^(FAILED|ERROR)" "$out/suite.log" | head -20; tail -3 "$out/suite.log" | cut -c1-300
echo "PASSED $(grep -c " PASSED" "$out/suite.log") FAILED $(grep -c " FAILED" "$out/suite.log") SKIPPED $(grep -c " SKIPPED" "$out/suite.log")"
grep -E " (PASSED|FAILED|SKIPPED|ERROR)" "$out/suite.log" | tail -1 | cut -c1-200
cd "$out" && gzip -f suite.log && ls
