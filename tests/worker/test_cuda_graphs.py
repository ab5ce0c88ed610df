"""CUDA graphs never change outputs: graph replay (over the torch.compile'd decoder, the CUDA
default) and eager runs give the same greedy tokens.

The bucket arithmetic is checked everywhere; replay itself needs a GPU (skipped on CPU: a gap
CI cannot close, run on the H200 with `pytest conformance --impl=fast -m gpu`).
"""

from __future__ import annotations

import os

import pytest
import torch

from enginespec.conformance.invariants import check_idle
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir
from enginespec.worker.cuda_graphs import DecodeGraphs, default_buckets, default_mixed_buckets


@pytest.mark.parametrize("max_num_seqs", [1, 3, 8, 20, 256])
def test_buckets_cover_every_batch_size(max_num_seqs):
    buckets = default_buckets(max_num_seqs)
    assert buckets == sorted(set(buckets)) and buckets[0] == 1 and buckets[-1] == max_num_seqs
    for n in range(1, max_num_seqs + 1):
        assert any(b >= n for b in buckets)
    assert all(b % 8 == 0 for b in buckets if b > 8 and b != max_num_seqs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_graph_replay_equals_eager(impl, family):
    from enginespec.llm import LLM

    if "cuda_graphs" not in getattr(impl, "capabilities", ()):
        pytest.skip(f"impl {impl.name!r} does not claim the cuda_graphs capability")
    prompts = [{"prompt_token_ids": [(7 * i + 3 * j) % 90 + 1 for j in range(5 + 3 * i)]} for i in range(11)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    outs = {}
    # eager; graphs over the default body (the model's own where its norms are folded:
    # compiled.should_compile); graphs over an inductor-compiled body (compile_model=True)
    runs = {"eager": dict(enforce_eager=True), "graphs": {}, "graphs_compiled": dict(compile_model=True)}
    for name, kwargs in runs.items():
        llm = LLM(
            tiny_model_dir(family),
            impl=impl,
            dtype="float32",
            device="cuda",
            block_size=4,
            max_num_seqs=16,
            num_gpu_blocks_override=64,
            **kwargs,
        )
        runner = llm.engine.runner
        assert (runner.graphs is None) == (name == "eager")
        body = runner.body
        assert (body is None) if name == "eager" else (body is None or body.error is None)
        assert name != "graphs_compiled" or body is not None
        outs[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)
    assert outs["graphs"] == outs["eager"] and outs["graphs_compiled"] == outs["eager"]


@pytest.mark.parametrize("max_tokens", [0, 7, 8, 16, 100, 512, 1024, 2000, 2048, 4096])
def test_mixed_buckets_cover_every_token_count(max_tokens):
    buckets = default_mixed_buckets(max_tokens)
    if max_tokens < 8:
        assert buckets == []
        return
    assert buckets == sorted(set(buckets)) and buckets[0] == 8 and buckets[-1] == max_tokens
    assert all(n % 128 == 0 for n in buckets if n > 256 and n != max_tokens)
    assert all(n % 256 == 0 for n in buckets if n > 1024 and n != max_tokens)
    # padding stays bounded: past 64 tokens the next bucket is at most 1.5x the token count
    for n in range(65, max_tokens + 1):
        assert min(b for b in buckets if b >= n) <= max(1.5 * n, 64)
    for n in range(2, max_tokens + 1):
        assert any(b >= n for b in buckets)


class _EagerGraph:
    """Stands in for a captured torch.cuda.CUDAGraph on the CPU: replay() runs the same call on
    the same static buffers again and writes the result where the capture left its output."""

    def __init__(self, run, out, replays: list):
        self.run, self.out, self.replays = run, out, replays

    def replay(self) -> None:
        outs = self.out if isinstance(self.out, tuple) else (self.out,)
        news = self.run() if isinstance(self.out, tuple) else (self.run(),)
        for out, new in zip(outs, news):
            out.copy_(new)
        self.replays.append(outs[0].shape[0])


def _graphs_over(runner, buckets, mixed_buckets, logits_max_rows: int = 0) -> DecodeGraphs:
    """DecodeGraphs (not captured) over the runner's model and pools, with these buckets."""
    return DecodeGraphs(
        runner.model,
        runner.kv_caches,
        block_size=runner.block_size,
        max_model_len=runner.max_model_len,
        max_num_seqs=runner.max_num_seqs,
        buckets=buckets,
        mixed_buckets=mixed_buckets,
        logits_max_rows=logits_max_rows,
    )


def _eager_graphs(runner, buckets, mixed_buckets, logits_max_rows: int = 0) -> tuple:
    """DecodeGraphs over the runner's model and pools whose "graphs" re-run the forward on the
    static buffers: everything but the capture itself (padding, empty request slots, stale rows
    and columns, the static query_start_loc) is what a CUDA replay sees. Decode graphs of up to
    logits_max_rows rows run the head too, as DecodeGraphs captures them."""
    graphs = _graphs_over(runner, buckets, mixed_buckets, logits_max_rows)
    decode, mixed = [], []
    for n, is_mixed in graphs._shapes():
        graphs._pad(n, is_mixed)  # as capture() does before each bucket
        out = graphs._run(n, is_mixed)  # the "capture": every row a padding row

        def run(n=n, is_mixed=is_mixed):
            return graphs._run(n, is_mixed)

        if graphs._with_head(n, is_mixed):

            def run(n=n):  # noqa: F811 - the head rides in the decode graph
                hidden = graphs._run(n, False)
                return hidden, runner.model.compute_logits(hidden)

            out, graphs.logits[n] = run()
            graphs.hidden[n], graphs.graphs[n] = out, _EagerGraph(run, (out, graphs.logits[n]), decode)
            continue
        if is_mixed:
            graphs.mixed_hidden[n], graphs.mixed_graphs[n] = out, _EagerGraph(run, out, mixed)
        else:
            graphs.hidden[n], graphs.graphs[n] = out, _EagerGraph(run, out, decode)
    for n in graphs.balanced_buckets:  # each twin over its bucket's static decode buffers, its own head

        def run_balanced(n=n):
            with graphs._launches(n, True):
                hidden = graphs._run(n, False)
            return (hidden, runner.model.compute_logits(hidden)) if graphs._with_head(n, False) else hidden

        graphs._pad(n, False)
        out = run_balanced()
        if isinstance(out, tuple):
            graphs.balanced_logits[n] = out[1]
        graphs.balanced_hidden[n] = out[0] if isinstance(out, tuple) else out
        graphs.balanced_graphs[n] = _EagerGraph(run_balanced, out, decode)
    return graphs, decode, mixed


def _interpreted_llm(**kwargs):
    """A tiny Qwen3 LLM on the CPU (fast impl, float32, 4-token blocks, 4 sequences) whose
    attention is the Triton kernel under the interpreter: what graph replays read on CUDA."""
    from enginespec.impls.fast.attention import FastAttention
    from enginespec.llm import LLM

    llm = LLM(
        tiny_model_dir("qwen3"),
        impl="fast",
        dtype="float32",
        device="cpu",
        block_size=4,
        max_num_seqs=4,
        **kwargs,
    )
    llm.engine.runner.model.attention = FastAttention("cpu", use_triton=True)
    return llm


# 1- to 3-token lookups: the periodic prompts below repeat short n-grams only (vLLM V1's default
# of 5 and 5 drafts nothing over them)
NGRAM_1_3 = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="the Triton attention kernel on CPU tensors needs the interpreter (CUDA: the replay test above)",
)
@pytest.mark.parametrize("spec", [False, True])
def test_padded_replays_equal_unpadded_steps_on_the_cpu(spec, monkeypatch):
    """Every step through the graphs' static buffers (decode buckets, and mixed buckets for
    prefill chunks beside decodes and for speculative verification rows) gives the greedy
    tokens of unpadded eager steps, over the Triton attention kernel that reads the buffers
    (the interpreter on the CPU). Both kinds of bucket must actually serve steps, and decode
    steps load their packed inputs with one copy (cuda_graphs.packed_span). Mixed steps of 8
    tokens whose lengths spread meet decode bucket 8's balanced twin, which they must not replay
    (it reads the decode buffers, not theirs)."""
    from enginespec.worker import cuda_graphs

    spans, real_span = [], cuda_graphs.packed_span

    def span_of(batch):
        spans.append(real_span(batch))
        return spans[-1]

    monkeypatch.setattr(cuda_graphs, "packed_span", span_of)

    prompts = [{"prompt_token_ids": [(5 * i + 3 * j) % 90 + 1 for j in range(3 + 9 * i)]} for i in range(5)]
    params = [SamplingParams(max_tokens=3 + 2 * i, temperature=0.0, ignore_eos=True) for i in range(5)]
    outs = {}
    for padded in (False, True):
        llm = _interpreted_llm(
            num_blocks=96,
            max_num_batched_tokens=40,
            speculative_config=NGRAM_1_3 if spec else None,
        )
        runner = llm.engine.runner
        if padded:  # decode bucket 8 has a balanced twin; no decode step fills it (4 sequences)
            runner.graphs, decode, mixed = _eager_graphs(runner, [1, 2, 4, 8], [8, 16, 40])
            assert runner.graphs.balanced_buckets == [8]
        outs[padded] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        check_idle(llm.engine.block_manager.state(), runner.num_blocks)
        if spec:  # the periodic prompts give the n-gram drafter matches: verification rows ran
            assert llm.engine.stats.spec_decode.num_draft_tokens > 0
    assert outs[True] == outs[False]
    assert decode and mixed, (decode, mixed)
    assert set(mixed) <= {8, 16, 40} and set(decode) <= {1, 2, 4}
    assert spans and all(span is not None for span in spans)  # every decode load: one copy


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="the Triton attention kernel on CPU tensors needs the interpreter (CUDA: the replay test above)",
)
def test_small_mixed_steps_of_spread_lengths_give_the_eager_tokens_on_the_cpu():
    """A long prompt's last chunks and then its decodes beside a short prompt's chunks, in an
    8-token budget: mixed steps of at most 8 tokens whose lengths spread (30 against 2-6), where
    8 is a mixed bucket and a decode bucket with a balanced twin. The graphs' greedy tokens equal
    unpadded eager steps' (the twin, which reads the decode buffers, once served these steps)."""
    prompts = [
        {"prompt_token_ids": [(3 * j) % 90 + 1 for j in range(30)]},
        {"prompt_token_ids": [7, 8, 9, 10, 11, 12]},
    ]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = {}
    for padded in (False, True):
        llm = _interpreted_llm(num_blocks=64, max_num_batched_tokens=8)
        runner = llm.engine.runner
        if padded:
            runner.graphs, decode, mixed = _eager_graphs(runner, [1, 2, 4, 8], [8], logits_max_rows=8)
            assert runner.graphs.balanced_buckets == [8] and 8 in runner.graphs.balanced_logits
        outs[padded] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert outs[True] == outs[False]
    assert 8 in mixed, mixed  # the small mixed steps ran through the graphs


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="the Triton attention kernel on CPU tensors needs the interpreter (CUDA: the replay test above)",
)
def test_decode_graphs_with_the_head_give_the_eager_tokens_on_the_cpu():
    """Decode graphs that run the logits head (ModelRunner.GRAPH_LOGITS_MAX_ROWS): the runner
    samples from the replayed logits on steady decode steps of those graphs, from the eager head
    on every other step (mixed steps, prefill, larger graphs; a padded bucket's stale rows never
    reach the sampler), and the greedy tokens and logprobs equal unpadded eager steps'."""

    prompts = [{"prompt_token_ids": [(7 * i + 2 * j) % 90 + 1 for j in range(4 + 7 * i)]} for i in range(3)]
    params = [
        SamplingParams(max_tokens=4 + 3 * i, temperature=0.0, ignore_eos=True, logprobs=2) for i in range(3)
    ]
    outs, used = {}, []
    for padded in (False, True):
        llm = _interpreted_llm(num_blocks=64, max_num_batched_tokens=32)
        runner = llm.engine.runner
        if padded:
            runner.graphs, decode, mixed = _eager_graphs(runner, [1, 2, 4], [8, 32], logits_max_rows=2)
            graph_logits = runner.graphs.decode_logits

            def counted(batch, graph_logits=graph_logits):
                got = graph_logits(batch)
                used.append(got is not None)
                return got

            runner.graphs.decode_logits = counted
        got = llm.generate(prompts, params, use_tqdm=False)
        outs[padded] = [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in got]
    assert [t for t, _ in outs[True]] == [t for t, _ in outs[False]]
    for (_, lp_graph), (_, lp_eager) in zip(outs[True], outs[False]):
        for a, b in zip(lp_graph, lp_eager):
            assert a.keys() == b.keys()
            for tok in a:
                assert abs(a[tok] - b[tok]) < 1e-4
    assert decode and any(used), (decode, used)  # steady decodes read the graph's logits
    assert 4 in decode and not all(used)  # the 4-row graph runs no head (over logits_max_rows)


