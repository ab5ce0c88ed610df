#!/usr/bin/env bash
# The fifty-fifth session's last call: the CUDA tests of what the fifty-fourth and fifty-fifth
# sessions changed (the sampler's min_tokens guard, hard constraints, further EOS ids,
# hf_overrides, the n-gram defaults), 8 xdist workers, failures rerun serially; then, by card,
# on an H200 the decode sweep 1-256 with its PNG and batch-1 LLM.generate (issue 19's figures),
# on an H100 generate_b1_probe.py's per-thread CPU in one fresh process.
#   bash benchmarks/gpu_round55c.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind); echo "device ${kind:-unknown}"
paths="conformance/test_sampling_distribution.py conformance/test_spec_combos.py conformance/test_structured_outputs.py
  conformance/test_vllm_params.py conformance/test_parity.py tests/sample tests/engine/test_generation_config.py
  tests/api/test_hf_overrides.py tests/engine/spec_decode tests/worker/test_loader.py tests/worker/test_skinny_table_file.py"
args=(-p enginespec.conformance.plugin --impl=fast -q -rfEs -o cache_dir=/tmp/pytest_cache)
# shellcheck disable=SC2086  # paths is a list
timeout "${SUITE_TIMEOUT:-300}" python3 -m pytest "${args[@]}" -vv -n 8 --dist loadfile --durations=10 $paths \
  > "$out/pytest_$sha.log" 2>&1
echo "tests rc=$? after ${SECONDS}s"; failed=$(grep -oE "(FAILED|ERROR) [^ ]+::[^ ]+" "$out/pytest_$sha.log" | cut -d" " -f2 | sort -u); echo "$failed" | head -20; tail -1 "$out/pytest_$sha.log"
if [ -n "$failed" ]; then  # # shellcheck disable=SC2086
  timeout 120 python3 -m pytest "${args[@]}" $failed > "$out/pytest_rerun_$sha.log" 2>&1
  echo "rerun rc=$?"; grep -E "^(FAILED|ERROR)" "$out/pytest_rerun_$sha.log" | head; tail -1 "$out/pytest_rerun_$sha.log"
fi
left=$((${END:-560} - SECONDS))
if [ "$kind" = h200 ] && [ $left -gt 120 ]; then
  timeout $left python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1,2,4,8,16,32,64,128,256 \
    --out "$out/decode_sweep_${kind}_$sha.json" > "$out/sweep.log" 2>&1
  echo "sweep rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate" "$out/sweep.log"
elif [ $left -gt 90 ]; then
  timeout $left python3 benchmarks/generate_b1_probe.py --tokens 512 --reps 4 --out "$out/b1_probe_${kind}_$sha.json" \
    > "$out/b1_probe.log" 2>&1
  echo "probe rc=$? after ${SECONDS}s"; grep -E "^(wall_ms|steps_after|many)" "$out/b1_probe.log"
fi
cd "$out" && tar czf "s55c_${kind}_$sha.tgz" ./*.log ./*.json ./*.png 2>/dev/null && rm -f ./*.log ./*.json ./*.png; ls
