"""Weight updates (vLLM's LLM.load_weights / reload_weights; worker/weight_update.py): after
load_weights(every tensor of checkpoint B) an engine loaded from checkpoint A holds exactly the
weights, derived ones included (merged q|k|v and gate|up, folded norms, a tied head, Qwen3's
stacked q/k norms), and serves exactly the greedy outputs of an engine loaded from B; a subset
updates only its names; refusals change nothing; reload_weights reads the checkpoint again; the
prefix cache is emptied; sleep(level=2) discards the target's parameters and the engine refuses
requests until they are filled again. B is the same tiny config written with another seed."""

from __future__ import annotations

import asyncio
import os
from contextlib import contextmanager

import pytest
import torch

from enginespec.async_llm import AsyncLLM
from enginespec.llm import LLM
from enginespec.spec import SamplingParams, load_impl
from enginespec.testing.checkpoints import tiny_model_dir
from enginespec.worker.flat_model import FlatModel
from enginespec.worker.loader import iter_tensors
from enginespec.worker.merged_decoder import FOLD_NORMS_ENV
from enginespec.worker.sleep import EngineAsleepError, model_tensors
from enginespec.worker.weight_update import apply_update, finish_update, plan_update

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [{"prompt_token_ids": list(range(5, 45))}, {"prompt_token_ids": [7, 8, 9, 10, 11]}]
GREEDY = SamplingParams(max_tokens=12, temperature=0)
ONE = SamplingParams(max_tokens=1, temperature=0)
FULL_BLOCKS = 32  # PROMPTS[0]'s two full blocks of 16


@contextmanager
def _fold(setting: str):
    """ENGINESPEC_FOLD_NORMS while a model is built ("1": fold on the CPU too)."""
    old = os.environ.get(FOLD_NORMS_ENV)
    os.environ[FOLD_NORMS_ENV] = setting
    try:
        yield
    finally:
        if old is None:
            del os.environ[FOLD_NORMS_ENV]
        else:
            os.environ[FOLD_NORMS_ENV] = old


def _greedy(llm) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def _paths(family: str = "qwen3", tied: bool = False) -> tuple[str, str]:
    return str(tiny_model_dir(family, tied)), str(tiny_model_dir(family, tied, seed=1))


@pytest.fixture(scope="module")
def want_b() -> list[list[int]]:
    with LLM(_paths()[1], dtype="float32", device="cpu", num_blocks=32) as llm:
        return _greedy(llm)


@pytest.fixture(scope="module")
def llm():
    """Loaded from A, with a draft model (A too: it stays A, updates reach the target only)."""
    path = _paths()[0]
    draft = {"method": "draft_model", "model": path, "num_speculative_tokens": 2}
    with LLM(
        path, dtype="float32", device="cpu", num_blocks=32, enable_sleep_mode=True, speculative_config=draft
    ) as llm:
        yield llm


@pytest.fixture(scope="module")
def want_a(llm) -> list[list[int]]:
    return _greedy(llm)


def _all_tensors(model) -> dict[str, torch.Tensor]:
    """Every named tensor of the model: the checkpoint's tree and the merged decoder's (merged
    and stacked weights, folded norms' weights, rope table)."""
    out = {f"hf.{n}": t for n, t in model.hf_model.state_dict(keep_vars=True).items()}
    if model.merged is not None:
        out.update({f"merged.{n}": t for n, t in model.merged.named_parameters(remove_duplicate=False)})
        out.update({f"merged.{n}": t for n, t in model.merged.named_buffers(remove_duplicate=False)})
    return out


def _assert_same_tensors(got, want) -> None:
    a, b = _all_tensors(got), _all_tensors(want)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name  # equal, not close


def _update(model, weights, finish: bool = True) -> None:
    """What LLM.load_weights does to the model, then (finish) what its next forward does first."""
    apply_update(model, plan_update(model, weights))
    if finish:
        finish_update(model)


def _flat(path: str, fold: str) -> FlatModel:
    with _fold(fold):
        backend = load_impl("fast").attention_backend(torch.device("cpu"))
        return FlatModel.from_pretrained(path, attention=backend, dtype=torch.float32)


