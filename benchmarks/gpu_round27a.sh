#!/usr/bin/env bash
# Twenty-seventh session, call 1 (issue 16's startup): a folded decoder uncompiled by default
# (worker/compiled.py) and the tuning table kept in enginespec's cache folder
# (worker/skinny_table_file.py). Cold starts on empty caches with the new default and with the
# decoder compiled (ENGINESPEC_COMPILE=1), a second start on the first one's caches, then the
# temperature-0.6 workload and the decode steps of 1-256 rows, uncompiled and compiled, on warm
# caches, one after the other.
#   bash benchmarks/gpu_round27a.sh SHA    # ~9 min on a cold machine; nothing to carry
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
cold_first_call cold_eager --hook-startup; echo "after ${SECONDS}s"
second_start second_eager; echo "after ${SECONDS}s"
ENGINESPEC_COMPILE=1 cold_first_call cold_compiled --hook-startup; echo "after ${SECONDS}s"
export TRITON_CACHE_DIR=$cold_caches/triton TORCHINDUCTOR_CACHE_DIR=$cold_caches/inductor \
  ENGINESPEC_CACHE_DIR=$cold_caches/enginespec
for c in 0 1; do
  left=$((560 - SECONDS)); [ "$left" -lt 90 ] && { echo "t06 compile=$c not run: ${left}s left"; continue; }
  ENGINESPEC_COMPILE=$c t06_workload t06_compile$c 150 $S --first-call
done
for c in 0 1; do
  left=$((590 - SECONDS)); [ "$left" -lt 50 ] && { echo "sweep compile=$c not run: ${left}s left"; continue; }
  ENGINESPEC_COMPILE=$c timeout "$left" python3 benchmarks/decode_sweep.py --git-commit $S \
    --batches 1,16,64,128,256 --steps 20 --latency-tokens 0 --out $out/sweep_compile$c.json > $out/sweep_compile$c.log 2>&1
  echo "sweep compile=$c rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]" $out/sweep_compile$c.log
done
cd $out && tar czf s27a_h200_$S.tgz *.json *.log 2>/dev/null && find . -maxdepth 1 -type f ! -name "s27a_*" -delete; ls $out
