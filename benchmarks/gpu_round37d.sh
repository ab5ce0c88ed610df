#!/usr/bin/env bash
# The thirty-seventh session's device call 5 (about 1 min, warm): cProfile over constrained_cost.py at 8 rows (mostly
# startup: not used), then the structured-outputs mask alone on the 0.6B vocabulary (151,936): xgrammar's
# bitmask fill and apply_token_bitmask's host and device time at 1, 8 and 32 rows.
source benchmarks/gpu_common.sh; gpu_setup || exit 1
timeout 150 python3 -m cProfile -o $out/cc.prof benchmarks/constrained_cost.py --batches 8 --cases greedy,regex --tokens 128 --out $out/cc_prof.json > $out/cc_prof.log 2>&1; echo "prof rc=$?"; grep "^|" $out/cc_prof.log
python3 -c "
import pstats; s = pstats.Stats('$out/cc.prof'); s.sort_stats('tottime').print_stats(25)" 2>&1 | tail -40 | cut -c1-150
cat > /tmp/mask_probe.py <<'PY'
import time, torch
from benchmarks.engine_runs import checkpoint
from enginespec.testing import checkpoints
from transformers import AutoTokenizer
from enginespec.engine.structured_output import StructuredOutputManager, fill_bitmask
from enginespec.sample.grammar_mask import apply_token_bitmask
from enginespec.spec.structured_outputs import StructuredOutputsParams
d = checkpoints.default_dir("qwen3-0.6b"); tok = AutoTokenizer.from_pretrained(str(d)); V = 151936
m = StructuredOutputManager(tok, V, [tok.eos_token_id]); g = m.compile(StructuredOutputsParams(regex="(w[1-4][0-9]*)+"))
for rows in (1, 8, 32):
    states = [m.new_state(g, [tok.eos_token_id]) for _ in range(rows)]
    logits = torch.randn(rows, V, device="cuda")
    for _ in range(5): bm = fill_bitmask(states); out = apply_token_bitmask(logits, list(range(rows)), bm)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(50): bm = fill_bitmask(states)
    fill = (time.perf_counter() - t) / 50
    t = time.perf_counter()
    for _ in range(50): out = apply_token_bitmask(logits, list(range(rows)), bm)
    host = (time.perf_counter() - t) / 50; torch.cuda.synchronize(); tot = (time.perf_counter() - t) / 50
    print(f"rows {rows}: fill {fill*1e3:.3f} ms, apply host {host*1e3:.3f} ms, apply host+device {tot*1e3:.3f} ms")
PY
timeout 60 python3 /tmp/mask_probe.py 2>&1 | grep -v Warn | tail -4
cd "$out" && tar czf s37d_h200_0c70056.tgz ./*.log ./*.json ./*.prof && rm -f ./*.log ./*.json ./*.prof; ls
