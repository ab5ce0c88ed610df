# Twenty-second session, call 4 (issue 16): the workload's prompt steps as generate() runs them
# (unsynced), alone and with the decodes of finished prompts mixed in, each with the first 9
# steps profiled by kernel (device busy against wall).
#   bash benchmarks/gpu_round22d.sh SHA
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
for n in 1 128; do
  timeout 200 python3 benchmarks/prefill_profile.py --git-commit $S --unsynced --output-len $n --profile-steps 9 \
    --out $out/prefill_out${n}_$S.json > $out/prefill_out$n.log 2>&1
  echo "output-len $n rc=$?"; grep -v "^USDT" $out/prefill_out$n.log | grep -E "tokens  " | head -14
  grep -E "^total|profiled" $out/prefill_out$n.log; grep -E "^ +[0-9.]+ us" $out/prefill_out$n.log | head -14
done
cd $out && tar czf s22d_$S.tgz *.json *.log *.txt 2>/dev/null && find . -maxdepth 1 -type f ! -name "*.tgz" -delete; ls $out
