#!/usr/bin/env bash
# Device call of the eleventh session: this tree's decode attention against variants of it on
# one machine. First (unless TESTS=0) the CUDA tests of the attention kernels, the backend and
# the graphs on this tree; then the 0.6B sweep (batches 1-64, LLM.generate at batch 1) on this tree and on
# each variant, in ROUNDS interleaved rounds (default 2; batches BATCHES, default 1,4,16,64;
# TEST_FILES replaces the test list; TESTS=all runs it on every tree, TESTS=0 on none; SWEEP_TIMEOUT,
# default 120 s, bounds each sweep: more tuned row buckets compile longer in a tree's first round);
# WARM=1 runs one untimed batch-1 sweep before the timed ones; PIN_TABLE=1 has every sweep take
# the first one's skinny GEMM picks (ENGINESPEC_SKINNY_TABLE: no tuning noise between trees); with PROFILE=1, then this tree's
# per-kernel profile at batch 1 with PDL off (PROFILE_PDL=1: on), and each of PROFILE_VARIANTS' (names).
# A variant is a folder .dev_carry/variants/NAME/ of files to copy over the tree (its commit in
# NAME/SHA; kernels/, impls/, worker/, sample/ and tests/ only: a branch's own tests of its kernels run
# with TESTS=all; a variant may instead or also have NAME/ENV, VAR=value words set for its
# sweep, e.g. ENGINESPEC_SKINNY_MAX_ROWS=32), sent beside the tree with carry [".dev_carry"].
# Usage (device machine, repo root): bash benchmarks/gpu_round11a.sh SHA
set -u
shopt -s nullglob
sha=${1:?commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
head_tree=$(mktemp -d); cp -r kernels impls worker sample tests "$head_tree"/  # every folder a variant may carry
plugin=(-p enginespec.conformance.plugin --impl=fast)
for v in .dev_carry/variants/*/files; do  # restored below between trees: nothing else may differ
  other=$(cd "$v" && ls -d * | grep -v -x -E "kernels|impls|worker|sample|tests")
  [ -z "$other" ] || { echo "variant $v carries $other: only kernels/, impls/, worker/, sample/ and tests/ are restored"; exit 1; }
done
use() {  # use NAME: this tree's kernels/impls/worker/tests, then the variant's files over them
  rm -rf kernels impls worker sample tests && cp -r "$head_tree"/kernels "$head_tree"/impls "$head_tree"/worker "$head_tree"/sample "$head_tree"/tests .
  [ "$1" = head ] || [ ! -d ".dev_carry/variants/$1/files" ] || cp -r ".dev_carry/variants/$1/files/." .
  gpu_setup || exit 1
}
tests() {  # tests NAME: TEST_FILES (or the attention and graph tests) on the tree in place
  # shellcheck disable=SC2086  # TEST_FILES is a list of paths
  timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider "${plugin[@]}" ${TEST_FILES:-tests/kernels/test_decode_attention.py \
    tests/kernels/test_paged_attention.py tests/worker/test_cuda_graphs.py tests/impls/test_fast_examples.py} \
    > "$out/pytest_$1.log" 2>&1
  echo "pytest $1 rc=$?"; grep -E "^(FAILED|ERROR)" "$out/pytest_$1.log" | head; tail -1 "$out/pytest_$1.log"
}
if [ "${TESTS:-1}" = 1 ]; then tests head; fi
if [ "${TESTS:-1}" = all ]; then  # every tree's tests (the variants' kernels too)
  use head; tests head
  for v in .dev_carry/variants/*/; do use "$(basename "$v")"; tests "$(basename "$v")"; done
  use head
fi
sweep() {  # sweep NAME COMMIT ROUND
  # shellcheck disable=SC2046  # NAME/ENV: VAR=value words for this tree's sweep (none for head)
  local tag="$1_r$3${PROMPT_LEN:+_p$PROMPT_LEN}"  # PROMPT_LEN: decode_sweep's --prompt-len (default 512)
  env $(cat ".dev_carry/variants/$1/ENV" 2>/dev/null) timeout "${SWEEP_TIMEOUT:-120}" python3 benchmarks/decode_sweep.py --git-commit "$2" --batches "${BATCHES:-1,4,16,64}" \
    ${PROMPT_LEN:+--prompt-len "$PROMPT_LEN"} --out "$out/sweep_${tag}_h200_$2.json" > "$out/sweep_${tag}.log" 2>&1
  echo "sweep $1 round $3${PROMPT_LEN:+ prompt $PROMPT_LEN} rc=$?"; grep -E "^\| [0-9]|LLM.generate" "$out/sweep_${tag}.log"
}
if [ "${PIN_TABLE:-0}" = 1 ]; then  # PIN_TABLE=1: every sweep loads the first one's GEMV picks (worker/skinny_table_file.py)
  export ENGINESPEC_SKINNY_TABLE=/tmp/pinned_skinny_table.json; rm -f "$ENGINESPEC_SKINNY_TABLE"
fi
if [ "${WARM:-0}" = 1 ]; then  # WARM=1: one untimed batch-1 sweep first, so no timed sweep compiles (a cold tree's first takes ~70 s)
  timeout 240 python3 benchmarks/decode_sweep.py --batches 1 --out "$out/warm.json" > "$out/warm.log" 2>&1
  echo "warm-up sweep rc=$?"; rm -f "$out/warm.json"
fi
for round in $(seq "${ROUNDS:-2}"); do  # ROUNDS=0: tests only
  use head; sweep head "$sha" "$round"
  for v in .dev_carry/variants/*/; do
    name=$(basename "$v"); use "$name"; sweep "$name" "$(cat "$v/SHA")" "$round"
  done
done
use head
pdl=${PROFILE_PDL:-0}  # PROFILE_PDL=1 profiles with PDL on: then read the critical column, not the own one
profile() {  # profile NAME COMMIT: the batch-1 per-kernel profile of the tree in place
  # shellcheck disable=SC2046  # NAME/ENV as in sweep
  env $(cat ".dev_carry/variants/$1/ENV" 2>/dev/null) ENGINESPEC_PDL=$pdl timeout 120 python3 benchmarks/decode_sweep.py \
    --git-commit "$2" --batches 1 --profile --out "$out/sweep_prof1_pdl${pdl}_$1_h200_$2.json" > "$out/prof_$1.log" 2>&1
  echo "profile $1 rc=$?"
  python3 -m benchmarks.sweep_profile "$out/sweep_prof1_pdl${pdl}_$1_h200_$2.json"
}
if [ "${PROFILE:-0}" = 1 ]; then  # this tree, then each of PROFILE_VARIANTS (names of variants)
  use head; [ "${PROFILE_HEAD:-1}" = 0 ] || profile head "$sha"  # PROFILE_HEAD=0: the variants only
  for name in ${PROFILE_VARIANTS:-}; do use "$name"; profile "$name" "$(cat ".dev_carry/variants/$name/SHA")"; done
  use head
fi
[ "${PIN_TABLE:-0}" = 1 ] && cp "$ENGINESPEC_SKINNY_TABLE" "$out/" 2>/dev/null
cd "$out" && tar czf logs.tgz *.log 2>/dev/null; rm -f *.log *.png; ls
