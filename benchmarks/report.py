"""The record of a throughput run: its environment (device, versions, commit, date), the
headline summary derived from the phases' results, and the few human-readable report lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch


def _git_commit(override: Optional[str]) -> dict:
    if override:
        return {"commit": override, "source": "--git-commit"}
    import subprocess

    root = Path(__file__).resolve().parents[1]  # the repository root
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = (
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            != ""
        )
        return {"commit": commit, "dirty": dirty, "source": "git"}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "source": "unavailable (no git checkout here; pass --git-commit)"}


def host_fingerprint(reps: int = 5) -> dict:
    """What says how fast and how busy this host was: CPUs, the load average at the start (a
    leftover process from an earlier call shows here) and the median microseconds of a fixed
    pure-Python loop (a slower host runs the engine's per-step work slower in proportion), so
    figures from two machine starts can be told apart by their host."""
    import os
    import statistics
    import time

    def loop() -> int:
        total = 0
        for i in range(20_000):
            total += i * i
        return total

    times = []
    for _ in range(reps):
        start = time.perf_counter()
        loop()
        times.append((time.perf_counter() - start) * 1e6)
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):  # not on every platform
        load = None
    return {
        "cpu_count": os.cpu_count(),
        "load_avg": load,
        "python_loop_us": round(statistics.median(times), 1),
    }


def environment(args) -> dict:
    """Device, library versions, commit, date, the host's fingerprint and the ENGINESPEC_*
    settings of this run (an A/B variant may differ from its head by an environment variable
    alone)."""
    import datetime
    import os
    import platform

    import transformers

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
    }
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        versions["triton"] = None
    dev = torch.device(args.device)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
    return {
        "device": str(dev),
        "gpu": gpu,
        "cpu": platform.processor() or platform.machine(),
        "host": host_fingerprint(),
        "versions": versions,
        "git": _git_commit(args.git_commit),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": {k: v for k, v in sorted(os.environ.items()) if k.startswith("ENGINESPEC_")},
    }


def _ratio(a, b):
    return a / b if a and b else None


def _by_scheduling(eng: dict, hf_tok_s) -> dict:
    """serial_* and async_* figures from the engine run and its --compare-scheduling twin."""
    out = {}
    for run in (eng, eng.get("other_scheduling") or {}):
        if "output_tok_s" not in run:
            continue
        mode = "async" if run.get("async_scheduling") else "serial"
        out[f"{mode}_output_tok_s"] = run["output_tok_s"]
        out[f"{mode}_wall_over_floor"] = _ratio(run.get("wall_s"), (run.get("floor") or {}).get("floor_s"))
        out[f"{mode}_ratio_vs_hf"] = _ratio(run["output_tok_s"], hf_tok_s)
    other = eng.get("other_scheduling") or {}
    out["scheduling_tokens_match"] = other.get("tokens_match_first_run")
    return out


def summarize(results: dict) -> dict:
    """The headline numbers (None where a phase did not run or failed)."""
    eng, hf, env = results.get("engine") or {}, results.get("hf") or {}, results.get("env") or {}
    lat, big = results.get("latency") or {}, results.get("big") or {}
    floor = (eng.get("floor") or {}).get("floor_s")
    floor_min = (eng.get("floor_min_steps") or {}).get("floor_s")
    tok_s, hf_tok_s = eng.get("output_tok_s"), hf.get("output_tok_s")
    wall = eng.get("wall_s")
    return {
        "impl": results["config"]["impl"],
        "shape": results["config"]["shape"],
        "output_tok_s": tok_s,
        "hf_output_tok_s": hf_tok_s,
        "ratio_vs_hf": tok_s / hf_tok_s if tok_s and hf_tok_s else None,
        "wall_s": wall,
        "floor_s": floor,
        "wall_over_floor": wall / floor if wall and floor else None,
        "floor_min_steps_s": floor_min,
        "num_steps": eng.get("num_steps"),
        "first_call_s": eng.get("first_call_s"),
        "first_call_over_floor": eng["first_call_s"] / floor if eng.get("first_call_s") and floor else None,
        "first_over_warm": eng.get("first_over_warm"),
        "startup_s": eng.get("startup_s"),
        "warmup_s": eng.get("warmup_s"),
        "runs_wall_over_floor": [r["wall_s"] / floor for r in eng["runs"]]
        if floor and eng.get("runs")
        else None,
        "gpu_busy_fraction": (results.get("profile") or {}).get("gpu_busy_fraction"),
        "tokens_match": eng.get("output_tokens") == eng.get("requested_output_tokens") if eng else None,
        "batch1_ms_per_token": lat.get("default_ms_per_token"),
        "batch1_eager_ms_per_token": lat.get("eager_ms_per_token"),
        **_by_scheduling(eng, hf_tok_s),
        "big_output_tok_s": big.get("output_tok_s"),
        "big_wall_over_floor": big.get("wall_over_floor"),
        "gpu": env.get("gpu"),
        "versions": env.get("versions"),
        "git_commit": (env.get("git") or {}).get("commit"),
        "date": env.get("date"),
    }


def _fmt(value, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)


def report(results: dict) -> str:
    """A few human-readable lines of the summary."""
    s = results["summary"]
    lines = [
        f"enginespec throughput: impl={s['impl']} shape={s['shape']} gpu={s['gpu']} commit={s['git_commit']}",
        f"  engine: {_fmt(s['output_tok_s'], '.1f')} output tok/s, wall {_fmt(s['wall_s'])} s, "
        f"{s['num_steps']} steps",
        f"  floor: {_fmt(s['floor_s'])} s (fewest steps: {_fmt(s['floor_min_steps_s'])} s), "
        f"wall/floor {_fmt(s['wall_over_floor'])}",
        f"  transformers: {_fmt(s['hf_output_tok_s'], '.1f')} tok/s, engine/HF {_fmt(s['ratio_vs_hf'])}",
        f"  gpu busy in decode: {_fmt(s['gpu_busy_fraction'])}",
    ]
    if s.get("startup_s") is not None:
        lines.append(f"  startup: {_fmt(s['startup_s'])} s (engine warm-up {_fmt(s.get('warmup_s'))} s)")
    if s.get("first_call_s") is not None:
        lines.append(
            f"  first call on a fresh LLM: {_fmt(s['first_call_s'])} s, {_fmt(s['first_over_warm'])}x the "
            f"warm median, wall/floor {_fmt(s['first_call_over_floor'])}"
        )
    if s.get("runs_wall_over_floor"):
        lines.insert(
            3,
            "  wall/floor of each run (median reported): "
            + ", ".join(_fmt(r) for r in s["runs_wall_over_floor"]),
        )
    for mode in ("serial", "async"):
        if s.get(f"{mode}_output_tok_s") is not None:
            lines.append(
                f"  {mode} scheduling: {_fmt(s[f'{mode}_output_tok_s'], '.1f')} output tok/s, "
                f"wall/floor {_fmt(s[f'{mode}_wall_over_floor'])}, "
                f"engine/HF {_fmt(s[f'{mode}_ratio_vs_hf'])}"
            )
    if s.get("scheduling_tokens_match") is not None:
        lines.append(f"  serial and async tokens equal: {s['scheduling_tokens_match']}")
    lat = results.get("latency") or {}
    if "default_ms_per_token" in lat:
        lines.append(
            f"  batch-1 decode: {_fmt(lat['default_ms_per_token'])} ms/token default, "
            f"{_fmt(lat.get('eager_ms_per_token'))} eager"
        )
    big = results.get("big") or {}
    if "output_tok_s" in big:
        lines.append(
            f"  {big['shape']}: {_fmt(big['output_tok_s'], '.1f')} tok/s, "
            f"wall/floor {_fmt(big.get('wall_over_floor'))}"
        )
    kinds = (results.get("engine") or {}).get("by_step_kind") or []
    if kinds:
        lines.append("  by step kind (first timed run; floor per step):")
    for row in kinds:
        lines.append(
            f"    {row['kind']:>14}: {row['steps']:5d} steps, wall {_fmt(row['wall_s'])} s, "
            f"floor {_fmt(row['floor_s'])} s, wall/floor {_fmt(row['wall_over_floor'])}, "
            f"host waited {_fmt(row.get('host_wait_s'))} s"
        )
    errors = [k for k, v in results.items() if isinstance(v, dict) and "error" in v]
    if errors:
        lines.append(f"  FAILED phases: {errors} (see the JSON)")
    return "\n".join(lines)
