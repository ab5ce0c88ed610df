#!/usr/bin/env bash
# The forty-eighth session's first call (about 9.5 min): the CUDA tests of what changed since
# the forty-seventh session's last device call (1f18822: the sampler's truncation tests, the
# runner's profile figures, the sampler memory probe), then sampler_memory_probe.py (does the KV
# sizing's profile run cover a served step's sampler tables?), then the decode sweep 1-256 rows
# with its PNG (issue 19's table) and the t 0.6 workload in the time left on an H200, or on an
# H100 the A/B of one-tile GEMV shapes offered at 8 rows (gemv_rows_ab). One tar back:
# s48a_KIND_SHA.tgz.
#   bash benchmarks/gpu_round48a.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind)
echo "device ${kind:-unknown}"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
tests=${TEST_PATHS:-tests/sample/test_device_sampler.py tests/benchmarks/test_sampler_memory_probe.py tests/worker/test_pool_memory.py}
args=(-p enginespec.conformance.plugin -p no:cacheprovider --impl=fast -rfEs -o cache_dir=/tmp/pytest_cache)
# shellcheck disable=SC2086  # TEST_PATHS is a list of paths
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest "${args[@]}" -v -n "${XDIST:-6}" --dist loadfile \
  $tests > "$out/pytest_v_$sha.log" 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E " (FAILED|ERROR) " "$out/pytest_v_$sha.log" | head -20
grep -cE " PASSED " "$out/pytest_v_$sha.log"; tail -2 "$out/pytest_v_$sha.log"
timeout 100 python3 benchmarks/sampler_memory_probe.py --rows 256 --out "$out/sampler_memory_$sha.json" \
  > "$out/sampler_memory.log" 2>&1
echo "sampler memory rc=$? after ${SECONDS}s"; grep -E "^\||profile run" "$out/sampler_memory.log"; tail -3 "$out/sampler_memory.log"
if [ "$kind" = h200 ]; then  # issue 19's H200 figures are the thirty-ninth session's: the sweep and workload
  timeout 230 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1,2,4,8,16,32,64,128,256 \
    --out "$out/decode_sweep_${kind}_$sha.json" > "$out/sweep.log" 2>&1
  echo "sweep rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate|decode steps, ms" "$out/sweep.log"
  left=$((${DEADLINE:-575} - SECONDS)); [ $left -gt 90 ] && t06_workload t06_$sha $left "$sha"
else  # an H100 (its sweep and workload unchanged since c8a2b88): the one-tile GEMV at 8 rows, A/B
  gemv_rows_ab "$sha" "${DEADLINE:-570}"
fi
cd "$out" && tar czf "${TAG:-s48a}_${kind:-gpu}_$sha.tgz" ./*.log ./*.json ./*.png 2>/dev/null && rm -f ./*.log ./*.json; ls
