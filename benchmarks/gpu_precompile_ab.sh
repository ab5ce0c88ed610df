#!/usr/bin/env bash
# Issue 16's cold start with and without the compile-only passes (kernels/compile_pool.py: the
# GEMM tuning's, the decode graphs' before their capture, the sampler's before the warm-up):
# two cold starts on empty caches, ENGINESPEC_PRECOMPILE=0 first, each with the JIT hook's
# timestamps; prints startup by phase and the compiles after the tuning.
#   bash benchmarks/gpu_precompile_ab.sh SHA    # ~3 min on a cold machine; nothing to carry
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
show() {
  python3 - "$out/$1.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); ph = d.get("startup_phases", {})
print({k: round(v, 1) for k, v in ph.items()}, "startup", round(d.get("startup_s", 0), 1))
after = ph.get("load", 0) + ph.get("gemm_tuning", 0)
late = [c for c in d.get("compiles_in_startup", []) if c["t"] >= after]
print(len(late), "compiles after the tuning,", len(d.get("compiles_in_first_call", [])), "in the first call")
PY
}
ENGINESPEC_PRECOMPILE=0 cold_first_call cold_off --hook-startup; show cold_off
cold_first_call cold_on --hook-startup; show cold_on
cd $out && tar czf precompile_ab_h200_$S.tgz *.json *.log 2>/dev/null && find . -maxdepth 1 -type f ! -name "precompile_ab_*" -delete; ls $out
