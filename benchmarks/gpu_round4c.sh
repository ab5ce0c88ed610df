#!/usr/bin/env bash
# Device call C of 2026-12-01 (fourth session): the server at half rate with threshold 128 and
# mixed graphs reading 8-token query blocks up to 512 tokens; temperature 0.6 end to end; a cold
# start with the Triton JIT hook on from construction; the Qwen3-8B shape at chat settings.
# Usage (device machine, repo root, server wheels in .whl/): bash benchmarks/gpu_round4c.sh SHA
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
cold_first_call first_call --hook-startup
serve_at half_t128_q8 21.4 --serve-arg=--long-prefill-token-threshold=128
c="--impl fast --git-commit $sha --repeat 3 --first-call --skip-hf --skip-big --skip-latency --skip-profile"
timeout 100 python3 benchmarks/throughput.py $c --temperature 0.6 --out "$out/t06.json" > "$out/t06.log" 2>&1; echo "t06 rc=$?"
grep -iE "floor|wall|first" "$out/t06.log" | grep -v "it/s" | tail -6
timeout 230 python3 benchmarks/throughput.py $c --shape qwen3-8b --chat --out "$out/chat_8b.json" > "$out/chat_8b.log" 2>&1; echo "8b rc=$?"
grep -iE "floor|wall|first|startup" "$out/chat_8b.log" | grep -v "it/s" | tail -8
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log; ls
