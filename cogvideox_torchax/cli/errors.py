"""The commands' exit codes, the errors that map to them, and how a failure or a warning is one line."""

from __future__ import annotations

import os
import sys

EXIT_OK, EXIT_ERROR, EXIT_BAD_INPUT, EXIT_OUT_OF_MEMORY, EXIT_SOME_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_TERMINATED, EXIT_HANGUP = 143, 129  # SIGTERM, SIGHUP: as an interrupt
SIGNALLED = (EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_HANGUP)
EXIT_REPORT_FAILED = 5  # everything written; only the summary on stdout failed


EXIT_CODES = """exit codes:
  0    success: every output was written (or, with --skip-existing, was there already)
  1    an error of this tool or the system (e.g. a disk filling up while writing, a jax.distributed
       cluster that did not start within --distributed-timeout); nothing written
  2    bad input or a refused output (unreadable or out-of-range latents/video, broken model
       folder or config, an output that exists or may not be replaced, an unwritable folder,
       a decode that would produce NaN/Inf); nothing written, checked before decoding
       wherever it can be
  3    out of memory: no plan fits --max-memory (checked from compiled programs before running),
       or the device ran out while compiling or running (the message names the shape); nothing written
  4    decoding many latents (--output-dir): some inputs failed, each named on stderr; the outputs
       of all the others were written (with --dry-run: some inputs cannot be decoded)
  5    the outputs were written, but the summary could not be printed (stdout closed or full)
  130  interrupted (Ctrl-C); nothing written (with --output-dir: the outputs already complete stay)
  143  terminated (SIGTERM: timeout, SLURM, docker stop), as 130
  129  hung up (SIGHUP: the terminal closed), as 130

Under jax.distributed every process exits with the same code; only process 0 reads inputs, writes
outputs and prints the summary. A process that dies ends the others within the heartbeat timeout
(JAX's coordination service; exit code 134).

--overwrite replaces an existing file, or a folder holding nothing but frame_*.png files;
anything else is refused with exit code 2. Outputs appear only when all are complete."""


class UsageError(Exception):
    """Bad input; reported as one line with exit code 2."""


class OutOfMemory(Exception):
    """The compile or the run needs more memory than there is; reported as one line with exit code 3."""


class PeerFailed(Exception):
    """A process of a jax.distributed run failed a step; every process leaves with the same exit code.

    ``own`` is this process's own error when it failed too, with another code
    than the one agreed (printed as well; the others' logs say theirs).
    """

    def __init__(self, code: int, text: str, own: BaseException | None = None):
        super().__init__(text)
        self.code = code
        self.own = own


def agreed_code(codes: list[int]) -> int:
    """The one exit code of a step from every process's code: an interrupt wins, else the first failure."""
    for signalled in SIGNALLED:
        if signalled in codes:
            return signalled
    return next((c for c in codes if c != EXIT_OK), EXIT_OK)


_warned: set[str] = set()


def warn_once(text: str, quiet: bool = False) -> None:
    """One ``warning:`` line on stderr, once per process (nothing when quiet)."""
    if text not in _warned and not quiet:
        say(f"warning: {text}")
    _warned.add(text)


def one_line(e: BaseException) -> str:
    # ModelLoadError, LatentsError, FramesError and OutputError are
    # ValueErrors with a message written for the user; anything else is ours
    # and says its type.
    if isinstance(e, OSError) and type(e).__name__ == "DiskFull":  # cogvideox_torchax.io.outputs.DiskFull
        return " ".join(e.strerror.split())
    text = " ".join(str(e).split())
    return text if isinstance(e, (UsageError, OutOfMemory, ValueError)) else f"{type(e).__name__}: {text}"


def exit_code(e: BaseException) -> int:
    """The exit code (`EXIT_CODES`) an exception ends a command with."""
    if isinstance(e, KeyboardInterrupt):
        return getattr(e, "code", EXIT_INTERRUPTED)  # interrupts.Terminated: 143 or 129
    if isinstance(e, PeerFailed):
        return e.code
    # Only a run that imported the planner can raise its error: importing it
    # here would start JAX, and an interrupt during that import would end
    # the command with a traceback instead of its exit code.
    budget = sys.modules.get("cogvideox_torchax.memory.budget")
    if isinstance(e, OutOfMemory) or (budget is not None and isinstance(e, budget.MemoryBudgetError)):
        return EXIT_OUT_OF_MEMORY
    return EXIT_BAD_INPUT if isinstance(e, (UsageError, ValueError)) else EXIT_ERROR


class _Stderr:
    """``sys.stderr`` as it is at each write, where a closed or failing stream swallows what it is given.

    A report that cannot be shown must not change the run's outcome: the
    exit code still says it (a bad input stays exit 2, a decoded and
    written video stays exit 0).
    """

    def write(self, text: str) -> int:
        stream = sys.stderr
        if stream is None:
            return len(text)
        try:
            return stream.write(text)
        except (OSError, ValueError):  # /dev/full, a closed pipe or file
            return len(text)

    def flush(self) -> None:
        stream = sys.stderr
        if stream is not None:
            try:
                stream.flush()
            except (OSError, ValueError):
                pass


STDERR = _Stderr()


def say(text: str) -> None:
    """One line on stderr (`STDERR`: nothing, and no error, when stderr is closed or failing)."""
    STDERR.write(text + "\n")
    STDERR.flush()


def reserve_stderr_fd() -> None:
    """Puts /dev/null on file descriptor 2 when the process started without one (``2>&-``).

    Otherwise the next file opened (an output) would get descriptor 2, and
    the C++ libraries' log lines would be written into it.
    """
    try:
        os.fstat(2)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)  # the lowest free descriptor: 2
        if fd != 2:
            os.close(fd)


def silence_stdout() -> None:
    """Points file descriptor 1 at /dev/null after stdout failed, so the exit's own flush cannot fail again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    except OSError:
        pass
