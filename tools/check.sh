#!/usr/bin/env bash
# Everything CI runs, in the order a failure is cheapest to find. `.ci/run` calls this after
# installing; run it yourself after `pip install torch==2.13.0 && pip install -e ".[test]"`.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== ruff"; ruff check . && ruff format --check .
echo "== import directions"; python tools/check_imports.py
echo "== mypy (spec, impls)"; python tools/typecheck.py
# pytest-xdist: whole files a worker (--dist loadfile keeps a file's module fixtures in one
# process); CI_WORKERS (default 2, CI's core count) workers; 0 runs in this process alone
workers=(-n "${CI_WORKERS:-2}" --dist loadfile)
echo "== tests (reference impl)"; python -m pytest -q -p no:cacheprovider "${workers[@]}"
# --backend-only: the fast run keeps the tests that take the impl under test; the others (the
# plugin's own pytest subprocesses, the strategies, the rules: about a third of conformance,
# a minute on 2 cores) judge no impl and already ran, identically, in the run above
echo "== conformance (fast impl)"; python -m pytest -q -p no:cacheprovider "${workers[@]}" conformance --impl=fast --backend-only
echo "== outside install"; bash tools/outside_check.sh
