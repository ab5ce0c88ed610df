#!/usr/bin/env bash
# Twenty-second session, call 5 (issues 16 and 19): the whole suite with the fast impl on the
# H200, the failures again serially (gpu_round19b.sh without its 8B sweep). One tar back.
# Usage (device machine, repo root; carry [".whl"]): bash benchmarks/gpu_round22e.sh SHA
SWEEP_8B=0 RERUN_END=${RERUN_END:-440} SUITE_TIMEOUT=${SUITE_TIMEOUT:-330} TAG=s22e exec bash benchmarks/gpu_round19b.sh "$@"
