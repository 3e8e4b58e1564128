"""What verlbox remembers between commands, in the user's state folder ($XDG_STATE_HOME/verlbox, else
~/.local/state/verlbox): the run folders `verlbox init` made, so that `clean --images` keeps the image
each one's .env names wherever it runs from, and the image the last `verlbox build` made, which `init`
takes. Losing either file loses only that knowledge: commands say what they cannot see, never fail on it. And
each build's record of its image's files (images/, host/trust/built.py), which `verify` holds images to: losing
one makes verify of that image fail until it is built here again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from verlbox.errors import VerlboxError
from verlbox.files import write_atomically

RUN_FOLDERS = "run-folders"  # one absolute path a line
LAST_BUILD = "last-build.json"  # {"image": the first tag, "id": the image's ID}
BUILD_RECORDS = "images"  # one record per image ID a build made here


def state_dir(environ: Mapping[str, str] = os.environ) -> Path:
    return Path(environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "verlbox"


def build_records(environ: Mapping[str, str] = os.environ) -> Path:
    """The folder of the records `verlbox build` writes of each image's files (host/trust/built.py)."""
    return state_dir(environ) / BUILD_RECORDS


def run_folders(environ: Mapping[str, str] = os.environ) -> list[Path]:
    """The run folders init made that are still there, oldest first."""
    try:
        lines = (state_dir(environ) / RUN_FOLDERS).read_text().splitlines()
    except OSError:
        return []
    return [Path(line) for line in dict.fromkeys(lines) if line and Path(line).is_dir()]


def remember_run_folder(folder: Path, environ: Mapping[str, str] = os.environ) -> str | None:
    """Adds FOLDER to the list; why it could not, or None. Folders gone since are dropped meanwhile."""
    path = Path(os.path.abspath(folder))  # as compose names the project: not through links
    known = [str(known_folder) for known_folder in run_folders(environ)]
    if str(path) in known:
        return None
    try:
        write_atomically(state_dir(environ) / RUN_FOLDERS, "".join(f"{line}\n" for line in [*known, str(path)]))
    except VerlboxError as exc:
        return f"{exc}: `verlbox clean --images` run elsewhere will not know this run folder's image"
    return None


def last_build(environ: Mapping[str, str] = os.environ) -> tuple[str, str] | None:
    """(tag, image ID) of the last image `verlbox build` made here, or None."""
    try:
        record = json.loads((state_dir(environ) / LAST_BUILD).read_text())
        return str(record["image"]), str(record["id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remember_build(tag: str, image_id: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """Records TAG as the image the last build made; why it could not, or None."""
    try:
        write_atomically(state_dir(environ) / LAST_BUILD, json.dumps({"image": tag, "id": image_id}) + "\n")
    except VerlboxError as exc:
        return f"{exc}: `verlbox init` will not know this build's image (--image {tag} names it)"
    return None
