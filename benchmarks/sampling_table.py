"""The short table of benchmarks/gpu_sampling.sh, from the JSON files it wrote into one folder.

    python benchmarks/sampling_table.py OUT_DIR

Rows: sampler ratios to argmax; startup cold / warm cache; temperature 0.6 and chat settings,
first call and warm median against the floor, and chat over temperature (the issue's targets:
first <= 1.05x warm, warm <= 1.3x floor, chat <= 1.1x temperature, first call included);
pressure, recompute vs swap. A missing file gives "n/a" rows.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(folder: Path, name: str) -> dict:
    try:
        return json.loads((folder / name).read_text())
    except (OSError, ValueError):
        return {}


def _f(value, spec: str = ".3g") -> str:
    return "n/a" if value is None else format(value, spec)


def rows(folder: Path) -> list[str]:
    out = []
    sam = _load(folder, "sampler.json")
    base = sam.get("argmax_ms")
    for case in ("device_temperature", "device_chat", "device_mixed", "sampler_chat", "sampler_mixed"):
        ms = sam.get(f"{case}_ms")
        ratio = ms / base if ms and base else None
        out.append(f"sampler {case:19s} {_f(ms)} ms  {_f(ratio)}x argmax ({_f(base)} ms)")
    st = _load(folder, "startup.json")
    for name in ("cold", "warm_cache"):
        r = st.get(name) or {}
        out.append(
            f"startup {name:10s} {_f(r.get('startup_s'))} s (warm-up {_f(r.get('warmup_s'))} s, process {_f(r.get('process_s'))} s)"
        )
    walls = {}
    for name, file in (("temperature 0.6", "t06.json"), ("chat settings", "chat.json")):
        s = _load(folder, file).get("summary") or {}
        walls[name] = (s.get("first_call_s"), s.get("wall_s"))
        out.append(
            f"{name:15s} first call {_f(s.get('first_call_s'))} s ({_f(s.get('first_call_over_floor'))}x floor), "
            f"warm {_f(s.get('wall_s'))} s ({_f(s.get('wall_over_floor'))}x floor), first/warm {_f(s.get('first_over_warm'))}, "
            f"startup {_f(s.get('startup_s'))} s"
        )
    (tf, tw), (cf, cw) = walls["temperature 0.6"], walls["chat settings"]
    if tw and cw:
        out.append(
            f"chat / temperature: warm {_f(cw / tw)}x, first call {_f(cf / tf if cf and tf else None)}x"
        )
    pr = _load(folder, "pressure.json")
    for mode, r in (pr.get("modes") or {}).items():
        out.append(
            f"pressure {mode:9s} wall {_f(r.get('wall_s'))} s, {r.get('num_preemptions')} preemptions, "
            f"{r.get('num_recomputed_tokens')} tokens recomputed, {_f(r.get('num_swapped_bytes', 0) / 2**30)} GiB swapped "
            f"(pool {pr.get('cap_blocks')} of {pr.get('need_blocks')} blocks)"
        )
    return out


if __name__ == "__main__":
    print("\n".join(rows(Path(sys.argv[1] if len(sys.argv) > 1 else "."))))
