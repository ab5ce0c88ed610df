#!/usr/bin/env bash
# Twenty-sixth session, call 2 (issues 16 and 19): call 1 found the folded norms no faster in
# the engine's decode graphs at 64-256 rows. Where the time goes: the decode steps at 64, 128
# and 256 rows with a kernel profile of the 128-row step, the norms folded and not, and folded
# with the row scale read before the PDL wait (ENGINESPEC_ROW_SCALE_EARLY=1); then the t 0.6
# workload for the early variant and the unfolded one again.
#   bash benchmarks/gpu_round26b.sh ddf328e    # ~8 min on a cold machine; nothing to carry. The
#   ENGINESPEC_ROW_SCALE_EARLY switch exists at ddf328e only (measured slower, removed after).
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
run() {  # name fold early
  ENGINESPEC_FOLD_NORMS=$2 ENGINESPEC_ROW_SCALE_EARLY=$3 timeout 150 python3 benchmarks/decode_sweep.py \
    --git-commit $S --batches 64,128,256 --latency-tokens 0 --profile --profile-batch 128 --profile-steps 10 \
    --out $out/sweep_$1.json > $out/sweep_$1.log 2>&1
  echo "sweep $1 rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|profile:" $out/sweep_$1.log
  grep -E "^\| [a-zA-Z_]" $out/sweep_$1.log | grep -v "^| kernel" | head -16 | cut -c1-110
}
run fold0 0 0; run fold1 1 0; run early 1 1
for v in "early 1 1" "fold0 0 0"; do
  set -- $v; left=$((590 - SECONDS)); [ "$left" -lt 100 ] && { echo "t06 $1 not run: ${left}s left"; continue; }
  ENGINESPEC_FOLD_NORMS=$2 ENGINESPEC_ROW_SCALE_EARLY=$3 timeout "$left" python3 benchmarks/throughput.py --impl fast \
    --git-commit $S --repeat 3 --first-call --skip-hf --skip-big --skip-latency --skip-profile --temperature 0.6 \
    --out $out/t06_$1.json > $out/t06_$1.log 2>&1
  echo "t06 $1 rc=$? after ${SECONDS}s"
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['summary']; print({k: s.get(k) for k in ('wall_s','floor_s','wall_over_floor','runs_wall_over_floor')})" $out/t06_$1.json
done
cd $out && tar czf s26b_h200_$S.tgz *.json *.log 2>/dev/null && find . -maxdepth 1 -type f ! -name "s26b_*" -delete; ls $out
