#!/usr/bin/env bash
# Device call prepared at the end of 2026-12-01's seventh session for the next one (issue 19):
# whether the host's CUDA calls cost more behind a busy GPU (host_contention_probe.py), a
# batch-1 step's phases and its profiler trace (the host's calls against the GPU's kernels), and
# LLM.generate at batch 1 with the steady steps' logits rows taken as a view (7a351d6); and
# where a 256-row decode step's device time goes (PDL off, so kernel times do not overlap).
# Usage (device machine, repo root): bash benchmarks/gpu_round8a.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
timeout 60 python3 benchmarks/host_contention_probe.py --out "$out/contention_$sha.json" > "$out/contention.log" 2>&1
echo "contention rc=$?"; cat "$out/contention.log" | tail -8
timeout 120 python3 benchmarks/step_anatomy.py --git-commit "$sha" --batch 1 --engine-arg max_num_seqs=256 \
  --generate-tokens 128 --trace "$out/trace_b1_$sha.json.gz" --out "$out/anatomy_b1_$sha.json" > "$out/anatomy.log" 2>&1
echo "anatomy rc=$?"; grep -E "^batch|^weight|generate" "$out/anatomy.log" | cut -c1-300
ENGINESPEC_PDL=0 timeout 200 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 256 --latency-tokens 0 \
  --profile --profile-batch 256 --profile-steps 10 --out "$out/sweep_prof256_$sha.json" > "$out/prof256.log" 2>&1
echo "prof256 rc=$?"; python3 benchmarks/decode_sweep.py --plot-from "$out/sweep_prof256_$sha.json" --png /tmp/x.png 2>&1 | tail -32 | cut -c1-200
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
