# Twenty-first session, call 2 (issue 16): the temperature-0.6 workload with its decode profile
# (256 rows, t 0.6), what compiles inside a first call on warm caches, the prefill steps' host
# time against their device time, and the sampler's kernels per case.
#   bash benchmarks/gpu_round21b.sh SHA
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
timeout 200 python3 benchmarks/prefill_profile.py --git-commit $S --out $out/prefill_$S.json > $out/prefill.log 2>&1
echo "prefill rc=$?"; grep -E "tokens|total|profiled" $out/prefill.log
timeout 240 python3 benchmarks/throughput.py --impl fast --git-commit $S --repeat 3 --first-call --skip-hf --skip-big \
  --skip-latency --temperature 0.6 --out $out/t06_$S.json > $out/t06.log 2>&1
echo "t06 rc=$?"
python3 - $out/t06_$S.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); s = d["summary"]; e = d["engine"]
print({k: s[k] for k in ("wall_s", "floor_s", "wall_over_floor", "first_over_warm", "startup_s", "runs_wall_over_floor")})
for r in e.get("by_step_kind", []): print(r)
print(json.dumps(d.get("profile", {}), indent=1)[:1200])
PY
head -60 $out/t06_$S.profile.txt 2>/dev/null | cut -c1-60,100-200 | sed -n 40,60p
timeout 150 python3 benchmarks/first_call_compiles.py --temperature 0.6 --out $out/first_call_$S.json > $out/first_call.log 2>&1
echo "first_call rc=$?"; grep -v "^USDT" $out/first_call.log | tail -45
timeout 150 python3 -m benchmarks.host_phases --temperature 0.6 > $out/host_phases.log 2>&1
echo "host_phases rc=$?"; grep -v "^USDT" $out/host_phases.log | tail -12
timeout 120 python3 benchmarks/bench_sampler.py --profile --json $out/sampler_$S.json > $out/sampler.log 2>&1
echo "sampler rc=$?"; tail -60 $out/sampler.log
cd $out && tar czf s21b_$S.tgz *.json *.log *.txt 2>/dev/null; ls $out
