#!/usr/bin/env bash
# Twenty-seventh session, call 2 (issues 19 and 16). (1) The row scale's static read and
# whole-row SiLU * up (1981025) against the kernels before it (.dev_carry/variants/base, made
# with `bash benchmarks/make_variant.sh base 8ee0f69 kernels/row_scale.py kernels/qkv_rope.py
# kernels/decode_attention.py kernels/silu_mul.py`): decode steps of 64-256 rows, base first.
# First the CUDA tests of the changed kernels and paths. (2) Decode steps of 8-64 rows over mixed contexts (uniform in 100-2,048 tokens, as a real
# batch's are) against one context of the same mean, then the decode attention's split count
# forced to 4 and 8 at up to 64 rows (ENGINESPEC_DECODE_ATTN); if one beats the default by
# 3% over those rows, the t 0.6 workload with it and without.
#   bash benchmarks/gpu_round27b.sh SHA    # carry [".dev_carry"]; ~8 min on a cold machine
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
base=$(mktemp -d); cp -r . "$base/" && cp -r .dev_carry/variants/base/files/. "$base/"
btree=$(mktemp -d); python3 "$base/tools/link_tree.py" "$btree" >/dev/null || exit 1
sweep() {  # sweep NAME [decode_sweep args...]: this tree
  local name=$1; shift
  timeout 150 python3 benchmarks/decode_sweep.py --git-commit $S --steps 20 --latency-tokens 0 \
    --out $out/$name.json "$@" > $out/$name.log 2>&1
  echo "$name rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]" $out/$name.log
}
timeout 120 python3 -m pytest -q -rfEs -p enginespec.conformance.plugin --impl=fast \
  tests/kernels/test_small_kernels.py tests/kernels/test_decode_attention.py tests/kernels/test_pdl.py \
  tests/worker/test_folded_norms.py tests/worker/test_compiled.py conformance/test_parity.py \
  -k "cuda or row or folded or qkv or silu or matches or compile" > $out/test.log 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)" $out/test.log | head; tail -1 $out/test.log
(cd "$base" && PYTHONPATH=$btree:$base:/tmp/site timeout 200 python3 benchmarks/decode_sweep.py \
  --git-commit "$S-base" --steps 20 --latency-tokens 0 --batches 64,128,256 --out $out/rs_base.json \
  > $out/rs_base.log 2>&1); echo "rs_base rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]" $out/rs_base.log
sweep rs_new --batches 64,128,256
python3 - <<'PY'
import torch
from enginespec.kernels.decode_attention import decode_config
for rows in (8, 16, 32, 64):
    c = decode_config(rows, 16, 8, 128, 40960, torch.device("cuda"))
    print(rows, "rows:", c)
PY
B=8,16,32,64
sweep mix_uniform --batches $B --prompt-len 1074
sweep mix_default --batches $B --prompt-len 100 --max-prompt-len 2048
for sp in 4 8; do
  ENGINESPEC_DECODE_ATTN=splits=$sp,max_rows=64 sweep mix_splits$sp --batches $B --prompt-len 100 --max-prompt-len 2048
done
best=$(python3 - $out <<'PY'
import json, sys
tot = lambda n: sum(r["ms_per_step"] for r in json.load(open(f"{sys.argv[1]}/{n}.json"))["rows"])
base = tot("mix_default"); cands = {sp: tot(f"mix_splits{sp}") for sp in (4, 8)}
sp, t = min(cands.items(), key=lambda kv: kv[1])
print(sp if t < 0.97 * base else "")
PY
)
echo "best split override: '${best}'"
left=$((585 - SECONDS)); [ "$left" -lt 170 ] && { echo "workload pair not run: ${left}s left"; best=; }
if [ -n "$best" ]; then
  for v in "" "splits=$best,max_rows=64"; do
    left=$((585 - SECONDS))
    tag=${v:+split$best}; tag=${tag:-default}
    ENGINESPEC_DECODE_ATTN=$v t06_workload t06_$tag "$left" $S
  done
fi
cd $out && tar czf s27b_h200_$S.tgz *.json *.log 2>/dev/null && find . -maxdepth 1 -type f ! -name "s27b_*" -delete; ls $out
