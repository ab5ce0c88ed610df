"""Where a batch-1 decode step's device time goes (decode_sweep.py --profile): torch.profiler over
a few steady steps of one request; per kernel name its device time and launches per step, the
kernel count per step, and the GPU-busy fraction (union of device intervals over wall time).

At batch 1 the floor is one read of the weights (0.28 ms for the 0.6B shape on an H200); the
gap is launches and latency-bound kernels, so the count per step and the top kernels are what
to read first.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: `benchmarks.*` resolves from the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.decode_profile import device_busy_us, device_events, profiled_steps, step_until_steady  # noqa: E402
from enginespec.spec import SamplingParams  # noqa: E402


def kernel_table(events, num_steps: int, top: int = 25) -> list[dict]:
    """Per device-side name (kernels, memcpy, memset; not user annotations): microseconds and
    launches per step, the largest total first, and each name's critical time (critical_us)."""
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    device = device_events(events)
    for e in device:
        total[e.name] += e.time_range.end - e.time_range.start
        count[e.name] += 1
    critical = critical_us(device)
    rows = sorted(total, key=total.get, reverse=True)[:top]
    return [
        {
            "name": name[:120],
            "us_per_step": total[name] / num_steps,
            "critical_us_per_step": critical[name] / num_steps,
            "launches_per_step": count[name] / num_steps,
        }
        for name in rows
    ]


def critical_us(events) -> dict[str, float]:
    """Per name, the device time its events add to the busy span: in start order, each event is
    charged for how far its end moves the latest end so far (0 when it ends inside an earlier
    one). The charges add up to the union of the intervals. Under programmatic dependent launch a
    kernel starts while the one before it runs, so its own duration counts its wait; this counts
    what it costs the chain: its end minus the end before it."""
    charged: dict[str, float] = defaultdict(float)
    for e, charge in _charges(events):
        charged[e.name] += charge
    return charged


def _charges(events) -> list[tuple]:
    """(event, its critical charge) in start order (critical_us)."""
    out = []
    frontier = float("-inf")
    for e in sorted(events, key=lambda e: e.time_range.start):
        start, end = e.time_range.start, e.time_range.end
        out.append((e, max(0.0, end - max(frontier, start))))
        frontier = max(frontier, end)
    return out


def slot_table(events, num_steps: int, num_layers: int) -> list[dict]:
    """The kernels launched k >= 2 times a layer (the GEMVs: q|k|v, o, gate|up, down), split by
    their slot: the i-th launch of that name in a layer, in launch order (slot = the launch's
    ordinal within the step mod k; every step launches the same sequence, and the profile holds
    whole steps). Per (name, slot): us and critical us a step, so one projection's distance from
    its floor is not averaged with the others'. Names launched another number of times: left out."""
    device = device_events(events)
    count: dict[str, int] = defaultdict(int)
    for e in device:
        count[e.name] += 1
    own: dict[tuple, float] = defaultdict(float)
    critical: dict[tuple, float] = defaultdict(float)
    seen: dict[str, int] = defaultdict(int)
    for e, charge in _charges(device):
        per_step, remainder = divmod(count[e.name], num_steps)
        k, off_layer = divmod(per_step, num_layers)
        ordinal = seen[e.name]
        seen[e.name] += 1
        if remainder or off_layer or k < 2:
            continue
        key = (e.name, ordinal % per_step % k, k)
        own[key] += e.time_range.end - e.time_range.start
        critical[key] += charge
    return [
        {
            "name": name[:120],
            "slot": slot,
            "per_layer": k,
            "us_per_step": own[name, slot, k] / num_steps,
            "critical_us_per_step": critical[name, slot, k] / num_steps,
        }
        for name, slot, k in sorted(own)
    ]


