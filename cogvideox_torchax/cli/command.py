"""Running a command: parse, join the cluster, run, report; every way out is an exit code of `errors.EXIT_CODES`."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

from cogvideox_torchax.cli import agreement, errors, interrupts, options, timeline
from cogvideox_torchax.platforms.accelerators import use_cpu_without_accelerators


class Config(Protocol):
    """What a command's configuration has: the shared `options.RunOptions`, and a copy made with other ones."""

    run: options.RunOptions

    def with_run(self, run: options.RunOptions) -> Config: ...


def command(
    parser: Callable[[], argparse.ArgumentParser],
    argv: list[str] | None,
    configure: Callable[[argparse.Namespace], Config],
    run: Callable[[Any], dict[str, Any]],
    print_summary: Callable[[dict[str, Any]], None],
) -> int:
    """Parses ``argv`` into the command's frozen configuration and runs it; returns the exit code (`errors.EXIT_CODES`).

    ``configure`` checks and types what argparse parsed (`errors.UsageError`:
    exit 2, before anything loads). An interrupt at any point in here ends
    with 130 (SIGTERM 143, SIGHUP 129), one line and no traceback;
    argparse's own usage errors keep its exit code 2. Run as the process's
    own command (`running_as_command`), it does not return: the process
    leaves through `interrupts.leave`, and a signal up to that moment is
    the exit code.
    """
    entry = argv is None and running_as_command()
    done: list[Config | None] = [None]  # the configuration, once parsed: what an interrupt's line says
    try:
        try:
            # The summary's timeline: from the process's start when the process is this command.
            with timeline.running(from_process_start=entry):
                code = _command(parser, argv, configure, run, print_summary, done, keep=entry)
        finally:
            if entry:
                interrupts.finishing()  # a signal from here on is the exit code `leave` gives
    except KeyboardInterrupt as e:  # landed after the command's own handling, before `finishing`
        _say_stopped(e, done[0])
        code = errors.exit_code(e)
    if entry:
        interrupts.leave(code, lambda e: _say_stopped(e, done[0]))
    return code


def running_as_command() -> bool:
    """Whether this process is ``python -m cogvideox_torchax.decode`` (or ``.encode``) itself, not a caller of main()."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) in ("cogvideox_torchax.decode", "cogvideox_torchax.encode")


def _command(parser, argv, configure, run, print_summary, done: list, keep: bool) -> int:
    config = None
    errors.reserve_stderr_fd()
    with interrupts.handled(keep=keep):
        try:
            try:
                args = parser().parse_args(argv)
            except SystemExit as e:  # --help (0) or a usage error (2), already printed by argparse
                return e.code if isinstance(e.code, int) else errors.EXIT_BAD_INPUT
            try:
                config = done[0] = configure(args)
                agreement.start_distributed(config.run.distributed)
            except (errors.UsageError, ValueError) as e:  # bad options (a FramesError for --size, ...)
                errors.say(f"error: {errors.one_line(e)}")
                return errors.EXIT_BAD_INPUT
            if not agreement.is_primary():  # no bars, no summary: process 0 reports
                config = done[0] = config.with_run(config.run.silenced())
            kept = agreement.stdout_kept_for_results() if agreement.process_count() > 1 else contextlib.nullcontext()
            with kept, _own_warnings_as_lines(config.run.quiet):
                return main(config, run, print_summary)
        except KeyboardInterrupt as e:
            _say_stopped(e, config)
            return errors.exit_code(e)


_PACKAGE = str(Path(__file__).resolve().parents[1])


@contextlib.contextmanager
def _own_warnings_as_lines(quiet: bool) -> Iterator[None]:
    """The package's own warnings (a config upstream takes with a quirk) as one ``warning:`` line each, once.

    Other libraries' warnings are shown as Python shows them.
    """
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if str(Path(filename).resolve()).startswith(_PACKAGE):
                errors.warn_once(" ".join(str(message).split()), quiet)
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


def _say_stopped(e: KeyboardInterrupt, config: Config | None) -> None:
    errors.say(f"error: {_what_stopped(e)}; {_interrupted_note(config)}")


def _what_stopped(e: KeyboardInterrupt) -> str:
    if isinstance(e, interrupts.Terminated):
        return f"{'terminated' if e.code == errors.EXIT_TERMINATED else 'hung up'} ({e.args[0]})"
    return "interrupted"


def _interrupted_note(config: Config | None) -> str:
    if getattr(config, "output_dir", None):
        return "the videos already written stay; the batch in progress was not written"
    written = interrupts.written()
    if written:  # the signal came after the outputs were moved in: they are whole, and stay
        return f"the outputs were already written ({', '.join(written)})"
    return "nothing was written"


def main(config: Config, run: Callable[[Any], dict[str, Any]], print_summary: Callable[[dict[str, Any]], None]) -> int:
    """Runs a command's configuration; returns the exit code (see `errors.EXIT_CODES`)."""
    try:
        with timeline.timed_part("backend"):  # JAX's plugins found (their imports are imports)
            use_cpu_without_accelerators()
        timeline.time_backend_start()
        summary = run(config)
    except KeyboardInterrupt as e:
        _say_stopped(e, config)
        return errors.exit_code(e)
    except Exception as e:  # one line for the user; the traceback with --debug
        if config.run.debug and not isinstance(e, errors.PeerFailed):
            if agreement.process_count() == 1:
                raise
            traceback.print_exception(e)  # and leave with the code the others agreed on
        own = e.own if isinstance(e, errors.PeerFailed) else e
        if own is not None:
            errors.say(f"error: {errors.one_line(own)}")
        # A peer's failure is news on process 0 only; the peer said it itself.
        if isinstance(e, errors.PeerFailed) and agreement.is_primary():
            errors.say(f"error: {errors.one_line(e)}")
        return errors.exit_code(e)
    clock = timeline.current()
    if clock is not None:
        summary["timeline"] = clock.breakdown()
    code = int(summary.get("exit_code", errors.EXIT_OK))
    if config.run.quiet and not config.run.json:
        return code  # nothing to report
    try:
        if sys.stdout is None:
            raise OSError("stdout is closed")
        if config.run.json:
            print(json.dumps(summary))
        else:
            print_summary(summary)
        sys.stdout.flush()
    except (OSError, ValueError) as e:  # stdout full or closed: the run itself is done
        errors.silence_stdout()
        errors.say(f"error: the run is complete ({'outputs written' if code == errors.EXIT_OK else f'exit {code}'}) "
                   f"but its summary could not be printed: {errors.one_line(e)}")
        return errors.EXIT_REPORT_FAILED if code == errors.EXIT_OK else code
    return code
