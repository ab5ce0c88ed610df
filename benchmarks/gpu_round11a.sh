#!/usr/bin/env bash
# Device call to measure branch idle-exit (splits that own no key tile exit at once; the decode
# merge reads only the splits that own tiles) against the tree it branched from, on one machine:
# the CUDA tests of the attention kernels and graphs, then the 0.6B sweep at 1 and 4 rows (with
# LLM.generate at batch 1) on this tree, then again after copying in the base tree's two kernel
# files, sent beside the tree in .dev_carry/base/kernels/ (carry [".dev_carry"]).
# Usage (device machine, repo root): bash benchmarks/gpu_round11a.sh SHA BASE_SHA
set -u
sha=${1:?commit}; base=${2:?base commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
plugin=(-p enginespec.conformance.plugin --impl=fast)
timeout 150 python3 -m pytest -q -p no:cacheprovider "${plugin[@]}" tests/kernels/test_decode_attention.py \
  tests/kernels/test_paged_attention.py tests/worker/test_cuda_graphs.py > "$out/pytest.log" 2>&1
echo "pytest rc=$?"; grep -E "^(FAILED|ERROR)" "$out/pytest.log" | head; tail -1 "$out/pytest.log"
sweep() {
  timeout 150 python3 benchmarks/decode_sweep.py --git-commit "$1" --batches 1,4 \
    --out "$out/sweep_$2_h200_$1.json" > "$out/sweep_$2.log" 2>&1
  echo "sweep $2 rc=$?"; grep -E "^\| [0-9]|LLM.generate" "$out/sweep_$2.log"
}
sweep "$sha" idle_exit
cp -r .dev_carry/base/. . && gpu_setup || exit 1
sweep "$base" base
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log *.png; ls
