#!/usr/bin/env bash
# Prepared in the twenty-fourth session (not run yet; issue 19): does the down GEMV's occupancy
# cost the q|k|v GEMV its PDL overlap? (benchmarks/RESULTS.md, twenty-fourth session: at one row
# the down GEMV's pick is 1,024 programs of 8 warps, 97% of the warp slots, and the q|k|v GEMV
# after it is the only one slower in the step than alone.) One warm-up sweep tunes and pins the
# table (ENGINESPEC_SKINNY_TABLE); table_variant.py then writes copies whose one-row down pick
# (1 x 1024 x 3072, residual) is 4 warps (w4), 2 rows a program on 4 warps (n2w4) or 4 rows a
# program on 8 warps (n4w8: the 2-row pick); two interleaved rounds of the batch-1 sweep with
# LLM.generate on each table; then the slot profile (sweep_profile.slot_table) on tuned and n2w4.
#   bash benchmarks/gpu_round25a.sh SHA    # ~7 min on a cold machine; nothing to carry
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
tables=/tmp/tables; mkdir -p $tables; rm -f $tables/*.json
ENGINESPEC_SKINNY_TABLE=$tables/tuned.json timeout 240 python3 benchmarks/decode_sweep.py --batches 1 \
  --latency-tokens 0 --out $out/warm.json > $out/warm.log 2>&1
echo "warm-up sweep (tunes and pins the table) rc=$?"; rm -f $out/warm.json $out/warm.png
down=1,1024,3072,residual
python3 benchmarks/table_variant.py $tables/tuned.json $tables/w4.json --set "$down=num_warps:4"
python3 benchmarks/table_variant.py $tables/tuned.json $tables/n2w4.json --set "$down=block_n:2,num_warps:4"
python3 benchmarks/table_variant.py $tables/tuned.json $tables/n4w8.json --set "$down=block_n:4,num_warps:8"
for round in 1 2; do
  for t in tuned w4 n2w4 n4w8; do
    ENGINESPEC_SKINNY_TABLE=$tables/$t.json timeout 120 python3 benchmarks/decode_sweep.py --git-commit $S \
      --batches 1 --out $out/sweep_${t}_r${round}_h200_$S.json > $out/sweep_${t}_r$round.log 2>&1
    echo "$t round $round rc=$?"; grep -E "^\| [0-9]|LLM.generate" $out/sweep_${t}_r$round.log
  done
done
for t in tuned n2w4; do
  ENGINESPEC_SKINNY_TABLE=$tables/$t.json timeout 100 python3 benchmarks/decode_sweep.py --git-commit $S \
    --batches 1 --latency-tokens 0 --profile --out $out/prof_${t}_h200_$S.json > $out/prof_$t.log 2>&1
  echo "profile $t rc=$?"; python3 -m benchmarks.sweep_profile $out/prof_${t}_h200_$S.json | tail -5
done
cp $tables/*.json $out/
cd $out && rm -f *.png && tar czf s25a_$S.tgz *.json *.log && find . -maxdepth 1 -type f ! -name "s25a_*" -delete; ls $out
