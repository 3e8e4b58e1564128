"""`verlbox fetch --from DIR`: the model (or GSM8K) from a folder on this machine, for a host that reaches no hub.

DIR is one of: a folder `verlbox fetch` filled (its `verlbox-fetch.json` checked, then copied with it); the
Hugging Face cache (a snapshot `models--ORG--NAME/snapshots/COMMIT`, the repository's `models--ORG--NAME`, or
the cache folder holding it: `~/.cache/huggingface/hub`, or HF_HOME with its `hub/`); or a plain folder holding a
model. The target is left as `fetch` leaves it: every file copied into a sibling temporary folder, checked,
`verlbox-fetch.json` written, then renamed into place in one step, so `train` finds a whole, recorded folder or
none. The cache is checked as the hub would be: each snapshot file is a link to a blob named by its hash (the
sha256 of a large file, git's blob id of the rest), and a file whose bytes do not match its name is refused.
A plain folder has no such hashes: its record names the repository it is said to hold and no commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from verlbox.errors import UsageError
from verlbox.files import unreadable_folder, write_atomically
from verlbox.runtime.training.hub import (
    CLIENT_STATE,
    DEFAULT_REVISION,
    RECORD,
    FetchError,
    FileEntry,
    Record,
    Source,
    check_record,
    read_record,
)

_CHUNK = 1 << 20
_COMMIT = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# where the cache keeps a repository: huggingface_hub's repo_folder_name ("--" cannot occur in a repo's name)
CACHE_PREFIXES = {"model": "models--", "dataset": "datasets--"}
WEIGHTS = ("*.safetensors", "pytorch_model*.bin")
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def copy_in(source: Source, given: Path, folder: Path, say: Callable[[str], None]) -> str:
    """FOLDER made to hold SOURCE, copied from GIVEN (see the module); one line saying what was done.

    A FOLDER that already holds a record is checked against it, as `fetch` does, and left as it is."""
    folder = Path(os.path.abspath(folder))
    for path in (given, folder):
        if problem := unreadable_folder(path):
            raise UsageError(problem)
    if not given.is_dir():
        raise UsageError(f"--from {given}: {'no such folder' if not given.exists() else 'not a folder'}")
    if (record := read_record(folder)) is not None:
        return check_record(folder, record, source)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise UsageError(f"{folder} already holds files but no {RECORD}: copy into a new or empty folder")
    snapshot, record_of = _found(source, given)
    files = _files(snapshot)
    if source.what == "model":
        _check_model_files(snapshot, set(files))
    say(f"copying {len(files)} files of {source.repo} from {snapshot} into {folder}")
    record = _copied(snapshot, files, folder, record_of)
    return f"copied {record.describe()} from {snapshot} into {folder} (recorded in its {RECORD})"


# the record of a found folder, made from its files as they were copied
RecordOf = Callable[[tuple[FileEntry, ...]], Record]


def _found(source: Source, given: Path) -> tuple[Path, RecordOf]:
    """The folder to copy, and how its record is made from the files as copied (their sizes and hashes)."""
    if (fetched := read_record(given)) is not None:
        check_record(given, fetched, source)  # the files as recorded, the repository and revision asked for

        def as_fetched(files: tuple[FileEntry, ...]) -> Record:
            if {(f.path, f.size, f.sha256) for f in files} != {(f.path, f.size, f.sha256) for f in fetched.files}:
                raise FetchError(f"{given} changed while it was copied: copy it again")
            return fetched

        return given, as_fetched
    snapshot = _cache_snapshot(source, given)
    if snapshot is None:
        return given, lambda files: Record(
            source.repo, source.repo_type, source.revision, "", given.resolve().as_uri(), files
        )
    repository, commit = snapshot.parent.parent, snapshot.name
    refs = _refs(repository)
    names = [name for name, points in refs.items() if points == commit]
    if source.revision != DEFAULT_REVISION and source.revision not in (commit, *names):
        raise UsageError(
            f"--from {given}: its snapshot {commit[:12]} is not {source.revision} ({source.setting('revision')}); "
            f"the cache's refs: {', '.join(f'{n} = {p[:12]}' for n, p in sorted(refs.items())) or 'none'}"
        )
    revision = source.revision if source.revision in names else (names[0] if names else commit)
    return snapshot, lambda files: Record(
        source.repo, source.repo_type, revision, commit, repository.resolve().as_uri(), files
    )


def _cache_snapshot(source: Source, given: Path) -> Path | None:
    """GIVEN's snapshot of SOURCE in the Hugging Face cache; None where GIVEN is no part of a cache."""
    expected = CACHE_PREFIXES[source.repo_type] + source.repo.replace("/", "--")
    if given.parent.name == "snapshots" and _is_cache_repository(given.parent.parent):
        _same_repository(given, given.parent.parent.name, expected, source)
        if not _COMMIT.fullmatch(given.name):
            raise UsageError(f"--from {given}: a snapshot of the Hugging Face cache is named by its commit")
        return given
    for repository in (given, given / expected, given / "hub" / expected):
        if _is_cache_repository(repository):
            _same_repository(given, repository.name, expected, source)
            return _snapshot_of(source, given, repository)
    return None


