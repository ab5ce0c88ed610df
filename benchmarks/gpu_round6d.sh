#!/usr/bin/env bash
# Device call D of 2026-12-01 (sixth session).
# - Why the min-p + top-p rows became slow with the new candidates (759cd92: 1.3 ms for 256 rows
#   against 0.29 before; the chat rows got faster): sampler_probe.py with what the candidates
#   see on those rows and 8 rows of each case on the device against Triton's interpreter.
# - Programmatic dependent launch for the one-tile GEMV (ENGINESPEC_PDL=1, kernels/skinny_gemm.py):
#   its CUDA tests, greedy parity on CUDA with it on, and batch 1 with and without it (the
#   decode graph alone, LLM.generate ms/token).
# Usage (device machine, repo root): bash benchmarks/gpu_round6d.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
plugin=(-p enginespec.conformance.plugin --impl=fast)
timeout 120 python3 benchmarks/sampler_probe.py "$out/probe_$sha.json" --vs-interpreter 8 > "$out/probe.log" 2>&1
echo "probe rc=$?"; grep -E "^(draw|scan|cand|vs_interp|argmax)[a-z_0-9]* +[0-9.]+$|Error" "$out/probe.log" | head -30
for pdl in 0 1; do
  ENGINESPEC_PDL=$pdl timeout 110 python3 benchmarks/step_anatomy.py --git-commit "$sha" --batch 1 \
    --engine-arg max_num_seqs=256 --generate-tokens 128 --out "$out/anatomy_b1_pdl$pdl.json" > "$out/anatomy_pdl$pdl.log" 2>&1
  echo "anatomy pdl=$pdl rc=$?"; grep -E "^batch|^startup|^weight" "$out/anatomy_pdl$pdl.log"
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('graph_replay_ms', d.get('graph_replay_ms'), 'step', d['ms_per_step'].get('step'))" "$out/anatomy_b1_pdl$pdl.json"
done
ENGINESPEC_PDL=1 timeout 150 python3 -m pytest -q -p no:cacheprovider "${plugin[@]}" tests/kernels/test_skinny_gemm.py \
  conformance/test_parity.py -k "cuda or skinny" > "$out/tests_pdl.log" 2>&1
echo "tests pdl rc=$?"; tail -3 "$out/tests_pdl.log"
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
