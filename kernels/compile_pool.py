"""Compile-only launches of Triton kernels, side by side on a thread pool.

A Triton kernel compiles the first time a launch meets a new variant (constexprs, argument
dtypes, the specialisation of its ints and pointers), on the launching thread, so a startup that
meets its variants one after another pays their compile times one after another. Under Triton's
AsyncCompileMode a launch that misses the cache hands its compile to an executor and returns,
and a compile-only launch (`JITFunction.warmup(..., grid=...)`, which every kernel wrapper here
offers as `compile_only=True`) runs nothing on the device: so a list of such launches issued on
one thread compiles on all the pool's threads at once, and the real launches later find their
variants in the cache. Users: the startup GEMM tuning (worker/gemm_tuning.py), the profile
run's and the decode graphs' kernels before they run (worker/runner.py, worker/cuda_graphs.py,
through compile_only_launches) and the sampler's kernels before the warm-up
(sample/precompile.py). Before the threads, the variants go to worker processes where those are
on (kernels/compile_procs.py): the threads' compiles then hit Triton's on-disk cache.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import os
from typing import Callable

from enginespec.kernels.switches import env_switch

log = logging.getLogger(__name__)
# "0": precompile() runs no job, so every variant compiles when first launched, one after another
# (the startup before these passes existed, for A/B runs of the cold start)
PRECOMPILE_ENV = "ENGINESPEC_PRECOMPILE"
# The pool's threads: a positive int, default DEFAULT_WORKERS (or fewer CPUs). Triton's compile
# spends much of its time outside the GIL (8 sm_90 compiles: 2.54 s on one thread, 1.43 s on two
# of a 2-core machine, triton 3.9), but on the H200 machine (16 CPUs, triton 3.6) 16 threads
# started no faster than 8: GEMM tuning 39.0 against 41.4 s, startup 72.2 against 73.4 s, one
# cold start each (benchmarks/RESULTS.md, twenty-ninth session).
WORKERS_ENV = "ENGINESPEC_PRECOMPILE_WORKERS"
DEFAULT_WORKERS = 8


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; all of them where there is no
    affinity API, as on macOS and Windows)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def num_workers() -> int:
    """The pool's thread count: ENGINESPEC_PRECOMPILE_WORKERS, else DEFAULT_WORKERS or the CPUs
    this process may run on (its affinity mask), whichever is fewer. ValueError naming the
    variable for a value that is not a positive int."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if not raw:
        return max(1, min(DEFAULT_WORKERS, usable_cpus()))
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{WORKERS_ENV} must be a positive int, got {raw!r}")
    return int(raw)


def precompile(jobs: list[Callable[[], object]], max_workers: int | None = None) -> int:
    """Run compile-only launches (each job one, e.g. skinny_linear(..., compile_only=True)) on a
    thread pool (max_workers threads, default num_workers()) under Triton's AsyncCompileMode
    where this Triton has it, so the variants compile side by side instead of one after
    another, and wait for them; first, where worker processes are on, their variants compile
    there (kernels/compile_procs.py: each job is called once more, before, to record its
    variants) and the threads' compiles are cache hits. Returns how many
    jobs raised (0 where this Triton has no AsyncCompileMode, or ENGINESPEC_PRECOMPILE=0: then
    nothing runs). Anything that goes wrong only costs the speed-up: a job that raises is
    skipped, a compile that fails is dropped (ignore_errors), and the real launch later
    compiles whatever is missing as usual. A bad ENGINESPEC_PRECOMPILE (env_switch),
    ENGINESPEC_PRECOMPILE_WORKERS or ENGINESPEC_COMPILE_PROCESSES is the one error raised."""
    if env_switch(PRECOMPILE_ENV) is False:
        return 0
    try:
        from concurrent.futures import ThreadPoolExecutor

        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return 0
    from enginespec.kernels.compile_procs import compile_in_processes

    compile_in_processes(jobs)
    num_failed = 0
    try:
        with (
            ThreadPoolExecutor(max_workers=max_workers or num_workers()) as pool,
            AsyncCompileMode(pool, ignore_errors=True),
        ):
            for job in jobs:
                try:
                    job()
                except Exception as e:  # noqa: BLE001 - that variant compiles when first launched
                    num_failed += 1
                    log.debug("compile-only launch failed: %s: %s", type(e).__name__, e)
    except Exception as e:  # noqa: BLE001 - an optimisation of startup, never a requirement
        log.info("parallel precompile skipped: %s: %s", type(e).__name__, e)
    return num_failed


# Whether launcher() compiles only, in this thread (a ContextVar, as Triton's AsyncCompileMode is):
# another thread's engine that steps meanwhile keeps launching for real.
_COMPILE_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("enginespec_compile_only", default=False)


@contextlib.contextmanager
def compile_only_launches():
    """Inside, every launch this thread makes through launcher() compiles its variant and runs
    nothing, as compile_only=True would, and its outputs stay uninitialised: so a whole forward
    pass of a model (the profile run's and each graph bucket's: worker/runner.py,
    worker/cuda_graphs.py), issued under precompile's AsyncCompileMode, hands every variant of
    ours it meets to the pool at once. Kernels launched otherwise (torch's, cuBLAS) run as
    usual, on whatever those outputs hold; other threads' launches are untouched."""
    token = _COMPILE_ONLY.set(True)
    try:
        yield
    finally:
        _COMPILE_ONLY.reset(token)


def launcher(kernel, grid, compile_only: bool = False) -> Callable:
    """What a wrapper calls with the launch's arguments: kernel[grid], or with compile_only (or
    inside compile_only_launches()) its compile-only launch (Triton's `warmup` with the same
    grid): the same arguments then compile the same variant (the same cache key) and nothing
    runs on the device."""
    if compile_only or _COMPILE_ONLY.get():
        return functools.partial(kernel.warmup, grid=grid)
    return kernel[grid]
