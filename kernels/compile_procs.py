"""Compiling Triton variants in worker processes, into Triton's on-disk cache.

compile_pool.precompile compiles a list of compile-only launches on a thread pool. Part of each
compile (the Python code generator, the cache's bookkeeping) holds the GIL, so threads stop
paying early: on the H200 machine (16 CPUs) 16 threads started the engine no faster than 8.
Processes share no GIL. This module lets precompile hand the compiles to them first:

1. record(jobs): run the compile-only launches with a Triton jit_cache_hook that, on this thread
   only, notes each variant's specialization data (the JSON Triton's own `preload` reads) and
   tells Triton to skip the compile. Nothing compiles, nothing runs on the device.
2. Workers.compile_all(specs): each spec the on-disk cache lacks (in_disk_cache: a start on warm
   caches sends none and starts no worker) goes to a worker process (`python -m
   enginespec.kernels.compile_procs`, one JSON line in, one out), which rebuilds the same
   ASTSource and calls triton.compile for the spec's target: the result lands in the on-disk
   cache (TRITON_CACHE_DIR), which the parent shares.
3. precompile then issues the jobs as before; each compile is now a cache hit.

Invariant: this is only ever a speed-up. A spec a worker cannot compile, a worker that dies,
a Triton without the hook: the parent's own pass compiles whatever is missing, as it did before
this module existed. Workers make no CUDA call (CUDA_VISIBLE_DEVICES is empty for them): they
compile for the target named in the spec. They are plain subprocesses, not multiprocessing's:
spawn would re-run a user's unguarded main script in every child.

ENGINESPEC_COMPILE_PROCESSES: how many workers; 0 turns them off (precompile then compiles on its
threads alone, as before); unset: DEFAULT_PROCESSES or the usable CPUs, whichever is fewer. On
the H200 machine (16 CPUs), cold starts with 16 against 0 on two machine starts: 57.8 against
58.0 s and 59.1 against 78.9 s (the GEMM tuning's compiles 21.7 -> 16.7 and 28.3 -> 18.7 s), and
53.6 s with the default on a third (benchmarks/RESULTS.md, thirtieth session). What is left is
stragglers: a precompile call waits for its slowest variant (the sampler's cut-pick kernel alone
compiles for 4.5-5 s). A worker holds about 0.3 GB of host memory idle (torch and triton
imported), more while it compiles; they end when the engine is built.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

log = logging.getLogger(__name__)

PROCESSES_ENV = "ENGINESPEC_COMPILE_PROCESSES"
DEFAULT_PROCESSES = 16  # (fewer where fewer CPUs are usable: num_processes)

# (module, qualname, specialization data): one variant of one @triton.jit function
Spec = tuple[str, str, str]

_RECORDING: contextvars.ContextVar[Optional[dict]] = contextvars.ContextVar(
    "enginespec_recording", default=None
)


def num_processes() -> int:
    """ENGINESPEC_COMPILE_PROCESSES as an int >= 0 (unset: DEFAULT_PROCESSES or the CPUs this
    process may run on, whichever is fewer); ValueError naming the variable for anything else."""
    raw = os.environ.get(PROCESSES_ENV, "").strip()
    if not raw:
        from enginespec.kernels.compile_pool import usable_cpus

        return min(DEFAULT_PROCESSES, usable_cpus())
    if not raw.isdigit():
        raise ValueError(f"{PROCESSES_ENV} must be an int >= 0, got {raw!r}")
    return int(raw)


@contextlib.contextmanager
def recording():
    """Inside, a compile this thread's launches would start is skipped and noted instead: the
    yielded dict maps each variant's specialization data to its (module, qualname). Other
    threads compile as usual, and a jit_cache_hook set before is called for them (and restored
    after). Yields None where this Triton has no jit_cache_hook knob."""
    try:
        from triton import knobs

        previous = knobs.runtime.jit_cache_hook
    except (ImportError, AttributeError):
        yield None
        return

    def hook(**kwargs):
        noted = _RECORDING.get()
        data = (kwargs.get("compile") or {}).get("specialization_data")
        info = kwargs.get("fn")
        if noted is not None and data and info is not None:
            noted.setdefault(data, (info.module, info.name))
            return True  # skip the compile: a worker will do it
        return previous(**kwargs) if previous is not None else None

    noted: dict = {}
    token = _RECORDING.set(noted)
    knobs.runtime.jit_cache_hook = hook
    try:
        yield noted
    finally:
        knobs.runtime.jit_cache_hook = previous
        _RECORDING.reset(token)


def record(jobs: list[Callable[[], object]]) -> list[Spec]:
    """The variants the jobs' compile-only launches would compile (record's steps, module doc);
    a job that raises adds what it met before raising."""
    with recording() as noted:
        if noted is None:
            return []
        for job in jobs:
            try:
                job()
            except Exception as e:  # noqa: BLE001 - the thread pass meets that job again
                log.debug("recording a compile-only launch failed: %s: %s", type(e).__name__, e)
    target = _current_target() if noted else None
    return [(module, qualname, _with_target(data, target)) for data, (module, qualname) in noted.items()]


def _current_target() -> Optional[dict]:
    """This process's Triton target as a dict (GPUTarget's fields), None where there is none."""
    try:
        from triton.runtime import driver

        return dict(vars(driver.active.get_current_target()))
    except Exception:  # noqa: BLE001 - then only specs that name their target can be compiled
        return None


def _with_target(data: str, target: Optional[dict]) -> str:
    """The specialization data with a "target" (Triton 3.6's has none: its preload compiles for
    the current device, and a worker has none)."""
    spec = json.loads(data)
    if "target" in spec or target is None:
        return data
    return json.dumps(dict(spec, target=target))


class Workers:
    """Up to `size` worker processes, started on demand and kept until close(), so the imports
    (torch, triton: seconds) are paid once per engine start.

    Invariant: a worker is used by one thread at a time (taken from `idle`, put back after its
    reply); a worker whose pipe broke is dropped, never put back. Once `size` workers have died
    before their first reply (a broken interpreter, an import that fails), no more are started:
    every spec is then answered with an error at once, and the parent compiles it."""

    def __init__(self, size: int):
        self.size = size
        self.idle: queue.SimpleQueue = queue.SimpleQueue()
        self.procs: list[subprocess.Popen] = []
        self.lock = threading.Lock()
        self.answered: set[int] = set()  # pids of workers that replied at least once
        self.num_failed_starts = 0

    def _spawn(self) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["CUDA_VISIBLE_DEVICES"] = ""  # compile only: no context, no device memory
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        proc = subprocess.Popen(
            [sys.executable, "-m", "enginespec.kernels.compile_procs"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            text=True,
            bufsize=1,
        )
        self.procs.append(proc)
        return proc

    def _take(self) -> subprocess.Popen:
        """An idle worker, else a new one while fewer than `size` live, else the next one put
        back (re-checking every half second: a dropped worker frees a place too)."""
        while True:
            try:
                return self.idle.get_nowait()
            except queue.Empty:
                pass
            with self.lock:
                if self.num_failed_starts >= self.size:
                    raise RuntimeError(
                        f"{self.num_failed_starts} compile workers exited before their first reply"
                    )
                if len(self.procs) < self.size:
                    return self._spawn()
            try:
                return self.idle.get(timeout=0.5)
            except queue.Empty:
                continue

    def compile_one(self, spec: Spec) -> dict:
        """One spec compiled by a worker: its reply ({"ok": True, "hash": ...} or {"ok": False,
        "error": ...}); never raises."""
        module, qualname, data = spec
        try:
            proc = self._take()
        except Exception as e:  # noqa: BLE001 - no worker could start: the parent compiles it
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
        try:
            proc.stdin.write(json.dumps({"module": module, "qualname": qualname, "spec": data}) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            if not line:
                raise EOFError(f"compile worker exited ({proc.poll()})")
            reply = json.loads(line)
        except Exception as e:  # noqa: BLE001 - that worker is dropped; the parent compiles the spec
            self._drop(proc)
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}
        self.answered.add(proc.pid)
        self.idle.put(proc)
        return reply

    def _drop(self, proc: subprocess.Popen) -> None:
        """End a worker whose pipe broke; its place frees up for another (module doc's limit)."""
        with self.lock:
            if proc in self.procs:
                self.procs.remove(proc)
            if proc.pid not in self.answered:
                self.num_failed_starts += 1
        with contextlib.suppress(Exception):
            proc.kill()

    def compile_all(self, specs: list[Spec]) -> list[dict]:
        """Every spec compiled, up to `size` at once; the replies in the specs' order."""
        if not specs:
            return []
        with ThreadPoolExecutor(max_workers=min(self.size, len(specs))) as pool:
            return list(pool.map(self.compile_one, specs))

    def close(self) -> None:
        """End every worker (closing its stdin ends its loop)."""
        with self.lock:
            procs, self.procs = self.procs, []
            self.idle = queue.SimpleQueue()
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.stdin.close()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


_WORKERS: Optional[Workers] = None
_SHARED_LOCK = threading.Lock()  # guards _WORKERS and _NUM_LEASES
_NUM_LEASES = 0
# Summed over compile_in_processes calls in this process (the startup report reads them):
# variants recorded, those already in the on-disk cache, those the workers compiled, wall seconds.
totals: dict = {"recorded": 0, "cached": 0, "compiled": 0, "seconds": 0.0}


def workers() -> Optional[Workers]:
    """The process's shared Workers (ENGINESPEC_COMPILE_PROCESSES of them), None when that is 0."""
    global _WORKERS
    size = num_processes()
    if size == 0:
        return None
    with _SHARED_LOCK:
        if _WORKERS is None or _WORKERS.size != size:
            if _WORKERS is not None:
                _WORKERS.close()
            _WORKERS = Workers(size)
        return _WORKERS


def close_workers() -> None:
    """End the shared workers now."""
    global _WORKERS
    with _SHARED_LOCK:
        shared, _WORKERS = _WORKERS, None
    if shared is not None:
        shared.close()


@contextlib.contextmanager
def lease():
    """Workers started inside live until the last lease ends: an engine's construction holds
    one (engine_core.py, a tensor-parallel rank's runner), so two engines built in two threads
    share the workers and the first to finish does not end them under the other."""
    global _NUM_LEASES
    with _SHARED_LOCK:
        _NUM_LEASES += 1
    try:
        yield
    finally:
        with _SHARED_LOCK:
            _NUM_LEASES -= 1
            last = _NUM_LEASES == 0
        if last:
            close_workers()


atexit.register(close_workers)


def compile_in_processes(jobs: list[Callable[[], object]]) -> tuple[int, int]:
    """record(jobs); of their variants, those the on-disk cache lacks compiled by the shared
    workers (started by the first such variant: a start on warm caches spawns none). Returns
    (variants recorded, variants the workers compiled); (0, 0) with no workers. Never raises
    but for a bad ENGINESPEC_COMPILE_PROCESSES."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return 0, 0  # the interpreter compiles nothing (and the jobs must run once only there)
    shared = workers()
    if shared is None:
        return 0, 0
    started = time.perf_counter()
    specs = record(jobs)
    missing = [spec for spec in specs if not in_disk_cache(spec)]
    replies = shared.compile_all(missing)
    _tally(shared.size, len(specs), missing, replies, time.perf_counter() - started)
    return len(specs), sum(bool(r.get("ok")) for r in replies)


def _tally(size: int, num_recorded: int, missing: list[Spec], replies: list[dict], seconds: float) -> None:
    """compile_in_processes' call into `totals` and the log."""
    failed = [r.get("error", "?") for r in replies if not r.get("ok")]
    totals["recorded"] += num_recorded
    totals["cached"] = totals.get("cached", 0) + num_recorded - len(missing)
    totals["compiled"] += len(missing) - len(failed)
    totals["seconds"] += seconds
    if failed and "first_failure" not in totals:
        totals["first_failure"] = failed[0]
    slowest = max(zip(replies, missing), key=lambda rs: rs[0].get("seconds", 0.0), default=({}, ("", "", "")))
    # per call: variants sent, wall s, the slowest one's s and its kernel
    totals.setdefault("calls", []).append(
        (len(missing), round(seconds, 2), slowest[0].get("seconds"), slowest[1][1])
    )
    log.info(
        "%d compile workers: %d variants recorded, %d already cached, %d compiled, in %.2f s%s",
        size, num_recorded, num_recorded - len(missing), len(missing) - len(failed), seconds,
        f" (first failure: {failed[0]})" if failed else "",
    )  # fmt: skip


def in_disk_cache(spec: Spec) -> bool:
    """Whether Triton's on-disk cache holds the spec's variant already (the key triton.compile
    would look up, from the same decoded source). False where that cannot be told: a worker
    then compiles it (a cache hit there too)."""
    try:
        import hashlib

        from triton import knobs
        from triton.compiler import compiler as tc

        if knobs.runtime.add_stages_inspection_hook is not None or knobs.compilation.always_compile:
            return False
        src, target, options = _source(*spec)
        backend = tc.make_backend(target)
        parsed = backend.parse_options(dict(options, **src.parse_options()))
        key = tc.get_cache_key(src, backend, parsed, env_vars=tc.get_cache_invalidating_env_vars())
        name = f"{src.name[:150]}.json"
        group = tc.get_cache_manager(hashlib.sha256(key.encode("utf-8")).hexdigest()).get_group(name)
        return bool(group and group.get(name))
    except Exception:  # noqa: BLE001 - another Triton's internals: let a worker find out
        return False


# ---- the worker process ----------------------------------------------------------------------


def _tuples(value):
    """JSON's lists back to the tuples Triton wrote (nested)."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _resolve(module: str, qualname: str):
    """The @triton.jit function `module`.`qualname` (unwrapping autotune/heuristics wrappers)."""
    import importlib

    from triton.runtime.jit import JITFunction

    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):
        obj = obj.fn
    if not isinstance(obj, JITFunction):
        raise TypeError(f"{module}.{qualname} is not a @triton.jit function")
    return obj


def _constant(value):
    """One constexpr as Triton's serialize_specialization_data wrote it, decoded as preload does."""
    import triton.language as tl

    is_dtype = getattr(tl.dtype, "is_dtype", None)
    if isinstance(value, str) and is_dtype is not None and is_dtype(value):
        return tl.dtype(value)
    if isinstance(value, dict) and "constexpr" in value:
        return tl.constexpr(_tuples(value["constexpr"]))
    if isinstance(value, dict) and "jit_function" in value:
        module, qualname = value["jit_function"].split(":")
        return _resolve(module, qualname)
    return _tuples(value)


def compile_spec(module: str, qualname: str, data: str) -> str:
    """Compile one recorded variant for its spec's target (into the on-disk cache); its hash."""
    import triton

    src, target, options = _source(module, qualname, data)
    return triton.compile(src, target=target, options=options).hash


def _source(module: str, qualname: str, data: str):
    """The recorded variant's (ASTSource, GPUTarget, options dict), decoded as Triton's preload
    decodes its specialization data."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _resolve(module, qualname)
    spec = json.loads(data)
    constexprs = {tuple(k): _constant(v) for k, v in zip(spec["constant_keys"], spec["constant_vals"])}
    # as Triton's preload decodes them (the cache key hashes their reprs: a list is not a tuple)
    attrs = {tuple(k): v for k, v in zip(spec["attrs_keys"], spec["attrs_vals"])}
    signature = {k: _tuples(v) for k, v in spec["signature"].items()}
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["options"].items()}
    return ASTSource(fn, signature, constexprs, attrs), GPUTarget(**spec["target"]), options


def serve(requests, replies) -> None:
    """The worker's loop: a JSON request a line from `requests`, its reply a line to `replies`."""
    for line in requests:
        request = json.loads(line)
        started = time.perf_counter()
        try:
            reply = {
                "ok": True,
                "hash": compile_spec(request["module"], request["qualname"], request["spec"]),
            }
            reply["seconds"] = round(time.perf_counter() - started, 3)
        except Exception as e:  # noqa: BLE001 - reported; the parent compiles it itself
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"[:1000]}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main() -> None:
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever a compile prints must not reach the replies' pipe
    import torch  # noqa: F401 - the kernels' modules import it: paid before the first request
    import triton.compiler  # noqa: F401

    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