def test_mixed_query_blocks_and_their_override(monkeypatch):
    """Mixed graphs up to SHORT_QUERY_TOKENS read 8-token query blocks (decode rows beside a
    chunk pay no wider block), larger ones 32; the A/B override is checked, naming itself."""
    from enginespec.worker import cuda_graphs

    assert cuda_graphs.mixed_capture_query_len(2) == 2
    assert cuda_graphs.mixed_capture_query_len(cuda_graphs.SHORT_QUERY_TOKENS) == 8
    assert cuda_graphs.mixed_capture_query_len(cuda_graphs.SHORT_QUERY_TOKENS + 1) == 32
    monkeypatch.setenv("ENGINESPEC_MIXED_SHORT_QUERY_TOKENS", "64")
    assert cuda_graphs._short_query_tokens() == 64
    monkeypatch.setenv("ENGINESPEC_MIXED_SHORT_QUERY_TOKENS", "lots")
    with pytest.raises(ValueError, match="ENGINESPEC_MIXED_SHORT_QUERY_TOKENS"):
        cuda_graphs._short_query_tokens()


def test_the_head_rides_in_single_gpu_decode_graphs_only():
    """The runner asks DecodeGraphs for the head (its capture reads this attribute, on CUDA
    only); tensor-parallel runners keep it eager (tp_runner.py says why)."""
    from enginespec.worker.runner import ModelRunner
    from enginespec.worker.tp_runner import TPModelRunner

    assert ModelRunner.GRAPH_LOGITS_MAX_ROWS >= 1
    assert TPModelRunner.GRAPH_LOGITS_MAX_ROWS == 0


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="compile-only launches are told apart by the interpreter's warmup flag",
)
def test_precompile_compiles_every_variant_the_capture_meets_and_runs_none(monkeypatch):
    """DecodeGraphs.precompile (before capture) runs one forward a bucket, decode and mixed,
    with our kernels' launches compile-only: it launches none of them for real and leaves the
    KV pools as they were; then the forwards the capture runs (every row a padding row) meet
    no variant it did not compile."""
    from enginespec.testing.triton_keys import record_launches

    llm = _interpreted_llm(num_blocks=32, max_num_batched_tokens=40)
    runner = llm.engine.runner
    graphs = _graphs_over(runner, [1, 2, 4], [8, 40])
    pools = [cache.clone() for cache in runner.kv_caches]
    seen = record_launches(monkeypatch)
    assert graphs.precompile() == 0
    compiled = set(seen["compile_only"])
    assert compiled and not seen["real"]
    assert all(torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)) for a, b in zip(pools, runner.kv_caches))
    names = {key[0] for key in compiled}
    assert {"_decode_attention_kernel", "_paged_attention_kernel"} <= names, names
    for n, mixed in graphs._shapes():
        graphs._pad(n, mixed)
        graphs._run(n, mixed)
    missing = [key for key in seen["real"] if key not in compiled]
    assert seen["real"] and not missing, missing[:2]


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="compile-only launches are told apart by the interpreter's warmup flag",
)
def test_the_profile_run_compiles_its_variants_before_it_runs_them(monkeypatch):
    """ModelRunner.profile_run first runs the largest step's forward with our kernels'
    launches compile-only (side by side on the pool), then for real: every real launch's
    variant was compiled by that pass, and the pass itself ran none."""
    from enginespec.testing.triton_keys import record_launches

    runner = _interpreted_llm(num_blocks=32, max_num_batched_tokens=40).engine.runner
    seen = record_launches(monkeypatch)
    real_forward, order = runner.model.forward, []

    def forward(*args, **kwargs):
        order.append((len(seen["compile_only"]), len(seen["real"])))
        return real_forward(*args, **kwargs)

    monkeypatch.setattr(runner.model, "forward", forward)
    runner.profile_run()
    assert len(order) == 2 and order[1] == (len(seen["compile_only"]), 0), "compile-only first, alone"
    missing = [key for key in seen["real"] if key not in set(seen["compile_only"])]
    assert seen["real"] and not missing, missing[:2]


