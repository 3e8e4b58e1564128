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
import http.client
import os
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from verlbox.errors import UsageError, VerlboxError
from verlbox.host.clients.upstream import opener, request_for
from verlbox.host.recipes.archive import ArchivePin
from verlbox.runtime.steps.urls import redact

CHUNK = 1 << 20
FETCH_TIMEOUT_S = 60


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


def _mismatch(pin: ArchivePin, file_sha256: str, tar_sha256: str | None) -> str:
    pinned = f"sha256 {pin.sha256}" + (f" or a tar stream of sha256 {pin.tar_sha256}" if pin.tar_sha256 else "")
    found = f"sha256 {file_sha256}" + (f", tar stream {tar_sha256}" if tar_sha256 else ", not gzip")
    return f"{found}, but the recipe pins {pinned}: refusing other source bytes"


def check_archive(path: Path, pin: ArchivePin) -> AcceptedArchive:
    """An archive already in the cache (or a bundle): refused with what to do when its bytes are not the pinned ones."""
    try:
        file_sha256, tar_sha256 = _digests(path)
    except OSError as exc:
        raise ArchiveRefused(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not _accepted(pin, file_sha256, tar_sha256):
        raise ArchiveRefused(f"{path}: {_mismatch(pin, file_sha256, tar_sha256)} (delete it to fetch it again)")
    return AcceptedArchive(path, file_sha256)


def _accepted(pin: ArchivePin, file_sha256: str, tar_sha256: str | None) -> bool:
    return file_sha256 == pin.sha256 or (pin.tar_sha256 is not None and tar_sha256 == pin.tar_sha256)


def mirror_url(base: str, name: str) -> str:
    """NAME under a mirror's base URL; a query (a token) stays a query."""
    parts = urllib.parse.urlsplit(base)
    return urllib.parse.urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{name}"))


def _download(url: str, target: Path, label: str, console: Console) -> None:
    with opener().open(request_for(url), timeout=FETCH_TIMEOUT_S) as response, target.open("wb") as out:
        size = response.headers.get("Content-Length")
        expected = int(size) if size and size.isdigit() else None
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        received = 0
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task(f"fetching {label}", total=expected)
            for chunk in iter(lambda: response.read(CHUNK), b""):
                out.write(chunk)
                received += len(chunk)
                progress.advance(task, len(chunk))
        if expected is not None and received != expected:  # a connection cut short reads as a clean end
            raise http.client.IncompleteRead(b"", expected - received)
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
        file_sha256, tar_sha256 = _digests(partial)
        if not _accepted(pin, file_sha256, tar_sha256):
            mismatch = _mismatch(pin, file_sha256, tar_sha256)
            raise ArchiveRefused(f"{redact(url)} served other bytes than the recipe pins ({mismatch}): {manual}")
        os.replace(partial, target)
    except (OSError, urllib.error.URLError, http.client.HTTPException, ValueError) as exc:
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or _http_reason(exc)
        raise VerlboxError(f"could not fetch {pin.name} from {redact(url)} ({reason}): {manual}") from None
    finally:
        partial.unlink(missing_ok=True)
    console.print(f"fetched {pin.name} from {redact(url)} (sha256 checked)")
    return AcceptedArchive(target, file_sha256)


def _http_reason(exc: Exception) -> str:
    if isinstance(exc, http.client.IncompleteRead):
        return f"the connection ended {exc.expected} bytes short"
    said = " ".join(str(exc).split())  # a server's garbage may hold line breaks: the error stays one line
    return f"{type(exc).__name__}: {said}" if isinstance(exc, http.client.HTTPException) else said
