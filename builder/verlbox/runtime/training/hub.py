"""The model and GSM8K from the Hugging Face hub into a folder: staged, verified, recorded, then moved into place.

`train` calls this on first start (inside the image) and `verlbox fetch` anywhere, the host included, so it
needs nothing beyond huggingface_hub (no torch, no pyarrow). A download lands in a sibling `FOLDER.partial`
first, kept between attempts and restarts so the hub client resumes its `.incomplete` files; the folder
itself appears only once every file matches what the hub lists, with `verlbox-fetch.json` inside it (the
repository, the revision asked for, the commit it resolved to, every file's size and sha256). A later start
checks the folder against that record, so a copy carried to an offline host is checked too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from verlbox import __version__
from verlbox.errors import UsageError, VerlboxError
from verlbox.files import unreadable_folder, write_atomically
from verlbox.runtime.steps.urls import redact, split_userinfo
from verlbox.runtime.training.environment import origin, setting

RECORD = "verlbox-fetch.json"
RECORD_FORMAT = 1
STAGING_SUFFIX = ".partial"
DEFAULT_ENDPOINT = "https://huggingface.co"
# what huggingface_hub can ask: a scheme it speaks, then a host
ENDPOINT = re.compile(r"https?://[^/?#\s]+(/\S*)?", re.IGNORECASE)
# a host (and port, path) with the scheme left out: the message suggests it with https://
BARE_HOST = re.compile(r"[\w.-]+(:[0-9]+)?(/\S*)?")
DEFAULT_REVISION = "main"
DEFAULT_REPOS = {"model": "Qwen/Qwen2.5-0.5B-Instruct", "data": "openai/gsm8k"}
REPO_TYPES = {"model": "model", "data": "dataset"}
# huggingface_hub's own reading of HF_HUB_OFFLINE
TRUE_VALUES = {"1", "ON", "YES", "TRUE"}
# a connection dropped mid-file: the next attempt resumes from the bytes already on disk
ATTEMPTS = 3
RETRY_DELAY_S = 2.0
_CHUNK = 1 << 20
# how often the waiting thread looks at the download: also how soon it answers a Ctrl-C
POLL_S = 0.1
WRITTEN_PIECE = 1 << 20  # bytes: what the bar can show of a download, and what a Ctrl-C keeps beyond the last piece
_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\")]+")
# the hub client's resume state inside FOLDER.partial, removed before the folder is promoted
CLIENT_STATE = ".cache"


class FetchError(VerlboxError):
    """The hub could not fill a folder, or a filled folder no longer matches its record."""


class FetchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a download: its message says where what arrived is kept (the CLI prints it after
    "interrupted")."""


@dataclass(frozen=True)
class Source:
    """What to fetch: `what` is the `verlbox fetch` argument (model or data), which also names its settings."""

    what: str
    repo: str
    revision: str

    @property
    def repo_type(self) -> str:
        return REPO_TYPES[self.what]

    def setting(self, flag: str) -> str:
        """Where the user chooses FLAG (repo or revision): `verlbox fetch`'s flag, or train's variable."""
        return f"--{flag} or VERLBOX_{self.what.upper()}_{flag.upper()}"

    def command(self, out: str) -> str:
        """The `verlbox fetch` command that fills OUT with this source."""
        words = ["verlbox", "fetch", self.what, "--out", shlex.quote(out)]
        if self.repo != DEFAULT_REPOS[self.what]:
            words += ["--repo", shlex.quote(self.repo)]
        if self.revision != DEFAULT_REVISION:
            words += ["--revision", shlex.quote(self.revision)]
        return " ".join(words)


def source_from_environment(
    what: str, environ: dict[str, str], repo: str | None = None, revision: str | None = None
) -> Source:
    """Arguments win, then VERLBOX_MODEL_REPO/_REVISION (or _DATA_), then the defaults; compose passes unset
    settings as empty strings, so empty means unset."""
    prefix = f"VERLBOX_{what.upper()}_"
    return Source(
        what,
        repo or environ.get(prefix + "REPO") or DEFAULT_REPOS[what],
        revision or environ.get(prefix + "REVISION") or DEFAULT_REVISION,
    )


