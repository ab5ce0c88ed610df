# Sourced by the device scripts (benchmarks/gpu_round4*.sh, gpu_call3.sh): what each call does
# first, and the serving run they share. Run from the repository root on the device machine.

# $out (the folder that comes back), the server wheels from .whl/ when carried, and enginespec
# imported through tools/link_tree.py's tree (it is not installed there).
gpu_setup() {
  out=${OUT:-/tmp/out}; mkdir -p "$out"; export PYTHONUNBUFFERED=1
  if compgen -G ".whl/*.whl" >/dev/null; then  # (not ls: under nullglob an empty glob lists the cwd)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
      .whl/*.whl >/dev/null 2>&1 || return 1
  fi
  local tree; tree=$(mktemp -d); python3 tools/link_tree.py "$tree" >/dev/null || return 1
  export PYTHONPATH=$tree:$PWD:/tmp/site
}

# gpu_kind: the first GPU's family, lower case (h100, h200), for file names and H200-only steps.
gpu_kind() {
  nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE "H[0-9]+" | tr A-Z a-z
}

# serve_at NAME RATE [serving.py args...]: the server under Poisson arrivals at RATE req/s, with
# its step trace; writes $out/serving_NAME.json and steps_NAME.json and prints a summary.
serve_at() {
  local name=$1 rate=$2; shift 2
  timeout 200 python3 -m benchmarks.serving --request-rate "$rate" --out "$out/serving_$name.json" \
    --step-trace "$out/steps_$name.json" "$@" > "$out/serving_$name.log" 2>&1
  echo "serving $name rc=$?"
  python3 - "$out/serving_$name.json" "$name" <<'PY'
import json, sys
h = json.load(open(sys.argv[1])); s = h["serve"]
print(f"{sys.argv[2]}: {s['request_rate']:.2f} req/s, TTFT p50/p99 {s['ttft']['p50_ms']:.1f}/{s['ttft']['p99_ms']:.1f} ms, "
      f"ITL p50/p99 {s['itl']['p50_ms']:.2f}/{s['itl']['p99_ms']:.2f} ms, {s['output_tok_s']:.0f} tok/s")
print(json.dumps(s.get("steps", h.get("steps")), indent=1)[:1500])
PY
}

# cold_first_call NAME [first_call_compiles.py args...]: a fresh LLM on empty inductor, Triton
# and enginespec (the tuning table) caches (startup by phase, first call against the second);
# writes $out/NAME.json. The caches stay in $cold_caches for second_start.
cold_first_call() {
  local name=$1; shift
  cold_caches=$(mktemp -d)
  first_call_in "$cold_caches" "$name" "$@"
}

# second_start NAME [args...]: the same on the caches the last cold_first_call left (a second
# start of the same engine in a new process).
second_start() { first_call_in "${cold_caches:?run cold_first_call first}" "$@"; }

first_call_in() {
  local dir=$1 name=$2; shift 2
  TRITON_CACHE_DIR=$dir/triton TORCHINDUCTOR_CACHE_DIR=$dir/inductor ENGINESPEC_CACHE_DIR=$dir/enginespec \
    timeout 200 python3 benchmarks/first_call_compiles.py --temperature 0.6 --out "$out/$name.json" "$@" \
    > "$out/$name.log" 2>&1
  echo "$name rc=$?"
  grep -E "^startup|compile at|load " "$out/$name.log" | head -20
}

# t06_workload NAME SECONDS SHA [throughput.py args...]: the temperature-0.6 workload, 3 runs
# (throughput.py --repeat 3, no HF/big/latency/profile phases), within SECONDS; writes
# $out/NAME.json and .log and prints its summary (wall over floor, its runs, first call, startup).
t06_workload() {
  local name=$1 secs=$2 sha=$3; shift 3
  timeout "$secs" python3 benchmarks/throughput.py --impl fast --git-commit "$sha" --repeat 3 \
    --skip-hf --skip-big --skip-latency --skip-profile --temperature 0.6 --out "$out/$name.json" "$@" \
    > "$out/$name.log" 2>&1
  echo "$name rc=$? after ${SECONDS}s"
  python3 - "$out/$name.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
print({k: s.get(k) for k in ("wall_s", "floor_s", "wall_over_floor", "first_over_warm", "startup_s", "runs_wall_over_floor")})
PY
}

# sweep_rows NAME SHA BATCHES [decode_sweep.py args...]: decode steps at BATCHES (20 steps, no
# latency run) within 90 s; writes $out/NAME.json and .log and prints its table's rows.
sweep_rows() {
  local name=$1 sha=$2 batches=$3; shift 3
  timeout 90 python3 benchmarks/decode_sweep.py --git-commit "$sha" --steps 20 --latency-tokens 0 \
    --batches "$batches" --out "$out/$name.json" "$@" > "$out/$name.log" 2>&1
  echo "$name rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]" "$out/$name.log"
}

# gemv_rows_ab SHA DEADLINE (the script's SECONDS to stop by): decode steps at 2, 4, 8 rows with the tuning's one-tile GEMV shapes
# offered up to 4 rows (the default) and up to 8 (ENGINESPEC_GEMV_TUNE_ROWS=8), two interleaved
# rounds in fresh processes (each setting tunes its own table: the fingerprint records it);
# writes $out/gemv_ab_{4,8}_{1,2}.json and prints each run's rows and its 8-row picks.
gemv_rows_ab() {
  local sha=$1 secs=$2 round rows
  for round in 1 2; do
    for rows in 4 8; do
      [ $((secs - SECONDS)) -lt 60 ] && { echo "gemv_rows_ab: out of time before ${rows}_$round"; return; }
      ENGINESPEC_GEMV_TUNE_ROWS=$rows timeout $((secs - SECONDS < 170 ? secs - SECONDS : 170)) \
        python3 benchmarks/decode_sweep.py --git-commit "$sha" --steps 30 --latency-tokens 0 --batches 2,4,8 \
        --out "$out/gemv_ab_${rows}_$round.json" > "$out/gemv_ab_${rows}_$round.log" 2>&1
      echo "gemv rows $rows round $round rc=$? after ${SECONDS}s"; grep -E "^\| [0-9]" "$out/gemv_ab_${rows}_$round.log"
    done
  done
  python3 - "$out" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(f"{sys.argv[1]}/gemv_ab_*_1.json")):
    d = json.load(open(f))
    for c in d.get("skinny_gemm", {}).get("choices", []):
        if c["rows"] == 8:
            print(f.rsplit("/", 1)[1], c["n"], c["k"], c["variant"], c["choice"][:90], round(c["us"], 2))
PY
}
