"""Can two half-batches on two streams hide a decode step's projections under its attention?
(issue 16's workload; measured before it is built). CUDA only for timing.

    python3 benchmarks/overlap_probe.py [--points 256x1024,128x1024,128x512,64x512] [--out overlap.json]

The 256-request workload's warm wall is 1.38x its floor, and most of the excess sits in decode
steps of 65-256 rows (RESULTS, twenty-first session): there the paged attention already reads
K/V at 0.98 of the copy rate, and the rest of the step (four cuBLAS projections at 6-8 us each,
the norms, SiLU * up, the q|k norm + rotary + K/V write: about 40 us a layer at 256 rows) runs
after it, one kernel at a time, latency-bound. Split the rows in two independent halves and the
one half's projections can run while the other half's attention streams K/V (NanoFlow's
nano-batches, SGLang's two-batch overlap). This probe builds the decode layer from the engine's
own kernels (kernels.rms_norm, kernels.qkv_rope, kernels.paged_attention, kernels.silu_mul;
cuBLAS for the projections, the residual adds inside them), Qwen3-0.6B's shape, 28 layers of
distinct weights and K/V pools, every context `context` tokens long, and times each way as one
CUDA graph replay:

- `serial`: the whole batch, one stream (the engine's scheme);
- `halves`: the two halves one after the other on one stream, layer by layer (what splitting
  costs with no overlap);
- `free`: each half's whole chain on its own stream, nothing ordering them;
- `lockstep`: each half on its own stream, the attentions alternating (half A's attention of
  layer l waits for half B's of layer l - 1; B's of l waits for A's of l), so that one half's
  projections always run beside the other half's attention;
- `attention`, `projections`: the serial chain's attention launches alone, and everything else
  alone (the overlap's bound is the larger of the two);
- `folded`: the serial chain without its two RMSNorm launches, 7 launches a layer instead of 9.
  With each norm's weight folded into the next projection's weight columns, the norm is only
  a row scale, and q and k are normed again per head (the scale cancels), so what remains is
  the v rows' and SiLU * up's row scale, which their own kernels could apply from the row they
  read. A timing stand-in: those two scales are left out, so its output is not compared.

Outputs of every way are compared against `serial` (max abs difference; cuBLAS may pick other
algorithms at half the rows). Nothing asserts speed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from enginespec.kernels.paged_attention import paged_attention  # noqa: E402
from enginespec.kernels.qkv_rope import qkv_rope  # noqa: E402
from enginespec.kernels.rms_norm import rms_norm  # noqa: E402
from enginespec.kernels.silu_mul import silu_mul  # noqa: E402
from enginespec.worker.gemm_tuning import graph_us  # noqa: E402

EPS = 1e-6
WAYS = ("serial", "halves", "free", "lockstep", "attention", "projections", "folded")
COMPARED = ("halves", "free", "lockstep")  # the ways that compute what serial does


@dataclass(frozen=True)
class Shape:
    """The model's dimensions (default: Qwen3-0.6B's) and the pool's block size."""

    hidden: int = 1024
    q_heads: int = 16
    kv_heads: int = 8
    head_dim: int = 128
    inter: int = 3072
    layers: int = 28
    block_size: int = 16

    @property
    def qkv(self) -> int:
        return (self.q_heads + 2 * self.kv_heads) * self.head_dim


@dataclass
class Batch:
    """Decode rows' inputs: row r's context is seq_lens[r] tokens, its new token at slot_mapping[r]."""

    x: torch.Tensor  # [n, hidden]
    cos: torch.Tensor  # [n, head_dim]
    sin: torch.Tensor  # [n, head_dim]
    block_table: torch.Tensor  # [n, blocks a row] int32
    seq_lens: torch.Tensor  # [n] int32
    slot_mapping: torch.Tensor  # [n] int64
    query_start_loc: torch.Tensor  # [n + 1] int32
    context: int

    def rows(self, start: int, stop: int) -> "Batch":
        """Rows [start, stop) as a batch of their own (views, a fresh query_start_loc)."""
        n = stop - start
        qsl = torch.arange(n + 1, dtype=torch.int32, device=self.x.device)
        sl = slice(start, stop)
        return Batch(self.x[sl], self.cos[sl], self.sin[sl], self.block_table[sl],
                     self.seq_lens[sl], self.slot_mapping[sl], qsl, self.context)  # fmt: skip