@dataclass(frozen=True)
class Hub:
    endpoint: str
    token: str | None
    offline: bool

    @classmethod
    def from_environment(cls, environ: dict[str, str]) -> Hub:
        # empty means unset (compose passes every setting); huggingface_hub would take an empty endpoint as is
        endpoint = (environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
        try:
            split_userinfo(endpoint)
        except ValueError as error:  # its message shows no part of the URL
            raise UsageError(f"HF_ENDPOINT{origin(environ)}: {error}") from None
        if not ENDPOINT.fullmatch(endpoint):
            # requests would say only "No scheme supplied", deep in the first download; shown without a login
            shown = endpoint.rpartition("@")[2]
            such_as = f"https://{shown}" if BARE_HOST.fullmatch(shown) else DEFAULT_ENDPOINT
            raise UsageError(
                f"{setting(environ, 'HF_ENDPOINT', shown)}: expected the hub's or a mirror's URL, http:// or https:// "
                f"and a host, such as {such_as}"
            )
        return cls(
            endpoint,
            environ.get("HF_TOKEN") or None,
            (environ.get("HF_HUB_OFFLINE") or "").upper() in TRUE_VALUES,
        )

    @property
    def shown(self) -> str:
        """The endpoint in messages and records: never its credentials."""
        return redact(self.endpoint)


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Record:
    repo: str
    repo_type: str
    revision: str  # as asked for: a branch, a tag or a commit
    commit: str  # what it resolved to; empty: not known (copied from a plain folder: fetch --from)
    endpoint: str
    files: tuple[FileEntry, ...]

    def to_json(self) -> str:
        return json.dumps({"format": RECORD_FORMAT, **asdict(self)}, indent=2) + "\n"

    def describe(self) -> str:
        at = f"at {self.commit[:12]}" if self.commit else "(no commit known)"
        return f"{self.repo} {at}, {len(self.files)} files"


def read_record(folder: Path) -> Record | None:
    """The folder's fetch record; None when it has none (never fetched, or filled by hand)."""
    path = folder / RECORD
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        files = tuple(FileEntry(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in data["files"])
        record = Record(
            str(data["repo"]),
            str(data["repo_type"]),
            str(data["revision"]),
            str(data["commit"]),
            str(data["endpoint"]),
            files,
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise FetchError(
            f"{path} is not a readable fetch record ({exc}): move {folder} away and start again to fetch it anew"
        ) from None
    # a copied record is as untrusted as the hub's listing: a name outside the folder would be read there
    for entry in record.files:
        why = unsafe_name(entry.path, folder)
        if why:
            raise FetchError(f"{path} names {entry.path!r}, {why}: move {folder} away and start again to fetch it anew")
    return record


def recorded(folder: Path) -> Record | None:
    """FOLDER's fetch record, or None when it has none or an unreadable one (the preflight names that)."""
    try:
        return read_record(folder)
    except (VerlboxError, OSError):
        return None


def unsafe_name(name: str, folder: Path) -> str | None:
    """Why NAME (from the hub's listing or a record) is not a plain file of FOLDER; None when it is.

    The hub client joins a listed name to the folder as it stands (it refuses `..` only on Windows), and the
    verification opens and deletes that path: `../x` or `/home/you/x` would be written or deleted outside."""
    parts = name.split("/")
    if not name or name.startswith("/") or "\\" in name or "\0" in name:
        return "not a relative /-separated path"
    if any(part in ("", ".", "..") for part in parts):
        return "a path with an empty, . or .. part"
    if name == RECORD:
        return "the name of verlbox's own record"
    if parts[0] == CLIENT_STATE:
        return f"under {CLIENT_STATE}/, where the hub client keeps its state"
    if not (folder / name).resolve().is_relative_to(folder.resolve()):
        return f"a path that leads out of {folder} through a link"
    return None


def ensure(
    source: Source,
    folder: Path,
    hub: Hub,
    say: Callable[[str], None],
    *,
    shown_as: str | None = None,
    by_hand: bool = True,
    suggest: bool = True,
) -> str:
    """Make FOLDER hold SOURCE and say how: checked against its record, used as is when filled by hand
    (BY_HAND; the caller's own checks judge it), else fetched when missing or empty.

    SHOWN_AS is the folder as the user names it where `verlbox fetch` runs (the run folder's path, not the
    container's); it goes into the command an error suggests."""
    # `verlbox fetch` itself (SUGGEST false) is not told to run `verlbox fetch`: it is what just failed
    shown = (shown_as or str(folder)) if suggest else None
    folder = _absolute(folder)
    if problem := unreadable_folder(folder):
        raise UsageError(problem)
    record = read_record(folder)
    if record is not None:
        return check_record(folder, record, source)
    if folder.is_dir() and any(folder.iterdir()):
        if by_hand:
            return f"{folder} has no {RECORD} (filled by hand): used as is"
        raise UsageError(f"{folder} already holds files but no {RECORD}: fetch into a new or empty folder")
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} is a file: fetch into a folder")
    record = fetch(source, folder, hub, say, shown)
    return f"fetched {record.describe()} into {folder} (recorded in its {RECORD})"


def _absolute(folder: Path) -> Path:
    """FOLDER made absolute, so that FOLDER.partial is its sibling for `.` or `..` too (not `..partial`)."""
    folder = Path(os.path.abspath(folder))  # not resolve(): messages name the folder as the user does
    if folder == folder.parent:
        raise UsageError(f"cannot fetch into {folder}: name a folder below it")
    return folder


def check_record(folder: Path, record: Record, source: Source) -> str:
    """Every recorded file is there with its size and sha256, and the record is of the source asked for.

    Asking for the default revision (main) accepts a record of any revision: a folder fetched at a pinned
    commit on a connected machine and copied here is used as it is; only another pinned revision is refused."""
    default = source.revision == DEFAULT_REVISION
    if (record.repo, record.repo_type) != (source.repo, source.repo_type) or not (
        default or source.revision in (record.revision, record.commit)
    ):
        raise FetchError(
            f"{folder} holds {record.repo} at {record.revision} ({record.commit[:12]}) but {source.repo} at "
            f"{source.revision} is asked for ({source.setting('repo')}, {source.setting('revision')}): "
            f"move {folder} away to fetch that, or ask for what it holds"
        )
    # sizes first: a missing or truncated file is named without hashing a gigabyte
    for entry in record.files:
        path = folder / entry.path
        size = path.stat().st_size if path.is_file() else None
        if size != entry.size:
            found = "missing" if size is None else f"{size} bytes, recorded {entry.size}"
            raise _changed(folder, path, found)
    for entry in record.files:
        if _hexdigests(folder / entry.path, hashlib.sha256()) != [entry.sha256]:
            raise _changed(folder, folder / entry.path, "its sha256 differs from the recorded one")
    done = f"{folder} matches its {RECORD} ({record.describe()})"
    if source.revision not in (record.revision, record.commit):
        done += (
            f"; note: fetched at {record.revision}, not {DEFAULT_REVISION}, and used as is "
            f"(a revision pinned with {source.setting('revision')} has to match)"
        )
    return done


def _changed(folder: Path, path: Path, found: str) -> FetchError:
    return FetchError(
        f"{path} does not match {folder / RECORD} ({found}): restore it, "
        f"or move {folder} away and start again to fetch it anew"
    )


def fetch(source: Source, folder: Path, hub: Hub, say: Callable[[str], None], shown_as: str | None) -> Record:
    """Download SOURCE into FOLDER.partial (resuming what an earlier attempt left), verify it, record it, move it
    into place. Every failure is one FetchError naming FOLDER and the command that fills it elsewhere."""
    if hub.offline:
        raise _unavailable(source, folder, shown_as, "HF_HUB_OFFLINE is set")
    folder = _absolute(folder)
    staging = folder.with_name(folder.name + STAGING_SUFFIX)
    # the nearest folder that exists: what is missing below it is made, and FOLDER.partial is renamed in it
    parent = next(path for path in folder.parents if path.is_dir())
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot fetch into {folder}: {parent} is not writable (and {staging.name} goes there)")
    with _hub_errors(source, folder, hub, shown_as, kept=None):
        info = _repo_info(source, hub)
    siblings = info.siblings or []
    _check_listing(source, info.sha, siblings, staging, hub)
    say(f"fetching {source.repo} ({source.revision}: {info.sha[:12]}) from {hub.shown} into {folder}")
    with _hub_errors(source, folder, hub, shown_as, kept=staging):
        _download(source, info.sha, siblings, staging, hub, say)
        files = _verified(staging, siblings)
    record = Record(source.repo, source.repo_type, source.revision, info.sha, hub.shown, files)
    _promote(staging, folder, record)
    return record


def _repo_info(source: Source, hub: Hub) -> Any:
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.endpoint, token=hub.token, library_name="verlbox", library_version=__version__)
    # blobs=True: each file's size and hash as the hub lists them, to verify the download against
    return api.repo_info(source.repo, repo_type=source.repo_type, revision=source.revision, files_metadata=True)


def _check_listing(source: Source, commit: str, siblings: list[Any], staging: Path, hub: Hub) -> None:
    """Every listed file has a name inside STAGING and a size and hash to verify it against; else nothing is
    downloaded (the README promises every file is checked)."""
    where = f"{hub.shown} lists for {source.repo} at {commit[:12]}"
    if not siblings:
        raise FetchError(f"{where} no files: nothing fetched")
    for sibling in siblings:
        why = unsafe_name(sibling.rfilename, staging)
        if why:
            raise FetchError(f"{where} a file named {sibling.rfilename!r}, {why}: nothing fetched")
        if sibling.size is None or (sibling.lfs is None and sibling.blob_id is None):
            raise FetchError(
                f"{where} {sibling.rfilename} without its size or hash, so it cannot be verified: nothing fetched"
            )


def _download(
    source: Source, commit: str, siblings: list[Any], staging: Path, hub: Hub, say: Callable[[str], None]
) -> None:
    """The listed files of COMMIT (not of the branch, which may move meanwhile) into STAGING, one after another.

    The hub client works in a daemon thread while this one only waits and draws the progress: a Ctrl-C here
    ends the command at once. (snapshot_download's own pool of threads is joined as Python exits, so a Ctrl-C
    waited silently for the file under way to end.) What arrived stays in STAGING for the next attempt."""
    failures: list[BaseException] = []
    progress = _DownloadProgress(staging, siblings)

    def work() -> None:
        try:
            _download_each(source, commit, siblings, staging, hub, say, progress)
        except BaseException as exc:  # handed to the waiting thread, which raises it there
            failures.append(exc)

    thread = threading.Thread(target=work, name="verlbox-fetch", daemon=True)
    thread.start()
    try:
        with progress.shown():
            while thread.is_alive():
                thread.join(POLL_S)
                progress.refresh()
    except KeyboardInterrupt:
        raise FetchInterrupted(f"what arrived is kept in {staging}; the same command resumes it from there") from None
    if failures:
        raise failures[0]


def _download_each(
    source: Source,
    commit: str,
    siblings: list[Any],
    staging: Path,
    hub: Hub,
    say: Callable[[str], None],
    progress: _DownloadProgress,
) -> None:
    import requests
    from huggingface_hub import constants, hf_hub_download

    # plain HTTP, not Xet: its partial files are the `.incomplete` ones in STAGING, which survive a
    # restart beside the folder (Xet resumes from a cache under HF_HOME, which may not be kept)
    constants.HF_HUB_DISABLE_XET = True
    # the client writes what arrives in pieces of this size, and the bar reads the partial file's size: its own
    # 10 MiB left a bar at 0 for minutes on a slow link, and a Ctrl-C kept nothing of a piece not yet whole
    constants.DOWNLOAD_CHUNK_SIZE = WRITTEN_PIECE
    for attempt in range(1, ATTEMPTS + 1):
        try:
            for sibling in siblings:
                progress.current = sibling.rfilename
                hf_hub_download(
                    source.repo,
                    sibling.rfilename,
                    repo_type=source.repo_type,
                    revision=commit,
                    local_dir=staging,
                    endpoint=hub.endpoint,
                    token=hub.token,
                    library_name="verlbox",
                    library_version=__version__,
                )
            return
        except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ConnectionError) as exc:
            if attempt == ATTEMPTS:
                raise
            say(f"download interrupted ({_short(exc)}); resuming (attempt {attempt + 1} of {ATTEMPTS})")
            time.sleep(RETRY_DELAY_S)


