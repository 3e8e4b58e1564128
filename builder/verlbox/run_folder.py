"""Where a host command finds the run folder it reads: `--run DIR`, else the current folder when it is one.

A run folder is what `verlbox init` writes: a .env, a compose.yaml, or both. Its .env says where the models,
data and checkpoints live, relative to the folder, as compose resolves them; the defaults below are
compose.yaml's own. Shared by the host's commands and `fetch`, which also runs in the image.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from verlbox.dotenv import dotenv_values
from verlbox.errors import UsageError

MARKS = (".env", "compose.yaml")
# .env key -> compose.yaml's default for it
FOLDER_DEFAULTS = {
    "VERLBOX_MODELS": "./models",
    "VERLBOX_DATA": "./data",
    "VERLBOX_CHECKPOINTS": "./checkpoints",
}
MODEL_NAME_DEFAULT = "Qwen2.5-0.5B-Instruct"
RAW_GSM8K = "gsm8k-raw"


@dataclass(frozen=True)
class RunFolder:
    path: Path
    settings: dict[str, str]  # its .env, as compose reads it

    def folder(self, variable: str) -> Path:
        """The folder VARIABLE names in the .env (compose's default where unset), as compose resolves it."""
        return self.path / (self.settings.get(variable) or FOLDER_DEFAULTS[variable])

    @property
    def checkpoints(self) -> Path:
        return self.folder("VERLBOX_CHECKPOINTS")

    def fetch_target(self, what: str) -> Path:
        """Where `train` looks for the model (models/NAME) or GSM8K's download (data/gsm8k-raw)."""
        if what == "model":
            return self.folder("VERLBOX_MODELS") / (self.settings.get("VERLBOX_MODEL_NAME") or MODEL_NAME_DEFAULT)
        return self.folder("VERLBOX_DATA") / RAW_GSM8K

    @property
    def described(self) -> str:
        return f"run folder {self.path}{' (its .env)' if self.settings else ''}"

    def announce(self, say: Callable[[str], None]) -> None:
        say(self.described)


def is_run_folder(path: Path) -> bool:
    return any((path / mark).is_file() for mark in MARKS)


def find_run_folder(option: str | None, current: Path | None = None, named_by: str = "--run ") -> RunFolder | None:
    """--run DIR (which must be a run folder), else the current folder if it is one, else none."""
    if option is not None:
        path = Path(option)
        if not path.is_dir():
            raise UsageError(f"{named_by}{option}: no such folder (`verlbox init {option}` makes a run folder)")
        if not is_run_folder(path):
            raise UsageError(
                f"{named_by}{option}: not a run folder (no .env or compose.yaml; `verlbox init {option}` writes them)"
            )
    else:
        path = current or Path.cwd()
        if not is_run_folder(path):
            return None
    path = path.resolve()
    return RunFolder(path, dotenv_values(path / ".env"))
