"""torch.compile of the decoder (worker/compiled.py) never changes greedy outputs, and one
compiled graph (plus the one-row specialisation) serves every step.

On the CPU the body is compiled with the "aot_eager" backend: dynamo traces the whole decoder
(attention as the opaque enginespec::paged_attention op) and AOTAutograd runs it, without
inductor's code generation, so CI stays fast. The inductor path itself runs on CUDA in
test_cuda_graphs.py (the default there).
"""

from __future__ import annotations

import pytest
import torch

from enginespec.conformance.invariants import check_idle
from enginespec.spec import SamplingParams
from enginespec.testing.checkpoints import tiny_model_dir
from enginespec.worker.compiled import should_compile
from enginespec.worker.step_context import current


def _generate(impl, family, **engine_args):
    from enginespec.llm import LLM

    # Prompts of 5..35 tokens with a 16-token budget: prefill chunks, mixed steps, and a tail
    # where one request decodes alone (the one-row graph).
    prompts = [{"prompt_token_ids": [(5 * i + 3 * j) % 90 + 1 for j in range(5 + 6 * i)]} for i in range(6)]
    params = [SamplingParams(max_tokens=4 + 3 * i, temperature=0.0, ignore_eos=True) for i in range(6)]
    llm = LLM(
        tiny_model_dir(family),
        impl=impl,
        dtype="float32",
        device="cpu",
        block_size=4,
        num_blocks=128,
        max_num_batched_tokens=16,
        max_num_seqs=4,
        **engine_args,
    )
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)
    return llm, outs


@pytest.mark.parametrize("family,fold", [("qwen3", "0"), ("mistral", "0"), ("qwen3", "1")])
def test_compiled_body_equals_eager(impl, family, fold, torch_one_thread, monkeypatch):
    """fold "1": the norms folded into the projections (where the impl's backend folds_norms),
    so the traced layers carry the in-place residual GEMMs (enginespec::add_linear_)."""
    from torch._dynamo.utils import counters

    from enginespec.worker.merged_decoder import FOLD_NORMS_ENV

    monkeypatch.setenv(FOLD_NORMS_ENV, fold)
    torch._dynamo.reset()
    counters.clear()
    _, eager = _generate(impl, family)
    llm, compiled = _generate(impl, family, compile_model=True, compile_backend="aot_eager")
    body = llm.engine.runner.body
    assert body is not None and body.error is None, f"compiled body fell back to eager: {body.error!r}"
    assert compiled == eager
    # one dynamic graph for N >= 2 plus the N = 1 specialisation; a graph per step would be a bug
    assert 1 <= counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_profile_run_compiles_the_graph_real_steps_use(impl, torch_one_thread):
    """The CUDA sizing run's forward compiles the graph every later eager step reuses: its batch
    must be built outside inference mode as real steps' batches are (dynamo guards on a tensor's
    dispatch keys, and an inference tensor's differ), else a cold start compiles the decoder a
    third time (the dynamic graph again: 16.4 s for the 0.6B shape on a cold H200)."""
    from torch._dynamo.utils import counters

    from enginespec.llm import LLM

    torch._dynamo.reset()
    prompts = [{"prompt_token_ids": [(3 * i + j) % 90 + 1 for j in range(5 + 7 * i)]} for i in range(3)]
    llm = LLM(
        tiny_model_dir("qwen3"), impl=impl, dtype="float32", device="cpu", block_size=4, num_blocks=64,
        max_num_batched_tokens=16, max_num_seqs=4, compile_model=True, compile_backend="aot_eager",
    )  # fmt: skip
    counters.clear()
    llm.engine.runner.profile_run(llm.engine.sampler)
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])
    check_idle(llm.engine.block_manager.state(), llm.engine.runner.num_blocks)