def test_load_weights_of_b_serves_bs_outputs_empties_the_prefix_cache_and_reload_restores_a(
    llm, want_a, want_b
):
    assert want_a != want_b  # the two checkpoints disagree: the test can tell them apart
    assert llm.generate(PROMPTS[0], ONE, use_tqdm=False)[0].num_cached_tokens == FULL_BLOCKS
    draft = {n: t.clone() for n, t in llm.engine.spec.drafter.runner.model.hf_model.state_dict().items()}
    assert llm.load_weights(iter_tensors(_paths()[1])) == len(draft)  # every checkpoint tensor
    assert llm.generate(PROMPTS[0], ONE, use_tqdm=False)[0].num_cached_tokens == 0  # old KV forgotten
    assert _greedy(llm) == want_b
    for name, t in llm.engine.spec.drafter.runner.model.hf_model.state_dict().items():
        assert torch.equal(t, draft[name]), name  # the draft model is not updated
    assert llm.generate(PROMPTS[0], ONE, use_tqdm=False)[0].num_cached_tokens == FULL_BLOCKS
    assert llm.reload_weights() == len(draft)  # the engine's own checkpoint, read from disk again
    assert llm.generate(PROMPTS[0], ONE, use_tqdm=False)[0].num_cached_tokens == 0  # reload forgets too
    assert _greedy(llm) == want_a
    assert llm.llm_engine.reload_weights(_paths()[1]) == len(draft)  # LLMEngine's, another directory
    assert _greedy(llm) == want_b
    llm.llm_engine.load_weights(dict(iter_tensors(_paths()[0])))  # a state dict itself too
    assert _greedy(llm) == want_a
    assert llm.collective_rpc("reload_weights", args=(_paths()[1],)) == [len(draft)]  # vLLM's spelling
    assert _greedy(llm) == want_b
    assert llm.collective_rpc("load_weights", kwargs={"weights": iter_tensors(_paths()[0])}) == [len(draft)]
    assert _greedy(llm) == want_a
    with pytest.raises(
        ValueError, match=r"collective_rpc: method must be one of \['load_weights', 'reload_weights'\]"
    ):
        llm.collective_rpc("init_weight_update_group")


@pytest.mark.parametrize(
    "family, tied, fold",
    [("qwen3", True, "1"), ("llama", False, "1"), ("qwen2", False, "0")],
    ids=["qwen3-tied-folded", "llama-folded", "qwen2-bias"],
)
def test_every_derived_tensor_equals_that_of_a_model_loaded_from_b(family, tied, fold):
    """The merged decoder's merged weights, Qwen3's stacked q/k norms, folded projections (the
    fast backend folds; ENGINESPEC_FOLD_NORMS=1 on the CPU) and a tied head, each exactly what a
    load of B derives (qwen2 has biases: no folding)."""
    a, b = _paths(family, tied)
    model, want = _flat(a, fold), _flat(b, fold)
    assert model.folded_norms == (fold == "1")
    weights = list(iter_tensors(b))
    if tied:  # an exporter's state dict holds the tied head too: checked, skipped (vLLM's rule)
        weights.append(("lm_head.weight", dict(weights)["model.embed_tokens.weight"]))
    _update(model, weights)
    _assert_same_tensors(model, want)
    with torch.no_grad():  # what a level-2 sleep's wake_up leaves: every parameter zero
        for t in model_tensors(model):
            if isinstance(t, torch.nn.Parameter):
                t.zero_()
    _update(model, weights)
    _assert_same_tensors(model, want)
    if tied:
        assert model.hf_model.lm_head.weight is model.hf_model.model.embed_tokens.weight


def test_fast_impl_with_folded_norms_serves_bs_outputs_also_after_a_level_2_sleep():
    """The fast impl's merged decoder with its norms folded (ENGINESPEC_FOLD_NORMS=1 on the
    CPU): B's outputs after load_weights, in one call or in buckets, and after sleep(level=2)
    (the norm modules' unit weights discarded too) and reload_weights."""
    a, b = _paths()
    with _fold("1"), LLM(b, impl="fast", dtype="float32", device="cpu", num_blocks=32) as llm_b:
        want = _greedy(llm_b)
    with (
        _fold("1"),
        LLM(a, impl="fast", dtype="float32", device="cpu", num_blocks=32, enable_sleep_mode=True) as llm,
    ):
        assert llm.engine.model.folded_norms
        llm.load_weights(iter_tensors(b))
        assert _greedy(llm) == want
        llm.reload_weights()
        weights = list(iter_tensors(b))
        for start in range(0, len(weights), 3):  # buckets: norms in later calls than their rows
            llm.load_weights(weights[start : start + 3])
        assert llm.engine.model.unfolded_rows  # raw until the next forward folds them
        assert _greedy(llm) == want and not llm.engine.model.unfolded_rows
        llm.reload_weights()
        llm.sleep(level=2)
        llm.wake_up()
        llm.reload_weights(b)
        assert _greedy(llm) == want