def test_balanced_graph_buckets_and_the_spread_rule(monkeypatch):
    """ENGINESPEC_BALANCED_GRAPHS=1 (the default) names the decode buckets of 8-64 rows, head
    or not (0: none; anything else: ValueError); a batch's live lengths spread when the longest
    is at least 1.5 times their mean."""
    from enginespec.worker import cuda_graphs as cg

    buckets = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 128]
    monkeypatch.setenv(cg.BALANCED_GRAPHS_ENV, "0")
    assert cg.balanced_graph_buckets(buckets) == []
    monkeypatch.delenv(cg.BALANCED_GRAPHS_ENV, raising=False)
    assert cg.balanced_graph_buckets(buckets) == [8, 16, 24, 32, 40, 48, 56, 64]
    assert cg.balanced_graph_buckets([1, 2, 4, 7, 65]) == []
    monkeypatch.setenv(cg.BALANCED_GRAPHS_ENV, "yes")
    with pytest.raises(ValueError, match="ENGINESPEC_BALANCED_GRAPHS must be 0 or 1"):
        cg.balanced_graph_buckets(buckets)
    spread = [([517] * 31 + [0], False), ([100, 2048, 1000, 900] + [0] * 4, True), ([300, 450, 0], False),
              ([30, 90], True), ([2048], False)]  # fmt: skip
    for lens, want in spread:
        assert cg.lengths_spread(torch.tensor(lens, dtype=torch.int32)) == want, lens


