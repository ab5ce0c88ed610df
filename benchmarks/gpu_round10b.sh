#!/usr/bin/env bash
# Device calls of 2026-12-02's tenth session: the suite with the fast impl on CUDA after the fused
# decode attention (every decode step of the engine now takes it) and the logprobs change.
#   part "a": conformance, tests/engine, tests/entrypoints, tests/worker, tests/impls;
#   part "b": tests/sample and tests/kernels, then the sampler table (draws checked against torch).
# Usage (device machine, repo root): bash benchmarks/gpu_round10b.sh SHA a|b
set -u
sha=${1:?commit}; part=${2:?a or b}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
plugin=(-p enginespec.conformance.plugin --impl=fast)
if [ "$part" = a ]; then
  dirs=(conformance tests/engine tests/entrypoints tests/worker tests/impls); limit=480
else
  dirs=(tests/sample tests/kernels); limit=300
fi
log="$out/pytest_fast_${part}_h200_$sha.log"
timeout $limit python3 -m pytest -q -p no:cacheprovider "${plugin[@]}" "${dirs[@]}" > "$log" 2>&1
echo "suite $part rc=$?"; grep -E "^(FAILED|ERROR)" "$log" | head; tail -1 "$log"
if [ "$part" = b ]; then
  timeout 120 python3 benchmarks/bench_sampler.py --profile --check --json "$out/sampler_h200_$sha.json" > "$out/bench.log" 2>&1
  echo "bench rc=$?"; grep -v "^ *$\|Warn\|warn_once" "$out/bench.log" | grep -v "^sampler_" | cut -c1-400
fi
gzip -f "$log"; cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
