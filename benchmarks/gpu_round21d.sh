# Twenty-first session, call 3 (issue 16): a prefill step's host syncs and host profile, the
# temperature-0.6 workload (first call, warm runs, decode profile), what compiles in a first call.
#   bash benchmarks/gpu_round21d.sh SHA
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
timeout 200 python3 benchmarks/prefill_profile.py --git-commit $S --profile-steps 1 --host-probe --out $out/prefill_$S.json > $out/prefill.log 2>&1
echo "prefill rc=$?"; grep -v "^USDT" $out/prefill.log | grep -B2 -A40 "host syncs" | head -80; grep -E "tokens  |total" $out/prefill.log
grep -A45 "# cProfile" $out/prefill_$S.host.txt | cut -c1-150 | tail -38
timeout 200 python3 benchmarks/throughput.py --impl fast --git-commit $S --repeat 3 --first-call --skip-hf --skip-big \
  --skip-latency --temperature 0.6 --out $out/t06_$S.json > $out/t06.log 2>&1
echo "t06 rc=$?"
python3 - $out/t06_$S.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); s = d["summary"]; e = d["engine"]
print({k: s[k] for k in ("wall_s", "floor_s", "wall_over_floor", "first_over_warm", "startup_s", "runs_wall_over_floor")})
for r in e.get("by_step_kind", []): print(r)
PY
timeout 150 python3 benchmarks/first_call_compiles.py --temperature 0.6 --out $out/first_call_$S.json > $out/first_call.log 2>&1
echo "first_call rc=$?"; grep -v "^USDT" $out/first_call.log | tail -40
cd $out && tar czf s21d_$S.tgz *.json *.log *.txt 2>/dev/null; ls $out
