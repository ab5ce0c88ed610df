# Twenty-second session, call 2 (issue 16): the sampler's CUDA tests with the streaming
# logprobs pass, the sampler by kernel, and the fused draw's second launch by phase for each
# of the mixed case's row kinds.
#   bash benchmarks/gpu_round22b.sh SHA
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
timeout 240 python3 -m pytest -q -p no:cacheprovider -p enginespec.conformance.plugin --impl=fast tests/sample \
  tests/kernels/test_sampling.py conformance/test_async_scheduling.py > $out/pytest_sampler.log 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)" $out/pytest_sampler.log | head; tail -1 $out/pytest_sampler.log
ENGINESPEC_BENCH_TOP_OPS=16 timeout 200 python3 benchmarks/bench_sampler.py --profile --check --json $out/sampler_h200_$S.json \
  > $out/sampler.log 2>&1
echo "sampler rc=$?"; grep -v -E "^USDT|warn|UserWarn" $out/sampler.log | cut -c1-600
timeout 150 python3 benchmarks/cut_draw_phases.py $out/phases_$S.json > $out/phases.log 2>&1
echo "phases rc=$?"; tail -30 $out/phases.log | cut -c1-300
cd $out && tar czf s22b_$S.tgz *.json *.log 2>/dev/null && find . -maxdepth 1 -type f ! -name "*.tgz" -delete; ls $out
