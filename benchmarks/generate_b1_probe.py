"""Where batch-1 `LLM.generate`'s ms/token goes outside its decode steps (issue 19).

decode_sweep.py's figure is (t(1 + n tokens) - t(1 token)) / n over whole generate() calls; the
engine's own step trace of the same call says how much of that its decode steps take. This
splits each call into: before its first step ends (the add and the prefill step), the decode
steps, and after the last step ends (the final output, the wrapper's return), for a 1-token
and a (1 + n)-token call, several times each, on the sweep's engine and prompt; and the Python
cyclic collections (generation, ms) that ran inside each call. On Linux, also who used the CPU
during each call (`threads`: this process's threads by CPU ms, their names and involuntary
context switches, and the machine's other CPU ms from /proc/stat): a host-bound batch 1 whose
main thread is busy the whole call is its own work; one whose main thread is not is waiting
(another thread holding the GIL, a preempted core).

    python3 benchmarks/generate_b1_probe.py [--tokens 128] [--reps 4] [--out probe.json]
"""

from __future__ import annotations

import gc
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import decode_sweep  # noqa: E402
from benchmarks.engine_runs import checkpoint, engine_core, make_llm, own_args, shape_of, sync  # noqa: E402
from enginespec.spec import SamplingParams  # noqa: E402


class GcLog:
    """Python's cyclic collections as they run (gc.callbacks): (generation, ms) of each."""

    def __init__(self):
        self.events: list = []
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.events.append((info["generation"], (time.perf_counter() - self._start) * 1e3))

    def take(self) -> list:
        events, self.events = self.events, []
        return events


TICK_MS = 1000.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)


def cpu_snapshot() -> dict:
    """This process's threads ({tid: (name, cpu ms, involuntary switches)}) and the machine's
    busy CPU ms, from /proc; empty where there is no /proc."""
    threads = {}
    for task in Path("/proc/self/task").glob("*"):
        try:
            stat = (task / "stat").read_text()
            status = (task / "status").read_text()
        except OSError:  # a thread that ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        switches = next((int(x.split()[1]) for x in status.splitlines() if x.startswith("nonvoluntary")), 0)
        threads[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) * TICK_MS, switches)
    try:
        cpu = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        busy = (sum(cpu) - cpu[3] - cpu[4]) * TICK_MS  # all but idle and iowait
    except (OSError, IndexError, ValueError):
        busy = 0.0
    return {"threads": threads, "busy_ms": busy}


def cpu_delta(before: dict, after: dict, top: int = 6) -> dict:
    """Who used the CPU between two snapshots: this process's busiest threads (name, cpu ms,
    involuntary switches), the main thread's share, and the machine's other CPU ms."""
    rows = []
    for tid, (name, ms, switches) in after["threads"].items():
        _, ms0, sw0 = before["threads"].get(tid, (name, 0.0, 0))
        rows.append((tid, name, ms - ms0, switches - sw0))
    ours = sum(r[2] for r in rows)
    main = next((r for r in rows if r[0] == os.getpid()), None)
    rows.sort(key=lambda r: -r[2])
    return {
        "main_cpu_ms": main[2] if main else None,
        "main_involuntary": main[3] if main else None,
        "threads": [(name, round(ms, 1), sw) for _, name, ms, sw in rows[:top] if ms > 0],
        "other_processes_cpu_ms": round(after["busy_ms"] - before["busy_ms"] - ours, 1),
    }


