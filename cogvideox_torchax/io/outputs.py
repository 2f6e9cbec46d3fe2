"""Outputs written atomically: staged beside their destination, moved in all together or not at all.

Every output of a run is first written beside its destination under a
temporary name (`StagedOutputs`; ``.name.XXXXXXXX.ext``, shortened with a
hash of the name where that would not fit the folder's NAME_MAX, so any
name the folder takes can be staged), and only when all of them are complete
are they moved in, each with a rename that never replaces anything
(``renameat2(RENAME_NOREPLACE)``, else a hard link or an exclusive create).
A failed or interrupted run leaves none of them and touches nothing that was
there before. A path that exists is replaced only when the caller allows it
(``overwrite``) and it is a file, or a folder holding nothing but frame files
(``frame_0000.png``, ...); anything else is refused. What goes into a staged
path is the codecs' business (`cogvideox_torchax.io.video.write_video_to`,
`cogvideox_torchax.io.latents.write_latents`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import hashlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

FILE_SUFFIXES = (".mp4", ".npy", ".safetensors")
KINDS = ("mp4", "png", "npy", "safetensors")
# The only entries a PNG output folder may hold for --overwrite to replace it.
FRAME_FILE = re.compile(r"frame_\d{4,}\.png")


class OutputError(ValueError):
    """An output path that cannot be written or may not be replaced; the message says why."""


class DiskFull(OSError):
    """The disk (or the user's quota) filled up while writing an output; the message names it and the bytes needed."""


_SHORT_WRITE = re.compile(r"(\d+) requested and (\d+) written")  # numpy's tofile on a full disk


@contextlib.contextmanager
def disk_full_named(output: str | os.PathLike, needed: int | None = None) -> Iterator[None]:
    """Turns a full disk while writing ``output`` (ENOSPC or EDQUOT from any writer, numpy's short write) into `DiskFull`.

    ``needed``: the bytes the output takes uncompressed, when known (named in the message).
    """
    try:
        yield
    except DiskFull:
        raise
    except OSError as e:
        short = _SHORT_WRITE.search(str(e)) if e.errno is None else None
        if e.errno not in (errno.ENOSPC, errno.EDQUOT) and short is None:
            raise
        if short is not None:
            want, wrote = int(short.group(1)), int(short.group(2))
            detail = f"{want} bytes needed, {wrote} written"
        else:
            detail = f"{needed} bytes needed" if needed is not None else "more space needed"
        what = "the quota is exceeded" if e.errno == errno.EDQUOT else "the disk is full"
        raise DiskFull(e.errno or errno.ENOSPC,
                       f"{what} writing {str(output)!r} ({detail}); nothing of it was kept") from e


def output_kind(path: str | os.PathLike) -> str:
    """``"mp4"``, ``"npy"``, ``"safetensors"``, or ``"png"`` for a path without a suffix (a folder of frames).

    Raises:
        OutputError: any other suffix.
    """
    suffix = Path(path).suffix.lower()
    if suffix == "":
        return "png"
    if suffix not in FILE_SUFFIXES:
        raise OutputError(
            f"unknown output extension {suffix!r}; use .mp4, .npy, .safetensors, or a folder name (PNG frames)"
        )
    return suffix[1:]


def output_paths(path: str | os.PathLike, batch: int) -> list[Path]:
    """One output per video: the path itself for one video, ``name_0.ext``, ``name_1.ext``, ... for more."""
    path = Path(path)
    if batch == 1:
        return [path]
    return [path.with_name(f"{path.stem}_{i}{path.suffix}") for i in range(batch)]


# -- what may be replaced ---------------------------------------------------


def _replaceable(path: Path, is_dir: bool) -> None:
    """Raises `OutputError` unless the existing ``path`` may be replaced under --overwrite."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(f"output {str(path)!r} is a symbolic link; it is never replaced, pick another name")
    if stat.S_ISREG(st.st_mode):
        return
    if not stat.S_ISDIR(st.st_mode):
        raise OutputError(f"output {str(path)!r} exists and is not a regular file; it is never replaced")
    if not is_dir:
        raise OutputError(f"output {str(path)!r} is a folder; a file output never replaces a folder")
    with os.scandir(path) as entries:
        foreign = sorted(e.name for e in entries if not (FRAME_FILE.fullmatch(e.name) and e.is_file(follow_symlinks=False)))
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise OutputError(
            f"output folder {str(path)!r} holds {foreign[0]!r}{more}, not only frame_*.png files; "
            "it is never replaced, even with --overwrite"
        )


def _check_target(path: Path, is_dir: bool, overwrite: bool) -> None:
    text = os.fspath(path)
    if "\0" in text:
        raise OutputError(f"output {text!r} contains a NUL character")
    absolute = Path(os.path.abspath(text))
    if absolute.name in ("", ".", ".."):
        raise OutputError(f"output {text!r} does not name a file or folder")
    cwd = Path(os.getcwd())
    if absolute == cwd or absolute in cwd.parents:
        raise OutputError(f"output {text!r} is the current folder or holds it; pick another name")
    parent = path.parent
    if not os.path.isdir(parent):  # False on any error (a component longer than NAME_MAX: ENAMETOOLONG)
        what = "is not a folder" if os.path.lexists(parent) else "does not exist"
        raise OutputError(f"output folder {str(parent)!r} {what}")
    # Checked here, not left to the final move: the staged name is bounded, so
    # it would be made and the output decoded, and only the move refused.
    size, limit = len(os.fsencode(absolute.name)), _limit(parent, "PC_NAME_MAX", 255)
    if size > limit or len(os.fsencode(text)) >= _limit(parent, "PC_PATH_MAX", 4096):
        what = f"name is {size} bytes, over its folder's {limit}" if size > limit else "path is longer than PATH_MAX"
        raise OutputError(f"output {text!r} is too long: its {what}")
    if os.path.lexists(path):
        if not overwrite:
            raise OutputError(f"output {text!r} exists; pass --overwrite to replace it")
        _replaceable(path, is_dir)


def _limit(folder: Path, name: str, default: int) -> int:
    """The folder's ``PC_NAME_MAX`` (in bytes: 255 on most file systems, never more here) or ``PC_PATH_MAX``."""
    with contextlib.suppress(OSError, ValueError):
        limit = os.pathconf(folder, name)
        if limit > 0:
            return min(limit, default)
    return default


def staged_prefix(path: Path, tag: str, suffix: str, limit: int) -> str:
    """``.name.[tag]``, the staged name before its 8 random characters and ``suffix``, all within ``limit`` bytes.

    A name too long for that keeps its first bytes (whole UTF-8 characters)
    and a hash of the whole name: ``.na~1a2b3c4d.[tag]``.
    """
    room = limit - len(os.fsencode(f"..{tag}{suffix}")) - 8  # tempfile's random part
    raw = os.fsencode(path.name)
    if len(raw) <= room:
        return f".{path.name}.{tag}"
    head = raw[: max(0, room - 9)].decode("utf-8", "ignore")  # a cut character dropped, not half kept
    return f".{head}~{hashlib.sha256(raw).hexdigest()[:8]}.{tag}"


def _reserve(path: Path, is_dir: bool, tag: str = "") -> Path:
    """Creates an empty entry beside ``path`` (``.name.[tag]XXXXXXXX[.suffix]``) with the umask's permissions.

    This is also the writability probe: it is the name the output is written
    under. Its name fits the folder whatever the output's (`staged_prefix`).
    """
    parent = path.parent
    suffix = "" if is_dir or len(os.fsencode(path.suffix)) > 16 else path.suffix  # a longer one is no codec's
    prefix = staged_prefix(path, tag, suffix, _limit(parent, "PC_NAME_MAX", 255))
    try:
        if is_dir:
            tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
        else:
            fd, name = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=parent)
            os.close(fd)
            tmp = Path(name)
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise OutputError(f"output {str(path)!r} is too long a path for its folder") from e
        raise OutputError(f"output folder {str(parent)!r} is not writable ({e.strerror})") from e
    # mkstemp/mkdtemp make owner-only entries; give the output the
    # permissions a plain open() would have.
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod((0o777 if is_dir else 0o666) & ~umask)
    return tmp


