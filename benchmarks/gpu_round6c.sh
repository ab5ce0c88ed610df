#!/usr/bin/env bash
# Device call C of 2026-12-01 (sixth session): the two kernel changes of this round on the H200.
# - The fused cut-and-draw's new candidates (kernels/cut_draw.py: the scan keeps only sub-block
#   maxima; the cut reads the GATHER best sub-blocks again): sampler_probe.py against the
#   b971081 version in the same process, bench_sampler's table, the sampler's CUDA tests.
# - Split decode attention merging in its own launch (kernels/paged_attention.py FUSED_MERGE):
#   the attention CUDA tests, the 0.6B decode sweep with its batch-1 profile (the merge launch
#   gone), batch 1 through LLM.generate.
# At most eight files come back.
# Usage (device machine, repo root): bash benchmarks/gpu_round6c.sh SHA BASE
set -u
sha=${1:?commit}; base=${2:?base commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
plugin=(-p enginespec.conformance.plugin --impl=fast)
timeout 240 python3 -m pytest -q -p no:cacheprovider "${plugin[@]}" tests/kernels tests/sample > "$out/tests.log" 2>&1
echo "tests rc=$?"; tail -4 "$out/tests.log"
cp "benchmarks/results/cut_draw_$base.py.txt" /tmp/old_cut_draw.py
timeout 150 python3 benchmarks/sampler_probe.py "$out/probe_$sha.json" --old /tmp/old_cut_draw.py > "$out/probe.log" 2>&1
echo "probe rc=$?"; grep -E "^[a-z_0-9]+ +[0-9.]+$|Error" "$out/probe.log" | grep -v probe_level | head -40
timeout 120 python3 benchmarks/bench_sampler.py --profile --check --json "$out/sampler_$sha.json" > "$out/bench.log" 2>&1
echo "bench rc=$?"; grep -E "x$|agree|device ops" "$out/bench.log" | cut -c1-150 | tail -26
timeout 200 python3 benchmarks/decode_sweep.py --git-commit "$sha" --out "$out/sweep.json" --profile \
  > "$out/sweep.log" 2>&1; echo "sweep rc=$?"; grep -E "^\||batch-1" "$out/sweep.log" | head -24
timeout 100 python3 benchmarks/step_anatomy.py --git-commit "$sha" --batch 1 --engine-arg max_num_seqs=256 \
  --generate-tokens 128 --out "$out/anatomy_b1.json" > "$out/anatomy.log" 2>&1
echo "anatomy rc=$?"; grep -E "^batch|^startup|^weight" "$out/anatomy.log"
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log sweep.png; ls
