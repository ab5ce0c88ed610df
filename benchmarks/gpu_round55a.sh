#!/usr/bin/env bash
# Device call of the fifty-fifth session: the row-scale bar A/B. This tree at the default
# (ENGINESPEC_RSCALE_WIN_MARGIN unset: a row-scale kernel must beat the norm launch + norm pick by
# 3%) against the bar at each of MARGINS (default 1.0 1.08), in ROUNDS interleaved rounds of the
# decode sweep (BATCHES, default 1,4,8,16,32), every sweep tuning afresh (ENGINESPEC_SKINNY_TABLE=0);
# first the skinny-linear CUDA tests. Then each sweep's rscale picks (kernel or baseline, us).
# Usage (device machine, repo root): bash benchmarks/gpu_round55a.sh SHA
set -u
sha=${1:?commit}
rm -rf .dev_carry/variants && mkdir -p .dev_carry/variants
for m in ${MARGINS:-1.0 1.08}; do
  d=.dev_carry/variants/rs${m/./}; mkdir -p "$d"; echo "$sha" > "$d/SHA"; echo "ENGINESPEC_RSCALE_WIN_MARGIN=$m" > "$d/ENV"
done
export ENGINESPEC_SKINNY_TABLE=0
TEST_FILES=${TEST_FILES:-"tests/worker/test_skinny_linear.py tests/worker/test_skinny_table_file.py"} \
  BATCHES=${BATCHES:-1,4,8,16,32} SWEEP_TIMEOUT=${SWEEP_TIMEOUT:-110} bash benchmarks/gpu_round11a.sh "$sha"
python3 - "${OUT:-/tmp/out}" <<'PY'
import glob, json, sys
for path in sorted(glob.glob(f"{sys.argv[1]}/sweep_*.json")):
    doc = json.load(open(path))
    rows = [c for c in doc.get("skinny_gemm", {}).get("choices", []) if c["variant"].startswith("rscale")]
    picks = ", ".join(f"{c['rows']}r {c['n']}x{c['k']} {'B' if c['choice'] == 'baseline' else 'K'} {c['us']:.2f}/{c['baseline_us']:.2f}"
                      for c in rows if c["rows"] >= 4)
    print(path.rsplit("/", 1)[-1], "|", picks)
PY
