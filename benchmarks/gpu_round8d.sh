#!/usr/bin/env bash
# Device call D of 2026-12-01's eighth session: the suite with --impl=fast on CUDA over what
# calls B and C did not run (the engine, async scheduling and parity with the logits head in
# the decode graphs and loose top-p by rejection), as far as the session's last device time
# goes. Usage (device machine, repo root): bash benchmarks/gpu_round8d.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
timeout 400 python3 -m pytest -q -p no:cacheprovider -p enginespec.conformance.plugin --impl=fast -rfE \
  conformance/test_parity.py conformance/test_async_scheduling.py conformance/test_batch_parity.py \
  conformance/test_engine.py tests/engine tests/entrypoints tests/worker conformance > "$out/suite.log" 2>&1
echo "suite rc=$? ($sha)"; grep -E "^(FAILED|ERROR)" "$out/suite.log" | head -20; tail -3 "$out/suite.log" | cut -c1-300
grep -cE "PASSED|passed" "$out/suite.log" >/dev/null; grep -oE "^[^ ]+::[^ ]+ (PASSED|FAILED)" "$out/suite.log" | tail -2
cd "$out" && gzip -f suite.log && ls
