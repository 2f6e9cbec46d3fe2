"""Ctrl-C during a command: one line and exit 130, even when Python swallowed the interrupt on the way."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

_interrupted = False


def _on_sigint(signum: int, frame: object) -> None:
    # Python raises KeyboardInterrupt in whatever Python code runs next,
    # which can be a garbage-collection callback that swallows it ("Exception
    # ignored in ..."); the flag makes the next check_interrupted() see it.
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def _unraisable(previous: Callable[[Any], None]) -> Callable[[Any], None]:
    def hook(info: Any) -> None:
        global _interrupted
        if info.exc_type is not None and issubclass(info.exc_type, KeyboardInterrupt):
            _interrupted = True  # swallowed by a callback: no traceback, seen at the next check
            return
        previous(info)

    return hook


def check_interrupted() -> None:
    """Raises KeyboardInterrupt if Ctrl-C was pressed during this command, even if the interrupt was swallowed."""
    if _interrupted:
        raise KeyboardInterrupt


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Within: Ctrl-C raises KeyboardInterrupt and is remembered for `check_interrupted`; handlers restored after."""
    global _interrupted
    _interrupted = False
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, _on_sigint)
    previous_unraisable = sys.unraisablehook
    sys.unraisablehook = _unraisable(previous_unraisable)
    try:
        yield
    finally:
        sys.unraisablehook = previous_unraisable
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
