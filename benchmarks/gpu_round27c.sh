#!/usr/bin/env bash
# Twenty-seventh session, call 3 (issue 19): the decode attention split 4 ways at 32 and 64
# rows (ENGINESPEC_DECODE_ATTN=splits=4,max_rows=64; choose_config leaves them unsplit) over one
# 517-token context and over mixed contexts (100-2,048), against the default; then as many of
# the changed kernels' CUDA tests as the time left allows.
#   bash benchmarks/gpu_round27c.sh SHA    # ~4.5 min on a cold machine; nothing to carry
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
sweep() {
  local name=$1; shift
  timeout 120 python3 benchmarks/decode_sweep.py --git-commit $S --steps 20 --latency-tokens 0 \
    --batches 32,64 --out $out/$name.json "$@" > $out/$name.log 2>&1
  echo "$name rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]" $out/$name.log
}
sweep uni_default --prompt-len 517
ENGINESPEC_DECODE_ATTN=splits=4,max_rows=64 sweep uni_split4 --prompt-len 517
sweep mix_default --prompt-len 100 --max-prompt-len 2048
ENGINESPEC_DECODE_ATTN=splits=4,max_rows=64 sweep mix_split4 --prompt-len 100 --max-prompt-len 2048
left=$((250 - SECONDS))
[ "$left" -gt 20 ] && timeout "$left" python3 -m pytest -q -rfEs -p enginespec.conformance.plugin --impl=fast \
  tests/kernels/test_decode_attention.py tests/kernels/test_small_kernels.py tests/worker/test_folded_norms.py \
  -k "cuda or row or folded or qkv or silu" > $out/test.log 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)" $out/test.log | head; tail -1 $out/test.log
cd $out && tar czf s27c_h200_$S.tgz *.json *.log 2>/dev/null && find . -maxdepth 1 -type f ! -name "s27c_*" -delete; ls $out
