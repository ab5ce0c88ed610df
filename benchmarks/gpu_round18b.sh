#!/usr/bin/env bash
# Device call of the eighteenth session (issue 19): the one-launch decode attention's config at
# 2-64 rows (benchmarks/decode_attention_probe.py: a grid of tile x splits x stages against the
# graph's config, in isolation), then each of AB_BATCHES (default 4,16) end to end: the decode
# sweep with the probe's best 517-token config for that batch (ENGINESPEC_DECODE_ATTN, applied to
# every bucket up to it) against this tree's default, one skinny GEMM table for every sweep.
# Usage (device machine, repo root): bash benchmarks/gpu_round18b.sh SHA
set -u
sha=${1:?commit}
ab=${AB_BATCHES:-4,16}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
export ENGINESPEC_SKINNY_TABLE=/tmp/skinny_table_18b.json
probe="$out/decode_attention_probe_h200_$sha.json"
timeout "${PROBE_TIMEOUT:-300}" python3 benchmarks/decode_attention_probe.py --out "$probe" \
  --batches "${PROBE_BATCHES:-2,4,8,16,32,64}" --contexts "${PROBE_CONTEXTS:-517,2048}" > "$out/probe.log" 2>&1
echo "probe rc=$? at ${SECONDS}s"; cat "$out/probe.log" | grep "^b="
best() {  # best BATCH: the probe's fastest 517-token config for BATCH as an override string
  python3 - "$probe" "$1" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r["batch"] == int(sys.argv[2]) and r["context"] == 517]
b = rows[0]["best"]
print(f"tile={b['tile']},splits={b['num_splits']},stages={b['num_stages']},preload=0,max_rows={sys.argv[2]}")
PY
}
sweep() {  # sweep NAME BATCHES [ENV...]
  local name=$1 batches=$2; shift 2
  env "$@" timeout 120 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches "$batches" --latency-tokens 0 \
    --out "$out/sweep_${name}_h200_$sha.json" > "$out/sweep_$name.log" 2>&1
  echo "sweep $name ($*) rc=$? at ${SECONDS}s"; grep -E "^\| [0-9]" "$out/sweep_$name.log"
}
sweep head "$ab"
for b in ${ab//,/ }; do
  cfg=$(best "$b") || continue
  sweep "best$b" "$b" ENGINESPEC_DECODE_ATTN="$cfg"
done
[ "${ROUND2:-1}" = 1 ] && sweep head_r2 "$ab"
cd "$out" && tar czf s18b_h200_"$sha".tgz ./*.log ./*.json 2>/dev/null && rm -f ./*.log ./*.json; ls