class _DownloadProgress:
    """One bar a file on a terminal, labelled with the file's name: its bytes are those of the client's
    `.incomplete` file being written (the newest one; the files go one after another)."""

    def __init__(self, staging: Path, siblings: list[Any]) -> None:
        self.partial_files = staging / CLIENT_STATE / "huggingface" / "download"
        self.sizes = {sibling.rfilename: sibling.size for sibling in siblings}
        self.staging = staging
        self.current: str | None = None
        self.tasks: dict[str, Any] = {}
        self.bars: Any = None

    @contextmanager
    def shown(self) -> Iterator[None]:
        from huggingface_hub.utils import disable_progress_bars
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        disable_progress_bars()  # the client's bars name a URL's last 40 characters: a cut commit hash
        console = Console(stderr=True)
        if not console.is_terminal:  # a log gets the lines `say` writes, not redrawn bars
            yield
            return
        columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
        with Progress(*columns, console=console) as self.bars:
            yield
            self.refresh()

    def refresh(self) -> None:
        if self.bars is None:
            return
        for name in list(self.tasks)[:-1]:  # the ones before the current one are done
            self.bars.update(self.tasks[name], completed=self.sizes[name])
        name = self.current
        if name is None:
            return
        if name not in self.tasks:
            self.tasks[name] = self.bars.add_task(name, total=self.sizes[name])
        done = (self.staging / name).is_file()
        self.bars.update(self.tasks[name], completed=self.sizes[name] if done else self._arrived())

    def _arrived(self) -> int:
        partial = sorted(self.partial_files.glob("*.incomplete"), key=_mtime)
        return partial[-1].stat().st_size if partial else 0


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # moved into place meanwhile
        return 0.0


