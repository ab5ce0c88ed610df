#!/usr/bin/env bash
# Device call D of 2026-12-01 (fifth session), the last: with skinny_gemm on by default (rows
# 1-8) and the graph inputs laid out as eager steps' (no third decoder compile), a cold start
# by phase and batch 1 (steps and LLM.generate) at the LLM's default max_num_seqs, then the
# whole suite with --impl=fast. Usage (device machine, repo root): bash benchmarks/gpu_round5d.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
TORCH_LOGS=recompiles timeout 130 python3 benchmarks/step_anatomy.py --git-commit "$sha" --batch 1 \
  --engine-arg max_num_seqs=256 --generate-tokens 128 --out "$out/anatomy_b1.json" > "$out/anatomy_b1.log" 2>&1
echo "anatomy b1 rc=$?"; grep -E "^batch|^startup|Recompiling|triggered by|- 0/" "$out/anatomy_b1.log" | cut -c1-260 | head -12
timeout 450 python3 -m pytest -p enginespec.conformance.plugin --impl=fast -v -rfEs -p no:cacheprovider \
  --durations=15 conformance tests > "$out/pytest_fast.log" 2>&1
echo "pytest exit: $?"
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest_fast.log" | grep -v " PASSED" | tail -25; grep -c " PASSED" "$out/pytest_fast.log"; grep -E " (FAILED|ERROR)" "$out/pytest_fast.log" | head -20
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; ls