class _Replay:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def replay(self):
        self.log.append(self.name)


def test_a_spread_batch_replays_the_balanced_graph(monkeypatch):
    """DecodeGraphs.forward replays a bucket's balanced graph for a batch whose lengths spread
    and its plain graph otherwise, returning that graph's output, and decode_logits then gives
    the head output of the graph that ran (8 rows: both graphs carry the head); buckets without
    a balanced graph always replay the plain one."""
    from types import SimpleNamespace

    from enginespec.worker import cuda_graphs as cg

    monkeypatch.setenv(cg.BALANCED_GRAPHS_ENV, "1")
    runner = _interpreted_llm(num_blocks=32, max_num_batched_tokens=40).engine.runner
    graphs = _graphs_over(runner, [4, 8, 24], [], logits_max_rows=8)
    assert graphs.balanced_buckets == [8, 24]
    log = []
    for n in (4, 8, 24):
        graphs.graphs[n], graphs.hidden[n] = _Replay(f"plain{n}", log), f"hidden{n}"
    for n in (8, 24):
        graphs.balanced_graphs[n], graphs.balanced_hidden[n] = (
            _Replay(f"balanced{n}", log),
            f"balanced_hidden{n}",
        )
    for n in (4, 8):
        graphs.logits[n] = torch.full((n, 3), float(n))
    graphs.balanced_logits[8] = torch.full((8, 3), -8.0)
    monkeypatch.setattr(graphs, "_load", lambda batch, mixed: None)

    def batch(lens, rows):
        lens = torch.tensor(lens + [0] * (rows - len(lens)), dtype=torch.int32)
        meta = SimpleNamespace(num_tokens=rows, num_reqs=rows, max_query_len=1, seq_lens_cpu=lens)
        return SimpleNamespace(meta=meta, num_reqs=rows)

    def head(b):
        return graphs.decode_logits(b)

    assert graphs.forward(batch([517] * 24, 24)) == "hidden24" and head(batch([517] * 24, 24)) is None
    assert graphs.forward(batch([100 + 80 * i for i in range(24)], 24)) == "balanced_hidden24"
    spread8 = batch([100, 2000, 3000], 8)
    assert graphs.forward(spread8) == "balanced_hidden8" and head(spread8).eq(-8.0).all()
    assert graphs.last_graph is graphs.balanced_graphs[8]  # what benchmarks replay to time it
    even8 = batch([517] * 8, 8)
    assert graphs.forward(even8) == "hidden8" and head(even8).eq(8.0).all()
    assert graphs.last_graph is graphs.graphs[8]
    four = batch([100, 3000], 4)
    assert graphs.forward(four) == "hidden4" and head(four).eq(4.0).all()
    assert log == ["plain24", "balanced24", "balanced8", "plain8", "plain4"]


