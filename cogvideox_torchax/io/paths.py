"""Input paths as the file system has them: what an entry is before anything opens it.

An input folder may hold, under an input's name, something that cannot be
read as one: a folder, a link that leads nowhere (or a loop), a FIFO (which
would block a reader), a socket. `not_a_file` says which, in words, so
the caller names the entry and fails it instead of passing it over.
"""

from __future__ import annotations

import errno
import os
import stat


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
