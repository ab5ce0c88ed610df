#!/usr/bin/env bash
# The forty-seventh session's first call (about 9.5 min): the CUDA tests of what changed since
# the forty-sixth session's last device call (96f85c6: LLMEngine's review fixes, the sampler's
# RowSpec cache, the min_tokens refusal, the mutation-run tests) in six xdist workers, verbose
# (a run cut off still names its failures), then the whole decode sweep 1-256 rows with its PNG
# (issue 19's table) and the t 0.6 workload in the time left. One tar back: s47a_KIND_SHA.tgz.
#   bash benchmarks/gpu_round47a.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind)
echo "device ${kind:-unknown}"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
tests=${TEST_PATHS:-tests/api tests/sample tests/engine/test_detokenizer.py tests/engine/test_output_processor.py tests/engine/test_prompt_logprobs_gap.py tests/benchmarks/test_launch_cost_probe.py conformance/test_vllm_params.py conformance/test_spec_decode.py}
args=(-p enginespec.conformance.plugin -p no:cacheprovider --impl=fast -rfEs -o cache_dir=/tmp/pytest_cache)
# shellcheck disable=SC2086  # TEST_PATHS is a list of paths
timeout "${TEST_TIMEOUT:-190}" python3 -m pytest "${args[@]}" -v -n "${XDIST:-6}" --dist loadfile \
  $tests > "$out/pytest_v_$sha.log" 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E " (FAILED|ERROR) " "$out/pytest_v_$sha.log" | head -20
grep -cE " PASSED " "$out/pytest_v_$sha.log"; tail -2 "$out/pytest_v_$sha.log"
timeout 230 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1,2,4,8,16,32,64,128,256 \
  --out "$out/decode_sweep_${kind}_$sha.json" > "$out/sweep.log" 2>&1
echo "sweep rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate|decode steps, ms" "$out/sweep.log"
left=$((575 - SECONDS)); [ $left -gt 90 ] && t06_workload t06_$sha $left "$sha"
cd "$out" && tar czf "${TAG:-s47a}_${kind:-gpu}_$sha.tgz" ./*.log ./*.json ./*.png 2>/dev/null && rm -f ./*.log ./*.json; ls
