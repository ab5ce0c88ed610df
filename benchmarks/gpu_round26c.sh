#!/usr/bin/env bash
# Twenty-sixth session, call 3 (issues 16 and 19): call 2's profile found the folded layers'
# out-of-place addmm copying the residual first (59 memcpy kernels a step, as many launches as
# the folded norms saved). With the residual GEMMs in place (folded_ops.add_linear_): the
# decode steps at 64-256 rows with the 128-row profile, the t 0.6 workload, then the whole suite
# with --impl=fast (gpu_round19b.sh; the server's wheels carried).
#   bash benchmarks/gpu_round26c.sh SHA    # carry [".whl"]; ~9.5 min on a cold machine
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
timeout 100 python3 benchmarks/decode_sweep.py --git-commit $S --batches 64,128,256 --latency-tokens 0 --profile \
  --profile-batch 128 --profile-steps 10 --out $out/sweep_fold1.json > $out/sweep_fold1.log 2>&1
echo "sweep rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|profile:" $out/sweep_fold1.log
grep -E "^\| [a-zA-Z_]" $out/sweep_fold1.log | grep -v "^| kernel" | head -12 | cut -c1-110
timeout 90 python3 benchmarks/throughput.py --impl fast --git-commit $S --repeat 3 --first-call --skip-hf \
  --skip-big --skip-latency --skip-profile --temperature 0.6 --out $out/t06_fold1.json > $out/t06_fold1.log 2>&1
echo "t06 rc=$? after ${SECONDS}s"
python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['summary']; print({k: s.get(k) for k in ('wall_s','floor_s','wall_over_floor','first_over_warm','runs_wall_over_floor')})" $out/t06_fold1.json
(cd $out && tar czf s26c_h200_$S.tgz *.json *.log && rm -f *.json *.log)
SWEEP_8B=0 SUITE_TIMEOUT=$((560 - SECONDS - 20)) RERUN_END=$((575 - SECONDS)) TAG=s26d bash benchmarks/gpu_round19b.sh $S