def _verified(staging: Path, siblings: list[Any]) -> tuple[FileEntry, ...]:
    """Each file against the size and hash the hub lists (sha256 for LFS files, the git blob id for the rest).
    A file that differs is deleted, so that the next attempt downloads it again."""
    entries = []
    for sibling in siblings:
        path = staging / sibling.rfilename
        size = path.stat().st_size
        # git's blob id: sha1 over a "blob SIZE" header and the bytes
        sha256, blob_id = _hexdigests(path, hashlib.sha256(), hashlib.sha1(f"blob {size}\0".encode()))
        expected = (sibling.lfs.sha256, sha256) if sibling.lfs else (sibling.blob_id, blob_id)
        if sibling.size != size or expected[0] != expected[1]:
            path.unlink()
            raise FetchError(f"{path} arrived different from what the hub lists: removed; start again to fetch it anew")
        entries.append(FileEntry(sibling.rfilename, size, sha256))
    return tuple(entries)


def _promote(staging: Path, folder: Path, record: Record) -> None:
    """STAGING becomes FOLDER in one rename: a reader sees no folder, or the whole one."""
    shutil.rmtree(staging / CLIENT_STATE, ignore_errors=True)  # the hub client's resume state, done with
    recorded = {entry.path for entry in record.files}
    # files an earlier attempt fetched at another commit, which this one does not have
    for path in sorted(staging.rglob("*"), reverse=True):
        relative = path.relative_to(staging).as_posix()
        if path.is_file() and relative not in recorded:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    write_atomically(staging / RECORD, record.to_json())
    try:
        os.replace(staging, folder)  # replaces an empty folder too
    except OSError as exc:
        raise FetchError(f"cannot move {staging} to {folder} ({exc.strerror or exc}): move it there yourself") from None