def test_a_balanced_buckets_plain_graph_balances_no_launch(monkeypatch):
    """The plain graph of a bucket that also has a balanced graph runs its forward with no
    decode launch balanced (the default rule balances 8-16-row split launches); the balanced
    one balances them; a bucket without a twin keeps the default rule."""
    from enginespec.kernels import decode_attention as da
    from enginespec.kernels import paged_attention as pa
    from enginespec.worker import cuda_graphs as cg

    monkeypatch.setenv(cg.BALANCED_GRAPHS_ENV, "1")
    monkeypatch.delenv(da.DECODE_ATTN_ENV, raising=False)
    monkeypatch.setattr(pa, "_num_sms", lambda device: 132)
    monkeypatch.setattr(pa, "_programs_per_sm", lambda *args: 1)
    runner = _interpreted_llm(num_blocks=32, max_num_batched_tokens=40).engine.runner
    graphs = _graphs_over(runner, [4, 8], [])

    def balance(n, balanced):
        with graphs._launches(n, balanced):
            return da.decode_config(n, 16, 8, 128, 40960, torch.device("cpu")).balance_splits

    assert da.decode_config(8, 16, 8, 128, 40960, torch.device("cpu")).balance_splits > 0  # the default
    assert balance(8, False) == 0 and balance(8, True) > 0
    assert balance(4, False) == da.decode_config(4, 16, 8, 128, 40960, torch.device("cpu")).balance_splits


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="compile-only launches are told apart by the interpreter's warmup flag",
)
def test_precompile_covers_the_balanced_graphs_variants(monkeypatch):
    """With ENGINESPEC_BALANCED_GRAPHS=1 the precompile pass runs the balanced buckets' forwards
    too (under balanced_launches): the balanced decode attention and merge are among its
    variants, and the capture's forwards of both kinds meet none it did not compile."""
    from enginespec.testing.triton_keys import record_launches
    from enginespec.worker import cuda_graphs as cg

    monkeypatch.setenv(cg.BALANCED_GRAPHS_ENV, "1")
    runner = _interpreted_llm(num_blocks=32, max_num_batched_tokens=40).engine.runner
    graphs = _graphs_over(runner, [2, 24], [])
    assert graphs._variants() == [(24, False, False), (2, False, False), (24, False, True)]
    seen = record_launches(monkeypatch)
    assert graphs.precompile() == 0 and not seen["real"]
    compiled = set(seen["compile_only"])
    balanced = [key for key in compiled if dict(key[1]).get("BALANCE")]
    assert {key[0] for key in balanced} == {"_decode_attention_kernel", "_merge_splits_kernel"}
    for n, mixed, is_balanced in graphs._variants():
        graphs._pad(n, mixed)
        with graphs._launches(n, is_balanced):
            graphs._run(n, mixed)
    missing = [key for key in seen["real"] if key not in compiled]
    assert seen["real"] and not missing, missing[:2]


