#!/usr/bin/env bash
# Twenty-eighth session, call 1 (issue 19): the decode attention's splits balanced over the
# batch (LaunchConfig.balance_splits; ENGINESPEC_DECODE_ATTN=balance=R,min_rows=2: R x
# choose_config's split count in the grid, a split owning the batch's share of tiles) against
# the default, over one 517-token context and over mixed contexts (100-2,048), at 4-64 rows;
# the balanced kernels' CUDA tests first, the rest of the decode attention's after.
#   bash benchmarks/gpu_round28a.sh SHA    # ~5.5 min on a cold machine; nothing to carry
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
timeout 90 python3 -m pytest -q -rfEs -p enginespec.conformance.plugin --impl=fast \
  tests/kernels/test_decode_attention.py -k "balanced" > $out/test_balanced.log 2>&1
echo "balanced tests rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)" $out/test_balanced.log | head; tail -1 $out/test_balanced.log
sweep() { sweep_rows "$1" "$S" 4,8,16,32,64 "${@:2}"; }
for round in 1; do
  sweep uni_base --prompt-len 517
  ENGINESPEC_DECODE_ATTN=balance=4,min_rows=2 sweep uni_bal4 --prompt-len 517
  sweep mix_base --prompt-len 100 --max-prompt-len 2048
  ENGINESPEC_DECODE_ATTN=balance=4,min_rows=2 sweep mix_bal4 --prompt-len 100 --max-prompt-len 2048
  ENGINESPEC_DECODE_ATTN=balance=2,min_rows=2 sweep mix_bal2 --prompt-len 100 --max-prompt-len 2048
  ENGINESPEC_DECODE_ATTN=balance=2,min_rows=2 sweep uni_bal2 --prompt-len 517
  ENGINESPEC_DECODE_ATTN=balance=1,min_rows=2 sweep mix_bal1 --prompt-len 100 --max-prompt-len 2048
  ENGINESPEC_DECODE_ATTN=balance=1,min_rows=2 sweep uni_bal1 --prompt-len 517
done
left=$((330 - SECONDS))
[ "$left" -gt 20 ] && timeout "$left" python3 -m pytest -q -rfEs -p enginespec.conformance.plugin --impl=fast \
  tests/kernels/test_decode_attention.py tests/kernels/test_paged_attention.py > $out/test.log 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)" $out/test.log | head; tail -1 $out/test.log
cd $out && tar czf s28a_h200_$S.tgz *.json *.log 2>/dev/null && find . -maxdepth 1 -type f ! -name "s28a_*" -delete; ls $out
