# Twenty-second session, call 3 (issue 16): cuBLAS, cuBLASLt and inductor's max-autotune choice
# for the decode projections at 64-256 rows, timed in a graph over 28 distinct weights.
#   bash benchmarks/gpu_round22c.sh SHA
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
timeout 500 python3 benchmarks/gemm_backend_probe.py --rows ${ROWS:-64,128,256} --out $out/gemm_backends_h200_$S.json \
  > $out/gemm_backends.log 2> $out/gemm_backends.err
echo "probe rc=$?"; cat $out/gemm_backends.log; grep -E "AUTOTUNE|^ +(triton|mm|bias)|SingleProcess|Error" $out/gemm_backends.err | head -60 | cut -c1-200
cd $out && tar czf s22c_$S.tgz *.json *.log *.err 2>/dev/null && find . -maxdepth 1 -type f ! -name "*.tgz" -delete; ls $out
