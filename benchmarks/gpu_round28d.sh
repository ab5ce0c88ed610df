#!/usr/bin/env bash
# Twenty-eighth session, call 4 (issue 16 and 19): a cold start with the sampler's kernels
# compiled side by side before the warm-up (sample/precompile.py; the JIT hook's timestamps),
# then a second start on its caches; then the default decode step at 8 and 16 rows (balanced
# splits now), one 517-token context and mixed contexts (100-2,048), on the same caches.
#   bash benchmarks/gpu_round28d.sh SHA    # ~3.5 min on a cold machine; nothing to carry
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
cold_first_call cold_start --hook-startup
python3 - "$out/cold_start.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print({k: round(v, 1) for k, v in d.get("startup_phases", {}).items()}, "startup", round(d.get("startup_s", 0), 1))
c = d.get("compiles_in_startup", [])
print(len(c), "compiles in startup,", len(d.get("compiles_in_first_call", [])), "in the first call; last 30:"); [print(round(x["t"], 2), x["kernel"][:50]) for x in c[-30:]]
PY
second_start second_start
export TRITON_CACHE_DIR=$cold_caches/triton TORCHINDUCTOR_CACHE_DIR=$cold_caches/inductor ENGINESPEC_CACHE_DIR=$cold_caches/enginespec
sweep() { sweep_rows "$1" "$S" 8,16 "${@:2}"; }
sweep uni_default --prompt-len 517
sweep mix_default --prompt-len 100 --max-prompt-len 2048
ENGINESPEC_DECODE_ATTN=balance=0 sweep mix_unbalanced --prompt-len 100 --max-prompt-len 2048
cd $out && tar czf s28d_h200_$S.tgz *.json *.log 2>/dev/null && find . -maxdepth 1 -type f ! -name "s28d_*" -delete; ls $out
