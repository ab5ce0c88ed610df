#!/usr/bin/env bash
# Issue 19: the 24-64-row decode buckets captured a second time with balanced decode attention,
# replayed for batches whose lengths spread (ENGINESPEC_BALANCED_GRAPHS=1, worker/cuda_graphs.py),
# against the default (off): decode steps at 24-64 rows over one 517-token context and over mixed
# contexts (100-2,048), then the temperature-0.6 workload both ways. With it on, one context
# should replay the plain graphs (no change) and mixed ones the balanced (7-17% at 32-64 rows in
# the twenty-eighth session's fixed-config runs).
#   bash benchmarks/gpu_balanced_graphs_ab.sh SHA    # ~5 min on a cold machine; nothing to carry
source benchmarks/gpu_common.sh; gpu_setup || exit 1
S=${1:?commit}
sweep() { sweep_rows "$1" "$S" 24,32,48,64 "${@:2}"; }
for on in 0 1; do
  ENGINESPEC_BALANCED_GRAPHS=$on sweep uni_bg$on --prompt-len 517
  ENGINESPEC_BALANCED_GRAPHS=$on sweep mix_bg$on --prompt-len 100 --max-prompt-len 2048
done
ENGINESPEC_BALANCED_GRAPHS=0 t06_workload t06_bg0 100 $S
ENGINESPEC_BALANCED_GRAPHS=1 t06_workload t06_bg1 100 $S
cd $out && tar czf balanced_graphs_h200_$S.tgz *.json *.log 2>/dev/null && find . -maxdepth 1 -type f ! -name "balanced_graphs_*" -delete; ls $out