def test_a_spread_mixed_step_replays_its_mixed_graph_not_a_balanced_decode_one(monkeypatch):
    """A mixed step (a prefill chunk beside decodes) padded to a token count that is also a
    balanced decode bucket (8-64: 8, 16, 32, 64 are mixed buckets too) replays its mixed graph,
    whatever its lengths: its inputs sit in the mixed buffers, so the balanced decode graph
    would run the decode bucket's stale inputs and the step would sample from their hidden rows.
    A spread mixed step (a 5-token first chunk beside a 100-token decode) used to do that."""
    from types import SimpleNamespace

    from enginespec.worker import cuda_graphs as cg

    monkeypatch.setenv(cg.BALANCED_GRAPHS_ENV, "1")
    runner = _interpreted_llm(num_blocks=32, max_num_batched_tokens=40).engine.runner
    graphs = _graphs_over(runner, [4, 8], [8, 16], logits_max_rows=8)
    assert graphs.balanced_buckets == [8]
    log = []
    graphs.graphs[8], graphs.hidden[8] = _Replay("plain8", log), "hidden8"
    graphs.balanced_graphs[8], graphs.balanced_hidden[8] = _Replay("balanced8", log), "balanced_hidden8"
    graphs.mixed_graphs[8], graphs.mixed_hidden[8] = _Replay("mixed8", log), "mixed_hidden8"
    graphs.logits[8] = graphs.balanced_logits[8] = torch.zeros(8, 3)
    monkeypatch.setattr(graphs, "_load", lambda batch, mixed: None)
    lens = torch.tensor([5, 100, 0, 0], dtype=torch.int32)  # two padding requests of one row
    meta = SimpleNamespace(num_tokens=8, num_reqs=4, max_query_len=5, seq_lens_cpu=lens)
    step = SimpleNamespace(meta=meta, num_reqs=4)
    assert cg.lengths_spread(lens)
    assert graphs.forward(step) == "mixed_hidden8"
    assert log == ["mixed8"] and graphs.last_graph is graphs.mixed_graphs[8]
    assert graphs.decode_logits(step) is None
