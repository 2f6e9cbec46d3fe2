"""Ctrl-C, SIGTERM and SIGHUP during a command: one line and exit 130 / 143 / 129, temporaries removed.

Each signal raises a `KeyboardInterrupt` (SIGTERM and SIGHUP the subclass
`Terminated`, which carries its exit code) in whatever Python code runs
next, so every cleanup that handles Ctrl-C handles them too. Only the first
signal raises: later ones, while the command cleans up after the first, are
remembered and ignored (a second Ctrl-C 50 ms later must not kill the
process in the middle of removing its temporaries).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

# Exit codes of the signals a command ends cleanly on: 128 + the signal's number, as a shell reports them.
SIGNAL_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (what `timeout`, SLURM, ``docker stop`` and a closed terminal send)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.code = SIGNAL_CODES[signum]


_interrupted: int | None = None  # the first signal's number
_signalled = False  # a real signal arrived (not only a KeyboardInterrupt raised in code)


def _raised(signum: int) -> KeyboardInterrupt:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _on_signal(signum: int, frame: object) -> None:
    # Python raises the exception in whatever Python code runs next, which
    # can be a garbage-collection callback that swallows it ("Exception
    # ignored in ..."); the flag makes the next check_interrupted() see it.
    global _interrupted, _signalled
    _signalled = True
    if _interrupted is not None:
        return  # cleaning up after the first: not again
    _interrupted = signum
    raise _raised(signum)


def _unraisable(previous: Callable[[Any], None]) -> Callable[[Any], None]:
    def hook(info: Any) -> None:
        global _interrupted
        if info.exc_type is not None and issubclass(info.exc_type, KeyboardInterrupt):
            if _interrupted is None:  # swallowed by a callback: no traceback, seen at the next check
                _interrupted = getattr(info.exc_value, "signum", signal.SIGINT)
            return
        previous(info)

    return hook


def check_interrupted() -> None:
    """Raises the interrupt of a signal received during this command, even if it was swallowed on the way."""
    if _interrupted is not None:
        raise _raised(_interrupted)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Within: SIGINT, SIGTERM and SIGHUP raise (once) and are remembered for `check_interrupted`.

    The handlers before are restored after, unless a signal arrived: the
    process then ignores further ones until it exits with the first's code.
    """
    global _interrupted, _signalled
    _interrupted, _signalled = None, False
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in SIGNAL_CODES:
            previous[signum] = signal.signal(signum, _on_signal)
    previous_unraisable = sys.unraisablehook
    sys.unraisablehook = _unraisable(previous_unraisable)
    try:
        yield
    finally:
        sys.unraisablehook = previous_unraisable
        for signum, handler in previous.items():
            # After a signal the process is on its way out with that signal's
            # code: a later one (Ctrl-C twice) must not kill it meanwhile.
            signal.signal(signum, signal.SIG_IGN if _signalled else handler)
