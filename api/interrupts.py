"""Ctrl-C and the engine: a KeyboardInterrupt only between two engine calls.

Python raises KeyboardInterrupt at whatever line the main thread runs when SIGINT arrives.
Inside an engine call (a step, an add, an abort) that may be the middle of the scheduler's or
the block manager's bookkeeping: a block taken from the free queue but in no table, a hash
published for a forward that never ran. No rollback can undo a half-made update of an impl's
own structures (EngineCore._recover rolls back whole phases), and the next generate() then
adopted KV that was never written and answered other tokens than a fresh LLM.

So an LLM runs each engine call as a `Critical` section: a SIGINT that arrives inside one is
held, and raised (SIGINT's own handler is called with it) when the section ends, where every
structure is whole and the step's outputs are routed; the call it interrupts then releases its
requests as for any KeyboardInterrupt. Outside the sections (the caller's progress bar, a
stream's consumer) a SIGINT raises at once, as before. A second SIGINT inside one section goes
to the handler at once, the held first one before it, so that a step that never ends can still
be interrupted. If the handler raises, the section is cut midway: the engine's state is then
unknown, and the section's `on_forced` is told (the LLM refuses further calls). A handler that
raises nothing (a host's "stop after this batch" flag; asyncio.run's, whose first Ctrl-C only
cancels the main task) cuts nothing: it gets every SIGINT, in order, and nothing is forced.

Only on the main thread (Python runs signal handlers nowhere else, so a KeyboardInterrupt from
a signal never lands in another thread's engine call) and while SIGINT's handler is a Python
callable: SIG_IGN and SIG_DFL are left alone. `hold_interrupts()` installs the handler for a
whole call (generate()), so that its per-step sections only count; a section outside one
installs it for itself (about half a microsecond). Whether ours is installed is always read
from the signal module, never remembered: a KeyboardInterrupt that lands in the middle of an
install or uninstall then leaves at worst our handler in place, which outside a section does
what the one it replaced does.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Optional

try:  # the C functions: the signal module's enum conversions cost 10-60 times more
    from _signal import getsignal as _getsignal
    from _signal import signal as _setsignal
except ImportError:  # pragma: no cover - other interpreters
    _getsignal, _setsignal = signal.getsignal, signal.signal

__all__ = ["HELD_NOTE", "Critical", "hold_interrupts"]

#: The note on a KeyboardInterrupt raised when the engine call it arrived in had ended.
HELD_NOTE = "enginespec: this Ctrl-C arrived inside an engine call and was raised once that call had ended"


#: `_State.held` once the held SIGINT went to the handler early (a second one came).
_DELIVERED = ("delivered",)


class _State:
    """The main thread's: the handler ours replaced, how many sections are open, the SIGINT
    held for their end (or _DELIVERED), whether the handler raised inside them (a SIGINT
    forced through), and whether the open sections installed ours themselves."""

    def __init__(self) -> None:
        self.previous: Optional[Callable] = None
        self.depth = 0
        self.held: Optional[tuple] = None
        self.forced = False
        self.installed_by_section = False


_STATE = _State()


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _on_sigint(signum, frame) -> None:
    """SIGINT's handler while ours: inside a section the first is held for its end, and a
    second goes to the replaced handler now, after the held one (the host counts both, in
    order); whichever of them raises cuts the section (forced). Outside one, the replaced
    handler runs now."""
    state = _STATE
    handler = state.previous or signal.default_int_handler
    if not state.depth:
        handler(signum, frame)
        return
    if state.held is None:
        state.held = (signum, frame)
        return
    try:
        if state.held is not _DELIVERED:
            first, state.held = state.held, _DELIVERED
            handler(*first)
        handler(signum, frame)
    except BaseException:
        state.forced = True
        raise


def _install() -> bool:
    """Put ours in SIGINT's place; whether this call did (not when ours is there already, nor
    when SIGINT's handler is no Python callable)."""
    current = _getsignal(signal.SIGINT)
    if current is _on_sigint or not callable(current):
        return False
    _STATE.previous = current  # first: a SIGINT right after the swap finds it
    _setsignal(signal.SIGINT, _on_sigint)
    return True


def _uninstall() -> None:
    if _getsignal(signal.SIGINT) is _on_sigint and _STATE.previous is not None:
        _setsignal(signal.SIGINT, _STATE.previous)


@contextmanager
def hold_interrupts() -> Iterator[None]:
    """Our SIGINT handler installed for the block (on the main thread; a nested block, or
    one inside a section, leaves it as it is), so that the sections inside only count."""
    if _STATE.depth or not _on_main_thread():
        yield
        return
    installed = _install()
    try:
        yield
    finally:
        if installed:
            _uninstall()


class Critical:
    """`with section:` one engine call that a SIGINT must not cut in two (module doc).
    Reentrant; the outermost open section raises the held SIGINT when it ends (after the
    exception it ends with, if any, as that one's context), with HELD_NOTE. `on_forced` is
    called instead, with the exception the section ends with (the forced KeyboardInterrupt,
    or None where code inside caught it), when the handler raised inside it (a second SIGINT)."""

    def __init__(self, on_forced: Callable[[Optional[BaseException]], None]) -> None:
        self.on_forced = on_forced

    def __enter__(self) -> "Critical":
        if _on_main_thread():
            state = _STATE
            if not state.depth:
                state.installed_by_section = _install()
            state.depth += 1
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not _on_main_thread():
            return
        state = _STATE
        state.depth -= 1
        if state.depth:
            return
        held, state.held = state.held, None
        forced, state.forced = state.forced, False
        if state.installed_by_section:
            state.installed_by_section = False
            _uninstall()
        if forced:
            self.on_forced(exc)
        elif held is not None and held is not _DELIVERED:
            try:
                (state.previous or signal.default_int_handler)(*held)
            except KeyboardInterrupt as interrupt:
                if hasattr(interrupt, "add_note"):  # Python 3.11+
                    interrupt.add_note(HELD_NOTE)
                raise
