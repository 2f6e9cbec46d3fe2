"""JAX's persistent compilation cache: where it lives and whether it was hit.

With the cache on, a second process decoding the same shapes loads the
compiled program from disk instead of compiling it. JAX keys each entry by
the lowered program, the compile options, the devices and the jax/XLA
versions, so a different dtype, mesh or latent shape (all of which change the
program) never reuses a wrong executable. JAX keeps no program holding a
host callback (LTX's CPU programs with `host_conv`): those compile in each
process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.monitoring

ENV_VAR = "COGVIDEOX_TORCHAX_CACHE_DIR"
_HIT = "/jax/compilation_cache/cache_hits"
_MISS = "/jax/compilation_cache/cache_misses"


def default_cache_dir() -> Path:
    """``$COGVIDEOX_TORCHAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/cogvideox_torchax/jax`` (``~/.cache`` by default)."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "cogvideox_torchax" / "jax"


def enable_compile_cache(path: str | os.PathLike | None = None) -> Path:
    """Turns on JAX's persistent compilation cache for this process.

    Every program is cached, however fast it compiled (JAX's default skips
    programs under a second).

    Args:
        path: the cache folder; `default_cache_dir()` if None. Created if missing.

    Returns:
        The folder in use.

    Raises:
        OSError: the folder cannot be created or written (probed by creating
            and removing a file in it); the cache is then left as it was.
    """
    folder = Path(path).expanduser() if path is not None else default_cache_dir()
    check_usable(folder)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder


def check_usable(folder: Path) -> None:
    """Creates ``folder`` if missing and probes that a file can be written in it.

    Raises:
        OSError: it cannot (the message names the folder and the reason).
    """
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OSError(e.errno, f"{str(folder)!r}: {e.strerror or e}") from e


def disable_compile_cache() -> None:
    """Turns JAX's persistent compilation cache off for this process (no reads, no writes)."""
    jax.config.update("jax_enable_compilation_cache", False)


@dataclasses.dataclass
class CacheEvents:
    """Persistent-cache hits and misses seen inside a `count_cache_events` block."""

    hits: int = 0
    misses: int = 0

    @property
    def status(self) -> str:
        """``"hit"`` (everything loaded), ``"miss"`` (something compiled) or ``"off"`` (cache not consulted)."""
        if self.misses:
            return "miss"
        return "hit" if self.hits else "off"


_active: list[CacheEvents] = []
_listening = False


def _listener(event: str, **_: object) -> None:
    for counter in _active:
        if event == _HIT:
            counter.hits += 1
        elif event == _MISS:
            counter.misses += 1


@contextlib.contextmanager
def count_cache_events() -> Iterator[CacheEvents]:
    """Counts persistent-cache hits and misses of the compilations inside the block."""
    global _listening
    if not _listening:
        # jax.monitoring has no unregister in its public API: register once.
        jax.monitoring.register_event_listener(_listener)
        _listening = True
    counter = CacheEvents()
    _active.append(counter)
    try:
        yield counter
    finally:
        _active.remove(counter)
