#!/usr/bin/env bash
# Twenty-eighth session, call 3 (issue 19): the balanced decode attention merging a row's
# splits in the launch (LaunchConfig.merge_in_launch: the last split to arrive merges; no merge
# launch) at R = 2 and 4 (ENGINESPEC_DECODE_ATTN=balance=R,inmerge=1,min_rows=4) against the
# default, one 517-token context and mixed contexts (100-2,048), 4-64 rows; its CUDA tests
# first; then the temperature-0.6 workload, default and balance=2,inmerge=1,min_rows=8.
#   bash benchmarks/gpu_round28c.sh SHA    # ~6 min on a cold machine; nothing to carry
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
timeout 90 python3 -m pytest -q -rfEs -p enginespec.conformance.plugin --impl=fast \
  tests/kernels/test_decode_attention.py tests/impls/test_fast_examples.py -k "balanced or arrival or attend_qkv" \
  > $out/test_balanced.log 2>&1
echo "balanced tests rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)" $out/test_balanced.log | head; tail -1 $out/test_balanced.log
sweep() { sweep_rows "$1" "$S" 4,8,16,32,64 "${@:2}"; }
B2=balance=2,inmerge=1,min_rows=4; B4=balance=4,inmerge=1,min_rows=4
sweep uni_base --prompt-len 517
ENGINESPEC_DECODE_ATTN=$B2 sweep uni_bal2m --prompt-len 517
ENGINESPEC_DECODE_ATTN=$B4 sweep uni_bal4m --prompt-len 517
sweep mix_base --prompt-len 100 --max-prompt-len 2048
ENGINESPEC_DECODE_ATTN=$B2 sweep mix_bal2m --prompt-len 100 --max-prompt-len 2048
ENGINESPEC_DECODE_ATTN=$B4 sweep mix_bal4m --prompt-len 100 --max-prompt-len 2048
t06_workload t06_base 100 $S
ENGINESPEC_DECODE_ATTN=balance=2,inmerge=1,min_rows=8 t06_workload t06_bal2m 100 $S
cd $out && tar czf s28c_h200_$S.tgz *.json *.log 2>/dev/null && find . -maxdepth 1 -type f ! -name "s28c_*" -delete; ls $out
