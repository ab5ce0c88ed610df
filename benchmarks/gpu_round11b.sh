#!/usr/bin/env bash
# Device call of 2026-12-02's eleventh session: the suite with the fast impl on CUDA after the
# decode attention's idle-split exit and L2 prefetch (every decode step of the engine takes it):
# conformance, tests/engine, tests/entrypoints, tests/worker, tests/impls and the attention
# kernels' tests (decode, paged, PDL). The sampler and the other kernels did not change.
# Usage (device machine, repo root): bash benchmarks/gpu_round11b.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
plugin=(-p enginespec.conformance.plugin --impl=fast)
dirs=(conformance tests/engine tests/entrypoints tests/worker tests/impls tests/kernels/test_decode_attention.py
      tests/kernels/test_paged_attention.py tests/kernels/test_pdl.py)
log="$out/pytest_fast_h200_$sha.log"
timeout 520 python3 -m pytest -q -p no:cacheprovider "${plugin[@]}" "${dirs[@]}" > "$log" 2>&1
echo "suite rc=$?"; grep -E "^(FAILED|ERROR)" "$log" | head; tail -1 "$log"
gzip -f "$log"; ls "$out"
