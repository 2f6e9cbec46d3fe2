"""Input paths as the file system has them: what an entry is before anything opens it, and names that are not UTF-8.

An input folder may hold, under an input's name, something that cannot be
read as one: a folder, a link that leads nowhere (or a loop), a FIFO (which
would block a reader), a socket. `not_a_file` says which, in words, so
the caller names the entry and fails it instead of passing it over.

Linux names are bytes; Python holds the bytes that are not UTF-8 as
surrogate escapes (``b"\\xff"`` -> ``"\\udcff"``), which every ``os`` call
takes back, but some readers (safetensors' ``safe_open``) refuse.
`by_bytes` gives such a reader a name it takes for the same file, and
`shown` a name any text stream can print.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator


def not_a_file(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be read as a file (``"is a folder"``, ...), or None for a regular file or a link to one.

    Nothing is opened: only ``stat``, which follows links.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        if os.path.islink(path):
            return "is a link that leads nowhere (dangling, or a loop)"
        if e.errno == errno.ENOENT:
            return "does not exist"
        return f"cannot be read: {e.strerror}"
    except ValueError as e:  # a NUL in the name
        return f"cannot be read: {e}"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a folder"
    return "is not a regular file (a FIFO, socket or device); not read"


@contextlib.contextmanager
def by_bytes(path: str | os.PathLike) -> Iterator[str]:
    """A UTF-8 name for the file at ``path``, for a reader that takes only UTF-8 names.

    The path itself where it is UTF-8; otherwise the file opened by its
    bytes and named by its descriptor (``/proc/self/fd/N``, or ``/dev/fd/N``)
    while the block runs.

    Raises:
        OSError: the file cannot be opened, or this system has no such
            descriptor folder.
    """
    text = os.fsdecode(path)
    if not _has_surrogates(text):
        yield text
        return
    fd = os.open(os.fsencode(text), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        folder = next((d for d in ("/proc/self/fd", "/dev/fd") if os.path.isdir(d)), None)
        if folder is None:
            raise OSError(errno.ENOTSUP, "the name is not UTF-8 and this system has no /proc/self/fd to read it by")
        yield f"{folder}/{fd}"
    finally:
        os.close(fd)


def shown(name: str | os.PathLike) -> str:
    """``name`` as any text stream prints it: its bytes that are not UTF-8 as ``\\xNN``, the rest unchanged."""
    text = os.fsdecode(name)
    return os.fsencode(text).decode("utf-8", "backslashreplace") if _has_surrogates(text) else text


def _has_surrogates(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
