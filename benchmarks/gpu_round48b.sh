#!/usr/bin/env bash
# The forty-eighth session's short call (device time nearly spent by refused starts): first the
# warp_k GEMV A/B at 2, 4 and 8 rows (the default tuning against ENGINESPEC_GEMV_TUNE_ROWS=8 with
# ENGINESPEC_GEMV_WARP_K=1, one round, fresh processes), then the CUDA tests of the session's
# changes, then sampler_memory_probe.py, each while DEADLINE (default 400 s) allows.
#   bash benchmarks/gpu_round48b.sh SHA
# (Measured at 632add1. The warp_k GEMV was dropped in 61652fe: on later commits ENGINESPEC_GEMV_WARP_K
# is read by nothing and the r8wk arm is the one-tile GEMV offered up to 8 rows alone.)
set -u
sha=${1:?commit}
deadline=${DEADLINE:-400}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind)
echo "device ${kind:-unknown}"; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for arm in r4 r8wk; do
  rows=${arm:1:1}; wk=0; [ "$arm" = r8wk ] && wk=1
  ENGINESPEC_GEMV_TUNE_ROWS=$rows ENGINESPEC_GEMV_WARP_K=$wk timeout 150 \
    python3 benchmarks/decode_sweep.py --git-commit "$sha" --steps 30 --latency-tokens 0 --batches 2,4,8 \
    --out "$out/gemv_ab_${arm}_1.json" > "$out/gemv_ab_${arm}_1.log" 2>&1
  echo "gemv $arm rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]" "$out/gemv_ab_${arm}_1.log"
done
python3 - "$out" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/gemv_ab_*_1.json")):
    d = json.load(open(f))
    for c in d.get("skinny_gemm", {}).get("choices", []):
        if c["rows"] in (2, 4, 8):
            print(f.rsplit("/", 1)[1], c["rows"], c["n"], c["k"], c["variant"], c["choice"][13:100], round(c["us"], 2))
PY
left=$((deadline - SECONDS))
if [ $left -gt 60 ]; then
  args=(-p enginespec.conformance.plugin -p no:cacheprovider --impl=fast -rfEs -o cache_dir=/tmp/pytest_cache)
  # shellcheck disable=SC2086  # TEST_PATHS is a list of paths
  timeout $((left < 110 ? left - 10 : 100)) python3 -m pytest "${args[@]}" -v -n 6 --dist loadfile $TEST_PATHS \
    > "$out/pytest_v_$sha.log" 2>&1
  echo "tests rc=$? after ${SECONDS}s"; grep -E " (FAILED|ERROR) " "$out/pytest_v_$sha.log" | head -20
  grep -cE " PASSED " "$out/pytest_v_$sha.log"; tail -2 "$out/pytest_v_$sha.log"
fi
left=$((deadline - SECONDS))
if [ $left -gt 60 ]; then
  timeout $((left - 5)) python3 benchmarks/sampler_memory_probe.py --rows 256 --out "$out/sampler_memory_$sha.json" \
    > "$out/sampler_memory.log" 2>&1
  echo "sampler memory rc=$? after ${SECONDS}s"; grep -E "^\||profile run" "$out/sampler_memory.log"; tail -3 "$out/sampler_memory.log"
fi
cd "$out" && tar czf "s48b_${kind:-gpu}_$sha.tgz" ./*.log ./*.json 2>/dev/null && rm -f ./*.log ./*.json; ls
