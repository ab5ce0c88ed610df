#!/usr/bin/env bash
# The forty-fourth session's probe call: where 4, 8 and 16-row decode steps go on the current
# code (8 rows is the sweep's worst ratio on both cards: 2.34x on H100s, 2.89x on the H200), each
# profiled by kernel (decode_sweep.py --profile, then sweep_profile's top kernels and slots); the
# 8-row step under three decode attention configs (ENGINESPEC_DECODE_ATTN, 8 rows only); then
# which C code resets CPython's "uncaught KeyboardInterrupt" flag at exit once an LLM is built
# (cuda-gdb breaks on PyRun_*: the forty-third session saw exit 1 where Python dies of SIGINT).
#   bash benchmarks/gpu_round44a.sh SHA      # one tar back: s44a_KIND_SHA.tgz
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind); echo "device ${kind:-unknown}"
for b in ${BATCHES:-8 4 16}; do
  timeout 120 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches "$b" --latency-tokens 0 \
    --profile --profile-batch "$b" --out "$out/prof_${b}.json" > "$out/prof_${b}.log" 2>&1
  echo "== $b rows rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]" "$out/prof_${b}.log"
  python3 -m benchmarks.sweep_profile "$out/prof_${b}.json" 2>&1 | head -40
done
i=0
for cfg in "balance=0,min_rows=8,max_rows=8" "splits=8,balance=0,min_rows=8,max_rows=8" \
           "tile=64,splits=16,balance=0,min_rows=8,max_rows=8"; do
  i=$((i + 1))
  ENGINESPEC_DECODE_ATTN=$cfg timeout 90 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 8 \
    --latency-tokens 0 --out "$out/ab8_$i.json" > "$out/ab8_$i.log" 2>&1
  echo "== 8 rows, $cfg: rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]" "$out/ab8_$i.log"
done
if command -v cuda-gdb >/dev/null && [ $SECONDS -lt 420 ]; then
  d=$(mktemp -d)
  python3 -c "from enginespec.testing.checkpoints import make_checkpoint; make_checkpoint('qwen3', '$d/qwen3')" 2>/dev/null
  printf 'from enginespec import LLM\nif __name__ == "__main__":\n    llm = LLM("%s/qwen3", impl="fast", device="cpu", dtype="float32")\n    raise KeyboardInterrupt\n' "$d" > "$d/p.py"
  printf 'set pagination off\nset breakpoint pending on\nrbreak ^PyRun_\ncommands\nsilent\nbt 25\ncontinue\nend\nrun\n' > "$d/gdb.cmd"
  timeout $((560 - SECONDS)) cuda-gdb -batch -x "$d/gdb.cmd" --args python3 "$d/p.py" > "$out/pyrun_gdb.log" 2>&1
  echo "cuda-gdb rc=$? after ${SECONDS}s"; grep -E "^#|exited|Breakpoint [0-9]+," "$out/pyrun_gdb.log" | grep -v "^#[0-9]* *0x.* in ?? " | head -60
fi
cd "$out" && tar czf "s44a_${kind:-gpu}_$sha.tgz" ./*.log ./*.json 2>/dev/null && rm -f ./*.log ./*.json; ls
