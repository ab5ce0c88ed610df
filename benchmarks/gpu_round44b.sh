#!/usr/bin/env bash
# The forty-fourth session's second call: the plain decode graphs of 8-16 rows captured with no
# launch balanced (their balanced twins replayed for spread contexts), A/B in one tree through
# ENGINESPEC_BALANCED_GRAPHS (0: no twins, the plain graphs balanced as before), at one
# 517-token context and at contexts uniform in 100-2,048, ROUNDS interleaved rounds; the CUDA
# tests of what changed; then which code imports or execs at shutdown after an uncaught
# KeyboardInterrupt once an LLM is built (audit hook: the exit status question).
#   bash benchmarks/gpu_round44b.sh SHA      # one tar back: s44b_KIND_SHA.tgz
set -u
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(gpu_kind); echo "device ${kind:-unknown}"
# TEST_PATHS and TEST_TIMEOUT (170 s) change the tests; AUDIT=0 skips the shutdown probe
# shellcheck disable=SC2086  # TEST_PATHS is a list
timeout "${TEST_TIMEOUT:-170}" python3 -m pytest -p enginespec.conformance.plugin -p no:cacheprovider --impl=fast -q -rfEs \
  ${TEST_PATHS:-tests/worker/test_cuda_graphs.py tests/kernels/test_decode_attention.py conformance/test_vllm_params.py} \
  > "$out/pytest_$sha.log" 2>&1
echo "tests rc=$? after ${SECONDS}s"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest_$sha.log" | tail -8
for r in $(seq 1 "${ROUNDS:-2}"); do
  for ctx in one mixed; do
    args="--prompt-len 517"; [ $ctx = mixed ] && args="--prompt-len 100 --max-prompt-len 2048"
    for bg in 1 0; do
      # shellcheck disable=SC2086  # args is a list
      ENGINESPEC_BALANCED_GRAPHS=$bg timeout 100 python3 benchmarks/decode_sweep.py --git-commit "$sha" \
        --batches 8,16 --latency-tokens 0 $args --out "$out/ab_${ctx}_bg${bg}_$r.json" > "$out/ab_${ctx}_bg${bg}_$r.log" 2>&1
      echo "round $r, $ctx context(s), BALANCED_GRAPHS=$bg: rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]" "$out/ab_${ctx}_bg${bg}_$r.log"
    done
  done
done
[ "${AUDIT:-1}" = 0 ] && { cd "$out" && tar czf "s44b_${kind:-gpu}_$sha.tgz" ./*.log ./*.json 2>/dev/null; exit 0; }
d=$(mktemp -d)
python3 -c "from enginespec.testing.checkpoints import make_checkpoint; make_checkpoint('qwen3', '$d/qwen3')" 2>/dev/null
cat > "$d/p.py" <<PY
import sys, traceback
from enginespec import LLM
state = {"on": False}
def hook(event, args):
    if state["on"] and event in ("import", "exec", "compile"):
        print("AUDIT", event, repr(args)[:150], file=sys.stderr)
        traceback.print_stack(limit=8, file=sys.stderr)
sys.addaudithook(hook)
if __name__ == "__main__":
    llm = LLM("$d/qwen3", impl="fast", device="cpu", dtype="float32")
    import atexit
    print("atexit callbacks", atexit._ncallbacks(), file=sys.stderr)
    state["on"] = True
    raise KeyboardInterrupt
PY
timeout 120 python3 "$d/p.py" > "$out/audit.out" 2> "$out/audit.err"; echo "audit probe exit $?"
grep -E "^AUDIT|atexit callbacks" "$out/audit.err" | cut -c1-200 | head -40
grep -B1 -A16 "^AUDIT exec\|^AUDIT compile" "$out/audit.err" | head -60
cd "$out" && tar czf "s44b_${kind:-gpu}_$sha.tgz" ./*.log ./*.json ./*.out ./*.err 2>/dev/null && rm -f ./*.log ./*.json ./*.out ./*.err ./*.png; ls