def _remove_own(tmp: Path) -> None:
    """Removes an entry this module created (a temporary output)."""
    with contextlib.suppress(FileNotFoundError):
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp)
        else:
            tmp.unlink()


def _discard_old(aside: Path) -> None:
    """Deletes a replaced output moved aside: a file, or a folder's frame files one by one (never a tree)."""
    if aside.is_dir() and not aside.is_symlink():
        for entry in os.scandir(aside):
            if FRAME_FILE.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                os.unlink(entry.path)
        with contextlib.suppress(OSError):  # something new in it: left there, hidden, not lost
            aside.rmdir()
    else:
        with contextlib.suppress(FileNotFoundError):
            aside.unlink()


# -- renames that never replace ---------------------------------------------

_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def _load_renameat2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_renameat2 = _load_renameat2()


def rename_noreplace(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Renames ``src`` to ``dst``, failing with `FileExistsError` if anything is at ``dst``.

    ``renameat2(RENAME_NOREPLACE)`` where the kernel and file system have it;
    otherwise a hard link then unlink (files) or an exclusive ``mkdir`` then a
    rename onto that empty folder (folders): the same guarantee, never a
    replace.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    if _renameat2 is not None:
        if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(err, os.strerror(err), dst)
        if err not in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            raise OSError(err, os.strerror(err), src, None, dst)
    if os.path.isdir(src) and not os.path.islink(src):
        os.mkdir(dst)  # exclusive: FileExistsError if anything is there
        try:
            os.rename(src, dst)  # onto the empty folder just made; fails if someone filled it
        except BaseException:
            with contextlib.suppress(OSError):
                os.rmdir(dst)
            raise
        return
    try:
        os.link(src, dst)  # exclusive: FileExistsError if anything is there
    except FileExistsError:
        raise
    except OSError:  # no hard links here: an exclusive create, then a replace of that empty file
        os.close(os.open(dst, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.replace(src, dst)
        return
    os.unlink(src)


# -- staging ----------------------------------------------------------------


class StagedOutputs:
    """Temporary entries beside each output path, moved in together by `commit` or all removed.

    Creating it checks every path (existing ones only with ``overwrite``, and
    then only a file or a folder of frame files; the folder must exist and
    take a new entry, which is probed by creating the temporary entry the
    output is written to). Use as a context manager: leaving the block
    without `commit` removes the temporary entries. `commit` moves them all
    in or, on any failure, none (outputs it already moved are taken back,
    replaced ones restored).

    Raises:
        OutputError: a path that cannot be written or may not be replaced.
    """

    def __init__(self, paths: list[str | os.PathLike], *, overwrite: bool = False, is_dir: bool | None = None):
        self.paths = [Path(p) for p in paths]
        self.overwrite = overwrite
        self.temps: list[Path] = []
        self._committed = False
        if len(set(map(os.path.abspath, self.paths))) != len(self.paths):
            raise OutputError("the same output path is named twice")
        self._is_dir = [output_kind(p) == "png" if is_dir is None else is_dir for p in self.paths]
        try:
            for path, d in zip(self.paths, self._is_dir, strict=True):
                _check_target(path, d, overwrite)
            for path, d in zip(self.paths, self._is_dir, strict=True):
                self.temps.append(_reserve(path, d))
        except BaseException:
            self.discard()
            raise

    def __enter__(self) -> StagedOutputs:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._committed:
            self.discard()

    def discard(self) -> None:
        """Removes the temporary entries (nothing else)."""
        for tmp in self.temps:
            _remove_own(tmp)

    def commit(self) -> None:
        """Moves every temporary entry to its path: all of them, or (raising) none."""
        placed: list[tuple[Path, Path, Path | None]] = []  # (path, its temp, the old entry moved aside)
        try:
            for path, tmp, d in zip(self.paths, self.temps, self._is_dir, strict=True):
                aside = self._move_old_aside(path, d)
                try:
                    rename_noreplace(tmp, path)
                except FileExistsError:
                    self._restore(path, aside)
                    raise OutputError(
                        f"output {str(path)!r} appeared while this command ran; it was not replaced"
                    ) from None
                except BaseException:
                    self._restore(path, aside)
                    raise
                placed.append((path, tmp, aside))
        except BaseException:
            for path, tmp, aside in reversed(placed):
                with contextlib.suppress(OSError):
                    os.rename(path, tmp)  # ours, back to its temporary name (then removed)
                self._restore(path, aside)
            raise
        self._committed = True
        for _, _, aside in placed:
            if aside is not None:
                _discard_old(aside)

    def _move_old_aside(self, path: Path, is_dir: bool) -> Path | None:
        if not os.path.lexists(path):
            return None
        if not self.overwrite:
            raise OutputError(f"output {str(path)!r} appeared while this command ran; it was not replaced")
        _replaceable(path, is_dir)
        old_is_dir = path.is_dir() and not path.is_symlink()
        aside = _reserve(path, old_is_dir, tag="old.")
        try:
            os.replace(path, aside)  # over the empty placeholder just made
        except BaseException:
            _remove_own(aside)
            raise
        try:
            _replaceable(aside, is_dir)  # what was moved, checked again: it may have changed meanwhile
        except OutputError:
            self._restore(path, aside)
            raise
        return aside

    @staticmethod
    def _restore(path: Path, aside: Path | None) -> None:
        if aside is not None:
            with contextlib.suppress(OSError):
                rename_noreplace(aside, path)


def check_outputs(paths: list[Path], overwrite: bool) -> None:
    """Refuses outputs that exist (unless ``overwrite`` and replaceable) or whose folder is missing or not writable.

    The folder is probed by creating (and removing) the temporary entry an
    output would be written to.

    Raises:
        OutputError: naming the first offending path.
    """
    StagedOutputs(paths, overwrite=overwrite).discard()


@contextlib.contextmanager
def atomic_output(path: Path, is_dir: bool = False, *, overwrite: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path``, moved to ``path`` when the block ends without error (else removed).

    The same guarantees as this module's writers (see `StagedOutputs`), for
    outputs written elsewhere (e.g. `latents.write_latents`).
    """
    with StagedOutputs([path], overwrite=overwrite, is_dir=is_dir) as staged:
        yield staged.temps[0]
        staged.commit()