def traced_call(llm, prompt: list[int], num_tokens: int, device, gc_log: "GcLog") -> dict:
    """One generate() of num_tokens greedy tokens: its wall and its parts, in ms, and the
    cyclic collections that ran inside it ((generation, ms) each)."""
    gc_log.take()
    core = engine_core(llm)
    core.stats.step_trace = []
    params = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    sync(device)
    cpu_before = cpu_snapshot()
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    sync(device)
    end = time.perf_counter()
    cpu = cpu_delta(cpu_before, cpu_snapshot())
    steps, core.stats.step_trace = core.stats.step_trace, None
    ends = [s[3] for s in steps]
    return {
        "wall_ms": (end - start) * 1e3,
        "num_steps": len(steps),
        "first_step_end_ms": (ends[0] - start) * 1e3 if ends else None,
        "steps_after_first_ms": (ends[-1] - ends[0]) * 1e3 if ends else None,
        "after_last_step_ms": (end - ends[-1]) * 1e3 if ends else None,
        "step_kinds": [(s[0], s[1]) for s in steps[:3]] + ([(steps[-1][0], steps[-1][1])] if steps else []),
        "gc": gc_log.take(),
        "cpu": cpu,
    }


def main(argv=None) -> int:
    import argparse

    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--tokens", type=int, default=128)
    own.add_argument("--reps", type=int, default=4)
    own.add_argument(
        "--cprofile", metavar="PATH", help="then one more long call under cProfile: its top functions to PATH"
    )
    extra, rest = own_args(own, argv)
    args = decode_sweep.parse_args(["--batches", "1", *rest])
    args.tokens, args.reps, args.cprofile = extra.tokens, extra.reps, extra.cprofile
    model_dir = checkpoint(args.shape, args)
    shape = shape_of(model_dir, args)
    llm = make_llm(model_dir, args)
    rng = random.Random(args.seed)
    prompt = [rng.randrange(min(shape.vocab_size, 10000)) for _ in range(args.prompt_len)]
    gc_log = GcLog()
    traced_call(llm, prompt, args.tokens + 1, args.device, gc_log)  # warm-up
    runs: dict = {"one": [], "many": []}
    for _ in range(args.reps):
        runs["one"].append(traced_call(llm, prompt, 1, args.device, gc_log))
        runs["many"].append(traced_call(llm, prompt, args.tokens + 1, args.device, gc_log))
    out = {"tokens": args.tokens, "runs": runs}
    for key in ("wall_ms", "first_step_end_ms", "steps_after_first_ms", "after_last_step_ms"):
        one = statistics.median(r[key] for r in runs["one"])
        many = statistics.median(r[key] for r in runs["many"])
        out[key] = {"one": one, "many": many, "per_token": (many - one) / args.tokens}
        print(
            f"{key:22s} one {one:9.3f}  many {many:9.3f}  (many - one) / n {(many - one) / args.tokens:7.4f}"
        )
    print("steps:", [r["num_steps"] for r in runs["many"]], runs["many"][0]["step_kinds"])
    for r in runs["many"]:
        c = r["cpu"]
        print(
            f"many: wall {r['wall_ms']:.1f} ms, main thread cpu {c['main_cpu_ms']} ms "
            f"({c['main_involuntary']} involuntary switches), other processes {c['other_processes_cpu_ms']} ms,",
            "threads:",
            c["threads"],
        )
    for key in ("one", "many"):
        print(
            f"{key}: walls ms",
            [round(r["wall_ms"], 2) for r in runs[key]],
            "collections (gen, ms):",
            [[(g, round(ms, 2)) for g, ms in r["gc"]] for r in runs[key]],
        )
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    if args.cprofile:
        profile_call(llm, prompt, args.tokens + 1, args.device, Path(args.cprofile))
    return 0


def profile_call(llm, prompt: list[int], num_tokens: int, device, path: Path) -> None:
    """One generate() of num_tokens under cProfile: the host's functions by own time and by
    cumulative time (where a batch-1 step's host work goes when the host sets the pace)."""
    import cProfile
    import io
    import pstats

    params = SamplingParams(max_tokens=num_tokens, temperature=0, ignore_eos=True)
    prof = cProfile.Profile()
    sync(device)
    prof.enable()
    llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    sync(device)
    prof.disable()
    text = io.StringIO()
    for key in ("tottime", "cumulative"):
        pstats.Stats(prof, stream=text).sort_stats(key).print_stats(40)
    path.write_text(text.getvalue())


if __name__ == "__main__":
    sys.exit(main())
