#!/usr/bin/env bash
# Device call A for the next round (written 2026-12-01, fifth session, not yet run): the figures
# of the fifth session's changes that its device time did not cover. With skinny_gemm on by
# default (rows 1-8), the host's phase spans free, and apply_patch's slice path:
# - the 0.6B decode sweep by batch size, each row with the host's wait (near zero: the host set
#   the pace) and the step's decode graph alone, replayed back to back (the decoder's own GPU
#   time), and its batch-1 profile;
# - batch 1 at the LLM's default max_num_seqs, on cold caches: startup by phase, host phases,
#   the decode graph alone, LLM.generate ms/token, and cProfile's ranking of the host's functions; then the
#   same with ENGINESPEC_EAGER_FUSED=1 (the fused path's rows 1-8 uncompiled: two fewer dynamo
#   graphs at startup, a few unfused glue kernels a step; worker/compiled.py) as the A/B that
#   decides whether it becomes the default;
# - the 8B shape at batch 1 (target: at most 1.25x its weight floor);
# - temperature 0.6 end to end, first call and warm (issue 16: at most 1.3x the floor).
# At most eight files come back: keep the list below at eight.
# Usage (device machine, repo root): bash benchmarks/gpu_round6a.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
cold() { TRITON_CACHE_DIR=$(mktemp -d) TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) "$@"; }
cold timeout 110 python3 benchmarks/step_anatomy.py --git-commit "$sha" --batch 1 --engine-arg max_num_seqs=256 \
  --generate-tokens 128 --cprofile "$out/cprofile_b1.txt" --out "$out/anatomy_b1.json" > "$out/anatomy.log" 2>&1
echo "anatomy rc=$?"; grep -E "^batch|^startup|^weight" "$out/anatomy.log"
ENGINESPEC_EAGER_FUSED=1 cold timeout 110 python3 benchmarks/step_anatomy.py --git-commit "$sha" --batch 1 \
  --engine-arg max_num_seqs=256 --generate-tokens 128 --out "$out/anatomy_b1_eager.json" >> "$out/anatomy.log" 2>&1
echo "anatomy eager-fused rc=$?"; grep -E "^batch|^startup|^weight" "$out/anatomy.log" | tail -4
timeout 170 python3 benchmarks/decode_sweep.py --git-commit "$sha" --out "$out/sweep.json" --profile \
  > "$out/sweep.log" 2>&1; echo "sweep rc=$?"; grep -E "^\||batch-1" "$out/sweep.log" | head -14
timeout 150 python3 benchmarks/step_anatomy.py --git-commit "$sha" --shape qwen3-8b --batch 1 \
  --engine-arg max_num_seqs=256 --generate-tokens 64 --out "$out/anatomy_8b.json" >> "$out/anatomy.log" 2>&1
echo "anatomy 8b rc=$?"; grep -E "^batch|^startup|^weight" "$out/anatomy.log" | tail -4
c="--impl fast --git-commit $sha --repeat 3 --first-call --skip-hf --skip-big --skip-latency --skip-profile"
timeout 110 python3 benchmarks/throughput.py $c --temperature 0.6 --out "$out/t06.json" > "$out/t06.log" 2>&1
echo "t06 rc=$?"; grep -iE "floor|wall|first" "$out/t06.log" | grep -v "it/s" | tail -6
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log sweep.png; ls
