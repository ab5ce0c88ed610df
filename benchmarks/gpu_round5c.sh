#!/usr/bin/env bash
# Device call C of 2026-12-01 (fifth session). Call B found batch 1 bound by the GPU with
# max_num_seqs=1 (1.46 ms/step cuBLAS, 1.05 with the one-tile GEMV), while decode_sweep (one LLM
# with max_num_seqs 64-256) and LLM.generate saw ~1.4-1.6 ms either way. Here batch 1 at the
# LLM's default max_num_seqs (256), default and skinny_gemm=true, with cProfile's host ranking.
# Usage (device machine, repo root): bash benchmarks/gpu_round5c.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
for v in default skinny; do
  extra=(); [ "$v" = skinny ] && extra=(--engine-arg skinny_gemm=true)
  timeout 200 python3 benchmarks/step_anatomy.py --git-commit "$sha" --batch 1 --engine-arg max_num_seqs=256 \
    "${extra[@]}" --out "$out/anatomy_$v.json" --cprofile "$out/cprofile_$v.txt" > "$out/anatomy_$v.log" 2>&1
  echo "anatomy $v rc=$?"; grep -E "^batch" "$out/anatomy_$v.log"
  head -45 "$out/cprofile_$v.txt" | tail -38 | cut -c1-160
done
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