def make_model(shape: Shape, num_blocks: int, device, dtype=torch.bfloat16, seed: int = 0) -> list[dict]:
    """Per layer: projection weights (scaled by 1/sqrt(K) so 28 layers stay finite), norm weights
    near 1, and a K/V pool [2, num_blocks + 1, block_size, kv_heads, head_dim] of random keys."""
    g = torch.Generator(device="cpu").manual_seed(seed)

    def rand(*size, scale=1.0):
        return (torch.randn(*size, generator=g) * scale).to(device=device, dtype=dtype)

    h, d = shape.hidden, shape.head_dim
    return [
        {
            "qkv": rand(shape.qkv, h, scale=h**-0.5),
            "o": rand(h, shape.q_heads * d, scale=(shape.q_heads * d) ** -0.5),
            "gate_up": rand(2 * shape.inter, h, scale=h**-0.5),
            "down": rand(h, shape.inter, scale=shape.inter**-0.5),
            "norm1": 1 + rand(h, scale=0.1),
            "norm2": 1 + rand(h, scale=0.1),
            "qk_norm": 1 + rand(shape.q_heads + shape.kv_heads, d, scale=0.1),
            "cache": rand(2, num_blocks + 1, shape.block_size, shape.kv_heads, d),
        }
        for _ in range(shape.layers)
    ]


def make_batch(shape: Shape, rows: int, context: int, num_blocks: int, device, seed: int = 1) -> Batch:
    """`rows` decode rows of `context` tokens each (the last one new), their blocks drawn shuffled
    from the pool without repeats."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    per_row = -(-context // shape.block_size)
    if rows * per_row > num_blocks:
        raise ValueError(f"rows x blocks a row = {rows * per_row} exceeds num_blocks {num_blocks}")
    table = torch.randperm(num_blocks, generator=g)[: rows * per_row].view(rows, per_row)
    last = context - 1
    slots = table[:, last // shape.block_size] * shape.block_size + last % shape.block_size
    angle = torch.rand(rows, shape.head_dim // 2, generator=g) * 6.28
    angle = torch.cat((angle, angle), dim=1)
    dtype = torch.bfloat16
    return Batch(
        x=torch.randn(rows, shape.hidden, generator=g).to(device=device, dtype=dtype),
        cos=angle.cos().to(device=device, dtype=dtype),
        sin=angle.sin().to(device=device, dtype=dtype),
        block_table=table.to(device=device, dtype=torch.int32),
        seq_lens=torch.full((rows,), context, dtype=torch.int32, device=device),
        slot_mapping=slots.to(device=device, dtype=torch.int64),
        query_start_loc=torch.arange(rows + 1, dtype=torch.int32, device=device),
        context=context,
    )


def pre(layer: dict, shape: Shape, x: torch.Tensor, b: Batch) -> torch.Tensor:
    """Input norm, q|k|v projection, q|k norm + rotary + the new K/V written: q [n, Hq, D]."""
    qkv = rms_norm(x, layer["norm1"], EPS) @ layer["qkv"].T
    return qkv_rope(qkv, b.cos, b.sin, layer["qk_norm"], EPS, layer["cache"], b.slot_mapping, shape.q_heads)


def attend(layer: dict, q: torch.Tensor, b: Batch) -> torch.Tensor:
    """The paged decode attention of q over the layer's pool: [n, Hq, D]."""
    return paged_attention(q, layer["cache"], b.query_start_loc, b.seq_lens, b.block_table,
                           max_query_len=1, max_seq_len=b.context)  # fmt: skip


