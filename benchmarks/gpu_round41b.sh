#!/usr/bin/env bash
# The forty-first session's second call: is the batch-1 host time a regression? This tree against
# an older commit on ONE machine (the first call's H100 stepped batch 1 at 0.875 ms with a 0.695
# graph and 0.006 ms of host wait, where the thirty-ninth session's H100 took 0.717 at 9ead191):
# decode_sweep at BATCHES rows (default 1), ROUNDS (default 2) interleaved rounds, then generate_b1_probe with a cProfile of a
# 257-token batch-1 generate() in each tree. The older tree comes as `git archive OLD | gzip` in
# .dev_carry/old.tgz (carry .dev_carry); it runs this tree's generate_b1_probe.py.
#   git archive OLD -- . ':!benchmarks/results' ':!.whl' | gzip > .dev_carry/old.tgz
#   bash benchmarks/gpu_round41b.sh SHA OLD
set -u
sha=${1:?commit}; oldsha=${2:?older commit}
source benchmarks/gpu_common.sh
gpu_setup || exit 1
kind=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE "H[0-9]+" | tr A-Z a-z)
echo "device ${kind:-unknown}"; uptime
repo=$PWD; new_pp=$PYTHONPATH
old=/tmp/oldrepo; rm -rf "$old"; mkdir -p "$old"; tar xzf .dev_carry/old.tgz -C "$old"
cp benchmarks/generate_b1_probe.py "$old/benchmarks/"
(cd "$old" && python3 tools/link_tree.py /tmp/es_old >/dev/null) || exit 1
old_pp=/tmp/es_old:$old:/tmp/site
tree() {  # tree new|old: cd there, its PYTHONPATH and commit
  if [ "$1" = new ]; then cd "$repo"; export PYTHONPATH=$new_pp; c=$sha; else cd "$old"; export PYTHONPATH=$old_pp; c=$oldsha; fi
}
for r in $(seq 1 "${ROUNDS:-2}"); do
  for t in new old; do
    tree $t
    timeout 130 python3 benchmarks/decode_sweep.py --git-commit "$c" --batches "${BATCHES:-1}" --out "$out/sweep_${t}_$r.json" > "$out/sweep_${t}_$r.log" 2>&1
    echo "$t ($c) round $r rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]|LLM.generate|its 128" "$out/sweep_${t}_$r.log"
  done
done
for t in new old; do
  tree $t
  timeout 100 python3 benchmarks/generate_b1_probe.py --tokens 256 --reps "${PROBE_REPS:-2}" --cprofile "$out/cprofile_$t.txt" > "$out/probe_$t.log" 2>&1
  echo "probe $t rc=$? after ${SECONDS}s"; grep -E "wall_ms|steps_after" "$out/probe_$t.log"
  grep -E "function calls" "$out/cprofile_$t.txt" | head -1
done
cd "$out" && tar czf "s41b_${kind:-gpu}_$sha.tgz" ./*.log ./*.json ./*.txt 2>/dev/null && rm -f ./*.log ./*.json ./*.txt; ls
