"""Where a host command finds the run folder it reads: `--run DIR`, else the current folder when it is one.

A run folder is what `verlbox init` writes: a compose.yaml, init's record, or a .env of verlbox's keys. Its
.env (the shell's variables winning, as in compose) says where the models, data and checkpoints live,
relative to the folder, as compose resolves them; the defaults below are compose.yaml's own. Shared by the
host's commands and `fetch`, which also runs in the image.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from verlbox.dotenv import dotenv_values
from verlbox.errors import UsageError

INIT_RECORD = ".verlbox-init.json"  # what `verlbox init` wrote there
# .env key -> compose.yaml's default for it
FOLDER_DEFAULTS = {
    "VERLBOX_MODELS": "./models",
    "VERLBOX_DATA": "./data",
    "VERLBOX_CHECKPOINTS": "./checkpoints",
}
# the folders a run folder binds, where no run folder goes: a .env key -> compose.yaml's default
BOUND_FOLDERS = FOLDER_DEFAULTS | {"VERLBOX_HF_CACHE": "./hf-cache"}
MODEL_NAME_DEFAULT = "Qwen2.5-0.5B-Instruct"
RAW_GSM8K = "gsm8k-raw"


@dataclass(frozen=True)
class RunFolder:
    path: Path
    settings: dict[str, str]  # its .env, as compose reads it

    def setting(self, variable: str) -> str | None:
        """VARIABLE as compose reads it here: the shell's value wins over the .env's; empty means unset."""
        return os.environ.get(variable) or self.settings.get(variable) or None

    def folder(self, variable: str) -> Path:
        """The folder VARIABLE names (compose's default where unset), relative to the run folder as compose takes it."""
        return self.path / (self.setting(variable) or FOLDER_DEFAULTS[variable])

    @property
    def checkpoints(self) -> Path:
        return self.folder("VERLBOX_CHECKPOINTS")

    def fetch_target(self, what: str) -> Path:
        """Where `train` looks for the model (models/NAME) or GSM8K's download (data/gsm8k-raw)."""
        if what == "model":
            return self.folder("VERLBOX_MODELS") / (self.setting("VERLBOX_MODEL_NAME") or MODEL_NAME_DEFAULT)
        return self.folder("VERLBOX_DATA") / RAW_GSM8K

    @property
    def described(self) -> str:
        """What a command says of the folder it used."""
        return f"run folder {self.path}{' (its .env)' if self.settings else ''}"


def source_tree(path: Path) -> bool:
    """verlbox's own source tree (a checkout): its compose.yaml is the template `init` copies, not a run's."""
    return (path / "builder" / "verlbox" / "cli.py").is_file()


def is_run_folder(path: Path) -> bool:
    """compose.yaml or init's record there, or a .env that sets verlbox's keys (a .env alone is any project's);
    never verlbox's source tree."""
    if source_tree(path):
        return False
    if (path / "compose.yaml").is_file() or (path / INIT_RECORD).is_file():
        return True
    return any(key.startswith("VERLBOX_") for key in dotenv_values(path / ".env"))


def find_run_folder(option: str | None, current: Path | None = None, named_by: str = "--run ") -> RunFolder | None:
    """--run DIR (which must be a run folder), else the current folder if it is one, else none."""
    if option is not None:
        path = Path(option)
        if not path.is_dir():
            raise UsageError(f"{named_by}{option}: no such folder (`verlbox init {option}` makes a run folder)")
        if source_tree(path):
            raise UsageError(f"{named_by}{option}: {not_a_run_folder(path)}")
        if not is_run_folder(path):
            raise UsageError(
                f"{named_by}{option}: not a run folder (no .env or compose.yaml; `verlbox init {option}` writes them)"
            )
    else:
        path = current or Path.cwd()
        if not is_run_folder(path):
            return None
    path = Path(os.path.abspath(path))  # not resolve(): compose names the project after the folder as given
    return RunFolder(path, dotenv_values(path / ".env"))


def not_a_run_folder(path: Path) -> str:
    """Why PATH, which is_run_folder refused, is not one, and the command that makes one."""
    if source_tree(path):
        return (
            "verlbox's source tree, not a run folder (its compose.yaml is init's template): `verlbox init ~/run` "
            "makes one"
        )
    return "not a run folder (no .env or compose.yaml): `verlbox init DIR` makes one"


def unfit_for_run_folder(path: Path) -> str | None:
    """Why `verlbox init` must not make a run folder at PATH: verlbox's source tree or a folder in it, or a
    folder inside a run folder's bound folders (models/, data/, ...), where compose would mount it into
    another run. None when it may."""
    absolute = Path(os.path.abspath(path))
    for folder in (absolute, *absolute.parents):
        if source_tree(folder):
            where = "is verlbox's source tree" if folder == absolute else f"is inside verlbox's source tree {folder}"
            return f"{path} {where}: make the run folder outside it, e.g. `verlbox init ~/run`"
    for folder in absolute.parents:
        if not is_run_folder(folder):
            continue
        run = RunFolder(folder, dotenv_values(folder / ".env"))
        for variable, default in BOUND_FOLDERS.items():
            bound = Path(os.path.abspath(folder / (run.setting(variable) or default)))
            if absolute == bound or bound in absolute.parents:
                beside = shlex.quote(str(folder.parent / absolute.name))
                return (
                    f"{path} is inside the run folder {folder} (its {variable}, {bound}): a run folder there would "
                    f"be mounted into that run; `verlbox init {beside}` makes one beside it"
                )
    return None
