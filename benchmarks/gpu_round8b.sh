#!/usr/bin/env bash
# Device call B of 2026-12-01's eighth session (issue 19): decode graphs of up to 16 rows now
# run the logits head (ModelRunner.GRAPH_LOGITS_MAX_ROWS); their CUDA tests first. Batch 1's phases and trace, the batch sweep 1-256 with
# LLM.generate at batch 1, the 0.6B batch-1 per-kernel profile (PDL off, so kernel times do not
# overlap), and the 8B shape at batch 1 with its per-kernel profile (PDL off).
# Usage (device machine, repo root): bash benchmarks/gpu_round8b.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
timeout 150 python3 -m pytest -q -p enginespec.conformance.plugin --impl=fast tests/worker/test_cuda_graphs.py tests/worker/test_sampled_rows.py tests/worker/test_compiled.py -x > "$out/pytest.log" 2>&1; echo "pytest rc=$?"; tail -3 "$out/pytest.log"
timeout 110 python3 benchmarks/step_anatomy.py --git-commit "$sha" --batch 1 --engine-arg max_num_seqs=256 \
  --generate-tokens 128 --trace "$out/trace_b1_$sha.json.gz" --out "$out/anatomy_b1_$sha.json" > "$out/anatomy.log" 2>&1
echo "anatomy rc=$?"; grep -E "^batch|^weight|generate|graph" "$out/anatomy.log" | cut -c1-300
timeout 170 python3 benchmarks/decode_sweep.py --git-commit "$sha" --out "$out/decode_sweep_h200_$sha.json" > "$out/sweep.log" 2>&1
echo "sweep rc=$?"; grep -E "^\| [0-9]|LLM.generate" "$out/sweep.log"
ENGINESPEC_PDL=0 timeout 90 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1 --latency-tokens 0 \
  --profile --profile-steps 10 --out "$out/sweep_prof1_pdl0_$sha.json" > "$out/prof1.log" 2>&1
echo "prof1 rc=$?"; grep -E "^\||profile" "$out/prof1.log" | head -30 | cut -c1-160
ENGINESPEC_PDL=0 timeout 170 python3 benchmarks/decode_sweep.py --git-commit "$sha" --shape qwen3-8b --batches 1 \
  --profile --profile-steps 10 --out "$out/sweep_8b_prof1_pdl0_$sha.json" > "$out/prof8b.log" 2>&1
echo "8b rc=$?"; grep -E "^\||profile|LLM.generate" "$out/prof8b.log" | head -30 | cut -c1-160
cd "$out" && rm -f *.png && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
