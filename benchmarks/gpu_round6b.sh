#!/usr/bin/env bash
# Device call B of 2026-12-01 (sixth session): where the fused sampler's device time goes
# (issue 16: chat within 2x a bare argmax, mixed within 3x). benchmarks/sampler_probe.py times
# the scan and the whole draw per case, the scan's steps cumulatively, the candidate cut's
# bisection split 2-16 ways, and the same scan and draw of kernels/cut_draw.py at BASE (the
# version before the split change) in the same process; cProfile ranks the host's share of
# chat device-path calls. Then bench_sampler's table (device path, launches, device time,
# draws checked against torch) and the sampler's CUDA tests.
# Usage (device machine, repo root): bash benchmarks/gpu_round6b.sh SHA BASE
set -u
sha=${1:?commit}; base=${2:?base commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
git show "$base:kernels/cut_draw.py" > /tmp/old_cut_draw.py 2>/dev/null || cp "benchmarks/results/cut_draw_$base.py.txt" /tmp/old_cut_draw.py
timeout 200 python3 benchmarks/sampler_probe.py "$out/probe_$sha.json" --old /tmp/old_cut_draw.py \
  --cprofile "$out/cprofile_sampler.txt" > "$out/probe.log" 2>&1
echo "probe rc=$?"; grep -vE "^\s*$" "$out/probe.log" | grep -E "^[a-z_0-9]+ +[0-9.]+$|Error|error" | head -60
head -40 "$out/cprofile_sampler.txt" | tail -32 | cut -c1-150
timeout 150 python3 benchmarks/bench_sampler.py --profile --check --json "$out/sampler_$sha.json" > "$out/bench.log" 2>&1
echo "bench rc=$?"; tail -30 "$out/bench.log" | cut -c1-160
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/sample tests/kernels/test_sampling.py > "$out/tests.log" 2>&1
echo "tests rc=$?"; tail -5 "$out/tests.log"
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