def test_graph_inputs_share_the_eager_steps_compiled_graph(impl):
    """CUDA-graph capture feeds the compiled body static buffers; eager steps feed it views of
    the step's staging copy. dynamo guards on storage offsets (0 and 1 specialised), so both
    must put input_ids at offset 0 and positions past 1, or capture compiles the decoder again."""
    from torch._dynamo.utils import counters

    from enginespec.impls.fast.batch import _Layout
    from enginespec.worker.cuda_graphs import static_token_inputs

    table = torch.randn(64, 8)

    def body(input_ids, positions):
        return table[positions] * input_ids[:, None].float()

    torch._dynamo.reset()
    compiled = torch.compile(body, backend="aot_eager", fullgraph=True)
    counters.clear()
    for n in (5, 3):  # an eager step's staging views, then a capture bucket's static buffers
        ids, pos = _Layout(n, n, 2, n).views(torch.zeros(4096, dtype=torch.uint8))[:2]
        ids, pos = ids.copy_(torch.arange(n)), pos.copy_(torch.arange(n))
        graph_ids, graph_pos = (t[:n] for t in static_token_inputs(8, "cpu"))
        for a, b in ((ids, pos), (graph_ids, graph_pos)):
            torch._dynamo.mark_dynamic(a, 0)
            torch._dynamo.mark_dynamic(b, 0)
            compiled(a, b)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_rows_up_to_eager_max_rows_run_uncompiled(impl, torch_one_thread):
    """CompiledBody.eager_max_rows: steps of that many rows or fewer run the eager body (no
    dynamo graph for them), larger ones the compiled graph; both compute what eager does."""
    from torch._dynamo.utils import counters

    from enginespec.worker.compiled import CompiledBody
    from enginespec.worker.flat_model import FlatModel
    from tests.worker.test_skinny_linear import _prefill

    model = FlatModel.from_pretrained(tiny_model_dir("qwen3"), attention=impl.attention_backend("cpu"))
    torch._dynamo.reset()
    body = CompiledBody(model, backend="aot_eager")
    body.eager_max_rows = 8
    counters.clear()
    for n, graphs in ((1, 0), (8, 0), (11, 1), (13, 1)):
        got = _prefill(model, impl, n, body=body)
        torch.testing.assert_close(got, _prefill(model, impl, n), atol=1e-5, rtol=1e-5)
        assert counters["stats"]["unique_graphs"] == graphs, (n, dict(counters["stats"]))


def test_compile_setting():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert should_compile(None, cuda, enforce_eager=False)
    assert not should_compile(None, cuda, enforce_eager=True)
    assert not should_compile(None, cpu, enforce_eager=False)
    assert should_compile(True, cpu, enforce_eager=False)
    assert not should_compile(False, cuda, enforce_eager=False)
    with pytest.raises(ValueError, match="compile_model"):
        should_compile("yes", cpu, enforce_eager=False)


def test_a_folded_decoder_is_not_compiled_unless_asked(monkeypatch):
    """A folded decoder has nothing left for inductor (compiled.py's should_compile): off by
    default; compile_model=True or ENGINESPEC_COMPILE=1 still compile it, =0 turns any off."""
    from enginespec.worker.compiled import COMPILE_ENV

    cuda = torch.device("cuda")
    monkeypatch.delenv(COMPILE_ENV, raising=False)
    assert not should_compile(None, cuda, enforce_eager=False, folded=True)
    assert should_compile(True, cuda, enforce_eager=False, folded=True)
    monkeypatch.setenv(COMPILE_ENV, "1")
    assert should_compile(None, cuda, enforce_eager=False, folded=True)
    assert should_compile(None, torch.device("cpu"), enforce_eager=False)
    monkeypatch.setenv(COMPILE_ENV, "0")
    assert not should_compile(None, cuda, enforce_eager=False)
    assert should_compile(True, cuda, enforce_eager=False)  # the argument wins over the env
    monkeypatch.setenv(COMPILE_ENV, "yes")
    with pytest.raises(ValueError, match=COMPILE_ENV):
        should_compile(None, cuda, enforce_eager=False)


def test_attention_op_needs_a_step_context():
    with pytest.raises(ValueError, match="StepContext"):
        current()
    q = torch.randn(1, 4, 3, 16)
    kv = torch.randn(1, 2, 3, 16)
    with pytest.raises(ValueError, match="StepContext"):
        torch.ops.enginespec.paged_attention(q, kv, kv, 0, 0.25, 0)
