#!/usr/bin/env bash
# Device calls prepared in the eleventh session for the next one (issues 19 and 16): do 8 warps
# pay for decode attention (never timed) and for prefill (its 4-warp blocks spill, by
# kernel_resources.py), and does the one-launch decode attention lose at 128 and 256 rows?
#   part "a": benchmarks/kernel_resources.py under the device's triton (registers and spills
#             of each config, to check the CPU's reading), then attention_split_probe.py with 4
#             and 8 warps;
#   part "b": the decode sweep (1-256 rows, two interleaved rounds) on this tree and on a
#             variant made here, "fused_all" (FastAttention.fused_decode_max_rows without its
#             bound), and with WARPS8=1 also "warps8" (paged_attention.DECODE_WARPS = 8), via
#             gpu_round11a.sh.
#   part "c": issue 16's 256-request workload (temperature 0.6, three runs) on this tree and on
#             a variant "prefill8" (paged_attention.PREFILL_WARPS = 8), two interleaved rounds.
# Usage (device machine, repo root): bash benchmarks/gpu_round12a.sh SHA a|b|c
set -u
sha=${1:?commit}; part=${2:?a, b or c}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
if [ "$part" = a ]; then
  python3 benchmarks/kernel_resources.py --json "$out/kernel_resources_h200_$sha.json" 2>&1 | grep -v -i warn
  timeout 420 python3 benchmarks/attention_split_probe.py --batches 1,4,16,64 --contexts 512,2048 --warps 4,8 \
    --out "$out/attention_probe_h200_$sha.json" > "$out/probe.log" 2>&1
  echo "probe rc=$?"; grep "^b=" "$out/probe.log"
  exit 0
fi
mk() {  # mk NAME FILE SED: a variant of FILE, edited by SED, in .dev_carry/variants/NAME
  mkdir -p ".dev_carry/variants/$1/files/$(dirname "$2")" && echo "$sha-$1" > ".dev_carry/variants/$1/SHA"
  sed "$3" "$2" > ".dev_carry/variants/$1/files/$2" || { echo "variant $1: sed failed"; exit 1; }
  if cmp -s "$2" ".dev_carry/variants/$1/files/$2"; then echo "variant $1: the edit changed nothing"; exit 1; fi
}
rm -rf .dev_carry/variants
if [ "$part" = c ]; then
  mk prefill8 kernels/paged_attention.py 's/^PREFILL_WARPS = 4$/PREFILL_WARPS = 8/'
  head_tree=$(mktemp -d); cp -r kernels "$head_tree"/
  c="--impl fast --repeat 3 --skip-hf --skip-big --skip-latency --skip-profile --temperature 0.6"
  for round in 1 2; do
    for name in head prefill8; do
      rm -rf kernels && cp -r "$head_tree"/kernels .
      [ "$name" = head ] || cp -r ".dev_carry/variants/$name/files/." .
      gpu_setup || exit 1
      timeout 125 python3 benchmarks/throughput.py $c --git-commit "$sha-$name" \
        --out "$out/throughput_t06_${name}_r${round}_h200_$sha.json" > "$out/t06_${name}_r$round.log" 2>&1
      echo "$name round $round rc=$?"; grep -iE "floor|wall" "$out/t06_${name}_r$round.log" | grep -v "it/s" | tail -3
    done
  done
  cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls; exit 0
fi
if [ "${WARPS8:-0}" = 1 ]; then mk warps8 kernels/paged_attention.py 's/^DECODE_WARPS = 4$/DECODE_WARPS = 8/'; fi
mk fused_all impls/fast/attention.py 's/^    fused_decode_max_rows = 64$/    fused_decode_max_rows = 1 << 30/'
TESTS=0 BATCHES=1,4,16,64,128,256 bash benchmarks/gpu_round11a.sh "$sha"
