#!/usr/bin/env bash
# The code it measured (b0a0f80: worker/l2_ahead.py, the merge's bulk prefetches) was measured slower and
# removed in the next commit (benchmarks/RESULTS.md, twenty-fourth session); run it at b0a0f80.
# Twenty-fourth session, call 2 (issue 19): the split merge asking L2 for the layer's later
# weights while the decode attention runs (worker/l2_ahead.py, ENGINESPEC_L2_AHEAD; off by
# default). First the CUDA tests with it on (o, gate|up, down at up to 4 rows): the kernels, the
# route, the graphs, batch parity; then this tree (off) against ENV-only variants gu (gate_up),
# mlp (gate_up,down) and all4 (o,gate_up,down,rows=4) at batches 1 and 4, two interleaved
# rounds, one skinny table.
#   bash benchmarks/gpu_round24b.sh SHA    # carry .dev_carry (variants/{gu,mlp,all4}/ENV, SHA)
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
for v in .dev_carry/variants/*/; do echo "$S" > "$v/SHA"; done
ENGINESPEC_L2_AHEAD=o,gate_up,down,rows=4 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  -p enginespec.conformance.plugin --impl=fast tests/worker/test_l2_ahead.py tests/kernels/test_decode_attention.py \
  tests/worker/test_cuda_graphs.py conformance/test_batch_parity.py > $out/pytest_ahead.log 2>&1
echo "pytest (L2 ahead on) rc=$?"; grep -E "^(FAILED|ERROR)" $out/pytest_ahead.log | head; tail -1 $out/pytest_ahead.log
TESTS=0 PIN_TABLE=1 WARM=1 ROUNDS=2 BATCHES=1,4 SWEEP_TIMEOUT=150 bash benchmarks/gpu_round11a.sh $S
cd $out && tar czf s24b_$S.tgz *.json *.log *.tgz 2>/dev/null && find . -maxdepth 1 -type f ! -name "s24b_*" -delete; ls $out
