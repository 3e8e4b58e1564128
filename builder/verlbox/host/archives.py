"""Pinned source archives (Apex's): found in the sources cache, else fetched, and accepted only by hash.

A `.tar.gz` is pinned twice: the sha256 of the file, and the sha256 of the tar stream inside it.
gzip's output differs between tools and over time, but the tar that `git archive` writes for a
commit does not, so GitHub's archive of the commit and one a user makes with `git archive` are both
accepted, and nothing else. A fetch is written beside its final name and renamed only once it
passed, so the cache never holds bytes that were not checked.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from verlbox.errors import UsageError, VerlboxError

CHUNK = 1 << 20
FETCH_TIMEOUT_S = 60


@dataclass(frozen=True)
class ArchivePin:
    name: str
    sha256: str
    # sha256 of the decompressed tar stream; None: only the exact file is accepted
    tar_sha256: str | None
    upstream_url: str
    # how a user makes the archive by hand, for the one-line error when it cannot be fetched
    how_to_make: str


@dataclass(frozen=True)
class AcceptedArchive:
    path: Path
    # the file's own sha256: what the build checks again inside its Apex stage
    sha256: str


class ArchiveRefused(UsageError):
    """Bytes that match neither pin: bad input, whether a user's file or a mirror's."""


def _digests(path: Path) -> tuple[str, str | None]:
    """The file's sha256 and its gzip stream's (None when it is not gzip)."""
    file_digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            file_digest.update(chunk)
    tar_digest = hashlib.sha256()
    try:
        with gzip.open(path, "rb") as stream:
            for chunk in iter(lambda: stream.read(CHUNK), b""):
                tar_digest.update(chunk)
    except (OSError, EOFError, zlib.error):
        return file_digest.hexdigest(), None
    return file_digest.hexdigest(), tar_digest.hexdigest()


def check_archive(path: Path, pin: ArchivePin) -> AcceptedArchive:
    file_sha256, tar_sha256 = _digests(path)
    if file_sha256 == pin.sha256 or (pin.tar_sha256 is not None and tar_sha256 == pin.tar_sha256):
        return AcceptedArchive(path, file_sha256)
    pinned = f"sha256 {pin.sha256}" + (f" or a tar stream of sha256 {pin.tar_sha256}" if pin.tar_sha256 else "")
    found = f"sha256 {file_sha256}" + (f", tar stream {tar_sha256}" if tar_sha256 else ", not gzip")
    raise ArchiveRefused(f"{path}: {found}, but the recipe pins {pinned}: refusing other source bytes")


def _download(url: str, target: Path, label: str, console: Console) -> None:
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as response, target.open("wb") as out:
        size = response.headers.get("Content-Length")
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task(f"fetching {label}")
            progress.update(task, total=int(size) if size and size.isdigit() else None)
            for chunk in iter(lambda: response.read(CHUNK), b""):
                out.write(chunk)
                progress.advance(task, len(chunk))
        out.flush()
        os.fsync(out.fileno())


def fetch_archive(pin: ArchivePin, directory: Path, url: str, console: Console) -> AcceptedArchive:
    """Download `url` into `directory` as `pin.name`: checked before the rename, nothing kept otherwise."""
    target = directory / pin.name
    manual = f"download {pin.upstream_url} (or {pin.how_to_make}) on a connected machine and put it in {directory}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{pin.name}.fetch-")
        os.close(fd)
    except OSError as exc:
        raise VerlboxError(f"{directory}: cannot write the sources cache ({exc.strerror or exc}): {manual}") from None
    partial = Path(temporary)
    try:
        _download(url, partial, pin.name, console)
        accepted = check_archive(partial, pin)
        os.replace(partial, target)
    except ArchiveRefused as exc:
        raise ArchiveRefused(f"{url} served other bytes than the recipe pins ({exc}): {manual}") from None
    except (OSError, urllib.error.URLError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
        raise VerlboxError(f"could not fetch {pin.name} from {url} ({reason}): {manual}") from None
    finally:
        partial.unlink(missing_ok=True)
    console.print(f"fetched {pin.name} from {url} (sha256 checked)")
    return AcceptedArchive(target, accepted.sha256)
