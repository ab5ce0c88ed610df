#!/usr/bin/env bash
# The thirty-ninth session's first device call (about 8 min): gpu_round38a.sh's checks on the
# bans' device value (92bab47: the CUDA tests under torch's sync debug mode, then
# constrained_cost.py's bad_words column at 1, 8 and 32 rows), the sweep at 1 and 8 rows with
# batch-1 LLM.generate by medians, then the t 0.6 workload (3 warm runs) on the same H200 start.
# One tar back: s39a_h200_SHA.tgz.
#   bash benchmarks/gpu_round39a.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
timeout 150 python3 -m pytest -p enginespec.conformance.plugin -p no:cacheprovider --impl=fast -q -rfEs \
  tests/sample conformance/test_async_scheduling.py conformance/test_vllm_params.py \
  > "$out/pytest_$sha.log" 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E "passed|failed|FAILED|ERROR" "$out/pytest_$sha.log" | tail -8
timeout 200 python3 benchmarks/constrained_cost.py --batches 1,8,32 --tokens 128 \
  --out "$out/constrained_cost_h200_$sha.json" > "$out/constrained.log" 2>&1
echo "constrained rc=$? after ${SECONDS}s"; grep -E "^\| " "$out/constrained.log"; tail -3 "$out/constrained.log"
timeout 120 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1,8 \
  --out "$out/decode_sweep_h200_$sha.json" > "$out/sweep.log" 2>&1
echo "sweep rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate|decode steps, ms" "$out/sweep.log"
left=$((560 - SECONDS)); [ $left -gt 60 ] && t06_workload t06_$sha $left "$sha" --repeat 3
cd "$out" && tar czf "s39a_h200_$sha.tgz" ./*.log ./*.json 2>/dev/null && rm -f ./*.log ./*.json; ls
