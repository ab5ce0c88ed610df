#!/usr/bin/env bash
# Device call A of 2026-12-01 (seventh session). Issue 16: the sampler's min-p rows after the
# MIN_P_ROUNDS fix (sampler_probe.py --quick, bench_sampler's table with its draws checked).
# Issue 19: PDL on the attention, split-merge and q|k|v kernels, and the one-wave split bound
# (kernels/paged_attention.py): their CUDA tests and greedy parity, the split/tile probe against
# the best measured config, then the decode sweep with its batch-1 profile.
# Usage (device machine, repo root): bash benchmarks/gpu_round7a.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
plugin=(-p enginespec.conformance.plugin --impl=fast)
timeout 45 python3 benchmarks/sampler_probe.py "$out/probe_$sha.json" --quick > "$out/probe.log" 2>&1
echo "probe rc=$?"; grep -E '"(draw|scan|cand|argmax)' "$out/probe.log" | head -20
timeout 100 python3 benchmarks/bench_sampler.py --profile --check --json "$out/sampler_$sha.json" > "$out/bench.log" 2>&1
echo "bench rc=$?"; tail -22 "$out/bench.log" | cut -c1-160
timeout 150 python3 -m pytest -q -p no:cacheprovider "${plugin[@]}" tests/kernels/test_paged_attention.py \
  tests/kernels/test_small_kernels.py tests/kernels/test_pdl.py tests/kernels/test_skinny_gemm.py \
  conformance/test_parity.py > "$out/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^(FAILED|ERROR)" "$out/tests.log" | head; tail -2 "$out/tests.log"
timeout 100 python3 benchmarks/attention_split_probe.py --out "$out/attn_probe_$sha.json" > "$out/attn.log" 2>&1
echo "attn probe rc=$?"; cat "$out/attn.log" | cut -c1-220 | tail -14
timeout 170 python3 benchmarks/decode_sweep.py --git-commit "$sha" --out "$out/sweep.json" --profile \
  > "$out/sweep.log" 2>&1; echo "sweep rc=$?"; grep -E "^\||batch-1" "$out/sweep.log" | head -14
python3 - "$out/sweep.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); p = d.get("profile_batch1") or {}
for t in p.get("top", [])[:9]:
    print(f"{t['us_per_step']:8.1f} us {t['launches_per_step']:5.0f}x {t['name'][:70]}")
PY
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log sweep.png; ls
