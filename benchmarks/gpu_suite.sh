#!/usr/bin/env bash
# The whole suite with --impl=fast on one GPU (the acceptance run of issues 16 and 19): every
# conformance test and every unit test, the CUDA-only ones included, on a device machine where
# enginespec is not installed (tools/link_tree.py's tree, the plugin loaded by name).
# Usage (device machine, repo root): bash benchmarks/gpu_suite.sh [seconds] [extra pytest args]
# Log: $OUT/pytest_fast.log (the last lines and the 20 slowest tests are printed).
set -u
limit=${1:-400}; shift || true
out=${OUT:-/tmp/out}; mkdir -p "$out"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then  # the server tests need fastapi/uvicorn on the device
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl >/dev/null 2>&1 && export PYTHONPATH=/tmp/site
fi
tree=$(mktemp -d)
python3 tools/link_tree.py "$tree" || { echo "tools/link_tree.py failed"; exit 1; }
export PYTHONPATH=$tree:$PWD${PYTHONPATH:+:$PYTHONPATH}
timeout "$limit" python3 -m pytest -p enginespec.conformance.plugin --impl=fast -q -rfEs \
  --durations=20 conformance tests "$@" > "$out/pytest_fast.log" 2>&1
echo "pytest exit: $?"
grep -E "^(FAILED|ERROR)|passed|failed" "$out/pytest_fast.log" | tail -25
