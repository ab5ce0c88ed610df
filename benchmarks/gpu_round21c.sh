# Twenty-first session, call 2: the row-tiled skinny GEMM on CUDA (its tests, then the tuning's
# picks at 64-256 rows against cuBLAS), a prefill step's host time, host phases by step kind.
#   bash benchmarks/gpu_round21c.sh SHA
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
timeout 150 python3 -m pytest -q -x -p enginespec.conformance.plugin --impl=fast tests/kernels/test_skinny_gemm.py \
  tests/worker/test_skinny_linear.py > $out/tests.log 2>&1; echo "tests rc=$?"; tail -3 $out/tests.log
timeout 240 python3 benchmarks/skinny_gemm_table.py --rows 64,128,256 --out $out/skinny_rows_$S.json > $out/skinny_rows.log 2>&1
echo "table rc=$?"; grep -v "^USDT" $out/skinny_rows.log | tail -40
timeout 100 python3 benchmarks/prefill_profile.py --git-commit $S --profile-steps 1 --out $out/prefill_$S.json > $out/prefill.log 2>&1
echo "prefill rc=$?"; grep -E "tokens|total|profiled" $out/prefill.log
timeout 120 python3 -m benchmarks.host_phases --temperature 0.6 > $out/host_phases.log 2>&1
echo "host_phases rc=$?"; grep -v "^USDT" $out/host_phases.log | tail -12
cd $out && tar czf s21c_$S.tgz *.json *.log 2>/dev/null; ls $out
