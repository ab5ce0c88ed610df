#!/usr/bin/env bash
# The thirty-seventh session's device calls 3 and 4 (run from ab_old/, committed here): an A/B of 0c70056 (constrained
# steps drawn on the device under async scheduling) against its parent's engine_core.py and sampler.py,
# two rounds, then the t 0.6 workload on HEAD. Before it, on this machine:
#   mkdir -p ab_old && for f in engine/engine_core.py sample/sampler.py; do git show 7a7627b:$f > ab_old/$(basename $f); done
source benchmarks/gpu_common.sh; gpu_setup || exit 1
old=/tmp/old; rm -rf $old; cp -r . $old; cp ab_old/engine_core.py $old/engine/; cp ab_old/sampler.py $old/sample/
otree=$(mktemp -d); (cd $old && python3 tools/link_tree.py $otree >/dev/null)
for round in 1 2; do
  PYTHONPATH=$otree:$old:/tmp/site timeout 100 python3 $old/benchmarks/constrained_cost.py --batches 1,8,32 --cases greedy,regex,one_regex --tokens 128 --out $out/cc_old_$round.json > $out/cc_old_$round.log 2>&1; echo "old $round rc=$?"; grep "^|" $out/cc_old_$round.log
  timeout 100 python3 benchmarks/constrained_cost.py --batches 1,8,32 --cases greedy,regex,one_regex --tokens 128 --out $out/cc_new_$round.json > $out/cc_new_$round.log 2>&1; echo "new $round rc=$?"; grep "^|" $out/cc_new_$round.log
done
t06_workload t06_0c70056 200 0c70056
cd "$out" && tar czf s37c_h200_0c70056.tgz ./*.log ./*.json && rm -f ./*.log ./*.json; ls
