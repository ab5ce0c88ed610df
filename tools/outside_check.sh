#!/usr/bin/env bash
# The kit as an outsider gets it: a clean, NON-editable install of enginespec in a fresh venv
# (no --system-site-packages), used only from a directory outside the repo.
#
#   1. enginespec with its runtime deps only (no hypothesis): an unrelated project's pytest run
#      works (the pytest11 plugin loads and costs it nothing).
#   2. + the test extra and the example backend (examples/ordered-pool-backend):
#      (a) the conformance suite against the example, `--backend-only`, writing a report that is
#          then checked; (b) the unrelated project's Hypothesis settings are unchanged.
#   3. Hugging Face's `kernels` (transformers 5.2x requires it, so it is already there; installed
#      if not): `import kernels` is theirs, `enginespec.kernels` ours, and both work.
#
# Stages 1 and 2 share one venv (hypothesis is installed only after stage 1), which proves the
# same as two venvs at half the install time. Usage: bash tools/outside_check.sh [--full]
# (--full runs every backend test, engine and greedy parity included: ~2 min on 2 cores;
# the default runs the control plane, attention and batch layout: points 1-7 of DESIGN.md).
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
FULL="${1:-}"
if [ -n "${OUTSIDE_WORK:-}" ]; then  # debugging: keep (and reuse) the work dir
  WORK="$OUTSIDE_WORK"; rm -rf "$WORK/src" "$WORK/elsewhere" "$WORK/other_project"
else
  WORK="$(mktemp -d "${TMPDIR:-/tmp}/enginespec-outside.XXXXXX")"
  trap 'rm -rf "$WORK"' EXIT
fi
START=$SECONDS
say() { printf '[outside_check %4ds] %s\n' "$((SECONDS - START))" "$*"; }

# A copy of the tracked tree: building from it leaves no build/ or egg-info in the repo.
mkdir -p "$WORK/src" "$WORK/elsewhere" "$WORK/other_project"
git -C "$REPO" ls-files -z --cached --others --exclude-standard | (cd "$REPO" && tar --null -T - -cf -) | tar -xf - -C "$WORK/src"

say "fresh venv; torch 2.13.0 (CPU wheel); enginespec non-editable, runtime deps only"
V="$WORK/venv/bin"
[ -x "$V/python" ] || "$PY" -m venv "$WORK/venv"
pipq() { "$V/pip" install -q "$@" 2> >(grep -v "^WARNING: Location" >&2); }
pipq torch==2.13.0
pipq "$WORK/src" pytest
if "$V/python" -c "import hypothesis" 2>/dev/null; then echo "hypothesis must be absent in stage 1" >&2; exit 1; fi
"$V/python" -c "import enginespec, sys; assert 'site-packages' in enginespec.__file__, enginespec.__file__"
# One version: the wheel's metadata (pyproject.toml reads it from enginespec.__version__), the
# package's attribute and `enginespec --version`, run from outside the tree.
DIST_VERSION="$("$V/python" -c 'import importlib.metadata as md; print(md.version("enginespec"))')"
"$V/python" -c "import enginespec, sys; assert enginespec.__version__ == sys.argv[1], (enginespec.__version__, sys.argv[1])" "$DIST_VERSION"
CLI_VERSION="$(cd "$WORK/elsewhere" && "$V/enginespec" --version)"
[ "$CLI_VERSION" = "enginespec $DIST_VERSION" ] || { echo "enginespec --version: '$CLI_VERSION', metadata: $DIST_VERSION" >&2; exit 1; }

# An unrelated project: a plain test, and (stage 2) one that asserts Hypothesis' defaults.
cat > "$WORK/other_project/test_plain.py" <<'PYEOF'
def test_plain():
    assert 1 + 1 == 2
PYEOF
say "stage 1: an unrelated project's pytest run without hypothesis"
(cd "$WORK/other_project" && "$V/python" -m pytest -q -p no:cacheprovider) | tail -1
HELP="$(cd "$WORK/other_project" && "$V/python" -m pytest --help)"
[[ "$HELP" == *--backend-only* ]] || { echo "the enginespec pytest11 plugin did not load" >&2; exit 1; }

