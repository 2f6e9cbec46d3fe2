"""Ctrl-C, SIGTERM and SIGHUP during a command: one line and exit 130 / 143 / 129, temporaries removed.

Each signal raises a `KeyboardInterrupt` (SIGTERM and SIGHUP the subclass
`Terminated`, which carries its exit code) in whatever Python code runs
next, so every cleanup that handles Ctrl-C handles them too. Only the first
signal raises: later ones, while the command cleans up after the first, are
remembered and ignored (a second Ctrl-C 50 ms later must not kill the
process in the middle of removing its temporaries). A signal during an
import on the main thread is raised when the outermost import ends: raised
inside one, it aborts the process from native code (torch's
``_autograd_init`` calls back into Python and cannot pass an exception on:
SIGABRT), segfaults, or leaves a half-imported numpy that recurses on the
next attribute. A second signal while that import still holds the first
raises at once: an import that hangs can still be interrupted.

Run as a process (``python -m cogvideox_torchax.decode``), a command keeps
its handlers to the end and leaves with `leave`: ``os._exit`` after
flushing, without the interpreter's teardown. That teardown is what made a
signal crash the process: an interrupt raised while XLA compiles leaves the
compile running on one of XLA's own threads, and finalizing the interpreter
destroys the client that thread still uses (SIGSEGV in
``SingleDeviceSharding::Create``); and the handlers restored for the
teardown let a late signal kill the process by itself, with no line.
"""

from __future__ import annotations

import contextlib
import importlib._bootstrap as bootstrap
import os
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
_deferring = 0  # inside `deferred`: a signal is remembered, raised when the block ends
_finishing = False  # the command has its exit code (`finishing`): a signal is only remembered
_importing = 0  # inside an import on the main thread (`_imports_whole`): a signal waits for its end
_held = False  # the first signal came inside an import and is not raised yet
# Outputs moved in (a `Writer`'s ``committed``, inside `deferred`): what an interrupt's line says stays.
WRITTEN: list[str] = []


def _raised(signum: int) -> KeyboardInterrupt:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _on_signal(signum: int, frame: object) -> None:
    # Python raises the exception in whatever Python code runs next, which
    # can be a garbage-collection callback that swallows it ("Exception
    # ignored in ..."); the flag makes the next check_interrupted() see it.
    global _interrupted, _signalled, _held
    _signalled = True
    if _interrupted is not None:
        if _held and not _deferring and not _finishing:  # a second while an import holds the first: it hangs?
            _held = False
            raise _raised(_interrupted)
        return  # cleaning up after the first: not again
    _interrupted = signum
    if _deferring or _finishing:
        return  # raised at the end of the deferred block, or turned into the exit code by `leave`
    if _importing:
        _held = True  # raised when the outermost import ends
        return
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
def deferred() -> Iterator[None]:
    """A block a signal must not cut in two (moving outputs in, or back out): its interrupt is raised after it."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if not _deferring:
        check_interrupted()


def written() -> list[str]:
    """The outputs this command moved in so far (`WRITTEN`)."""
    return list(WRITTEN)


def finishing() -> None:
    """From now on a signal is only remembered: `leave` turns it into the exit code."""
    global _finishing
    _finishing = True


def leave(code: int, say_signalled: Callable[[KeyboardInterrupt], None]) -> None:
    """Ends the process with ``code``, or with a signal's code if one came after the command decided ``code``.

    Flushes stdout and stderr and leaves with ``os._exit``: no interpreter
    teardown (XLA threads still compiling for an interrupted command would
    crash it), no atexit handlers (jax.distributed's shutdown is run here
    first), and no moment where a signal finds the default handlers.
    ``say_signalled`` prints the one line of a late signal.
    """
    global _interrupted
    finishing()
    if "jax" in sys.modules:
        with contextlib.suppress(Exception):
            from cogvideox_torchax.parallel import distributed

            if distributed.is_initialized():
                sys.modules["jax"].distributed.shutdown()
    main = threading.current_thread() is threading.main_thread()
    if main:
        # A signal must not slip in between the check below and the exit (exit
        # code 0 with the signal sent, no line): blocked on this thread, it
        # stays pending and is read here. One that another thread took runs
        # its handler here at the next check for signals, which CPython makes
        # as pthread_sigmask returns: the handler only records it (`finishing`).
        signal.pthread_sigmask(signal.SIG_BLOCK, SIGNAL_CODES)
    _flush()
    if main:
        signal.pthread_sigmask(signal.SIG_BLOCK, ())  # the last check: handlers of signals that arrived meanwhile
        pending = [s for s in SIGNAL_CODES if s in signal.sigpending()]
        if _interrupted is None and pending:
            _interrupted = pending[0]
    if _interrupted is not None and code not in SIGNAL_CODES.values():
        # After the command had its code (the summary printed, maybe): the
        # exit code still says the signal came, the line what was written.
        code = SIGNAL_CODES[signal.Signals(_interrupted)]
        with contextlib.suppress(Exception):
            say_signalled(_raised(_interrupted))
        _flush()
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()


def _imports_whole() -> Callable[[], None]:
    """Defers a signal on the main thread to the end of the outermost import; returns the undo."""
    original = getattr(bootstrap, "_find_and_load", None)
    if original is None:
        return lambda: None
    main = threading.main_thread().ident

    def find_and_load(name: str, import_: Any) -> Any:
        global _importing, _held
        if _importing or threading.get_ident() != main:
            return original(name, import_)
        _importing += 1
        try:
            return original(name, import_)
        finally:
            _importing -= 1
            # Only a signal this import held (one before it was raised already:
            # the command may be importing while it cleans up).
            if _held:
                _held = False
                if not _finishing:
                    raise _raised(_interrupted)  # noqa: B012 - the module is whole; the interrupt replaces its return

    def undo() -> None:
        if getattr(bootstrap, "_find_and_load", None) is find_and_load:  # nobody wrapped it after us
            bootstrap._find_and_load = original

    bootstrap._find_and_load = find_and_load
    return undo


@contextlib.contextmanager
def handled(keep: bool = False) -> Iterator[None]:
    """Within: SIGINT, SIGTERM and SIGHUP raise (once) and are remembered for `check_interrupted`.

    The handlers before are restored after, unless a signal arrived: the
    process then ignores further ones until it exits with the first's code.
    With ``keep`` (a command run as a process, which ends with `leave`),
    this module's handlers stay, and a signal after the block is only
    remembered (`finishing`).
    """
    global _interrupted, _signalled, _deferring, _finishing, _importing, _held
    _interrupted, _signalled, _deferring, _finishing, _importing, _held = None, False, 0, False, 0, False
    WRITTEN.clear()
    previous = {}
    main = threading.current_thread() is threading.main_thread()
    unwrap_imports = _imports_whole() if main else (lambda: None)
    if main:
        for signum in SIGNAL_CODES:
            previous[signum] = signal.signal(signum, _on_signal)
    previous_unraisable = sys.unraisablehook
    sys.unraisablehook = _unraisable(previous_unraisable)
    try:
        yield
    finally:
        unwrap_imports()
        if keep:
            finishing()  # the handlers stay until `leave`
        else:
            sys.unraisablehook = previous_unraisable
            for signum, handler in previous.items():
                # After a signal the process is on its way out with that signal's
                # code: a later one (Ctrl-C twice) must not kill it meanwhile.
                signal.signal(signum, signal.SIG_IGN if _signalled else handler)