def _hexdigests(path: Path, *digests: Any) -> list[str]:
    """The file through each of DIGESTS (hashlib objects), read once."""
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            for digest in digests:
                digest.update(chunk)
    return [digest.hexdigest() for digest in digests]


def _unavailable(source: Source, folder: Path, shown_as: str | None, why: str, *, elsewhere: bool = True) -> FetchError:
    """One sentence; where another machine can help (the hub out of reach from `train`), the command that
    fills the folder there (SHOWN_AS: the folder as it is named there). None for `verlbox fetch` itself,
    which that command would only repeat, and none for a wrong name or a refused token."""
    advice = ""
    if elsewhere and shown_as is not None:
        advice = f"; fill it on a connected machine with `{source.command(shown_as)}` and copy that folder here"
    return FetchError(f"cannot fetch {source.repo} ({source.revision}) into {folder}: {why}{advice}")


@contextmanager
def _hub_errors(source: Source, folder: Path, hub: Hub, shown_as: str | None, kept: Path | None) -> Iterator[None]:
    """The hub client's exceptions as one sentence each: what went wrong, and the command that fills FOLDER.
    KEPT: where a broken download's bytes wait for the next start (None while nothing is downloaded yet)."""
    import requests
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    resume = f"; what arrived is kept in {kept} and the next start resumes it" if kept else ""
    # a hub (or a mirror) that answers a bare 404: no such repository, revision or file there
    not_found = (
        f"no {source.repo_type} {source.repo} at revision {source.revision} there (check {source.setting('repo')} "
        f"and {source.setting('revision')}; a private one needs HF_TOKEN)"
    )
    # the user's own settings: fixed by changing them, not by another machine
    settings: list[tuple[type[BaseException], Callable[[Any], str]]] = [
        (GatedRepoError, lambda _: f"{source.repo} is gated: accept its terms on the hub and set HF_TOKEN"),
        (
            RepositoryNotFoundError,
            lambda _: (
                f"repository not found: {hub.shown} has no {source.repo_type} {source.repo} "
                f"(check {source.setting('repo')}; a private one needs HF_TOKEN)"
            ),
        ),
        (
            RevisionNotFoundError,
            lambda _: f"{source.repo} has no revision {source.revision} ({source.setting('revision')})",
        ),
    ]
    reasons: list[tuple[type[BaseException] | tuple[type[BaseException], ...], Callable[[Any], str]]] = [
        (OfflineModeIsEnabled, lambda _: "HF_HUB_OFFLINE is set"),
        # the client's "cannot locate the files" wraps what actually failed: a connection, a status
        (LocalEntryNotFoundError, lambda exc: _cause(exc, hub, not_found) + resume),
        (HfHubHTTPError, lambda exc: _http_status(exc, hub, not_found)),
        (requests.exceptions.SSLError, lambda exc: f"TLS to {hub.shown} failed ({_short(exc)})"),
        (requests.exceptions.ChunkedEncodingError, lambda exc: f"the connection broke ({_short(exc)}){resume}"),
        (requests.exceptions.ConnectionError, lambda exc: f"{hub.shown} cannot be reached ({_short(exc)}){resume}"),
        (requests.exceptions.Timeout, lambda _: f"{hub.shown} did not answer in time{resume}"),
        (requests.exceptions.RequestException, lambda exc: f"a request to {hub.shown} failed ({_short(exc)})"),
        (OSError, lambda exc: f"{exc.filename or folder}: {exc.strerror or exc}"),
    ]
    try:
        yield
    except VerlboxError:
        raise  # already one sentence of its own (a file that arrived different), not a failure of the client
    except Exception as exc:
        for kind, reason in settings:
            if isinstance(exc, kind):
                raise _unavailable(source, folder, shown_as, reason(exc), elsewhere=False) from None
        for kind, reason in reasons:
            if isinstance(exc, kind):
                raise _unavailable(source, folder, shown_as, reason(exc)) from None
        # a failure of the client this list does not know yet: still one sentence (VERLBOX_DEBUG=1 shows it whole)
        raise _unavailable(
            source, folder, shown_as, f"the download failed ({type(exc).__name__}: {_short(exc)})"
        ) from exc


def _cause(exc: BaseException, hub: Hub, not_found: str) -> str:
    cause = exc.__cause__
    if cause is None:
        return f"{hub.shown} cannot be reached"
    response = getattr(cause, "response", None)
    if response is not None:
        return _http_status(cause, hub, not_found)
    return f"{hub.shown} cannot be reached ({_short(cause)})"


def _http_status(exc: BaseException, hub: Hub, not_found: str) -> str:
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        return f"{hub.shown} refused access ({status}): set HF_TOKEN to a token that may read it"
    if status == 404:
        return f"{hub.shown} answered 404: {not_found}"
    return f"{hub.shown} answered {status}"


def _short(exc: BaseException) -> str:
    """The part of a connection error a user can act on ("[Errno 111] Connection refused", "Connection broken:
    IncompleteRead(...)"), not the reprs of the pool and the wrappers around it."""
    match = _ERRNO.search(str(exc))
    if match:
        return match.group(0)
    while exc.args and isinstance(exc.args[0], BaseException):
        exc = exc.args[0]
    text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
    lines = text.strip().splitlines()
    return lines[0][:200] if lines else type(exc).__name__