say "stage 2: + the test extra and the example backend"
pipq "$WORK/src[test]" "$WORK/src/examples/ordered-pool-backend"
# What Hypothesis alone picks here, with no pytest and no plugin: its `default` profile, or its
# built-in `ci` profile where the CI variable is set. The other project must see exactly that.
read -r BASE_PROFILE BASE_EXAMPLES BASE_DERANDOMIZE < <("$V/python" -c \
  "from hypothesis import settings as s; d = s.default; print(s.get_current_profile_name(), d.max_examples, d.derandomize)")
export BASE_PROFILE BASE_EXAMPLES BASE_DERANDOMIZE
cat > "$WORK/other_project/test_hypothesis_defaults.py" <<'PYEOF'
import os

from hypothesis import given, settings, strategies as st

EXAMPLES = int(os.environ["BASE_EXAMPLES"])


def test_profile_is_what_hypothesis_alone_picks():
    assert not os.environ["BASE_PROFILE"].startswith("enginespec")
    assert settings.get_current_profile_name() == os.environ["BASE_PROFILE"]
    assert settings.default.max_examples == EXAMPLES
    assert str(settings.default.derandomize) == os.environ["BASE_DERANDOMIZE"]


@given(st.integers())
def test_given_sees_the_defaults(x):
    assert settings.default.max_examples == EXAMPLES
PYEOF
say "stage 2 (c): the unrelated project's Hypothesis settings are Hypothesis' own ($BASE_PROFILE)"
(cd "$WORK/other_project" && "$V/python" -m pytest -q -p no:cacheprovider) | tail -1

if [ "$FULL" = "--full" ]; then
  TARGETS=(enginespec.conformance)
else
  TARGETS=()
  for m in block_manager scheduler stateful errors numeric_args batch attention; do
    TARGETS+=("enginespec.conformance.test_$m")
  done
fi
say "stage 2 (a): conformance suite against the example backend (${TARGETS[*]})"
(cd "$WORK/elsewhere" && "$V/python" -m pytest -q -p no:cacheprovider --pyargs "${TARGETS[@]}" \
  --impl=ordered-pool --backend-only --conformance-report=report.json) | tail -3
"$V/python" - "$WORK/elsewhere/report.json" <<'PYEOF'
import json, sys
import enginespec
data = json.load(open(sys.argv[1]))
assert data["enginespec_version"] == enginespec.__version__
assert data["impl"]["name"] == "ordered-pool" and data["impl"]["version"] == "0.1.0", data["impl"]
ran = [p for p in data["points"] if p["status"] != "not-run"]
assert len(ran) >= 7 and all(p["status"] == "pass" for p in ran), [(p["key"], p["status"]) for p in data["points"]]
print("report:", ", ".join(f'{p["key"]}={p["status"]}' for p in data["points"]))
PYEOF

say "stage 3: Hugging Face's kernels beside enginespec"
# the version transformers asks for (a pin of our own made pip report a conflict with it)
"$V/python" -c "import importlib.metadata as md; md.version('kernels')" 2>/dev/null || pipq kernels
(cd "$WORK/elsewhere" && "$V/python" - <<'PYEOF'
import importlib.metadata as md
import kernels
import enginespec.kernels
import enginespec.kernels.paged_attention  # noqa: F401  (ours still loads with theirs installed)
from enginespec import LLM, SamplingParams, load_impl
assert hasattr(kernels, "get_kernel"), "HF kernels lost its API"
assert "/enginespec/" not in kernels.__file__ and "/enginespec/kernels/" in enginespec.kernels.__file__
assert load_impl("ordered-pool").name == "ordered-pool"
print("kernels", md.version("kernels"), kernels.__file__, "| enginespec.kernels", enginespec.kernels.__file__)
PYEOF
)
(cd "$WORK/elsewhere" && "$V/python" -m pytest -q -p no:cacheprovider --pyargs enginespec.conformance.test_attention \
  --impl=ordered-pool) | tail -1
say "all outside checks passed"