def _is_cache_repository(folder: Path) -> bool:
    return folder.name.startswith(tuple(CACHE_PREFIXES.values())) and (folder / "snapshots").is_dir()


def _same_repository(given: Path, name: str, expected: str, source: Source) -> None:
    if name != expected:
        kind, _, repo = name.partition("--")
        raise UsageError(
            f"--from {given}: the Hugging Face cache's {name} holds {kind[:-1]} {repo.replace('--', '/')}, not "
            f"{source.repo} ({source.setting('repo')})"
        )


def _refs(repository: Path) -> dict[str, str]:
    """The cache's refs/NAME files: a branch or tag name, and the commit it pointed at when last downloaded."""
    refs_folder = repository / "refs"
    if not refs_folder.is_dir():
        return {}
    found = {}
    for path in refs_folder.rglob("*"):
        if path.is_file() and _COMMIT.fullmatch(commit := path.read_text().strip()):
            found[path.relative_to(refs_folder).as_posix()] = commit
    return found


def _snapshot_of(source: Source, given: Path, repository: Path) -> Path:
    """The snapshot that SOURCE's revision names: a ref of the cache, a commit, or the only snapshot there."""
    snapshots = sorted(path.name for path in (repository / "snapshots").iterdir() if path.is_dir())
    wanted = _refs(repository).get(source.revision, source.revision)
    if wanted in snapshots:
        return repository / "snapshots" / wanted
    if source.revision == DEFAULT_REVISION and len(snapshots) == 1:
        return repository / "snapshots" / snapshots[0]
    held = ", ".join(name[:12] for name in snapshots) or "none"
    raise UsageError(
        f"--from {given}: no snapshot of {source.revision} in {repository / 'snapshots'} (it holds {held}): name "
        f"the snapshot's folder, or give {source.setting('revision')}"
    )


def _files(folder: Path) -> list[str]:
    """Every file below FOLDER, /-separated, links followed (a cache's files are links to its blobs); the hub
    client's state and an old record stay behind."""
    names = []
    for root, dirs, files in os.walk(folder, followlinks=True):
        relative = Path(root).relative_to(folder)
        dirs[:] = sorted(d for d in dirs if relative.parts or d != CLIENT_STATE)
        names += [(relative / name).as_posix() for name in sorted(files) if relative.parts or name != RECORD]
    if not names:
        raise UsageError(f"--from {folder}: an empty folder")
    return names


def _check_model_files(folder: Path, names: set[str]) -> None:
    """What `train` needs of a model before it copies a gigabyte: config.json, weights, every shard indexed."""
    expected = "expected a model's folder (config.json and *.safetensors) or the Hugging Face cache"
    if "config.json" not in names:
        raise UsageError(f"--from {folder}: no config.json there: {expected}")
    if not any(Path(name).match(pattern) for name in names if "/" not in name for pattern in WEIGHTS):
        raise UsageError(f"--from {folder}: a config.json but no weights (*.safetensors): {expected}")
    for index in (name for name in SHARD_INDEXES if name in names):
        try:
            shards = set(json.loads((folder / index).read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UsageError(f"--from {folder}: {index} is no weight index ({exc})") from None
        if missing := sorted(shards - names):
            raise UsageError(f"--from {folder}: {index} names {', '.join(missing)}, not there (a partial download?)")


def _copied(snapshot: Path, names: list[str], folder: Path, record_of: RecordOf) -> Record:
    """NAMES copied into a temporary sibling of FOLDER, each hashed as it is read and checked against its cache
    blob's name, the record written, then the whole renamed into place; nothing is left behind on a failure."""
    staging = folder.with_name(f".{folder.name}.copying")
    shutil.rmtree(staging, ignore_errors=True)  # what a killed copy left: this command's own
    staging.mkdir(parents=True)
    try:
        entries = tuple(_copy_one(snapshot / name, staging / name, name) for name in names)
        record = record_of(entries)
        write_atomically(staging / RECORD, record.to_json())
        if folder.is_dir():
            folder.rmdir()  # empty (checked above): the rename takes its place
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return record


def _copy_one(source: Path, target: Path, name: str) -> FileEntry:
    target.parent.mkdir(parents=True, exist_ok=True)
    sha256 = hashlib.sha256()
    size = source.stat().st_size
    blob = hashlib.sha1(f"blob {size}\0".encode())  # git's blob id: the cache names small files by it
    with source.open("rb") as reading, target.open("wb") as writing:
        for chunk in iter(lambda: reading.read(_CHUNK), b""):
            sha256.update(chunk)
            blob.update(chunk)
            writing.write(chunk)
    blob_name = source.resolve().name if source.is_symlink() else ""
    expected = sha256 if _SHA256.fullmatch(blob_name) else blob if _COMMIT.fullmatch(blob_name) else None
    if expected is not None and expected.hexdigest() != blob_name:
        raise FetchError(
            f"{source} does not match its blob in the Hugging Face cache ({blob_name[:12]}...): a damaged cache; "
            "download it again there"
        )
    if target.stat().st_size != size:
        raise FetchError(f"{source} changed while it was copied: copy it again")
    return FileEntry(name, size, sha256.hexdigest())