def test_a_subset_updates_only_its_names_folded_norms_included():
    """A few names from B (an embedding, a q_proj and Qwen3's q_norm, a folded norm with its
    gate and up): the model equals one loaded from B whose other tensors are A's. A folded norm
    given alone rescales its rows (one more rounding: close, not equal)."""
    a, b = _paths()
    subset = {
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.q_norm.weight",
        "model.layers.1.post_attention_layernorm.weight",
        "model.layers.1.mlp.gate_proj.weight",
        "model.layers.1.mlp.up_proj.weight",
    }
    model, want = _flat(a, "1"), _flat(b, "1")
    from_a, from_b = dict(iter_tensors(a)), dict(iter_tensors(b))

    def mixed() -> list:  # the whole state dict, B's tensors for `subset`: exact in one call
        return [(n, from_b[n] if n in subset else t) for n, t in from_a.items()]

    _update(model, [(n, from_b[n]) for n in subset])
    _update(want, mixed())
    _assert_same_tensors(model, want)
    norm = "model.layers.0.input_layernorm.weight"  # alone: q|k|v rows rescaled
    _update(model, [(norm, from_b[norm])])
    subset.add(norm)
    _update(want, mixed())
    got, expected = _all_tensors(model), _all_tensors(want)
    for name in got:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-6, atol=1e-7, msg=name)


def test_one_tensor_a_call_in_file_order_is_exact_too():
    """An RLHF framework sends its state dict in buckets: here one tensor a call, in the files'
    order, where a layer's post-attention norm comes after its gate and up projections. The
    folded rows wait unfolded until the next forward (finish_update), so the norm arriving last
    still gives exactly the weights a load of B folds."""
    a, b = _paths()
    model, want = _flat(a, "1"), _flat(b, "1")
    names = [n for n, _ in iter_tensors(b)]
    assert names.index("model.layers.0.post_attention_layernorm.weight") > names.index(
        "model.layers.0.mlp.up_proj.weight"
    )
    for pair in iter_tensors(b):
        _update(model, [pair], finish=False)  # no forward between the calls
    finish_update(model)
    _assert_same_tensors(model, want)


def _snapshot(llm) -> list[torch.Tensor]:
    return [t.clone() for t in model_tensors(llm.engine.model)]


def _unchanged(llm, before) -> bool:
    return all(torch.equal(a, b) for a, b in zip(model_tensors(llm.engine.model), before))


def test_refusals_name_the_fault_and_change_nothing(llm, want_a):
    """An unknown name after good ones, a shape, an integer tensor for a float weight, a name
    twice, a request unfinished, the weights asleep, a checkpoint of another model: each an
    error naming it, no weight copied, the prefix cache kept."""
    b = dict(iter_tensors(_paths()[1]))
    good = [(n, t) for n, t in b.items() if "layers.0" in n]
    llm.generate(PROMPTS[0], ONE, use_tqdm=False)
    before = _snapshot(llm)
    q = "model.layers.0.self_attn.q_proj.weight"
    cases = [
        (
            good + [("model.layers.9.mlp.up_proj.weight", b[q])],
            r"unknown weight 'model\.layers\.9\.mlp\.up_proj\.weight'",
        ),
        (
            good + [(q, b[q][:-1])],
            r"'model\.layers\.0\.self_attn\.q_proj\.weight' has shape \[63, 32\], the model's is \[64, 32\]",
        ),
        (good + [(q, b[q].long())], r"dtype torch\.int64, which cannot be the model's torch\.float32"),
        (good + [good[0]], "is given twice"),
        ([q], r"\(name, tensor\) pairs"),
    ]
    for weights, message in cases:
        with pytest.raises(ValueError, match=message):
            llm.load_weights(weights)
        assert _unchanged(llm, before)
    with pytest.raises(ValueError, match="unknown weight|has shape"):
        llm.reload_weights(str(tiny_model_dir("qwen2")))  # another family: its names or shapes
    stream = llm.stream(PROMPTS[1], GREEDY)
    next(stream)  # running
    with pytest.raises(RuntimeError, match=r"load_weights: 1 unfinished request\(s\)"):
        llm.load_weights(good)
    with pytest.raises(RuntimeError, match=r"reload_weights: 1 unfinished request\(s\)"):
        llm.reload_weights()
    stream.close()
    llm.sleep()
    with pytest.raises(RuntimeError, match=r"weights are asleep .*wake_up\(tags=\['weights'\]\)"):
        llm.load_weights(good)
    with pytest.raises(RuntimeError, match=r"^reload_weights: the weights are asleep"):
        llm.reload_weights()
    llm.wake_up()
    assert _unchanged(llm, before)
    assert llm.generate(PROMPTS[0], ONE, use_tqdm=False)[0].num_cached_tokens == 0  # the sleep's reset
    assert _greedy(llm) == want_a


