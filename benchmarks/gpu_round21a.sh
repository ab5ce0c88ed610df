# Twenty-first session, call 1: where the 256-request workload's excess goes outside small
# decodes (issue 16): a prefill step by kernel, a 256-row decode step by kernel, and the paged
# decode attention's configs at 128-256 rows (tiles, stages, warps, splits) against the copy rate.
#   bash benchmarks/gpu_round21a.sh SHA
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 240 python3 benchmarks/prefill_profile.py --git-commit $S --out $out/prefill_$S.json > $out/prefill.log 2>&1
echo "prefill rc=$?"; grep -v "^USDT\|Warning\|warn" $out/prefill.log | tail -45
timeout 200 python3 benchmarks/decode_sweep.py --git-commit $S --batches 128,256 --prompt-len 1024 --latency-tokens 0 \
  --profile --profile-batch 256 --profile-steps 10 --out $out/sweep256_$S.json > $out/sweep256.log 2>&1
echo "sweep rc=$?"; grep -v "^USDT" $out/sweep256.log | tail -40
timeout ${PROBE_TIMEOUT:-240} python3 benchmarks/attention_split_probe.py --out $out/probe_big_$S.json --batches 128,256 \
  --contexts 512,1024,2048 --tiles 32,64,128 --stages 2,3,4 --warps 4,8 --splits 1,2 > $out/probe.log 2>&1
echo "probe rc=$?"; grep "^b=" $out/probe.log
python3 - $out/probe_big_$S.json <<'PY'
import json, sys
try:
    rows = json.load(open(sys.argv[1]))["rows"]
except Exception as e:
    sys.exit(f"no probe json: {e}")
for r in rows:
    top = sorted(r["all"], key=lambda a: a["us"])[:6]
    print(r["batch"], r["context"], f"graph {r['graph_us']:.1f} us ({r['graph']})", " | ".join(
        f"t{a['tile']} s{a['splits']} w{a['warps']} st{a['stages']} {a['us']:.1f}" for a in top))
PY
cd $out && tar czf s21a_$S.tgz *.json *.log *.txt 2>/dev/null; ls -la $out | head
