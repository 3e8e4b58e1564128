"""run.json in a run's checkpoint folder: what produced its checkpoints, one entry per start of `train`.

A week-long run is started many times (reboots, `docker compose up`, a changed `.env`); each start
appends an entry with the image's recipe and patch set, the profile and every override, the GPUs it
found, the model's fetched commit and the data files' sha256, then closes it with how the run ended and
the last step saved. verl's own restarts inside one start are listed in that entry. `verlbox runs`
reads these files back as a table.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from verlbox.errors import UsageError
from verlbox.files import write_atomically
from verlbox.runtime.steps.apex_build import file_sha256

RUN_FILE = "run.json"
RUN_FORMAT = 1


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
    model_commit: str | None  # from the model's fetch record; None for a folder filled by hand
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


class RunLog:
    """This start's entry in FOLDER/run.json, written whole at every change (a crash leaves the last state)."""

    def __init__(self, folder: Path, run: Run, say: Callable[[str], None]) -> None:
        self.folder = folder
        try:
            earlier = read_runs(folder)
        except UsageError as exc:  # a damaged record must not stop a run: kept aside, said, begun anew
            kept = folder / f"{RUN_FILE}.damaged-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}"
            (folder / RUN_FILE).rename(kept)
            say(f"{exc}: kept as {kept.name}, starting a new one")
            earlier = []
        self.runs = [*earlier, run]
        self.run = run
        _write(folder, self.runs)

    def restarted(self, after: str, from_step: int | None) -> None:
        self.run.restarts.append(Restart(at=now(), after=after, from_step=from_step))
        _write(self.folder, self.runs)

    def ended(self, outcome: str, last_step: int | None) -> None:
        self.run.ended, self.run.outcome, self.run.last_step = now(), outcome, last_step
        _write(self.folder, self.runs)