def test_a_value_beyond_float16s_range_is_refused_as_at_load():
    """A float16 model: an update holding a value that becomes inf in the cast (65520 and up;
    a checkpoint holding one is refused at load, worker/loader.py) is a ValueError naming the
    tensor, nothing copied (a good tensor given before it neither); the largest value that
    rounds to a finite float16 (65519.9 -> 65504) is taken. It was copied in, every logit NaN."""
    a, b = _paths()
    model = FlatModel.from_pretrained(
        a, attention=load_impl("fast").attention_backend(torch.device("cpu")), dtype=torch.float16
    )
    before = {n: t.clone() for n, t in model.hf_model.state_dict().items()}
    q, norm = "model.layers.1.self_attn.q_proj.weight", "model.norm.weight"
    weights = dict(iter_tensors(b))
    for big in (65520.0, float("inf"), -1e6):
        bad = weights[q].clone()
        bad[3, 5] = big
        with pytest.raises(
            ValueError, match=r"tensor 'model\.layers\.1\.self_attn\.q_proj\.weight' .*float16"
        ):
            _update(model, [(norm, weights[norm]), (q, bad)])
        for name, t in model.hf_model.state_dict().items():
            assert torch.equal(t, before[name]), name
    ok = weights[q].clone()
    ok[3, 5] = 65519.9
    _update(model, [(q, ok)])
    assert float(model.hf_model.state_dict()[q][3, 5]) == 65504.0
    wide = FlatModel.from_pretrained(
        a, attention=load_impl("fast").attention_backend(torch.device("cpu")), dtype=torch.float32
    )
    big = weights[q].clone()
    big[3, 5] = 1e6  # float32's own range: no float16 check for a float32 model
    _update(wide, [(q, big)])
    assert float(wide.hf_model.state_dict()[q][3, 5]) == 1e6


def _weight_groups(runner) -> list:
    return runner._asleep["weights"].groups


def test_sleep_level_2_discards_the_targets_weights_until_load_weights_fills_them(llm, want_a, want_b):
    """vLLM's recipe: sleep(level=2); wake_up(tags=["weights"]); load_weights; wake_up(tags=
    ["kv_cache"]). The target's parameters get no host copy (its rope buffers do); the draft's
    weights sleep as at level 1. Until every checkpoint name is loaded again, requests are
    refused (a part is not enough); then B's outputs, and a second cycle with reload_weights."""
    target, draft = llm.engine.runner, llm.engine.spec.drafter.runner
    llm.sleep(level=2)
    assert llm.is_sleeping()
    kept = [g for g in _weight_groups(target) if g.keep]
    assert kept and all(not isinstance(t, torch.nn.Parameter) for g in kept for t in g.tensors)
    assert sum(not g.keep for g in _weight_groups(target)) > 0
    assert all(g.keep for g in _weight_groups(draft))
    llm.wake_up(tags=["weights"])
    weights = list(iter_tensors(_paths()[1]))
    llm.load_weights(weights[:3])
    llm.wake_up(tags=["kv_cache"])
    assert not llm.is_sleeping()  # vLLM's: every tag awake; requests wait for the weights
    with pytest.raises(
        EngineAsleepError, match=r"sleep\(level=2\) and \d+ checkpoint tensor\(s\) are not loaded"
    ):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert llm.engine.num_unfinished == 0
    llm.load_weights(weights[3:])
    assert _greedy(llm) == want_b
    llm.sleep(level=2)
    llm.wake_up()
    with pytest.raises(EngineAsleepError, match="reload_weights"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.reload_weights()
    assert _greedy(llm) == want_a


def test_async_reload_weights_crosses_to_the_engine_process(want_b):
    a, b = _paths()
    engine = AsyncLLM(a, in_process=True, start_timeout=120, dtype="float32", device="cpu", num_blocks=32)

    async def tokens(request_id: str) -> list[int]:
        outs = [out async for out in engine.generate(PROMPTS[0], GREEDY, request_id)]
        return outs[-1].outputs[0].token_ids

    async def run():
        want_a = await tokens("a")
        assert await engine.reload_weights(b) > 0
        assert await tokens("b") == want_b[0]
        with pytest.raises(ValueError, match="unknown weight|has shape"):
            await engine.reload_weights(str(tiny_model_dir("qwen2")))
        await engine.reload_weights()
        assert await tokens("c") == want_a

    try:
        asyncio.run(run())
    finally:
        engine.shutdown()
