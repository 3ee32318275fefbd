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

Cost: two ``sigaction`` calls, about 0.5 µs per block. The calls go to the C module
``_signal`` directly: ``signal.signal`` and ``signal.getsignal`` convert every
argument and result to and from enums, which costs about 2 µs per call.
"""

from __future__ import annotations

import _signal
import threading
from types import FrameType
from typing import Any

_SIGINT = int(_signal.SIGINT)
_getsignal = _signal.getsignal
_setsignal = _signal.signal
_get_ident = threading.get_ident
_main_thread = threading.main_thread


class deferred_interrupts:
    """Within the block, SIGINT's Python handler waits for the block to end (see the
    module docstring). Nests: an inner block hands what it caught to the outer one."""

    __slots__ = ("_handler", "_caught")

    def __enter__(self) -> None:
        self._handler = None
        handler = _getsignal(_SIGINT)
        if callable(handler) and _get_ident() == _main_thread().ident:
            self._caught: tuple[int, FrameType | None] | None = None
            _setsignal(_SIGINT, self._catch)
            self._handler = handler

    def _catch(self, signum: int, frame: FrameType | None) -> None:
        self._caught = (signum, frame)

    def __exit__(self, *exc: Any) -> None:
        handler = self._handler
        if handler is None:
            return
        _setsignal(_SIGINT, handler)
        caught, self._caught = self._caught, None
        if caught is not None:
            handler(*caught)  # Python's own raises KeyboardInterrupt here, after the block