def profile_steps(core, shape, args) -> dict:
    """Profile `args.profile_steps` steady decode steps of `args.profile_batch` requests (greedy;
    one by default: the batch-1 latency question; 256 asks where a full decode step goes)."""
    if torch.device(args.device).type != "cuda":
        return {"skipped": "no CUDA device: nothing to profile"}
    batch = getattr(args, "profile_batch", 1)
    params = SamplingParams(max_tokens=64 + 2 * args.profile_steps + 8, temperature=0.0, ignore_eos=True)
    ids = [f"sweep-profile-{i}" for i in range(batch)]
    for i, rid in enumerate(ids):
        core.add_request(rid, [1 + (i + j) % 1000 for j in range(args.prompt_len)], params)
    step_until_steady(core, batch, 64)
    for _ in range(args.profile_steps):  # untimed: settle, and the unprofiled time
        core.step(final_only=True)
    prof, wall_us = profiled_steps(core, args.device, args.profile_steps)
    core.abort(ids)
    while core.has_unfinished:
        core.step()
    events = prof.events()
    busy_us, num_events = device_busy_us(events)
    steps = args.profile_steps
    table = kernel_table(events, steps, top=10**6)
    slots = slot_table(events, steps, core.model.num_layers)
    copies = sum(r["launches_per_step"] for r in table if r["name"].startswith(("Memcpy", "Memset")))
    return {
        "batch": batch,
        "steps": steps,
        "wall_ms_per_step": wall_us / 1e3 / steps,
        "gpu_busy_ms_per_step": busy_us / 1e3 / steps,
        "gpu_busy_fraction": busy_us / wall_us,
        "device_events_per_step": num_events / steps,
        "kernels_per_step": num_events / steps - copies,
        "copies_per_step": copies,
        "top": table[:25],
        "slots": slots,
        "note": "wall includes the profiler's overhead; device times are the kernels' own",
    }


def print_top(path: str, num: int = 14) -> None:
    """Print a saved sweep JSON's profile: busy time, then its kernels by critical time."""
    import json

    prof = json.load(open(path)).get("profile")
    if not prof or "top" not in prof:
        print(f"{path}: no profile")
        return
    print(
        f"batch {prof.get('batch', 1)}: busy {prof['gpu_busy_ms_per_step']:.3f} ms/step, "
        f"{prof['kernels_per_step']:.0f} kernels; us/step: own, critical (what it adds to the chain), launches"
    )
    for k in sorted(prof["top"], key=lambda k: -k.get("critical_us_per_step", 0))[:num]:
        print(
            f"{k['us_per_step']:9.1f} {k.get('critical_us_per_step', 0):9.1f} {k['launches_per_step']:6.1f} x {k['name'][:90]}"
        )
    for k in prof.get("slots", []):  # older JSONs have none
        print(
            f"{k['us_per_step']:9.1f} {k['critical_us_per_step']:9.1f}  slot {k['slot']} of {k['per_layer']} a layer: {k['name'][:70]}"
        )


def print_choices(
    path: str, variants: tuple[str, ...] = ("norm", "norm_silu", "rscale", "rscale_silu")
) -> None:
    """Print a saved sweep JSON's skinny GEMM picks of `variants` (the fused norms by default):
    per (rows, N, K, variant) the kind kept (gemv, tiled, or the baseline: separate launches),
    its time and the baseline's, us."""
    import json

    choices = (json.load(open(path)).get("skinny_gemm") or {}).get("choices") or []
    picked = [c for c in choices if c.get("variant") in variants]
    print(f"{path}: {len(picked)} picks of {', '.join(variants)}")
    for c in sorted(picked, key=lambda c: (c["rows"], c["variant"], c["n"])):
        choice = c.get("choice")
        kind = (
            "baseline"
            if choice in (None, "None", "baseline")
            else "gemv"
            if "gemv=True" in choice
            else "tiled"
        )
        print(
            f"{c['rows']:4d} {c['n']:6d} {c['k']:6d} {c['variant']:10s} {kind:8s} {c['us']:7.2f} {c['baseline_us']:7.2f}"
        )


if (
    __name__ == "__main__"
):  # python3 -m benchmarks.sweep_profile [--choices] SWEEP.json...: each profile or its fused-norm picks
    show = print_choices if sys.argv[1:2] == ["--choices"] else print_top
    for arg in sys.argv[1 + (show is print_choices) :]:
        show(arg)
