"""Changes made whole or not at all under Ctrl-C: :class:`deferred_interrupts`.

Python runs SIGINT's handler (by default the one that raises ``KeyboardInterrupt``)
between any two bytecodes of the main thread. A change made in several parts (a
step: the parameters move, then the algorithm state is committed; a load: the
parameters, the buffers, the algorithm state) would be left half made. Within
``with deferred_interrupts():`` the handler waits: a SIGINT that arrives is
recorded, and the handler runs once when the block ends, so that a
``KeyboardInterrupt`` is raised after the change is whole.

It defers only what can interrupt the block: on the main thread (Python runs signal
handlers there, and only there: a block on another thread is never interrupted by
one), a SIGINT handler that is a Python callable (Python's own or the program's,
which then runs later with the same arguments). ``SIG_IGN``, ``SIG_DFL`` (the
process ends) and a handler not installed from Python are left alone.

:func:`defer` / :func:`resume` are the same without a context manager's object and
calls, for the step. Cost: two ``sigaction`` system calls per block (about 0.3 µs,
and the step's caches after them); the calls go to the C module ``_signal`` directly
(``signal.signal`` and ``signal.getsignal`` convert every argument and result to and
from enums: about 2 µs per call).
"""

from __future__ import annotations

import _signal
from collections.abc import Callable
from types import FrameType
from typing import Any

_SIGINT = int(_signal.SIGINT)
_getsignal = _signal.getsignal
_setsignal = _signal.signal
_caught: tuple[int, FrameType | None] | None = None  # a SIGINT that arrived while deferred

Handler = Callable[[int, FrameType | None], Any]


def _record(signum: int, frame: FrameType | None) -> None:
    global _caught
    _caught = (signum, frame)


def defer() -> Handler | None:
    """From here on, SIGINT's Python handler waits for :func:`resume` (give it what this
    returns, in a ``finally``). ``None``: nothing to defer (not the main thread, no
    Python handler, or deferred already: the outer block resumes)."""
    handler = _getsignal(_SIGINT)
    if handler is _record or not callable(handler):
        return None
    try:
        _setsignal(_SIGINT, _record)
    except ValueError:  # not the main thread: Python never runs a signal handler here
        return None
    return handler


def resume(handler: Handler | None) -> None:
    """Give SIGINT its handler back (what :func:`defer` returned), and run it if a SIGINT
    arrived meanwhile (Python's own raises ``KeyboardInterrupt`` here)."""
    global _caught
    if handler is None:
        return
    _setsignal(_SIGINT, handler)
    caught, _caught = _caught, None
    if caught is not None:
        handler(*caught)


class deferred_interrupts:
    """:func:`defer` and :func:`resume` as a context manager: SIGINT's Python handler
    waits for the block to end. Nests (the outermost block resumes)."""

    __slots__ = ("_handler",)

    def __enter__(self) -> None:
        self._handler = defer()

    def __exit__(self, *exc: Any) -> None:
        resume(self._handler)
