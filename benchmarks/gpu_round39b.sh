#!/usr/bin/env bash
# The thirty-ninth session's second device call (about 4 min): tests/sample on CUDA, then what bad words cost a decode step
# once one-token words stop making a step wait for the one before (b58af3a): constrained_cost.py
# at 1, 8 and 32 rows, every case (bad_words: two one-token words, no resolve now; bad_pair: one
# two-token word, which still resolves first). One tar back: s39b_SHA.tgz.
#   bash benchmarks/gpu_round39b.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m pytest -p enginespec.conformance.plugin -p no:cacheprovider --impl=fast -q -rfEs tests/sample \
  > "$out/pytest_$sha.log" 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$out/pytest_$sha.log" | tail -4
timeout 300 python3 benchmarks/constrained_cost.py --batches 1,8,32 --tokens 128 \
  --out "$out/constrained_cost_$sha.json" > "$out/constrained.log" 2>&1
echo "constrained rc=$? after ${SECONDS}s"; grep -E "^\| " "$out/constrained.log" | sort -u -t'|' -k2,3 | sort -t'|' -k2n
cd "$out" && tar czf "s39b_$sha.tgz" ./*.log ./*.json 2>/dev/null && rm -f ./*.log ./*.json; ls
