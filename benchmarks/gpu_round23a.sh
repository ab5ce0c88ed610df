# Twenty-third session, call 1 (issue 19): a grid barrier against a PDL kernel boundary
# (persistent_gemv_probe.py: 28 layers of the four batch-1 GEMV phases, one persistent launch
# against 112), where each decode attention program's time goes (decode_attention_phases.py at
# 1, 4 and 16 rows, 517 and 2,048 tokens), then this tree's chains by kernel with PDL on.
#   bash benchmarks/gpu_round23a.sh SHA
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
timeout 120 python3 benchmarks/persistent_gemv_probe.py --out $out/persistent_$S.json > $out/persistent.log 2>&1
echo "persistent rc=$?"; grep -v "^USDT" $out/persistent.log | tail -12
timeout 240 python3 benchmarks/decode_attention_phases.py $out/phases_$S.json --batches 1,4,16 --contexts 517,2048 \
  > $out/phases.log 2>&1
echo "phases rc=$?"; grep -v "^USDT" $out/phases.log | cut -c1-400 | head -80
[ "${PROFILE:-1}" = 1 ] && TESTS=0 ROUNDS=1 BATCHES=1,4,16 PROFILE=1 PROFILE_PDL=1 bash benchmarks/gpu_round11a.sh $S
cd $out && tar czf s23a_$S.tgz *.json *.log *.tgz 2>/dev/null && find . -maxdepth 1 -type f ! -name "s23a_*" -delete; ls $out
