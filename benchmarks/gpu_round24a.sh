#!/usr/bin/env bash
# Twenty-fourth session, call 1 (issue 19): the fast batch builder's ring of device buffers
# (121682f, Staging.RING_SLOTS) on CUDA: its tests (builder examples, batch parity, graphs), then
# this tree against the builder before it (variant oldbuild = b21b08c's batch.py and
# batch_buffers.py, made with make_variant.sh) at batches 1, 4 and 16, two interleaved rounds,
# one skinny table; then batch 1's host functions ranked by cProfile (step_anatomy.py, warm caches).
#   bash benchmarks/gpu_round24a.sh SHA    # carry .dev_carry
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
TEST_FILES="tests/impls/test_fast_examples.py conformance/test_batch_parity.py tests/worker/test_cuda_graphs.py" \
  TESTS=1 PIN_TABLE=1 WARM=1 ROUNDS=2 BATCHES=1,4,16 SWEEP_TIMEOUT=150 bash benchmarks/gpu_round11a.sh $S
timeout 120 python3 benchmarks/step_anatomy.py --git-commit "$S" --batch 1 --engine-arg max_num_seqs=256 \
  --generate-tokens 128 --cprofile "$out/cprofile_b1.txt" --out "$out/anatomy_b1_$S.json" > "$out/anatomy.log" 2>&1
echo "anatomy rc=$?"; grep -E "^batch|^startup|^weight|^host|^step" "$out/anatomy.log"
head -45 "$out/cprofile_b1.txt"
cd $out && tar czf s24a_$S.tgz *.json *.txt *.log *.tgz 2>/dev/null && find . -maxdepth 1 -type f ! -name "s24a_*" -delete; ls $out