def post(layer: dict, x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """o projection + residual, post-attention norm, gate|up, SiLU * up, down + residual."""
    x = torch.addmm(x, a.reshape(x.shape[0], -1), layer["o"].T)
    act = silu_mul(rms_norm(x, layer["norm2"], EPS) @ layer["gate_up"].T)
    return torch.addmm(x, act, layer["down"].T)


def run_serial(model: list[dict], shape: Shape, b: Batch, attention: bool = True) -> torch.Tensor:
    """Every layer over the whole batch, one stream; attention=False leaves the attention out (q
    stands in for its output)."""
    x = b.x
    for layer in model:
        q = pre(layer, shape, x, b)
        x = post(layer, x, attend(layer, q, b) if attention else q)
    return x


def run_folded(model: list[dict], shape: Shape, b: Batch) -> torch.Tensor:
    """The serial chain's launches less the two norms (module doc: a timing stand-in)."""
    x = b.x
    for layer in model:
        q = qkv_rope(x @ layer["qkv"].T, b.cos, b.sin, layer["qk_norm"], EPS, layer["cache"],
                     b.slot_mapping, shape.q_heads)  # fmt: skip
        x = torch.addmm(x, attend(layer, q, b).reshape(x.shape[0], -1), layer["o"].T)
        x = torch.addmm(x, silu_mul(x @ layer["gate_up"].T), layer["down"].T)
    return x


def run_attention(model: list[dict], q: torch.Tensor, b: Batch) -> torch.Tensor:
    """The serial chain's attention launches alone, each layer's output its next query."""
    for layer in model:
        q = attend(layer, q, b)
    return q


def run_halves(model: list[dict], shape: Shape, halves: list[Batch]) -> torch.Tensor:
    """Both halves one stream, layer by layer: A's layer l, then B's."""
    xs = [h.x for h in halves]
    for layer in model:
        xs = [post(layer, x, attend(layer, pre(layer, shape, x, h), h)) for x, h in zip(xs, halves)]
    return torch.cat(xs)


def run_streams(model: list[dict], shape: Shape, halves: list[Batch], streams: list, lockstep: bool):
    """Half i on streams[i]. lockstep: the two halves' attentions alternate (A's of layer l after
    B's of l - 1, B's of l after A's of l), so each half's other kernels run beside the other's
    attention; otherwise nothing orders the two chains."""
    here = torch.cuda.current_stream()
    for s in streams:
        s.wait_stream(here)
    xs = [h.x for h in halves]
    done: list[Optional[torch.cuda.Event]] = [None, None]  # the last attention of each half
    for layer in model:
        for i, (s, h) in enumerate(zip(streams, halves)):
            with torch.cuda.stream(s):
                q = pre(layer, shape, xs[i], h)
                other = done[1 - i]
                if lockstep and other is not None:
                    s.wait_event(other)
                a = attend(layer, q, h)
                done[i] = torch.cuda.Event()
                done[i].record(s)
                xs[i] = post(layer, xs[i], a)
    for s in streams:
        here.wait_stream(s)
    return torch.cat(xs)


def ways(model: list[dict], shape: Shape, b: Batch) -> dict[str, Callable[[], torch.Tensor]]:
    """Each way of WAYS as a callable (the stream ways only where CUDA is)."""
    n = b.x.shape[0]
    halves = [b.rows(0, n // 2), b.rows(n // 2, n)]
    q = torch.randn(n, shape.q_heads, shape.head_dim, device=b.x.device).to(b.x.dtype)
    out = {
        "serial": lambda: run_serial(model, shape, b),
        "halves": lambda: run_halves(model, shape, halves),
        "attention": lambda: run_attention(model, q, b),
        "projections": lambda: run_serial(model, shape, b, attention=False),
        "folded": lambda: run_folded(model, shape, b),
    }
    if b.x.is_cuda:
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        out["free"] = lambda: run_streams(model, shape, halves, streams, lockstep=False)
        out["lockstep"] = lambda: run_streams(model, shape, halves, streams, lockstep=True)
    return out


def graph_ms(fn: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
    """ms of one replay of fn captured in a CUDA graph (gemm_tuning.graph_us: the median of 7
    replays after a warm-up run and one replay), and fn's output (float32) as the graph left it."""
    us, outs = graph_us(lambda: [fn()], 1)
    return us / 1e3, outs[0]


def probe_point(model: list[dict], shape: Shape, rows: int, context: int, num_blocks: int) -> dict:
    """Every way at one (rows, context) point: ms a step and max |difference| from serial."""
    b = make_batch(shape, rows, context, num_blocks, model[0]["cache"].device)
    result: dict = {"rows": rows, "context": context}
    ref = None
    for name, fn in ways(model, shape, b).items():
        ms, out = graph_ms(fn)
        result[f"{name}_ms"] = ms
        if name == "serial":
            ref = out  # graph_ms returns a float32 copy, not the graph's own output
        elif name in COMPARED:
            result[f"{name}_diff"] = (out - ref).abs().max().item()
    result["bound_ms"] = max(result["attention_ms"], result["projections_ms"])
    return result


def print_table(points: list[dict]) -> None:
    """Markdown: ms a step per way, and the best overlapped way over serial."""
    cols = ("serial", "halves", "free", "lockstep", "attention", "projections", "folded")
    print("| rows x context | " + " | ".join(cols) + " | bound | best / serial |")
    print("| --- |" + " ---: |" * (len(cols) + 2))
    for p in points:
        best = min(p.get("free_ms", p["serial_ms"]), p.get("lockstep_ms", p["serial_ms"]))
        cells = " | ".join(f"{p[c + '_ms']:.3f}" if c + "_ms" in p else "-" for c in cols)
        print(
            f"| {p['rows']} x {p['context']} | {cells} | {p['bound_ms']:.3f} | {best / p['serial_ms']:.3f} |"
        )


def main(argv: Optional[list] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", default="256x1024,128x1024,128x512,64x512", help="ROWSxCONTEXT,...")
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--out", help="write the JSON here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("overlap_probe times CUDA graphs: run it on a GPU")
    points = [tuple(int(v) for v in s.split("x")) for s in args.points.split(",")]
    shape = Shape(layers=args.layers)
    num_blocks = max(r * -(-c // shape.block_size) for r, c in points)
    model = make_model(shape, num_blocks, "cuda")
    results = []
    for rows, context in points:
        results.append(probe_point(model, shape, rows, context, num_blocks))
        print(json.dumps(results[-1]), flush=True)
    print_table(results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"shape": asdict(shape), "device": torch.cuda.get_device_name(), "points": results},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
