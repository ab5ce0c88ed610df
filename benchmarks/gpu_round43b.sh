#!/usr/bin/env bash
# The forty-third session's second call: why the TP Ctrl-C test's script exits 1 on the device
# (sigint_exit_probe.sh; at 7a87aae the TP test script's variants of its uncaught raise, since
# removed; an LLM built, then a KeyboardInterrupt raised by hand, with and without TP), then the
# README's scripts after the request-log test in one process (the cached-memory release), then,
# on an H200 only, the decode sweep.
#   bash benchmarks/gpu_round43b.sh SHA      # carry .whl
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind); echo "device ${kind:-unknown}"
bash benchmarks/sigint_exit_probe.sh 2>&1 | tee "$out/sigint_probe.log"  # (7a87aae ran tp_sigint_probe.py here)
d=$(mktemp -d)
python3 -c "from enginespec.testing.checkpoints import make_checkpoint; make_checkpoint('qwen3', '$d/qwen3')" 2>/dev/null
by_hand() {  # LLM kwargs, a statement, then `raise KeyboardInterrupt` at the top level
  printf 'from enginespec import LLM, SamplingParams\nif __name__ == "__main__":\n    llm = LLM("%s/qwen3", %s)\n    %s\n    raise KeyboardInterrupt\n' \
    "$d" "$1" "$2" > "$d/p.py"
  timeout 120 python3 "$d/p.py" > "$d/o" 2> "$d/e"; echo "by hand [$1 | $2]: exit $?"
}
cpu='impl="fast", device="cpu", dtype="float32"'
by_hand "$cpu, tensor_parallel_size=2" pass
by_hand "$cpu, tensor_parallel_size=2" 'llm.generate([[5, 6]], SamplingParams(max_tokens=4))'
echo "probes done after ${SECONDS}s"
timeout $((400 - SECONDS)) python3 -m pytest -p enginespec.conformance.plugin -p no:cacheprovider --impl=fast -q -rfEs \
  tests/entrypoints/test_request_log.py tests/test_readme.py > "$out/pytest_$sha.log" 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest_$sha.log" | tail -8
if [ "$kind" = h200 ] && [ $SECONDS -lt 340 ]; then
  timeout 230 python3 benchmarks/decode_sweep.py --git-commit "$sha" --batches 1,2,4,8,16,32,64,128,256 \
    --out "$out/decode_sweep_${kind}_$sha.json" > "$out/sweep.log" 2>&1
  echo "sweep rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate|decode steps, ms" "$out/sweep.log"
fi
cd "$out" && tar czf "${TAG:-s43c}_${kind:-gpu}_$sha.tgz" ./*.log ./*.json ./*.png 2>/dev/null && rm -f ./*.log ./*.json; ls
