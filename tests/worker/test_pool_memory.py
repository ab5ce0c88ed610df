"""A KV pool the user sized past the device's memory is a ValueError naming the field at
construction (ModelRunner._check_pool_memory), never the allocator's RuntimeError naming none,
nor a zero-fill that pages the host out of memory."""

from __future__ import annotations

import pytest

from enginespec.testing.checkpoints import tiny_model_dir
from enginespec.worker import runner as runner_module

pytestmark = pytest.mark.usefixtures("torch_one_thread")

AVAILABLE = 1 << 20  # what the tests pretend the host has free: 1 MiB


def _llm(**kwargs):
    from enginespec.llm import LLM

    return LLM(
        str(tiny_model_dir("qwen3")), impl="fast", dtype="float32", device="cpu", block_size=4, **kwargs
    )


@pytest.fixture
def small_host(monkeypatch):
    monkeypatch.setattr(runner_module, "host_bytes_available", lambda: AVAILABLE)


@pytest.mark.parametrize(
    "field, value",
    [("num_blocks", 10**12), ("num_gpu_blocks_override", 10**12), ("kv_cache_bytes", 10**15)],
)
def test_an_absurd_pool_size_names_the_field_and_the_bound(field, value):
    """On the real host: a pool of about a petabyte failed inside torch's allocator."""
    with pytest.raises(ValueError, match=rf"{field} \({value}\).*bytes of host memory available"):
        _llm(**{field: value})


@pytest.mark.parametrize("field", ["num_blocks", "num_gpu_blocks_override"])
def test_a_block_count_past_the_free_memory_is_refused_before_allocating(small_host, field):
    """A count that malloc would grant (overcommit) but zero-filling could not back: refused
    before anything is allocated, naming the count, the bytes it needs and the bytes free."""
    per_block = _llm(num_blocks=1).engine.runner.bytes_per_block
    fits = AVAILABLE // per_block - 1  # the scratch block comes on top
    assert _llm(**{field: fits}).engine.runner.num_blocks == fits
    with pytest.raises(ValueError, match=rf"{field} \({fits + 1}\) needs {(fits + 2) * per_block} bytes"):
        _llm(**{field: fits + 1})


def test_kv_cache_bytes_past_the_free_memory_is_refused(small_host):
    assert _llm(kv_cache_bytes=AVAILABLE // 2).engine.runner.num_blocks >= 1
    with pytest.raises(ValueError, match=rf"kv_cache_bytes \({2 * AVAILABLE}\).*{AVAILABLE} bytes"):
        _llm(kv_cache_bytes=2 * AVAILABLE)


def test_the_default_pool_is_not_checked(small_host):
    """The default budget is the engine's own choice, capped at what the requests can use: it is
    never refused for a field the user did not set."""
    assert _llm(max_num_seqs=1, max_model_len=16).engine.runner.num_blocks == 4


def test_an_allocator_refusal_the_check_let_through_names_the_field(monkeypatch):
    """Where the free memory cannot be read (no check) or the allocation fails anyway (a GPU's
    fragmented memory), the allocator's RuntimeError is a ValueError naming the setting; any
    other RuntimeError of the allocation passes as it is."""
    from enginespec.worker.flat_model import FlatModel

    monkeypatch.setattr(runner_module, "host_bytes_available", lambda: None)

    def refuse(self, num_blocks, block_size):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(FlatModel, "allocate_kv", refuse)
    with pytest.raises(ValueError, match=r"num_blocks sized it, could not be allocated .*lower num_blocks"):
        _llm(num_blocks=64)
    monkeypatch.setattr(FlatModel, "allocate_kv", lambda *a: (_ for _ in ()).throw(RuntimeError("other")))
    with pytest.raises(RuntimeError, match="^other$"):
        _llm(num_blocks=64)


def test_a_block_count_is_checked_against_the_host_once_per_tensor_parallel_rank(monkeypatch):
    """On the CPU the ranks' pools all come out of one host's memory. Each rank checked its own
    pool alone, so TP=2 took a block count that fits the host once but not twice: rank 0 (the
    host pretends here, the worker reads the real one) passed, and on a real host both ranks
    zero-filled their pools until the kernel killed one. Refused now, before any allocation,
    and the worker that was started is released."""
    import multiprocessing

    from enginespec.llm import LLM

    path = str(tiny_model_dir("qwen3"))
    kwargs = dict(impl="fast", dtype="float32", device="cpu", block_size=4, tensor_parallel_size=2)
    with LLM(path, num_blocks=1, **kwargs) as llm:
        per_block = llm.engine.runner.bytes_per_block  # one rank's: half the KV heads
    blocks = AVAILABLE // per_block // 2  # the scratch block on top: fits once, not twice
    monkeypatch.setattr(runner_module, "host_bytes_available", lambda: AVAILABLE)
    before = set(multiprocessing.active_children())
    need = 2 * (blocks + 1) * per_block
    with pytest.raises(ValueError, match=rf"num_blocks \({blocks}\) needs {need} bytes.*2 tensor-parallel"):
        LLM(path, num_blocks=blocks, **kwargs)
    assert set(multiprocessing.active_children()) <= before
    with LLM(path, num_blocks=blocks // 2 - 1, **kwargs) as llm:  # both ranks' pools fit
        assert llm.engine.runner.num_blocks == blocks // 2 - 1
