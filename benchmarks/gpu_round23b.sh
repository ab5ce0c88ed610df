# Twenty-third session, call 2 (issue 19): the decode attention asking L2 for more of its keys
# before its PDL wait (LaunchConfig.prefetch_tiles; variants pf0, pf2, pf4 in .dev_carry: ENV only),
# by phase (decode_attention_phases.py at 4 and 16 rows) and in the step (4, 8, 16 rows, two
# interleaved rounds, one skinny table for every tree), no tests (a prefetch is a hint: it changes no value).
#   bash benchmarks/gpu_round23b.sh SHA    # carry .dev_carry
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
for pf in 0 1 4; do
  ENGINESPEC_DECODE_ATTN=prefetch=$pf timeout 100 python3 benchmarks/decode_attention_phases.py $out/phases_pf${pf}_$S.json \
    --batches 4,16 --contexts 517,2048 > $out/phases_pf$pf.log 2>&1
  echo "phases prefetch=$pf rc=$?"
  python3 - $out/phases_pf${pf}_$S.json <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["batch"], r["context"], "span", r["span"], "program", r["program_us"], "0-1", r["0-1"], "1-2", r["1-2"], "4-5", r["4-5"])
PY
done
TESTS=0 PIN_TABLE=1 WARM=1 ROUNDS=2 BATCHES=4,8,16 \
  SWEEP_TIMEOUT=150 bash benchmarks/gpu_round11a.sh $S
cd $out && tar czf s23b_$S.tgz *.json *.log *.tgz 2>/dev/null && find . -maxdepth 1 -type f ! -name "s23b_*" -delete; ls $out
