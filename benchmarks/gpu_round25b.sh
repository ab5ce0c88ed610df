#!/usr/bin/env bash
# Twenty-fifth session (issue 16's workload): can two half-batches on two streams hide a decode
# step's projections under its attention? benchmarks/overlap_probe.py (its CUDA test first), at
# the workload's large decode sizes.
#   bash benchmarks/gpu_round25b.sh SHA    # ~3 min on a cold machine; nothing to carry
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
timeout 120 python3 -m pytest -q -p enginespec.conformance.plugin tests/benchmarks/test_overlap_probe.py \
  > $out/test.log 2>&1; echo "probe tests rc=$?"; tail -2 $out/test.log
timeout 300 python3 benchmarks/overlap_probe.py --points ${POINTS:-256x1024,256x512,128x1024,128x512,64x1024,64x512,32x512} \
  --out $out/overlap_h200_$S.json > $out/overlap.log 2>&1
echo "probe rc=$?"; grep -v "^{" $out/overlap.log | tail -30
cd $out && tar czf s25b_$S.tgz *.json *.log && find . -maxdepth 1 -type f ! -name "s25b_*" -delete; ls $out
