"""run.json in a run's checkpoint folder: what produced its checkpoints, one entry per start of `train`.

A week-long run is started many times (reboots, `docker compose up`, a changed `.env`); each start
appends an entry with the image's recipe and patch set, the profile and every override, the GPUs it
found, the model's fetched commit and the data files' sha256, then closes it with how the run ended and
the last step saved. verl's own restarts inside one start are listed in that entry. `verlbox runs`
reads these files back as a table. One `train` runs an experiment at a time (one_train): two would lose
each other's entries and save into the same step folders.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from verlbox.errors import PreflightFailed, UsageError
from verlbox.files import write_atomically
from verlbox.runtime.steps.apex_build import file_sha256

RUN_FILE = "run.json"
RUN_FORMAT = 1
# held by the `train` that runs the experiment: two of them lose each other's run.json entries and save into the
# same step folders (`docker compose run --rm train train ...` beside `up`)
LOCK_FILE = "verlbox-train.lock"


class Loose(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Gpu(Loose):
    name: str
    capability: str
    memory_gib: float


class Restart(Loose):
    at: str
    after: str  # how verl's previous attempt ended
    from_step: int | None


class Run(Loose):
    started: str
    ended: str | None = None
    outcome: str | None = None  # None while it runs, or after a crash that took `train` with it
    last_step: int | None = None
    restarts: list[Restart] = []
    recipe: str
    recipe_hash: str
    lock_hash: str | None = None  # None: an image built without a lock
    patch_set_hash: str
    verlbox: str
    image: str | None  # the reference compose started (VERLBOX_IMAGE), when it says
    profile: str
    overrides: list[str]
    gpus: list[Gpu]
    memory_cap_gib: float | None = None  # --gpu-memory-gib: the limit each process had, below the card's
    driver: str | None
    model: str
    model_commit: str | None  # from the model's fetch record; None for a folder filled by hand or copied from one
    data_commit: str | None = None  # the GSM8K download's fetched commit, likewise
    data: dict[str, str]  # parquet file -> sha256


class RunFile(Loose):
    format: int = RUN_FORMAT
    runs: list[Run]


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def file_hashes(paths: Iterable[Path]) -> dict[str, str]:
    return {str(path): file_sha256(path) for path in paths if path.is_file()}


def read_runs(folder: Path) -> list[Run]:
    """The runs recorded in FOLDER/run.json (none when there is no file); a damaged file is one sentence."""
    path = folder / RUN_FILE
    if not path.is_file():
        return []
    try:
        return RunFile.model_validate(json.loads(path.read_text())).runs
    except (OSError, ValueError, ValidationError) as exc:
        reason = " ".join(str(exc).split())[:200]
        raise UsageError(f"{path}: not a readable run record ({reason})") from None


def _write(folder: Path, runs: list[Run]) -> None:
    write_atomically(folder / RUN_FILE, RunFile(runs=runs).model_dump_json(indent=1) + "\n")


def _disk_full(error: UsageError) -> bool:
    """ERROR (write_atomically's "cannot write here") came from a full disk or quota, not from the path: its
    OSError is kept as the context its one line suppresses."""
    cause = error.__context__
    return isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT)


class RunLog:
    """This start's entry in FOLDER/run.json, written whole at every change (a crash leaves the last state). A full
    disk is no reason to stop the run, nor bad input: the write is said once and tried again at the next change,
    and whether the saves still have room is the checkpoints' check to say."""

    def __init__(self, folder: Path, run: Run, say: Callable[[str], None]) -> None:
        self.folder = folder
        self.say = say
        self.unwritten = False  # the last write met a full disk
        try:
            earlier = read_runs(folder)
        except UsageError as exc:  # a damaged record must not stop a run: kept aside, said, begun anew
            kept = folder / f"{RUN_FILE}.damaged-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
            (folder / RUN_FILE).rename(kept)
            say(f"{exc}: kept as {kept.name}, starting a new one")
            earlier = []
        self.runs = [*earlier, run]
        self.run = run
        self._write()

    def restarted(self, after: str, from_step: int | None) -> None:
        self.run.restarts.append(Restart(at=now(), after=after, from_step=from_step))
        self._write()

    def ended(self, outcome: str, last_step: int | None) -> None:
        self.run.ended, self.run.outcome, self.run.last_step = now(), outcome, last_step
        self._write()

    def write_pending(self) -> bool:
        """Write what a full disk held back; True once nothing is pending."""
        if self.unwritten:
            self._write()
        return not self.unwritten

    def _write(self) -> None:
        try:
            _write(self.folder, self.runs)
        except UsageError as exc:
            if not _disk_full(exc):
                raise
            if not self.unwritten:
                self.say(f"run record: {exc}: the disk is full; this start's entry is written at its next change")
            self.unwritten = True
            return
        self.unwritten = False


@contextlib.contextmanager
def one_train(folder: Path | None, say: Callable[[str], None]) -> Iterator[None]:
    """Hold FOLDER, an experiment's checkpoint folder, for this `train` while the block runs; a second `train` on it
    is refused (PreflightFailed) in one line naming the first. The lock is flock's, which the kernel drops with the
    process that holds it, so a killed container leaves a lock file that blocks nothing (and verl, started with
    close_fds, never inherits it). None: a folder Hydra resolves later, which verlbox does not write to."""
    if folder is None:
        yield
        return
    path = folder / LOCK_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise UsageError(f"{path}: cannot open the experiment's lock here ({exc.strerror or exc})") from None
    try:
        _take(fd, folder, say)
        yield
    finally:
        os.close(fd)


class AlreadyRunning(PreflightFailed):
    """Another `train` runs this experiment: refused at once, never held (the advice a hold gives, to recreate or
    stop the service, would end the run that is going on)."""


def _take(fd: int, folder: Path, say: Callable[[str], None]) -> None:
    """Lock FD's file for this process and write who holds it, for the refusal of the next one."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "one that is just starting"
        raise AlreadyRunning(
            f"{folder}: another `train` runs this experiment ({holder}); one `train` per experiment folder: wait "
            "for it or stop it (`docker compose stop train`), or start this one as another experiment "
            "(VERLBOX_EXPERIMENT)"
        ) from None
    except OSError as exc:  # a file system without locks (some network or FUSE mounts) must not stop every run
        say(f"run record: cannot lock {folder / LOCK_FILE} ({exc.strerror or exc}); a second `train` is not refused")
        return
    with contextlib.suppress(OSError):  # held all the same on a full disk: only the next refusal says less
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {now()}\n".encode(), 0)
