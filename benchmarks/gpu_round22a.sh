# Twenty-second session, call 1: the sampler's cases by kernel (issue 16: which of the mixed
# case's 12 launches to cut), then the paired gate|up tiles of 8 columns against this tree at
# 4-32 rows (issue 19; .dev_carry/variants/paired from benchmarks/make_variant.sh).
#   bash benchmarks/gpu_round22a.sh SHA
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
ENGINESPEC_BENCH_TOP_OPS=16 timeout 200 python3 benchmarks/bench_sampler.py --profile --check --json $out/sampler_h200_$S.json \
  > $out/sampler.log 2>&1
echo "sampler rc=$?"; grep -v -E "^USDT|warn" $out/sampler.log | cut -c1-700
TESTS=0 ROUNDS=1 BATCHES=4,8,16,32 SWEEP_TIMEOUT=150 bash benchmarks/gpu_round11a.sh $S
cd $out && tar czf s22a_$S.tgz *.json *.log 2>/dev/null && find . -maxdepth 1 -type f ! -name "*.tgz" -delete; ls $out
