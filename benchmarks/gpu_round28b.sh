#!/usr/bin/env bash
# Twenty-eighth session, call 2 (issue 19): where the balanced decode attention's cost goes at
# one context (32 rows, 517 tokens: the step by kernel, default and balance=2), and the
# temperature-0.6 workload (mixed contexts) with the balanced launch at 8-64 rows against the
# default.
#   bash benchmarks/gpu_round28b.sh SHA    # ~4.5 min on a cold machine; nothing to carry
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
prof() {
  local name=$1; shift
  timeout 90 python3 benchmarks/decode_sweep.py --git-commit $S --steps 20 --latency-tokens 0 --batches 32 \
    --profile --profile-batch 32 --profile-steps 10 --prompt-len 517 --out $out/$name.json > $out/$name.log 2>&1
  echo "$name rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|^batch-|attention|merge|^\| _" $out/$name.log | head -14
}
prof prof32_base
ENGINESPEC_DECODE_ATTN=balance=2,min_rows=8 prof prof32_bal2
t06_workload t06_base 100 $S
ENGINESPEC_DECODE_ATTN=balance=2,min_rows=8 t06_workload t06_bal2 100 $S
cd $out && tar czf s28b_h200_$S.tgz *.json *.log 2>/dev/null && find . -maxdepth 1 -type f ! -name "s28b_*" -delete; ls $out
