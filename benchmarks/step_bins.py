"""Where the gap to the floor lives: a traced run's steps binned by kind (prefill steps, then
decode steps by batch size), each bin's wall time against the sum of its steps' floors.

A trace is (start time, steps), each step (num_reqs, num_tokens, kv_tokens, end time, host
wait) as EngineStats.step_trace records it.
"""

from __future__ import annotations

from benchmarks import roofline as rl

# Decode steps are binned by their number of requests (upper bounds); steps with prompt rows
# form their own bin.
BATCH_BINS = (8, 32, 64, 128, 256)


def step_floor(shape: rl.ModelShape, rates: dict, prompt_tokens: int, kv_tokens: int) -> float:
    """One step's floor: (weights + K/V of its contexts) / copy bandwidth + 2 * body params *
    prompt tokens / matmul rate."""
    return (shape.weight_bytes_per_step + kv_tokens * shape.kv_bytes_per_token) / rates[
        "copy_bytes_per_s"
    ] + 2 * shape.body_params * prompt_tokens / rates["matmul_flops_per_s"]


def timed_steps(trace: tuple, shape: rl.ModelShape, rates: dict):
    """(num_reqs, num_tokens, wall s, floor s, host wait s) per traced step; a step's wall is the
    time since the previous step's work ended (the first: since the trace started)."""
    previous, steps = trace
    for num_reqs, num_tokens, kv_tokens, end, wait in steps:
        yield (
            num_reqs,
            num_tokens,
            end - previous,
            step_floor(shape, rates, num_tokens - num_reqs, kv_tokens),
            wait,
        )
        previous = end


def step_breakdown(trace: tuple, shape: rl.ModelShape, rates: dict) -> list[dict]:
    """Wall time against a per-step floor (step_floor), by kind of step: "prefill" (some
    prompt rows), then decode steps by batch size; walls as in timed_steps. Per-step floors sum
    to about the workload's floor (they count the K/V of the new tokens too). host_wait_s: how
    long the host blocked on the GPU in those steps (async scheduling); a bin whose wait is far
    below its wall was bound by the host."""
    bins: dict[str, dict] = {}
    for num_reqs, num_tokens, wall, floor, wait in timed_steps(trace, shape, rates):
        name = (
            "prefill"
            if num_tokens > num_reqs
            else next((f"decode <= {b}" for b in BATCH_BINS if num_reqs <= b), f"decode > {BATCH_BINS[-1]}")
        )
        row = bins.setdefault(name, {"steps": 0, "wall_s": 0.0, "floor_s": 0.0, "host_wait_s": 0.0})
        row["steps"] += 1
        row["wall_s"] += wall
        row["floor_s"] += floor
        row["host_wait_s"] += wait
    order = ["prefill"] + [f"decode <= {b}" for b in BATCH_BINS] + [f"decode > {BATCH_BINS[-1]}"]
    return [
        {"kind": k, **bins[k], "wall_over_floor": bins[k]["wall_s"] / bins[k]["floor_s"]}
        for k in order
        if k in bins
    ]


def first_steps(trace: tuple, shape: rl.ModelShape, rates: dict, num: int = 40) -> list[dict]:
    """The first `num` steps of a trace one by one (the prefill phase and the start of decode):
    requests, tokens, wall and floor in ms, floored as in step_breakdown."""
    start, steps = trace
    return [
        {
            "num_reqs": num_reqs,
            "num_tokens": num_tokens,
            "wall_ms": round(wall * 1e3, 3),
            "floor_ms": round(floor * 1e3, 3),
            "host_wait_ms": round(wait * 1e3, 3),
        }
        for num_reqs, num_tokens, wall, floor, wait in timed_steps((start, steps[:num]), shape, rates)
    ]
