"""Writing files so that a reader sees the old content or the new, never half of it; folders that cannot be read."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from verlbox.errors import UsageError


def default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_atomically(path: Path, text: str | bytes, mode: int | None = None) -> None:
    """Replace `path` in one step; a new file gets the mode an ordinary write would give it.

    The data is on disk before the rename, and the rename before returning, so a crash leaves
    either file whole. A path that cannot be written is bad input: one line, nothing left behind.
    """
    if mode is None:
        mode = path.stat().st_mode & 0o7777 if path.is_file() else default_mode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    except OSError as exc:
        raise UsageError(f"{path}: cannot write here ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        Path(temporary).unlink(missing_ok=True)
        raise UsageError(f"{path}: cannot write here ({exc.strerror or exc})") from None
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    # some file systems refuse to open a directory for fsync; the rename is then as durable as it gets
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def unreadable_folder(folder: Path) -> str | None:
    """Why this process cannot list and read FOLDER (its owner and mode, and who we are), or None. A folder
    it cannot enter looks empty to glob() and makes is_file() raise: both would mislead what follows."""
    try:
        info = folder.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"{folder}: cannot look at it ({exc.strerror or exc})"
    if not folder.is_dir() or os.access(folder, os.R_OK | os.X_OK):
        return None
    return (
        f"{folder}: cannot read it (owner uid {info.st_uid}, mode {info.st_mode & 0o777:o}; this runs as uid "
        f"{os.getuid()}): on the host, `sudo chown -R $(id -u):$(id -g)` the folder, or give its files read access"
    )
