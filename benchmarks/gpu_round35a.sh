#!/usr/bin/env bash
# The thirty-fifth session's first device call (about 5-6 min): what the thirty-fourth session
# changed after its CUDA suite, on CUDA with the fast impl (the two tests whose environment it
# fixed, and the vLLM-style logprob outputs: Logprob ranks counted on the device, cumulative
# logprob, num_cached_tokens; the thirty-fifth session's AsyncLLM, output_kind and the engine
# client's new fields), then torch.profiler over the t 0.6 workload's own prefill steps
# (`host_phases --torch-profile-prefill`), to set against prefill_profile.py's isolated step.
# One tar back: s35a_h200_SHA.tgz.   bash benchmarks/gpu_round35a.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
timeout 300 python3 -m pytest -p enginespec.conformance.plugin --impl=fast -q -rfEs -p no:cacheprovider \
  tests/test_mutation_tool.py tests/benchmarks/test_harness.py tests/sample/test_device_sampler.py \
  tests/sample/test_sampler.py tests/api/test_outputs.py conformance/test_engine.py \
  conformance/test_async_scheduling.py conformance/test_vllm_params.py conformance/test_spec_draft_model.py \
  tests/api/test_async_llm.py tests/entrypoints/test_engine_client.py tests/entrypoints/test_usage_details.py \
  > "$out/pytest_$sha.log" 2>&1
echo "tests rc=$? after ${SECONDS}s"; tail -4 "$out/pytest_$sha.log"
timeout 200 python3 -m benchmarks.host_phases --temperature 0.6 \
  --torch-profile-prefill "$out/prefill_torch.txt" > "$out/hp_torch.log" 2>&1
echo "torch-profile rc=$? after ${SECONDS}s"; grep -E "^wall|prefill|profiled" "$out/hp_torch.log"
head -40 "$out/prefill_torch.txt" 2>/dev/null | cut -c1-60,100-200
cd "$out" && tar czf "s35a_h200_$sha.tgz" ./*.log ./*.txt 2>/dev/null && rm -f ./*.log ./*.txt; ls
